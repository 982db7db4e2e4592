// MemoryStore: the movement journal, the change feed, low-stock thresholds and the audit
// (docs/journal.md).
//
// The audit reads without stopping writers: a row and its holds are read at different
// moments, so a violation it sees is looked at again (the row's version unchanged and the
// holds summed anew) before it is reported; a write in flight between the two looks is
// not a violation.
#include <map>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>

#include "memory/memory_store_impl.hpp"

namespace stockade::detail {

namespace {

bool in_scope(const AuditOptions& options, const SkuKey& key) {
  return !options.sku || key.sku == *options.sku;
}

// The keys of the stock rows in scope, a shard at a time under its lock.
template <class Shards>
std::vector<SkuKey> rows_in_scope(const Shards& shards, const AuditOptions& options) {
  std::vector<SkuKey> keys;
  for (const auto& shard : shards) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (const auto& entry : shard.rows) {
      if (in_scope(options, entry.first)) keys.push_back(entry.first);
    }
  }
  return keys;
}

}  // namespace

struct MemoryStore::AuditSums {
  std::unordered_map<SkuKey, Quantity, SkuKeyHash> held;  // per row
  std::map<std::string, Quantity> counted;  // per group '\0' buyer: Reservation::counted()
  std::uint64_t reservations = 0;
  std::vector<Reservation> inconsistent;  // units that do not add up (units_consistent)
};

std::vector<Movement> MemoryStore::movements(const MovementQuery& query) {
  return journal_->read(query);
}

FeedPosition MemoryStore::feed_open(const std::string& consumer, bool from_start) {
  return journal_->open(consumer, from_start);
}

FeedBatch MemoryStore::feed_poll(const std::string& consumer, const FeedPosition& from,
                                 std::size_t limit) {
  return journal_->poll(consumer, from, limit);
}

void MemoryStore::feed_commit(const std::string& consumer, const FeedPosition& at) {
  journal_->commit(consumer, at);
}

bool MemoryStore::feed_drop(const std::string& consumer) {
  return journal_->drop(consumer);
}

std::uint64_t MemoryStore::purge_movements(std::int64_t older_than_us, std::uint64_t limit) {
  return journal_->purge(older_than_us, options_.feed_lag_max_us, limit);
}

StockLevel MemoryStore::set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) {
  StockRow& row = require_row(key);
  const TimestampUs now = clock_->now_us();
  const auto decide = [&](const RowValues& v) {
    RowValues next = changed(v, now);
    next.low_stock = threshold.value_or(RowValues::no_low_stock);
    return next;
  };
  return level_of(row, compare_and_set(row, decide, nullptr));
}

MemoryStore::AuditSums MemoryStore::audit_sums(const AuditOptions& options) const {
  AuditSums sums;
  for (const ReservationShard& shard : *reservations_) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    for (const auto& [id, record] : shard.records) {
      const Reservation& r = record.value;
      ++sums.reservations;
      if (!units_consistent(r) && in_scope(options, r.key)) sums.inconsistent.push_back(r);
      const bool counts =
          r.state == ReservationState::held || r.state == ReservationState::confirmed;
      if (counts && r.limit_group && r.buyer) {
        sums.counted[*r.limit_group + '\0' + *r.buyer] += r.counted();
      }
      if (r.state != ReservationState::held || !in_scope(options, r.key)) continue;
      sums.held[r.key] += r.held();
    }
  }
  return sums;
}

void MemoryStore::audit_rows(const AuditOptions& options, const AuditSums& sums,
                             AuditReport& report) const {
  std::vector<std::pair<StockRow*, RowValues>> suspects;
  std::vector<SkuKey> slot_rows;  // looked up after the shard's lock is let go
  for (const StockShard& shard : *stock_) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (const auto& [key, row] : shard.rows) {
      if (!in_scope(options, key)) continue;
      ++report.rows;
      const RowValues v = row->cell.read().values;
      const auto it = sums.held.find(key);
      const Quantity held = it == sums.held.end() ? 0 : it->second;
      if (v.reserved != held) suspects.emplace_back(row.get(), v);
      if (key.slot > 0) slot_rows.push_back(key);
    }
  }
  for (const SkuKey& key : slot_rows) {
    if (find_row(slot_key(key, 0)) != nullptr) continue;
    add_violation(report, options,
                  {"slot_row_has_sku", key, "", "the SKU's own row (slot 0)", "no such row"});
  }
  if (suspects.empty()) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let writes in flight land
  const AuditSums again = audit_sums(options);
  for (const auto& [row, seen] : suspects) {
    const RowValues v = row->cell.read().values;
    const auto it = again.held.find(row->key);
    const Quantity held = it == again.held.end() ? 0 : it->second;
    if (v.version != seen.version || v.reserved == held) continue;
    add_violation(report, options,
                  {"reserved_matches_holds", row->key, "", "reserved = " + std::to_string(held),
                   "reserved = " + std::to_string(v.reserved)});
  }
}

// A buyer's count must cover the units its buyer holds or bought that are still kept
// (retention purges confirmed ones the count still holds), within the limit: the rule of
// the PostgreSQL store's audit_limits. Read without stopping writers, so a count that
// looks wrong is read again, with its sums, after the writes in flight have landed.
void MemoryStore::audit_limits(const AuditOptions& options, const AuditSums& sums,
                               AuditReport& report) {
  std::map<std::string, Quantity> limits;
  {
    std::shared_lock<std::shared_mutex> lock(limits_mutex_);
    limits.insert(group_limits_.begin(), group_limits_.end());
  }
  const auto per_buyer = [&limits](const std::string& group) {
    const auto it = limits.find(group);
    return it == limits.end() ? std::optional<Quantity>() : std::optional<Quantity>(it->second);
  };
  const auto wrong = [this, &per_buyer](const AuditSums& kept) {
    std::map<std::string, Quantity> counts;
    {
      std::lock_guard<std::mutex> lock(allowance_mutex_);
      counts.insert(allowances_.begin(), allowances_.end());
    }
    std::map<std::string, std::pair<Quantity, Quantity>> out;  // key: (kept, count)
    std::map<std::string, Quantity> all = kept.counted;
    for (const auto& [k, n] : counts) all.emplace(k, 0);
    for (const auto& [k, units] : all) {
      const auto it = counts.find(k);
      const Quantity count = it == counts.end() ? 0 : it->second;
      const std::optional<Quantity> limit = per_buyer(k.substr(0, k.find('\0')));
      if (count < units || (limit && count > *limit)) out.emplace(k, std::make_pair(units, count));
    }
    return out;
  };
  const auto first = wrong(sums);
  if (first.empty()) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  for (const auto& [k, seen] : wrong(audit_sums(options))) {
    if (first.count(k) == 0) continue;
    const std::size_t cut = k.find('\0');
    add_violation(report, options,
                  {"limit_matches_holds",
                   {},
                   k.substr(0, cut) + "/" + k.substr(cut + 1),
                   "held >= " + std::to_string(seen.first) + " and <= per_buyer " +
                       std::to_string(per_buyer(k.substr(0, cut)).value_or(0)),
                   "held = " + std::to_string(seen.second)});
  }
}

void MemoryStore::audit_keys(const AuditOptions& options, AuditReport& report) {
  std::vector<std::pair<std::string, Uuid>> ids;
  {
    std::lock_guard<std::mutex> lock(idempotency_mutex_);
    for (const auto& [key, entry] : idempotency_) {
      if (entry.pending) continue;
      for (const Uuid& id : entry.ids) ids.emplace_back(key, id);
    }
  }
  for (const auto& [key, id] : ids) {
    ReservationShard& shard = shard_of(id);
    std::lock_guard<std::mutex> lock(shard.mutex);
    if (shard.records.count(id) != 0) continue;
    add_violation(report, options,
                  {"key_has_reservations",
                   {},
                   shown(key, 128),
                   "reservation " + id.to_string(),
                   "no such reservation"});
  }
}

void MemoryStore::audit_journal(const AuditOptions& options, AuditReport& report) const {
  MovementQuery all;
  all.limit = SIZE_MAX;
  if (options.sku) all.sku = options.sku;
  // The rows first: a row is made with its first entry under its shard's lock, so a row
  // read here without an entry in the journal read next has lost its entries.
  const std::vector<SkuKey> rows = rows_in_scope(*stock_, options);
  const std::vector<Movement> entries = journal_->read(all);
  report.movements = entries.size();
  report.journal_checked = options_.journal_max > 0;
  if (!report.journal_checked) {
    add_unchecked_journal(report, "the journal is off (journal_max=0): changes are not journaled");
    return;
  }
  report.checks.insert(report.checks.end(),
                       {"journal_chain", "journal_adds_up", "journal_matches_row"});
  std::unordered_map<SkuKey, const Movement*, SkuKeyHash> last;
  for (const Movement& m : entries) {
    const auto it = last.find(m.key);
    if (it != last.end() && it->second->version_after != m.version_before) {
      add_violation(report, options,
                    {"journal_chain", m.key, "position " + std::to_string(m.position),
                     "version_before = " + std::to_string(it->second->version_after),
                     "version_before = " + std::to_string(m.version_before)});
    }
    if (it != last.end() && it->second->on_hand + m.on_hand_delta != m.on_hand) {
      add_violation(report, options,
                    {"journal_adds_up", m.key, "position " + std::to_string(m.position),
                     "on_hand = " + std::to_string(it->second->on_hand + m.on_hand_delta),
                     "on_hand = " + std::to_string(m.on_hand)});
    }
    last[m.key] = &m;
  }
  std::uint64_t without_entry = 0;
  for (const SkuKey& key : rows) {
    if (last.count(key) == 0) ++without_entry;
  }
  add_unchecked_rows(report, without_entry);
  for (const auto& [key, m] : last) {
    StockRow* row = find_row(key);
    if (row == nullptr) continue;
    const RowValues v = row->cell.read().values;
    if (v.version != m->version_after) continue;  // written since the read: not a finding
    if (v.on_hand != m->on_hand || v.reserved != m->reserved) {
      add_violation(report, options,
                    {"journal_matches_row", key, "position " + std::to_string(m->position),
                     "on_hand = " + std::to_string(m->on_hand) +
                         ", reserved = " + std::to_string(m->reserved),
                     "on_hand = " + std::to_string(v.on_hand) +
                         ", reserved = " + std::to_string(v.reserved)});
    }
  }
}

// Each own row's incoming against the transfers in transit to it (and transfers in transit
// to rows that do not exist). Transfers are read under their lock, rows as they are then.
void MemoryStore::audit_transit(const AuditOptions& options, AuditReport& report) {
  std::map<SkuKey, Quantity> transit;
  {
    std::lock_guard<std::mutex> guard(transfers_mutex_);
    for (const auto& [id, t] : transfers_) {
      if (t.in_transit() > 0 && (!options.sku || t.sku == *options.sku)) {
        transit[t.destination_key()] += t.in_transit();
      }
    }
  }
  const TimestampUs now = clock_->now_us();
  for (const StockShard& shard : *stock_) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    for (const auto& [key, row] : shard.rows) {
      if (key.slot != 0 || (options.sku && key.sku != *options.sku)) continue;
      const Quantity incoming = level_at(key, row->cell.read().values, now).incoming;
      auto it = transit.find(key);
      const Quantity expected = it == transit.end() ? 0 : it->second;
      if (it != transit.end()) transit.erase(it);
      if (incoming == expected) continue;
      add_violation(report, options,
                    {"incoming_matches_transfers", key, "",
                     "incoming = " + std::to_string(expected) + " (its transfers in transit)",
                     "incoming = " + std::to_string(incoming)});
    }
  }
  for (const auto& [key, units] : transit) {
    add_violation(
        report, options,
        {"incoming_matches_transfers", key, "",
         "incoming = " + std::to_string(units) + " (its transfers in transit)", "no such row"});
  }
}

AuditReport MemoryStore::audit(const AuditOptions& options) {
  AuditReport report;
  // No hold_not_expired: the memory store has no thread; its holds lapse into expiry as
  // calls arrive (MemoryOptions::expire_lapsed), so one past its expiry with no call
  // since is no fault.
  report.checks = {"reservation_units", "reserved_matches_holds", "slot_row_has_sku",
                   "incoming_matches_transfers"};
  const AuditSums sums = audit_sums(options);
  for (const Reservation& r : sums.inconsistent) {
    add_violation(report, options,
                  {"reservation_units", r.key, r.id.to_string(),
                   "held + confirmed + released + expired = qty, returned <= confirmed, "
                   "state held exactly while units are held",
                   units_of(r)});
  }
  report.reservations = sums.reservations;
  audit_rows(options, sums, report);
  audit_transit(options, report);
  if (!options.sku) {
    report.checks.insert(report.checks.end(), {"limit_matches_holds", "key_has_reservations"});
    audit_limits(options, sums, report);
    audit_keys(options, report);
  }
  add_unchecked_scope(report, options);
  audit_journal(options, report);
  return report;
}

}  // namespace stockade::detail
