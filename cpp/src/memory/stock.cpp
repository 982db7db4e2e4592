// MemoryStore: stock rows and the four per-request strategies.
#include <algorithm>
#include <chrono>

#include "memory/memory_store_impl.hpp"
#include "stockade/hash.hpp"
#include "store/error_helpers.hpp"
#include "store/unit_states.hpp"

namespace stockade::detail {
namespace {

std::size_t shard_index(const SkuKey& key, std::size_t shards) {
  return SkuKeyHash{}(key) % shards;
}

// Pessimistic and advisory locks wait like PostgreSQL's: NOWAIT fails at once
// (LockNotAvailable), otherwise wait at most lock_timeout (LockTimeout). Waits are counted.
std::unique_lock<TimedLock> acquire(TimedLock& mutex, const SkuKey& key,
                                    const WriteOptions& options, StrategyCounters* counters,
                                    Telemetry* telemetry) {
  std::unique_lock<TimedLock> lock(mutex, std::try_to_lock);
  if (lock.owns_lock()) return lock;
  if (options.nowait) {
    throw Error(ErrorCode::lock_not_available, "lock not available (NOWAIT) for " + describe(key),
                context_of(key));
  }
  if (counters != nullptr) bump(counters->lock_waits);
  if (telemetry != nullptr) telemetry->count(key, SkuEvent::lock_wait);
  const auto start = std::chrono::steady_clock::now();
  const bool got = lock.try_lock_for(std::chrono::milliseconds(options.lock_timeout_ms));
  const auto waited = std::chrono::steady_clock::now() - start;
  if (counters != nullptr) {
    bump(counters->lock_wait_us,
         static_cast<std::uint64_t>(
             std::chrono::duration_cast<std::chrono::microseconds>(waited).count()));
  }
  if (!got) {
    throw Error(ErrorCode::lock_timeout,
                "lock_timeout of " + std::to_string(options.lock_timeout_ms) +
                    " ms passed waiting for " + describe(key),
                context_of(key));
  }
  return lock;
}

class HeldLock final : public LockHold {
 public:
  explicit HeldLock(std::unique_lock<TimedLock> lock) : lock_(std::move(lock)) {}

 private:
  std::unique_lock<TimedLock> lock_;
};

}  // namespace

void throw_invariant_violation(const RowValues& next, const SkuKey& key) {
  throw Error(ErrorCode::invariant_violation,
              "refused a write that breaks 0 <= reserved and reserved + damaged + "
              "quality_control <= on_hand + backorder_limit on " +
                  describe(key) + ": on_hand " + std::to_string(next.on_hand) + ", reserved " +
                  std::to_string(next.reserved) + ", backorder_limit " +
                  std::to_string(next.backorder_limit) + ", damaged " +
                  std::to_string(next.damaged) + ", quality_control " +
                  std::to_string(next.quality_control) + ", safety_stock " +
                  std::to_string(next.safety_stock),
              context_of(key));
}

StockLevel level_at(const SkuKey& key, const RowValues& v, TimestampUs now) {
  StockLevel level{key, v.on_hand, v.reserved, v.version, v.updated_at_us};
  level.backorder_limit = v.backorder_limit;
  level.discontinued = v.discontinued != 0;
  level.lease_token = v.lease_token;
  level.leased = v.lease_live(now);
  level.lease_expires_at_us = level.leased ? v.lease_expires_us : 0;
  if (v.low_stock != RowValues::no_low_stock) level.low_stock = v.low_stock;
  level.active_slots = static_cast<int>(v.active_slots);
  level.safety_stock = v.safety_stock;
  level.damaged = v.damaged;
  level.quality_control = v.quality_control;
  level.incoming = v.incoming;
  return level;
}

RowValues changed(const RowValues& v, TimestampUs now) {
  RowValues next = v;
  next.version += 1;
  next.updated_at_us = now;
  return next;
}

void check_row(const SkuKey& key, const RowValues& v, TimestampUs now,
               const std::optional<Version>& expected, const std::optional<FencingToken>& token) {
  if (v.discontinued == 0 && !token && !v.lease_live(now)) {  // the common case: open
    check_expected(key, expected, v.version);
    return;
  }
  check_writable(level_at(key, v, now), expected, token);
}

Quantity available_of(const RowValues& v) {
  return available_units(v.on_hand, v.backorder_limit, v.reserved, v.withheld());
}

RowValues hold_units(Telemetry* telemetry, StockRow& row, const RowValues& current, Quantity qty,
                     TimestampUs now) {
  STOCKADE_ASSERT(qty > 0);
  // a consistent read
  STOCKADE_ASSERT_ROW(current.on_hand, current.reserved, current.backorder_limit);
  check_row(row.key, current, now, std::nullopt, std::nullopt);
  const Quantity available = available_of(current);
  if (available < qty) {
    if (telemetry != nullptr) telemetry->count(row.key, SkuEvent::refused);
    throw_out_of_stock(row.key, available, qty, current.version);
  }
  RowValues next = changed(current, now);
  next.reserved += qty;
  STOCKADE_ASSERT_ROW(next.on_hand, next.reserved, next.backorder_limit);
  return next;
}

MemoryStore::MemoryStore(std::shared_ptr<Clock> clock, std::shared_ptr<Telemetry> shared,
                         MemoryOptions options)
    : Store(std::move(shared)),
      clock_(std::move(clock)),
      journal_(std::make_unique<MemoryJournal>(clock_, options.journal_max)),
      stock_(std::make_unique<std::array<StockShard, stock_shards>>()),
      reservations_(std::make_unique<std::array<ReservationShard, reservation_shards>>()),
      advisory_(std::make_unique<std::array<TimedLock, advisory_stripes>>()),
      options_(options) {}

StockRow* MemoryStore::find_row(const SkuKey& key) const {
  const StockShard& shard = (*stock_)[shard_index(key, stock_shards)];
  std::shared_lock<std::shared_mutex> lock(shard.mutex);
  auto it = shard.rows.find(key);
  return it == shard.rows.end() ? nullptr : it->second.get();
}

StockRow& MemoryStore::require_row(const SkuKey& key) const {
  StockRow* row = find_row(key);
  if (row == nullptr) throw_stock_not_found(key);
  return *row;
}

std::pair<StockRow*, bool> MemoryStore::insert_row(const SkuKey& key, const RowValues& initial) {
  StockShard& shard = (*stock_)[shard_index(key, stock_shards)];
  std::unique_lock<std::shared_mutex> lock(shard.mutex);
  auto [it, inserted] = shard.rows.try_emplace(key, nullptr);
  if (inserted) {
    it->second = std::make_unique<StockRow>(key, initial, journal_.get());
    journal_->record(key, nullptr, initial);  // under the shard's lock: before any change
    if (key.slot == 0) {
      std::lock_guard<std::mutex> index(locations_mutex_);
      locations_[key.sku].insert(key.location);
    }
  }
  return {it->second.get(), inserted};
}

std::vector<std::string> MemoryStore::sku_locations(const std::string& sku,
                                                    const std::optional<std::string>& after,
                                                    std::size_t limit) {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> index(locations_mutex_);
  auto found = locations_.find(sku);
  if (found == locations_.end()) return out;
  const std::set<std::string>& locations = found->second;
  for (auto it = after ? locations.upper_bound(*after) : locations.begin();
       it != locations.end() && out.size() < limit; ++it) {
    out.push_back(*it);
  }
  return out;
}

StockLevel MemoryStore::level_of(const StockRow& row, const RowValues& values) const {
  return level_at(row.key, values, clock_->now_us());
}

RowValues MemoryStore::compare_and_set(StockRow& row, const Decide& decide,
                                       StrategyCounters* counters) {
  SpinWait wait;
  for (std::uint32_t attempt = 0; attempt < cas_attempts_max; ++attempt) {
    const RowSnapshot seen = row.cell.read();
    const RowValues next = decide(seen.values);  // throws to refuse, on a consistent read
    if (row.cell.try_latch(seen.seq)) {
      RowLatch latch(row.cell, seen.values);
      latch.publish(next, row.key);
      return next;
    }
    if (counters != nullptr) bump(counters->conflicts);
    telemetry().count(row.key, SkuEvent::conflict);
    wait.once();
  }
  throw Error(ErrorCode::overloaded,
              "gave up after " + std::to_string(cas_attempts_max) +
                  " lost compare-and-set races on " + describe(row.key),
              context_of(row.key));
}

RowValues MemoryStore::optimistic(StockRow& row, const WriteOptions& options,
                                  const Decide& decide) {
  StrategyCounters& counters = telemetry().of(Strategy::optimistic);
  for (int attempt = 0;; ++attempt) {
    const RowSnapshot seen = row.cell.read();
    const RowValues next = decide(seen.values);
    // UPDATE ... SET ... WHERE version = :read_version
    RowLatch latch(row.cell, row.cell.latch());
    if (latch.values().version == seen.values.version) {
      latch.publish(next, row.key);
      return next;
    }
    bump(counters.conflicts);
    telemetry().count(row.key, SkuEvent::conflict);
    if (attempt >= options.retries_max) {
      throw Error(ErrorCode::retries_exhausted,
                  "optimistic write to " + describe(row.key) + " lost the race " +
                      std::to_string(attempt + 1) + " times (retries_max " +
                      std::to_string(options.retries_max) + ")",
                  context_of(row.key));
    }
    bump(counters.retries);
    latch = RowLatch();  // release before sleeping
    sleep_full_jitter(attempt, backoff_base_us, backoff_cap_us);
  }
}

TimedLock& MemoryStore::advisory_lock_of(const SkuKey& key) {
  const std::uint64_t lock_key = stable_hash64({"stockade", key.sku, key.location});
  return (*advisory_)[lock_key & (advisory_stripes - 1)];
}

RowValues MemoryStore::apply(StockRow& row, const WriteOptions& options, const Decide& decide) {
  StrategyCounters& counters = telemetry().of(options.strategy);
  if (options.count_request) telemetry().count(row.key, SkuEvent::request);
  switch (options.strategy) {
    case Strategy::atomic:
      return compare_and_set(row, decide, &counters);
    case Strategy::pessimistic: {
      auto lock = acquire(row.row_lock, row.key, options, &counters, &telemetry());
      return compare_and_set(row, decide, &counters);
    }
    case Strategy::advisory: {
      auto lock = acquire(advisory_lock_of(row.key), row.key, options, &counters, &telemetry());
      return compare_and_set(row, decide, &counters);
    }
    case Strategy::optimistic:
      return optimistic(row, options, decide);
    case Strategy::batched:
    case Strategy::automatic:
      break;
  }
  throw Error(ErrorCode::not_supported,
              std::string("the memory store has no per-request path for strategy '") +
                  strategy_name(options.strategy) + "'");
}

StockLevel MemoryStore::upsert(const SkuKey& key, std::optional<Version> expected,
                               std::optional<FencingToken> token, const RowValues& initial,
                               const Decide& decide) {
  StockRow* row = find_row(key);
  if (row == nullptr) {
    if (expected) throw_stock_not_found(key);  // a version was expected: the row must exist
    if (token) throw_stock_not_found(key);     // a token comes from a lease, which makes the row
    auto [created, inserted] = insert_row(key, initial);
    if (inserted) return level_of(*created, initial);
    row = created;  // another thread created it first: update theirs
  }
  return level_of(*row, compare_and_set(*row, decide, nullptr));
}

StockLevel MemoryStore::restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                                std::optional<FencingToken> token,
                                const std::optional<std::string>& idempotency_key) {
  const std::string print =
      idempotency_key ? stock_fingerprint(key, qty, true, expected, token) : std::string();
  return keyed<StockLevel>(idempotency_key, print, [&] {
    const TimestampUs now = clock_->now_us();
    const auto decide = [&](const RowValues& v) {
      check_row(key, v, now, expected, token);
      RowValues next = changed(v, now);
      next.on_hand = checked_on_hand(v.on_hand, qty, "restock");
      return next;
    };
    return upsert(key, expected, token, RowValues{qty, 0, 1, now}, decide);
  });
}

StockLevel MemoryStore::set_on_hand(const SkuKey& key, Quantity on_hand,
                                    std::optional<Version> expected,
                                    std::optional<FencingToken> token,
                                    const std::optional<std::string>& idempotency_key) {
  const std::string print =
      idempotency_key ? stock_fingerprint(key, on_hand, false, expected, token) : std::string();
  return keyed<StockLevel>(idempotency_key, print, [&] {
    expire_lapsed();  // a lapsed hold keeps no units that set_on_hand must leave
    const TimestampUs now = clock_->now_us();
    const auto decide = [&](const RowValues& v) {
      check_row(key, v, now, expected, token);
      check_covers(key, on_hand, v.reserved, v.backorder_limit, v.damaged + v.quality_control);
      RowValues next = changed(v, now);
      next.on_hand = on_hand;
      return next;
    };
    return upsert(key, expected, token, RowValues{on_hand, 0, 1, now}, decide);
  });
}

StockLevel MemoryStore::set_backorder_limit(const SkuKey& key, Quantity limit,
                                            std::optional<Version> expected,
                                            std::optional<FencingToken> token) {
  StockRow& row = require_row(key);
  const TimestampUs now = clock_->now_us();
  const auto decide = [&](const RowValues& v) {
    refuse_if_slotted(key, "a backorder limit");
    check_row(key, v, now, expected, token);
    check_covers(key, v.on_hand, v.reserved, limit, v.damaged + v.quality_control);
    RowValues next = changed(v, now);
    next.backorder_limit = limit;
    return next;
  };
  return level_of(row, compare_and_set(row, decide, nullptr));
}

StockLevel MemoryStore::set_safety_stock(const SkuKey& key, Quantity units,
                                         std::optional<Version> expected,
                                         std::optional<FencingToken> token) {
  StockRow& row = require_row(key);
  const TimestampUs now = clock_->now_us();
  const auto decide = [&](const RowValues& v) {
    refuse_if_slotted(key, "safety stock");
    check_row(key, v, now, expected, token);
    RowValues next = changed(v, now);
    next.safety_stock = units;
    return next;
  };
  return level_of(row, compare_and_set(row, decide, nullptr));
}

StockLevel MemoryStore::move_units(const MoveRequest& request) {
  const SkuKey& key = request.key;
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<StockLevel>(request.idempotency_key, print, [&] {
    StockRow& row = require_row(key);
    const TimestampUs now = clock_->now_us();
    const auto decide = [&](const RowValues& v) {
      check_row(key, v, now, request.expected_version, request.fencing_token);
      // Units in a bucket stay on their row: a slotted SKU would spread them as free units.
      refuse_if_slotted(key, "moving units between states");
      const UnitCounts counts = plan_move(level_at(key, v, now), request);
      RowValues next = changed(v, now);
      next.on_hand = counts.on_hand;
      next.damaged = counts.damaged;
      next.quality_control = counts.quality_control;
      return next;
    };
    return level_of(row, compare_and_set(row, decide, nullptr));
  });
}

// The engine refuses leases and backorder limits on a slotted SKU after reading its rows;
// this check, inside the write's compare-and-set, closes the window in which another
// engine slots the SKU between that read and the write: reshape makes slot rows while it
// holds the own row's latch and moves the own row's version, so either this decide sees
// the slot rows, or its compare-and-set fails and it runs again and sees them, or the
// write lands first and set_slots then finds the lease or the limit and refuses.
void MemoryStore::refuse_if_slotted(const SkuKey& key, const char* feature) const {
  if (find_row(slot_key(key, 1)) == nullptr) return;  // no slot row: the common case
  std::vector<StockLevel> rows;
  const TimestampUs now = clock_->now_us();
  for (const StockRow* row : rows_of_sku(key)) {
    rows.push_back(level_at(row->key, row->cell.read().values, now));
  }
  refuse_if_slots(key, feature, rows);
}

std::vector<StockLevel> MemoryStore::set_discontinued(const SkuKey& key, bool discontinued,
                                                      std::int64_t lock_timeout_ms,
                                                      const RowsCheck& check) {
  WriteOptions wait;
  wait.strategy = Strategy::pessimistic;
  wait.lock_timeout_ms = lock_timeout_ms;
  std::vector<std::unique_lock<TimedLock>> locks;
  locks.push_back(acquire(require_row(key).row_lock, key, wait, nullptr, nullptr));
  // Its slot rows, found under the own row's lock (reshape makes them under it): the
  // list is whole.
  const std::vector<StockRow*> rows = rows_of_sku(key);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    locks.push_back(acquire(rows[i]->row_lock, rows[i]->key, wait, nullptr, nullptr));
  }
  // Then every row's latch, in the same order: other writers wait or fail their
  // compare-and-set until the tombstones are published.
  std::vector<RowLatch> latches;
  latches.reserve(rows.size());
  for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
  const TimestampUs now = clock_->now_us();
  std::vector<StockLevel> levels;
  levels.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    levels.push_back(level_at(rows[i]->key, latches[i].values(), now));
  }
  check(levels);  // a refusal releases the latches unchanged
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const RowValues& seen = latches[i].values();
    if ((seen.discontinued != 0) == discontinued) continue;
    RowValues next = changed(seen, now);
    next.discontinued = discontinued ? 1 : 0;
    latches[i].publish(next, rows[i]->key);
    levels[i] = level_at(rows[i]->key, next, now);
  }
  return levels;
}

Lease MemoryStore::acquire_lease(const SkuKey& key, std::int64_t ttl_us, const std::string& owner) {
  std::lock_guard<std::mutex> lock(lease_mutex_);
  const TimestampUs now = clock_->now_us();
  StockRow* row = find_row(key);
  if (row == nullptr) row = insert_row(key, RowValues{0, 0, 1, now}).first;
  FencingToken token = 0;
  const auto decide = [&](const RowValues& v) {
    refuse_if_slotted(key, "a lease");
    StockLevel level = level_at(key, v, now);
    level.discontinued = false;  // a discontinued row can be leased (to reinstate it)
    check_writable(level, std::nullopt, std::nullopt);  // LeaseHeld while one is live
    token = lease_tokens_.fetch_add(1, std::memory_order_relaxed) + 1;
    RowValues next = changed(v, now);
    next.lease_token = token;
    next.lease_expires_us = expiry_of(now, ttl_us, "the lease");
    return next;
  };
  const RowValues next = compare_and_set(*row, decide, nullptr);
  lease_owners_[key] = owner;
  return Lease{key, owner, token, next.lease_expires_us};
}

Lease MemoryStore::renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us) {
  std::lock_guard<std::mutex> lock(lease_mutex_);
  StockRow& row = require_row(key);
  const TimestampUs now = clock_->now_us();
  const auto decide = [&](const RowValues& v) {
    StockLevel level = level_at(key, v, now);
    level.discontinued = false;  // a lease outlives a discontinue
    check_writable(level, std::nullopt, token);
    if (!level.leased) throw_lease_lapsed(key, token);
    RowValues next = changed(v, now);
    next.lease_expires_us = expiry_of(now, ttl_us, "the lease");
    return next;
  };
  const RowValues next = compare_and_set(row, decide, nullptr);
  return Lease{key, lease_owners_[key], token, next.lease_expires_us};
}

bool MemoryStore::release_lease(const SkuKey& key, FencingToken token) {
  std::lock_guard<std::mutex> lock(lease_mutex_);
  StockRow& row = require_row(key);
  const TimestampUs now = clock_->now_us();
  // Lease fields change only under lease_mutex_, so this read of them stays true.
  const RowValues seen = row.cell.read().values;
  if (seen.lease_token != token || !seen.lease_live(now)) return false;
  const auto decide = [&](const RowValues& v) {
    RowValues next = changed(v, now);
    next.lease_expires_us = 0;
    return next;
  };
  compare_and_set(row, decide, nullptr);
  lease_owners_.erase(key);
  return true;
}

StockLevel MemoryStore::stock(const SkuKey& key) {
  const StockRow& row = require_row(key);
  expire_lapsed();
  return level_of(row, row.cell.read().values);
}

// `base` and its slot rows that exist, in slot order (which is key order). Slot rows are
// made together (reshape), so the first missing one ends them.
std::vector<StockRow*> MemoryStore::rows_of_sku(const SkuKey& base) const {
  std::vector<StockRow*> rows;
  for (int slot = 0; slot < slots_max; ++slot) {
    StockRow* row = find_row(slot_key(base, slot));
    if (row == nullptr) break;
    rows.push_back(row);
  }
  return rows;
}

std::vector<StockLevel> MemoryStore::sku_rows(const SkuKey& base) {
  expire_lapsed();
  const std::vector<StockRow*> rows = rows_of_sku(base);
  // One snapshot: every row's latch at once, taken in slot order (which is key order).
  std::vector<RowLatch> latches;
  latches.reserve(rows.size());
  for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
  const TimestampUs now = clock_->now_us();
  std::vector<StockLevel> out;
  out.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out.push_back(level_at(rows[i]->key, latches[i].values(), now));
  }
  return out;  // the latches release unchanged
}

namespace {

// What reshape's plan sees: each row as latched, and a row not made yet as zero.
std::vector<StockLevel> latched_levels(const std::vector<SkuKey>& keys,
                                       const std::vector<RowLatch>& latches, TimestampUs now) {
  std::vector<StockLevel> levels;
  levels.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    levels.push_back(latches[i].held() ? level_at(keys[i], latches[i].values(), now)
                                       : level_at(keys[i], RowValues{0, 0, 1, now}, now));
  }
  return levels;
}

// reshape's last step, with every row latched: writes the plan's on_hand where it changes
// a row (every row with `write_all`), after checking every row's invariant first, so that
// a refusal writes none.
std::vector<StockLevel> publish_reshape(const std::vector<SkuKey>& keys, std::size_t first,
                                        const std::vector<Quantity>& on_hand,
                                        std::vector<RowLatch>& latches, bool write_all,
                                        int active_slots, TimestampUs now) {
  if (on_hand.size() != keys.size()) {
    throw Error(ErrorCode::invariant_violation,
                "a reshape plan returned " + std::to_string(on_hand.size()) + " quantities for " +
                    std::to_string(keys.size()) + " rows");
  }
  std::vector<RowValues> next(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    next[i] = latches[i].values();
    const bool count = i == first && active_slots > 0;  // the own row takes the slot count
    if (on_hand[i] == next[i].on_hand && !write_all && !count) continue;
    next[i] = changed(next[i], now);
    next[i].on_hand = on_hand[i];
    if (count) next[i].active_slots = active_slots;
    if (next[i].reserved > next[i].on_hand + next[i].backorder_limit) {
      throw_invariant_violation(next[i], keys[i]);  // before any row is written
    }
  }
  std::vector<StockLevel> out;
  out.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    out.push_back(level_at(keys[i], next[i], now));
    if (next[i].version != latches[i].values().version) latches[i].publish(next[i], keys[i]);
  }
  return out;
}

}  // namespace

std::vector<StockLevel> MemoryStore::reshape(const std::vector<SkuKey>& keys, bool create,
                                             bool write_all, std::int64_t lock_timeout_ms,
                                             const ReshapePlan& plan, int active_slots) {
  const TimestampUs now = clock_->now_us();
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  WriteOptions wait;
  wait.strategy = Strategy::pessimistic;
  wait.lock_timeout_ms = lock_timeout_ms;
  std::vector<StockRow*> rows(keys.size(), nullptr);
  std::vector<std::unique_lock<TimedLock>> locks;
  std::vector<RowLatch> latches(keys.size());
  // The rows' FOR UPDATE locks, then their latches, each in key order: no deadlock with
  // an order, and every other writer waits or fails its compare-and-set meanwhile. (No
  // latch is held while a lock is awaited: readers spin on a latch.)
  const auto take = [&](std::size_t i) {
    locks.push_back(acquire(rows[i]->row_lock, keys[i], wait, nullptr, nullptr));
    latches[i] = RowLatch(rows[i]->cell, rows[i]->cell.latch());
  };
  std::vector<std::size_t> missing;
  std::vector<std::size_t> present;
  for (std::size_t i : order) {
    rows[i] = find_row(keys[i]);
    if (rows[i] == nullptr) {
      if (!create) throw_stock_not_found(keys[i]);
      missing.push_back(i);
    } else if (missing.empty()) {
      present.push_back(i);
    } else {
      missing.push_back(i);  // after a missing one in key order: taken with those
    }
  }
  for (std::size_t i : present) {
    locks.push_back(acquire(rows[i]->row_lock, keys[i], wait, nullptr, nullptr));
  }
  for (std::size_t i : present) latches[i] = RowLatch(rows[i]->cell, rows[i]->cell.latch());
  const auto levels_now = [&] { return latched_levels(keys, latches, now); };
  // The plan decides before any row is made, so a refusal leaves nothing behind (as a
  // rolled-back INSERT does); rows made after are zero until it is applied.
  std::vector<Quantity> on_hand = plan(levels_now());
  bool made = false;
  if (!missing.empty()) {
    for (std::size_t i : missing) {
      if (rows[i] == nullptr) {
        auto [row, inserted] = insert_row(keys[i], RowValues{0, 0, 1, now});
        rows[i] = row;
        made = made || inserted;
      }
      take(i);
    }
    try {
      on_hand = plan(levels_now());  // on what the new rows hold (zero, unless another made them)
    } catch (...) {
      // Rows were made: the first row in key order moves its version all the same.
      const std::size_t first = order.front();
      if (made && latches[first].held()) {
        latches[first].publish(changed(latches[first].values(), now), keys[first]);
      }
      throw;
    }
  }
  return publish_reshape(keys, order.front(), on_hand, latches, write_all || made, active_slots,
                         now);
}

StockLevel MemoryStore::sell(const SellRequest& request) {
  StockRow& row = require_row(request.key);
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<StockLevel>(
      request.idempotency_key, print,
      [&] {
        expire_lapsed();
        const TimestampUs now = clock_->now_us();
        const auto decide = [&](const RowValues& v) {
          check_row(row.key, v, now, request.options.expected_version,
                    request.options.fencing_token);
          if (available_of(v) < request.qty) {
            if (request.options.count_refusal) telemetry().count(row.key, SkuEvent::refused);
            throw_out_of_stock(row.key, available_of(v), request.qty, v.version);
          }
          RowValues next = changed(v, now);
          next.on_hand -= request.qty;
          STOCKADE_ASSERT_ROW(next.on_hand, next.reserved, next.backorder_limit);
          return next;
        };
        return level_of(row, apply(row, request.options, decide));
      },
      request.options.lock_timeout_ms);
}

std::vector<std::unique_lock<TimedLock>> MemoryStore::lock_for(const std::vector<StockRow*>& rows,
                                                               const WriteOptions& options) {
  std::vector<std::unique_lock<TimedLock>> locks;
  StrategyCounters& counters = telemetry().of(options.strategy);
  if (options.strategy == Strategy::pessimistic) {
    for (StockRow* row : rows) {  // rows are sorted by key: no deadlock
      locks.push_back(acquire(row->row_lock, row->key, options, &counters, &telemetry()));
    }
  } else if (options.strategy == Strategy::advisory) {
    // Distinct keys can share a stripe: take each stripe once, in address order.
    std::vector<std::pair<TimedLock*, StockRow*>> stripes;
    for (StockRow* row : rows) stripes.emplace_back(&advisory_lock_of(row->key), row);
    std::sort(stripes.begin(), stripes.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < stripes.size(); ++i) {
      if (i > 0 && stripes[i].first == stripes[i - 1].first) continue;
      StockRow* row = stripes[i].second;
      locks.push_back(acquire(*stripes[i].first, row->key, options, &counters, &telemetry()));
    }
  }
  return locks;
}

bool MemoryStore::try_apply_latched(const std::vector<StockRow*>& rows,
                                    const std::vector<Quantity>& qtys, TimestampUs now,
                                    const std::vector<RowSnapshot>* read_versions,
                                    Telemetry* counting) {
  std::vector<RowLatch> latches;
  latches.reserve(rows.size());
  for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
  std::vector<RowValues> next;
  next.reserve(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const RowValues& v = latches[i].values();
    if (read_versions != nullptr && (*read_versions)[i].values.version != v.version) {
      telemetry().count(rows[i]->key, SkuEvent::conflict);
      return false;  // optimistic: someone wrote since our read; latches release unchanged
    }
    next.push_back(
        hold_units(counting, *rows[i], v, qtys[i], now));  // throws: every latch released
  }
  for (std::size_t i = 0; i < rows.size(); ++i) latches[i].publish(next[i], rows[i]->key);
  return true;
}

void MemoryStore::apply_order(const std::vector<StockRow*>& rows, const std::vector<Quantity>& qtys,
                              const WriteOptions& options, TimestampUs now) {
  if (options.count_request) {
    for (StockRow* row : rows) telemetry().count(row->key, SkuEvent::request);
  }
  Telemetry* counting = options.count_refusal ? &telemetry() : nullptr;
  auto locks = lock_for(rows, options);
  if (options.strategy != Strategy::optimistic) {
    try_apply_latched(rows, qtys, now, nullptr, counting);
    return;
  }
  StrategyCounters& counters = telemetry().of(Strategy::optimistic);
  for (int attempt = 0;; ++attempt) {
    std::vector<RowSnapshot> seen;
    seen.reserve(rows.size());
    for (StockRow* row : rows) seen.push_back(row->cell.read());
    // Refuse on the read, as the optimistic SELECT would, before taking any latch.
    for (std::size_t i = 0; i < rows.size(); ++i)
      hold_units(counting, *rows[i], seen[i].values, qtys[i], now);
    if (try_apply_latched(rows, qtys, now, &seen, counting)) return;
    bump(counters.conflicts);
    if (attempt >= options.retries_max) {
      throw Error(ErrorCode::retries_exhausted,
                  "optimistic order lost the race " + std::to_string(attempt + 1) +
                      " times (retries_max " + std::to_string(options.retries_max) + ")");
    }
    bump(counters.retries);
    sleep_full_jitter(attempt, backoff_base_us, backoff_cap_us);
  }
}

Reservation MemoryStore::naive_reserve_unsafe(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                              std::int64_t window_us) {
  StockRow& row = require_row(key);
  // SELECT on_hand, reserved ...; the application decides by the reservation rule.
  const RowValues stale =
      hold_units(&telemetry(), row, row.cell.read().values, qty, clock_->now_us());
  if (window_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(window_us));
  const TimestampUs now = clock_->now_us();
  // UPDATE stock SET reserved = :value_computed_from_the_stale_read  (the lost update)
  RowLatch latch(row.cell, row.cell.latch());
  RowValues next = changed(latch.values(), now);
  next.reserved = stale.reserved;
  latch.publish(next, key);
  Reservation reservation = new_reservation(row, qty, ttl_us, now, std::nullopt);
  insert_reservation(reservation, &row);
  return reservation;
}

Reservation MemoryStore::limited_reserve_by_check(const SkuKey& key, Quantity qty,
                                                  const std::string& buyer, bool serializable,
                                                  std::int64_t window_us) {
  if (serializable) {
    throw Error(ErrorCode::not_supported, "SERIALIZABLE is a PostgreSQL isolation level");
  }
  StockRow& row = require_row(key);
  std::string group;
  Quantity per_buyer = 0;
  {
    std::shared_lock<std::shared_mutex> lock(limits_mutex_);
    auto it = sku_group_.find(key.sku);
    if (it == sku_group_.end()) throw_invalid_argument("sku " + shown(key.sku) + " has no limit");
    group = it->second;
    per_buyer = group_limits_.at(group);
  }
  // SELECT sum(qty) FROM reservation WHERE buyer = :buyer AND sku IN (the group's skus)
  Quantity held = 0;
  for (ReservationShard& shard : *reservations_) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    for (const auto& [id, record] : shard.records) {
      const Reservation& r = record.value;
      if (r.buyer == buyer && r.limit_group == group &&
          (r.state == ReservationState::held || r.state == ReservationState::confirmed)) {
        held += r.counted();
      }
    }
  }
  if (held + qty > per_buyer) throw limit_exceeded(key, group, buyer, held, per_buyer, qty);
  if (window_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(window_us));
  ReserveRequest request{key,         qty, 15LL * 60 * 1000 * 1000, std::nullopt, WriteOptions{},
                         std::nullopt};
  request.options.buyer = buyer;
  return reserve_now(row, request, group);
}

std::unique_ptr<LockHold> MemoryStore::hold_lock(const SkuKey& key, Strategy kind,
                                                 std::int64_t timeout_ms) {
  StockRow& row = require_row(key);
  WriteOptions options;
  options.lock_timeout_ms = timeout_ms;
  if (kind == Strategy::pessimistic) {
    return std::make_unique<HeldLock>(acquire(row.row_lock, key, options, nullptr, nullptr));
  }
  if (kind == Strategy::advisory) {
    return std::make_unique<HeldLock>(
        acquire(advisory_lock_of(key), key, options, nullptr, nullptr));
  }
  throw_invalid_argument(std::string("hold_lock takes 'pessimistic' or 'advisory', not '") +
                         strategy_name(kind) + "'");
}

}  // namespace stockade::detail
