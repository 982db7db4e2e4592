// PostgresStore::apply_batch: many reserve and sell requests, one transaction.
//
// The fast path, for a batch of reserves and sells: one statement in autocommit (one
// round trip, its own commit) locks the touched rows in sorted order and, if every row
// has room for all of its requests, writes the summed deltas and inserts every
// reservation; if not, it changes nothing. That is the common case under a flash sale
// until the last units go. A batch on one row with distinct idempotency keys takes it
// too: its statement moves the row and claims the keys; a key that exists already fails
// the claim, which rolls the statement back (a replay, a conflict, or no room: the full
// path decides those).
// It saves most of the round trips of:
//
// The full path, one transaction whose statements run once per batch, whatever its size,
// with arrays for arguments:
//   1. claim the batch's new idempotency keys (sorted), and read the keys that exist;
//   2. lock every touched stock row, in sorted key order, and read it;
//   3. decide each request in arrival order against the rows as read, in C++;
//   4. write every row's summed deltas and insert every reservation, in one statement;
//   5. free the keys of requests that were refused, so that a retry can run afresh.
// The runner commits. A batch whose fast statement found no room runs the full path, as
// a new transaction that reads the rows afresh; either way one transaction commits the
// batch's changes. After a miss the store skips the fast path for a few batches, so a
// sold-out SKU does not pay for it on every batch. The lock order is the one every other path
// keeps: idempotency keys before stock rows, stock rows sorted. So batches from many engines, and
// per-request calls, cannot deadlock with each other.
//
// A granted change moves a row's version by one, as a per-request write would: a batch
// that grants 40 units in 40 requests moves the version by 40, and the stock level a sell
// returns is the row as it stood right after that sale.
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "base/invariant.hpp"
#include "postgres/postgres_store_impl.hpp"
#include "stockade/hash.hpp"
#include "store/fingerprint.hpp"

namespace stockade::detail::pg {

std::string text_array(const std::vector<std::string>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

std::string int_array(const std::vector<std::int64_t>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out + "}";
}

namespace {

struct RowState {
  Quantity on_hand = 0;
  Quantity reserved = 0;
  Version version = 0;
  Quantity backorder_limit = 0;
  bool discontinued = false;
  bool leased = false;
  Quantity sold = 0;
  Quantity held = 0;
  std::int64_t changes = 0;
};

// The row as the batch has decided it so far (its lease, if live, is not this batch's).
StockLevel level_of(const SkuKey& key, const RowState& row) {
  StockLevel level{key, row.on_hand, row.reserved, row.version + row.changes, 0};
  level.backorder_limit = row.backorder_limit;
  level.discontinued = row.discontinued;
  level.leased = row.leased;
  return level;
}

// A key's first request in the batch, and what the database said about the key.
struct KeyClaim {
  std::size_t first = 0;
  std::string fingerprint;  // of the first request
  bool claimed = false;     // this batch inserted the key: its first request decides
  std::optional<std::string> stored_fingerprint;  // the key existed: its request's
  std::optional<Reservation> stored;              // ... and the reservation it made
};

// A reservation a transition in the batch is about, as locked (and as changed so far).
struct Hold {
  Reservation reservation;
  bool lapsed = false;  // expires_at <= now() when it was locked
};

// The keyed fast statement failed on a key claimed elsewhere meanwhile; it rolled back, and
// the full path decides the batch.
struct FastMiss {};

// The Citus layout's multi-row INSERT ... VALUES of new reservations, and of their keys,
// with every value quoted into the SQL (see citus_move_one in statements.cpp): Citus routes
// them to the one shard their shard key names. Empty strings stand for NULL, as in the
// statements' NULLIF. Keys go in sorted bytewise, as batch_claim claims them. The times
// are the batch's `now_us` (from the statement that locked or moved its row): a now() in
// the INSERT would be the worker's, which Citus began later than the coordinator's.
// The reservations a Citus batch inserts, one element per reservation (`buyers` and
// `groups` may be empty: none).
struct CitusHolds {
  const std::vector<std::string>& ids;
  const std::vector<std::string>& skus;
  const std::vector<std::string>& locations;
  const std::vector<std::int64_t>& slots;
  const std::vector<std::int64_t>& qtys;
  const std::vector<std::int64_t>& ttls;
  const std::vector<std::string>& keys;
  const std::vector<std::string>& buyers;
  const std::vector<std::string>& groups;
};

std::string citus_holds_sql(pqxx::transaction_base& w, const std::string& schema,
                            std::uint16_t shard, std::int64_t now_us, const CitusHolds& h) {
  const auto text_or_null = [&](const std::string& v) { return v.empty() ? "NULL" : w.quote(v); };
  const std::string now =
      "('epoch'::timestamptz + " + std::to_string(now_us) + " * interval '1 microsecond')";
  std::string sql = "INSERT INTO " + schema +
                    ".reservation (id, sku, location, slot, qty, state, version, expires_at,"
                    " idempotency_key, created_at, updated_at, buyer, limit_group, shard_key)"
                    " VALUES ";
  for (std::size_t i = 0; i < h.ids.size(); ++i) {
    sql += (i == 0 ? "(" : ", (") + w.quote(h.ids[i]) + "::uuid, " + w.quote(h.skus[i]) + ", " +
           w.quote(h.locations[i]) + ", " + std::to_string(h.slots[i]) + ", " +
           std::to_string(h.qtys[i]) + ", 'held', 1, " + now + " + " + std::to_string(h.ttls[i]) +
           " * interval '1 microsecond', " + text_or_null(h.keys[i]) + ", " + now + ", " + now +
           ", " + text_or_null(h.buyers.empty() ? std::string() : h.buyers[i]) + ", " +
           text_or_null(h.groups.empty() ? std::string() : h.groups[i]) + ", " +
           std::to_string(shard) + ")";
  }
  return sql;
}

std::string citus_keys_sql(pqxx::transaction_base& w, const std::string& schema,
                           std::uint16_t shard, const std::vector<std::string>& names,
                           const std::vector<std::string>& prints,
                           const std::vector<std::string>& ids, bool skip_taken) {
  std::vector<std::size_t> order(names.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return names[a] < names[b];  // std::string compares bytewise, as COLLATE "C"
  });
  std::string sql = "INSERT INTO " + schema +
                    ".idempotency (key, request_fingerprint, reservation_ids, created_at,"
                    " shard_key) VALUES ";
  for (std::size_t n = 0; n < order.size(); ++n) {
    const std::size_t i = order[n];
    sql += (n == 0 ? "(" : ", (") + w.quote(names[i]) + ", " + w.quote(prints[i]) + ", ARRAY[" +
           w.quote(ids[i]) + "::uuid], now(), " + std::to_string(shard) + ")";
  }
  if (skip_taken) sql += " ON CONFLICT (shard_key, key) DO NOTHING RETURNING key";
  return sql;
}

void fail(BatchItem& item, Error error) {
  item.ok = false;
  item.error = std::move(error);
}

}  // namespace

// The state of one batch while its transaction runs.
struct OneRowHolds;
struct NewKeys;

class BatchTx {
 public:
  BatchTx(const std::vector<BatchItem*>& items, std::int64_t now_ms)
      : items_(items),
        ids_(items.size()),
        prints_(items.size()),
        decided_(items.size(), false),
        shard_(items.empty() ? 0 : items.front()->shard_key()) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      items[i]->clear_outcome();
      ids_[i] = make_uuid_v7(now_ms, row_shard_key(items[i]->key.sku, items[i]->key.location));
    }
  }

  // The id the fast path gave its first reserve request, if it has one.
  std::optional<Uuid> first_reservation_id() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]->op == BatchOp::reserve) return ids_[i];
    }
    return std::nullopt;
  }

  // A reservation the full path decided to make in this attempt (not a replay), if any:
  // the attempt's transaction committed if and only if it is in the database.
  std::optional<Uuid> made_reservation_id() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const BatchItem& item = *items_[i];
      if (item.ok && item.op == BatchOp::reserve && item.reservation.id == ids_[i]) return ids_[i];
    }
    return std::nullopt;
  }

  // The fast statement landed though its answer was lost: every request was granted.
  // Reservations are read back; a sell's resulting level is unknown, so it is in doubt.
  void adopt_landed(PostgresStore& store, Tx& tx, const Error& in_doubt_error) {
    std::vector<Uuid> ids;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]->op == BatchOp::reserve) ids.push_back(ids_[i]);
    }
    const std::vector<Reservation> made = store.fetch(tx, ids);
    std::size_t next = 0;
    for (BatchItem* item : items_) {
      item->clear_outcome();
      if (item->op == BatchOp::reserve) {
        item->reservation = made[next++];
        item->ok = true;
      } else {
        item->error = in_doubt_error;
      }
    }
  }

  // Transitions need the full path, and so do idempotency keys, unless the batch is on one
  // row and its keys are distinct: then the keyed fast statement claims them all or none.
  bool needs_full_path() const {
    std::set<std::string_view> names;
    bool buyers = false;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (is_transition(items_[i]->op)) return true;
      buyers = buyers || items_[i]->buyer.has_value();
      if (keyed(i) && !names.insert(*items_[i]->idempotency_key).second) return true;
    }
    const bool one = one_row();
    // Buyers (purchase limits): the one-row statement takes their allowances, without keys.
    if (buyers && (!one || !names.empty())) return true;
    return !names.empty() && !one;
  }

  bool has_buyer() const {
    return std::any_of(items_.begin(), items_.end(),
                       [](const BatchItem* item) { return item->buyer.has_value(); });
  }

  // Whether every request of the batch is for one row.
  bool one_row() const {
    for (const BatchItem* item : items_) {
      if (is_transition(item->op) || !(item->key == items_.front()->key)) return false;
    }
    return true;
  }

  // Once the batch committed: each reserve and sell, and each confirm or release that
  // went through, learns its row's version as the batch found it and as it left it
  // (BatchItem::row_found; a transition's row is its reservation's). A row the batch did
  // not read (an unknown SKU, an answer adopted after a lost commit) has version 0 and
  // says nothing.
  // Also reports what each row moved to (Store::report_write, for `auto`'s tracker): a row that
  // moved by more than this batch's changes since this process's last write has other writers.
  template <class Report>
  void report_row_versions(const Report& report) const {
    for (const auto& [key, row] : rows_) {
      if (row.version != 0 && row.changes > 0) {
        report(key, row.version + row.changes, static_cast<std::uint32_t>(row.changes));
      }
    }
    const SkuKey* last = nullptr;
    const RowState* row = nullptr;
    for (BatchItem* item : items_) {
      if (is_transition(item->op) && !item->ok) continue;
      const SkuKey& key = item->row_key();
      if (last == nullptr || !(key == *last)) {
        const auto it = rows_.find(key);
        row = it == rows_.end() ? nullptr : &it->second;
        last = &key;
      }
      if (row == nullptr || row->version == 0) continue;
      item->row_found = row->version;
      item->row_left = row->version + row->changes;
    }
  }

  bool any_keyed() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (keyed(i)) return true;
    }
    return false;
  }

  // The fast path; false if some row lacked room (nothing was changed).
  bool run_fast(Tx& tx) {
    reset();
    for (const BatchItem* item : items_) {
      RowState& row = rows_[item->key];
      row.on_hand = std::numeric_limits<Quantity>::max() / 2;  // decide as if all fit
    }
    decide();
    // quantity_max keeps a batch's sums far below the made-up level, so every request was
    // granted; should that ever fail, the full path decides against the rows as they are.
    for (const BatchItem* item : items_) {
      if (!item->ok) return false;
    }
    const pqxx::result moved = rows_.size() == 1 ? write_one(tx) : write(tx, Stmt::batch_fast);
    if (moved.empty()) return false;
    // Decide again from the rows as they stood before the write: every request fits, and
    // each gets the row's values right after it.
    const bool one_row = rows_.size() == 1;
    for (const auto& row : moved) {
      // One row: its key; several (batch_fast): the row's slot is its last column.
      RowState& state = one_row ? rows_.begin()->second
                                : rows_.at(SkuKey{row[0].as<std::string>(),
                                                  row[1].as<std::string>(), row[7].as<int>()});
      state.on_hand = row[2].as<std::int64_t>() + state.sold;
      state.reserved = row[3].as<std::int64_t>() - state.held;
      state.version = row[4].as<std::int64_t>() - state.changes;
      state.backorder_limit = row[6].as<std::int64_t>();
      state.sold = state.held = state.changes = 0;
      now_us_ = row[5].as<std::int64_t>();
    }
    std::fill(decided_.begin(), decided_.end(), false);
    decide();
    // The limited one-row statement names the SKU's purchase-limit group last.
    if (one_row && moved[0].size() > 7 && !moved[0][7].as<std::string>().empty()) {
      for (BatchItem* item : items_) {
        if (item->ok && item->op == BatchOp::reserve && item->buyer) {
          item->reservation.limit_group = moved[0][7].as<std::string>();
        }
      }
    }
    return true;
  }

  void run_full(PostgresStore& store, Tx& tx) {
    reset();
    claim_keys(store, tx);
    lock_reservations(tx);
    lock_allowances(tx);
    lock_rows(tx);
    decide();
    // affected_rows() is an int in libpqxx 7 and unsigned in 6.4.
    const auto inserted = static_cast<std::size_t>(write(tx, Stmt::batch_write).affected_rows());
    if (inserted != reservations_written_) {
      // The rows are locked, so every update matches; anything else is a bug. Throwing
      // rolls the whole batch back.
      throw Error(ErrorCode::invariant_violation,
                  "a batch wrote " + std::to_string(inserted) + " of " +
                      std::to_string(reservations_written_) + " reservations; rolled back");
    }
    write_transitions(tx);
    write_allowances(tx);
    unclaim_refused(tx);
    settle_duplicates();
  }

 private:
  // A retried attempt starts from clean outcomes.
  void reset() {
    rows_.clear();
    keys_.clear();
    holds_.clear();
    transitions_.clear();
    limits_.clear();
    allowances_.clear();
    std::fill(decided_.begin(), decided_.end(), false);
    for (BatchItem* item : items_) item->clear_outcome();
  }

  bool keyed(std::size_t i) const {
    return items_[i]->op == BatchOp::reserve && items_[i]->idempotency_key.has_value();
  }

  void claim_keys(PostgresStore& store, Tx& tx);
  void replay(PostgresStore& store, Tx& tx, const std::vector<std::string>& names);
  void lock_reservations(Tx& tx);
  void lock_allowances(Tx& tx);
  void write_allowances(Tx& tx);
  std::vector<pqxx::result> allowance_statement(Tx& tx, Stmt statement,
                                                const std::vector<std::string>& groups,
                                                const std::vector<std::string>& buyers,
                                                const std::vector<std::int64_t>& deltas);
  // Purchase limits for a reserve with a buyer: LimitExceeded (true) or room (false).
  bool limit_refuses(BatchItem& item);
  void lock_rows(Tx& tx);
  void decide();
  void decide_transition(BatchItem& item);
  void write_transitions(Tx& tx);
  pqxx::result write(Tx& tx, Stmt statement);
  pqxx::result write_one(Tx& tx);
  pqxx::result write_one_citus(Tx& tx, const OneRowHolds& h, const NewKeys& k);
  void unclaim_refused(Tx& tx);
  void settle_duplicates();

  const std::vector<BatchItem*>& items_;
  std::vector<Uuid> ids_;
  std::vector<std::string> prints_;  // fingerprints of keyed requests
  std::vector<bool> decided_;
  std::map<std::string, KeyClaim> keys_;
  std::map<SkuKey, RowState> rows_;
  std::map<Uuid, Hold> holds_;  // the reservations transitions are about, as locked
  std::vector<std::pair<Uuid, const char*>> transitions_;  // new states to write
  // Purchase limits: each limited SKU's (group, per_buyer), and each (group, buyer) parent
  // row as locked, with the change this batch makes to it.
  struct Allowance {
    Quantity held = 0;
    Quantity delta = 0;
  };
  std::map<std::string, std::pair<std::string, Quantity>> limits_;
  std::map<std::pair<std::string, std::string>, Allowance> allowances_;
  TimestampUs now_us_ = 0;
  std::size_t reservations_written_ = 0;
  // The shard key of the batch's rows: on the Citus layout, apply_batch gives a BatchTx the
  // requests of one shard key only, so that each statement runs on one shard.
  std::uint16_t shard_ = 0;
};

void BatchTx::claim_keys(PostgresStore& store, Tx& tx) {
  std::vector<std::string> names, fingerprints, ids;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (!keyed(i)) continue;
    const BatchItem& item = *items_[i];
    WriteOptions options;
    options.buyer = item.buyer;
    prints_[i] =
        fingerprint(ReserveRequest{item.key, item.qty, item.ttl_us, item.idempotency_key, options});
    const std::string& print = prints_[i];
    auto [it, first] = keys_.try_emplace(*item.idempotency_key);
    if (!first) {
      decided_[i] = true;  // a duplicate inside the batch: settled by settle_duplicates()
      continue;
    }
    it->second = KeyClaim{i, print, false, std::nullopt, std::nullopt};
    names.push_back(it->first);
    fingerprints.push_back(print);
    ids.push_back(ids_[i].to_string());
  }
  if (names.empty()) return;
  const Statements& statements = tx.conn.statements();
  const pqxx::result claimed =
      statements.citus()
          ? tx.conn.exec_sql(tx.work, citus_keys_sql(tx.work, statements.schema(), shard_, names,
                                                     fingerprints, ids, true))
          : tx.exec_on(shard_, Stmt::batch_claim, text_array(names), text_array(fingerprints),
                       text_array(ids));
  for (const auto& row : claimed) keys_.at(row[0].as<std::string>()).claimed = true;
  std::vector<std::string> taken;
  for (const auto& [name, claim] : keys_) {
    if (!claim.claimed) taken.push_back(name);
  }
  if (!taken.empty()) replay(store, tx, taken);
}

// Keys committed before this batch: the same request replays its reservation, a different
// one is a conflict.
void BatchTx::replay(PostgresStore& store, Tx& tx, const std::vector<std::string>& names) {
  const pqxx::result found = tx.exec_on(shard_, Stmt::batch_keys_get, text_array(names));
  for (const auto& row : found) {
    KeyClaim& claim = keys_.at(row[0].as<std::string>());
    BatchItem& item = *items_[claim.first];
    decided_[claim.first] = true;
    claim.stored_fingerprint = row[1].as<std::string>();
    if (*claim.stored_fingerprint != claim.fingerprint) {
      fail(item, idempotency_conflict(*item.idempotency_key));
    }
    // Read even on a conflict: a later duplicate in the batch may be the same request.
    claim.stored = store.fetch(tx, parse_ids(row[2].as<std::string>())).front();
    if (!item.error) {
      item.reservation = *claim.stored;
      item.ok = true;
    }
  }
  for (const std::string& name : names) {
    const KeyClaim& claim = keys_.at(name);
    if (!decided_[claim.first]) {
      // Neither claimed nor found: its holder rolled back between the two statements.
      // Rare; the request fails as a lock wait would, and its caller may retry at once.
      fail(*items_[claim.first],
           Error(ErrorCode::lock_timeout,
                 "idempotency key " + shown(name) + " was released by a concurrent request; retry",
                 context_of(items_[claim.first]->key)));
      decided_[claim.first] = true;
    }
  }
}

void BatchTx::lock_reservations(Tx& tx) {
  std::vector<Uuid> ids;
  for (const BatchItem* item : items_) {
    if (is_transition(item->op)) ids.push_back(item->id);
  }
  if (ids.empty()) return;
  for (const auto& row : tx.exec_on(shard_, Stmt::batch_lock_reservations, uuid_array(ids))) {
    Hold hold;
    hold.reservation = read_reservation(row, &hold.lapsed);
    holds_.emplace(hold.reservation.id, std::move(hold));
  }
}

void BatchTx::lock_rows(Tx& tx) {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (decided_[i]) continue;
    if (!is_transition(items_[i]->op)) {
      rows_.try_emplace(items_[i]->key);
    } else if (auto it = holds_.find(items_[i]->id); it != holds_.end()) {
      rows_.try_emplace(it->second.reservation.key);
    }
  }
  if (rows_.empty()) return;
  std::vector<std::string> skus, locations;
  std::vector<std::int64_t> slots;
  for (const auto& [key, state] : rows_) {
    skus.push_back(key.sku);
    locations.push_back(key.location);
    slots.push_back(key.slot);
  }
  std::map<SkuKey, RowState> found;
  const pqxx::result rows = tx.exec_on(shard_, Stmt::batch_lock, text_array(skus),
                                       text_array(locations), int_array(slots));
  for (const auto& row : rows) {
    RowState state;
    state.on_hand = row[2].as<std::int64_t>();
    state.reserved = row[3].as<std::int64_t>();
    state.version = row[4].as<std::int64_t>();
    now_us_ = row[5].as<std::int64_t>();
    state.backorder_limit = row[6].as<std::int64_t>();
    state.discontinued = row[7].as<bool>();
    state.leased = row[8].as<bool>();
    found.emplace(SkuKey{row[0].as<std::string>(), row[1].as<std::string>(), row[9].as<int>()},
                  state);
  }
  rows_ = std::move(found);
}

void BatchTx::decide() {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (decided_[i]) continue;
    decided_[i] = true;
    BatchItem& item = *items_[i];
    if (is_transition(item.op)) {
      decide_transition(item);
      continue;
    }
    auto it = rows_.find(item.key);
    if (it == rows_.end()) {
      fail(item, stock_not_found(item.key));
      continue;
    }
    RowState& row = it->second;
    // as locked, or as decided so far
    STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
    STOCKADE_ASSERT(item.qty > 0);
    if (item.op == BatchOp::reserve && item.buyer && limit_refuses(item)) continue;
    if (row.discontinued || row.leased) {  // batched calls carry no fencing token
      try {
        check_writable(level_of(item.key, row), std::nullopt, std::nullopt);
      } catch (const Error& e) {
        fail(item, e);
        continue;
      }
    }
    const Quantity available = row.on_hand + row.backorder_limit - row.reserved;
    if (available < item.qty) {
      fail(item, out_of_stock(item.key, available, item.qty, row.version));
      continue;
    }
    ++row.changes;
    if (item.op == BatchOp::sell) {
      row.on_hand -= item.qty;
      row.sold += item.qty;
      STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
      item.level = level_of(item.key, row);
      item.level.updated_at_us = now_us_;
    } else {
      row.reserved += item.qty;
      row.held += item.qty;
      STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
      Reservation& r = item.reservation;
      r = Reservation{};
      r.id = ids_[i];
      r.key = item.key;
      r.qty = item.qty;
      r.version = 1;
      r.expires_at_us = now_us_ + item.ttl_us;
      r.created_at_us = r.updated_at_us = now_us_;
      r.idempotency_key = item.idempotency_key;
      r.buyer = item.buyer;
      if (item.buyer) {
        if (auto limit = limits_.find(item.key.sku); limit != limits_.end()) {
          r.limit_group = limit->second.first;
          allowances_[{limit->second.first, *item.buyer}].delta += item.qty;
        }
      }
    }
    item.ok = true;
  }
}

// Writes every row's summed deltas and inserts every reservation granted here (not those
// replayed from an earlier key), with `statement` (batch_write or batch_fast).
pqxx::result BatchTx::write(Tx& tx, Stmt statement) {
  std::vector<std::string> skus, locations;
  std::vector<std::int64_t> sold, held, changes, slots;
  for (const auto& [key, row] : rows_) {
    if (row.changes == 0 && statement == Stmt::batch_write) continue;
    skus.push_back(key.sku);
    locations.push_back(key.location);
    slots.push_back(key.slot);
    sold.push_back(row.sold);
    held.push_back(row.held);
    changes.push_back(row.changes);
  }
  std::vector<std::string> ids, r_skus, r_locations, r_keys, r_buyers, r_groups;
  std::vector<std::int64_t> qtys, ttls, r_slots;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!item.ok || item.op != BatchOp::reserve || item.reservation.id != ids_[i]) continue;
    ids.push_back(ids_[i].to_string());
    r_skus.push_back(item.key.sku);
    r_locations.push_back(item.key.location);
    r_slots.push_back(item.key.slot);
    r_keys.push_back(item.idempotency_key.value_or(std::string()));
    r_buyers.push_back(item.reservation.buyer.value_or(std::string()));
    r_groups.push_back(item.reservation.limit_group.value_or(std::string()));
    qtys.push_back(item.qty);
    ttls.push_back(item.ttl_us);
  }
  reservations_written_ = ids.size();
  if (skus.empty()) return pqxx::result();
  if (tx.conn.statements().citus() && statement == Stmt::batch_write) {
    // Two statements there (see citus_move_one in statements.cpp); the rows are locked.
    const auto moved = static_cast<std::size_t>(
        tx.exec_on(shard_, Stmt::citus_move, text_array(skus), text_array(locations),
                   int_array(sold), int_array(held), int_array(changes), int_array(slots))
            .affected_rows());
    if (moved != skus.size()) {
      throw Error(ErrorCode::invariant_violation, "a batch moved " + std::to_string(moved) +
                                                      " of its " + std::to_string(skus.size()) +
                                                      " locked rows; rolled back");
    }
    if (ids.empty()) return pqxx::result();
    return tx.conn.exec_sql(
        tx.work, citus_holds_sql(tx.work, tx.conn.statements().schema(), shard_, now_us_,
                                 CitusHolds{ids, r_skus, r_locations, r_slots, qtys, ttls, r_keys,
                                            r_buyers, r_groups}));
  }
  return tx.exec_on(shard_, statement, text_array(skus), text_array(locations), int_array(sold),
                    int_array(held), int_array(changes), text_array(ids), text_array(r_skus),
                    text_array(r_locations), int_array(qtys), int_array(ttls), text_array(r_keys),
                    static_cast<std::int64_t>(skus.size()), text_array(r_buyers),
                    text_array(r_groups), int_array(slots), int_array(r_slots));
}

// A confirm or release, by the per-request rules: NotFound, VersionConflict, a hold no
// longer held (InvalidState or ReservationExpired); a lapsed hold is expired here, which
// the batch commits, and then raises ReservationExpired.
void BatchTx::decide_transition(BatchItem& item) {
  auto it = holds_.find(item.id);
  if (it == holds_.end()) {
    ErrorContext context;
    context.reservation_id = item.id;
    fail(item, Error(ErrorCode::not_found, "no reservation " + item.id.to_string(), context));
    return;
  }
  Reservation& r = it->second.reservation;
  try {
    check_expected(r, item.expected_version);
  } catch (const Error& e) {
    fail(item, e);
    return;
  }
  if (r.state != ReservationState::held) {
    fail(item, not_holdable(r));
    return;
  }
  auto found = rows_.find(r.key);  // locked with the batch's rows
  if (found == rows_.end()) {
    fail(item,
         Error(ErrorCode::invariant_violation,
               "the stock row of a reservation is missing: " + describe(r.key), context_of(r.key)));
    return;
  }
  RowState& row = found->second;
  STOCKADE_ASSERT(r.qty > 0 && r.qty <= row.reserved);  // a held hold's units are reserved
  const bool sold = item.op == BatchOp::confirm && !it->second.lapsed;
  if (!sold && r.buyer && r.limit_group) {  // released or expired: the units go back
    if (auto a = allowances_.find({*r.limit_group, *r.buyer}); a != allowances_.end()) {
      a->second.delta -= r.qty;
    }
  }
  row.reserved -= r.qty;
  row.held -= r.qty;
  if (sold) {
    row.on_hand -= r.qty;
    row.sold += r.qty;
  }
  ++row.changes;
  STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
  r.state = it->second.lapsed             ? ReservationState::expired
            : item.op == BatchOp::confirm ? ReservationState::confirmed
                                          : ReservationState::released;
  ++r.version;
  r.updated_at_us = now_us_;
  transitions_.emplace_back(r.id, reservation_state_name(r.state));
  if (it->second.lapsed) {
    fail(item, not_holdable(r));
    return;
  }
  item.reservation = r;
  item.ok = true;
}

// The parent rows of every (group, buyer) the batch touches: those of reserves with a
// buyer on a limited SKU (made if new), and those of the holds it releases or expires.
// Locked in sorted order after the reservation rows and before any stock row.
void BatchTx::lock_allowances(Tx& tx) {
  std::vector<std::string> skus;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!decided_[i] && item.op == BatchOp::reserve && item.buyer) skus.push_back(item.key.sku);
  }
  if (!skus.empty()) {
    for (const auto& row : tx.exec(Stmt::limit_lookup, text_array(skus))) {
      limits_.emplace(row[0].as<std::string>(),
                      std::make_pair(row[1].as<std::string>(), row[2].as<std::int64_t>()));
    }
  }
  std::set<std::pair<std::string, std::string>> made, existing;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (decided_[i] || item.op != BatchOp::reserve || !item.buyer) continue;
    if (auto it = limits_.find(item.key.sku); it != limits_.end()) {
      made.emplace(it->second.first, *item.buyer);
    }
  }
  for (const auto& [id, hold] : holds_) {
    const Reservation& r = hold.reservation;
    if (r.buyer && r.limit_group) existing.emplace(*r.limit_group, *r.buyer);
  }
  if (made.empty() && existing.empty()) return;
  std::vector<std::string> groups, buyers;
  for (const auto& [group, buyer] : made) {
    groups.push_back(group);
    buyers.push_back(buyer);
  }
  if (!groups.empty()) allowance_statement(tx, Stmt::batch_allowance_make, groups, buyers, {});
  for (const auto& [group, buyer] : existing) {
    if (made.count({group, buyer}) != 0) continue;
    groups.push_back(group);
    buyers.push_back(buyer);
  }
  for (const auto& rows : allowance_statement(tx, Stmt::batch_allowance_lock, groups, buyers, {})) {
    for (const auto& row : rows) {
      allowances_[{row[0].as<std::string>(), row[1].as<std::string>()}].held =
          row[2].as<std::int64_t>();
    }
  }
}

// Runs a batch_allowance_* statement on the pairs (groups[i], buyers[i]) (and `deltas`,
// if given): once for all of them on one server; on Citus, where each pair's row lies on
// the shard of its own shard key, once per pair, in (group, buyer) order, which is the
// order every path locks them in.
std::vector<pqxx::result> BatchTx::allowance_statement(Tx& tx, Stmt statement,
                                                       const std::vector<std::string>& groups,
                                                       const std::vector<std::string>& buyers,
                                                       const std::vector<std::int64_t>& deltas) {
  std::vector<pqxx::result> out;
  const auto run_on = [&](std::uint16_t shard, const std::vector<std::string>& g,
                          const std::vector<std::string>& b, const std::vector<std::int64_t>& d) {
    out.push_back(d.empty()
                      ? tx.exec_on(shard, statement, text_array(g), text_array(b))
                      : tx.exec_on(shard, statement, text_array(g), text_array(b), int_array(d)));
  };
  if (!tx.conn.statements().citus()) {
    run_on(0, groups, buyers, deltas);
    return out;
  }
  std::vector<std::size_t> order(groups.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::tie(groups[a], buyers[a]) < std::tie(groups[b], buyers[b]);
  });
  for (const std::size_t i : order) {
    const std::uint16_t shard = shard_key_of(groups[i], buyers[i]);
    if (statement == Stmt::batch_allowance_make) {  // VALUES: see allowance_make_one
      out.push_back(tx.exec_on(shard, Stmt::allowance_make_one, groups[i], buyers[i]));
      continue;
    }
    run_on(shard, {groups[i]}, {buyers[i]},
           deltas.empty() ? std::vector<std::int64_t>{} : std::vector<std::int64_t>{deltas[i]});
  }
  return out;
}

bool BatchTx::limit_refuses(BatchItem& item) {
  auto limit = limits_.find(item.key.sku);
  if (limit == limits_.end()) return false;
  const auto& [group, per_buyer] = limit->second;
  const Allowance& a = allowances_[{group, *item.buyer}];
  if (a.held + a.delta + item.qty <= per_buyer) return false;
  fail(item, limit_exceeded(item.key, group, *item.buyer, a.held + a.delta, per_buyer, item.qty));
  return true;
}

void BatchTx::write_allowances(Tx& tx) {
  std::vector<std::string> groups, buyers;
  std::vector<std::int64_t> deltas;
  for (const auto& [pair, a] : allowances_) {
    if (a.delta == 0) continue;
    groups.push_back(pair.first);
    buyers.push_back(pair.second);
    deltas.push_back(a.delta);
  }
  if (groups.empty()) return;
  allowance_statement(tx, Stmt::batch_allowance_write, groups, buyers, deltas);
}

void BatchTx::write_transitions(Tx& tx) {
  if (transitions_.empty()) return;
  std::vector<Uuid> ids;
  std::vector<std::string> states;
  for (const auto& [id, state] : transitions_) {
    ids.push_back(id);
    states.emplace_back(state);
  }
  const auto written = static_cast<std::size_t>(
      tx.exec_on(shard_, Stmt::batch_transition, uuid_array(ids), text_array(states))
          .affected_rows());
  if (written != ids.size()) {
    throw Error(ErrorCode::invariant_violation, "a batch changed " + std::to_string(written) +
                                                    " of " + std::to_string(ids.size()) +
                                                    " reservations; rolled back");
  }
}

// The arrays of a one-row batch's reservations (write_one), one element per granted
// reserve, and of its new keys (one per keyed reserve).
struct OneRowHolds {
  std::vector<std::string> ids, keys, buyers;
  std::vector<std::int64_t> qtys, ttls;
  bool any_buyer = false;
};
struct NewKeys {
  std::vector<std::string> names, prints, ids;
};

// write() for a batch on one row, through batch_fast_one: the key travels once.
pqxx::result BatchTx::write_one(Tx& tx) {
  const auto& [key, row] = *rows_.begin();
  OneRowHolds h;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!item.ok || item.op != BatchOp::reserve) continue;
    h.ids.push_back(ids_[i].to_string());
    h.keys.push_back(item.idempotency_key.value_or(std::string()));
    h.buyers.push_back(item.buyer.value_or(std::string()));
    h.any_buyer = h.any_buyer || item.buyer.has_value();
    h.qtys.push_back(item.qty);
    h.ttls.push_back(item.ttl_us);
  }
  reservations_written_ = h.ids.size();
  if (h.any_buyer) {  // needs_full_path() sent keyed batches with buyers the long way
    try {
      return tx.exec_on(shard_, Stmt::batch_fast_one_limited, key.sku, key.location, row.sold,
                        row.held, row.changes, text_array(h.ids), int_array(h.qtys),
                        int_array(h.ttls), text_array(h.keys), text_array(h.buyers), key.slot);
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() == statement_aborted) throw FastMiss{};  // rolled back in full
      throw;
    }
  }
  if (!any_keyed() && !tx.conn.statements().citus()) {
    return tx.exec_on(shard_, Stmt::batch_fast_one, key.sku, key.location, row.sold, row.held,
                      row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls),
                      text_array(h.keys), key.slot);
  }
  NewKeys k;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (!keyed(i)) continue;
    const BatchItem& item = *items_[i];
    k.names.push_back(*item.idempotency_key);
    k.prints.push_back(fingerprint(
        ReserveRequest{item.key, item.qty, item.ttl_us, item.idempotency_key, WriteOptions{}}));
    k.ids.push_back(ids_[i].to_string());
  }
  if (tx.conn.statements().citus()) return write_one_citus(tx, h, k);
  try {
    return tx.exec_on(shard_, Stmt::batch_fast_one_keyed, key.sku, key.location, row.sold, row.held,
                      row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls),
                      text_array(h.keys), text_array(k.names), text_array(k.prints),
                      text_array(k.ids), key.slot);
  } catch (const pqxx::unique_violation&) {
    throw FastMiss{};  // a key claimed in flight elsewhere: the statement rolled back
  }
}

// write_one on Citus: the same writes as separate statements of one transaction (see
// citus_move_one).
pqxx::result BatchTx::write_one_citus(Tx& tx, const OneRowHolds& h, const NewKeys& k) {
  const auto& [key, row] = *rows_.begin();
  if (!k.names.empty() &&
      tx.exec_on(shard_, Stmt::citus_keys_taken, text_array(k.names))[0][0].as<std::int64_t>() >
          0) {
    return pqxx::result();  // a replay or a conflict: the full path decides
  }
  pqxx::result moved = tx.exec_on(shard_, Stmt::citus_move_one, key.sku, key.location, row.sold,
                                  row.held, row.changes, key.slot);
  if (moved.empty()) return moved;
  const std::string& schema = tx.conn.statements().schema();
  if (!h.ids.empty()) {
    const std::vector<std::string> skus(h.ids.size(), key.sku),
        locations(h.ids.size(), key.location), none;
    const std::vector<std::int64_t> slots(h.ids.size(), key.slot);
    const std::int64_t now_us = moved[0][5].as<std::int64_t>();  // the move's now()
    tx.conn.exec_sql(tx.work, citus_holds_sql(tx.work, schema, shard_, now_us,
                                              CitusHolds{h.ids, skus, locations, slots, h.qtys,
                                                         h.ttls, h.keys, none, none}));
  }
  if (!k.names.empty()) {
    try {
      tx.conn.exec_sql(tx.work,
                       citus_keys_sql(tx.work, schema, shard_, k.names, k.prints, k.ids, false));
    } catch (const pqxx::unique_violation&) {
      throw FastMiss{};  // claimed elsewhere meanwhile: the transaction rolls back
    }
  }
  return moved;
}

void BatchTx::unclaim_refused(Tx& tx) {
  std::vector<std::string> names;
  for (const auto& [name, claim] : keys_) {
    if (claim.claimed && !items_[claim.first]->ok) names.push_back(name);
  }
  if (!names.empty()) tx.exec_on(shard_, Stmt::batch_unclaim, text_array(names));
}

// Requests that repeat a key already seen in this batch. The key's request is the one
// stored before the batch, if there was one, else the batch's first with that key; the
// same request gets that one's outcome, a different one IdempotencyConflict.
void BatchTx::settle_duplicates() {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (!keyed(i)) continue;
    BatchItem& item = *items_[i];
    const KeyClaim& claim = keys_.at(*item.idempotency_key);
    if (claim.first == i) continue;
    const std::string& owner = claim.stored_fingerprint.value_or(claim.fingerprint);
    if (prints_[i] != owner) {
      fail(item, idempotency_conflict(*item.idempotency_key));
    } else if (claim.stored) {
      item.reservation = *claim.stored;
      item.ok = true;
    } else {
      const BatchItem& first = *items_[claim.first];
      item.ok = first.ok;
      item.reservation = first.reservation;
      item.error = first.error;
    }
  }
}

void PostgresStore::apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) {
  if (items.empty()) return;
  // One bound over the fast statement, the full path and the resolution of a lost commit:
  // the deadline of the batch's oldest request, so that a batch queued behind one whose
  // commit hung keeps its callers' bound instead of waiting call_timeout anew.
  std::int64_t oldest_us = 0;
  for (const BatchItem* item : items) {
    if (item->started_us != 0 && (oldest_us == 0 || item->started_us < oldest_us)) {
      oldest_us = item->started_us;
    }
  }
  const CallDeadline deadline(options_.call_timeout_ms, oldest_us);
  if (statements_->citus()) {
    // Citus runs a statement on one shard only when it names one shard key: a batch whose
    // requests span several runs as one batch per shard key, each in arrival order.
    std::map<std::uint16_t, std::vector<BatchItem*>> by_shard;
    for (BatchItem* item : items) {
      item->clear_outcome();
      by_shard[item->shard_key()].push_back(item);
    }
    const bool whole = by_shard.size() == 1 && by_shard.begin()->second.size() == items.size();
    if (!whole) {  // each group runs alone (and passes here whole)
      for (const auto& [shard, group] : by_shard) apply_batch(group, options);
      return;
    }
  }
  WriteOptions write;
  write.strategy = Strategy::batched;
  write.lock_timeout_ms = options.lock_timeout_ms;
  const std::int64_t now_ms = SystemClock().now_us() / 1000;
  const ErrorContext context = context_of(items.front()->key);
  BatchTx batch(items, now_ms);
  // Take one skip if any are left (flushers of several shards share the count).
  int skips = fast_skips_.load(std::memory_order_relaxed);
  while (skips > 0 && !fast_skips_.compare_exchange_weak(skips, skips - 1)) {
  }
  // (On Citus a batch on several rows takes the full path: batch_fast is one statement
  // that Citus would run as a two-phase transaction; see citus_move_one. So does a batch
  // with buyers: their counts lie on the shards of their own shard keys.)
  const bool fast = skips == 0 && !batch.needs_full_path() &&
                    (!statements_->citus() || (batch.one_row() && !batch.has_buyer()));
  if (fast) {
    std::optional<bool> done;
    try {
      done =
          run<RunMode::one_statement>(&write, context, [&](Tx& tx) { return batch.run_fast(tx); });
    } catch (const FastMiss&) {
      done = false;
    } catch (const LostCommit& e) {
      done = resolve_fast(batch, e, context);  // empty: it did not land, run the full path
    }
    if (done && *done) {
      batch.report_row_versions(
          [this](const SkuKey& k, Version v, std::uint32_t n) { report_write(k, v, n); });
      count_batch(items);
      return;
    }
    if (done) fast_skips_.store(fast_skips_after_miss, std::memory_order_relaxed);
  }
  run_full_resolving(batch, write, context);
  batch.report_row_versions(
      [this](const SkuKey& k, Version v, std::uint32_t n) { report_write(k, v, n); });
  count_batch(items);
}

// The full path, one transaction. If its commit is lost and the session was ended, a
// reservation the attempt made tells whether it committed: if so, every decision of the
// attempt stands (grants, refusals, replays, transitions, sells, all in that one
// transaction); if not, nothing changed and the batch runs once more. A batch that made
// no reservation (only sells, transitions or replays) stays InDoubt.
void PostgresStore::run_full_resolving(BatchTx& batch, const WriteOptions& write,
                                       const ErrorContext& context) {
  for (int lost = 0;; ++lost) {
    try {
      run(&write, context, [&](Tx& tx) {
        batch.run_full(*this, tx);
        return true;
      });
      return;
    } catch (const LostCommit& e) {
      const std::optional<Uuid> probe = batch.made_reservation_id();
      if (lost > 0 || !probe) throw;
      if (!find_landed({*probe}, e, context).empty()) return;  // unsettled: found, or InDoubt
    }
  }
}

// The fast statement's connection broke while it ran, or before it was sent (a pooled
// connection that a server restart killed looks alive until used). run() ended its server
// session first, so the statement has landed or not for good (a statement still waiting
// for a row lock could otherwise commit after we looked). It inserts every reservation of
// the batch or none, so one of them tells which: if not, nothing changed and the batch
// runs the full path; if so, the reservations are read back, and only sells (which leave
// no row to look for) stay in doubt. A batch of sells alone, or a session that could not
// be ended, fails with InDoubt.
std::optional<bool> PostgresStore::resolve_fast(BatchTx& batch, const LostCommit& lost,
                                                const ErrorContext& context) {
  const std::optional<Uuid> probe = batch.first_reservation_id();
  if (!probe) throw lost;
  // Unsettled, find_landed answers only if the batch is there already; InDoubt otherwise.
  if (find_landed({*probe}, lost, context).empty()) return std::nullopt;
  run<RunMode::read>(nullptr, context, [&](Tx& tx) {
    batch.adopt_landed(*this, tx, lost);
    return true;
  });
  return true;
}

// Per-SKU counters, as the per-request paths keep them: one count per run of requests
// for the same key.
void PostgresStore::count_batch(const std::vector<BatchItem*>& items) {
  const SkuKey* last = nullptr;
  std::uint64_t requests = 0;
  std::uint64_t refused = 0;
  auto flush = [&] {
    if (last == nullptr) return;
    if (requests > 0) telemetry().count(*last, SkuEvent::request, requests);
    if (refused > 0) telemetry().count(*last, SkuEvent::refused, refused);
  };
  for (const BatchItem* item : items) {
    if (is_transition(item->op)) continue;  // counted per SKU as reserve and sell only
    if (last == nullptr || !(item->key == *last)) {
      flush();
      last = &item->key;
      requests = refused = 0;
    }
    if (item->count_request) ++requests;
    if (item->error && item->error->code() == ErrorCode::out_of_stock && item->count_refusal) {
      ++refused;
    }
  }
  flush();
}

}  // namespace stockade::detail::pg
