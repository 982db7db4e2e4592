// PostgresStore: stock rows and the per-request strategies.
#include <algorithm>
#include <chrono>

#include "base/invariant.hpp"
#include "postgres/postgres_store_impl.hpp"
#include "stockade/hash.hpp"
#include "store/fingerprint.hpp"
#include "store/unit_states.hpp"

namespace stockade::detail::pg {

// Used by this file alone: reserve, sell and the orders' reserve.
template <class Fn>
std::vector<Reservation> PostgresStore::run_resolving(const std::vector<Uuid>& ids,
                                                      const ErrorContext& context, Fn&& attempt) {
  const CallDeadline deadline(options_.call_timeout_ms);
  for (int lost = 0;; ++lost) {
    try {
      return attempt();
    } catch (const LostCommit& e) {
      if (lost > 0) throw;
      // Unsettled (the session could not be ended, or a pooler hides it), only a write
      // that is there already is a certain answer: find_landed raises InDoubt otherwise.
      std::vector<Reservation> landed = find_landed(ids, e, context);
      if (!landed.empty()) return landed;
    }
  }
}

template <class Fn>
auto PostgresStore::optimistic_retry(const SkuKey* key, const WriteOptions& options, Fn&& attempt)
    -> std::invoke_result_t<Fn&> {
  StrategyCounters& counters = telemetry().of(Strategy::optimistic);
  const CallDeadline deadline(options_.call_timeout_ms);
  for (int n = 0;; ++n) {
    try {
      return attempt();
    } catch (const OptimisticRace&) {
      bump(counters.conflicts);
      if (key != nullptr) telemetry().count(*key, SkuEvent::conflict);
      if (n >= options.retries_max) {
        ErrorContext context;
        if (key != nullptr) context = context_of(*key);
        throw Error(ErrorCode::retries_exhausted,
                    "optimistic write" +
                        (key != nullptr ? " to " + describe(*key) : std::string()) +
                        " lost the race " + std::to_string(n + 1) + " times (retries_max " +
                        std::to_string(options.retries_max) + ")",
                    std::move(context));
      }
      bump(counters.retries);
      sleep_full_jitter(n, retry_backoff_base_us, retry_backoff_cap_us);
    }
  }
}

// Every row the database returns passed its CHECK constraint; the assertion states what the
// decisions made on it rely on.
StockLevel level_from(const SkuKey& key, const pqxx::row& row) {
  StockLevel level{key, row[0].as<std::int64_t>(), row[1].as<std::int64_t>(),
                   row[2].as<std::int64_t>(), row[3].as<std::int64_t>()};
  level.backorder_limit = row[4].as<std::int64_t>();
  level.discontinued = row[5].as<bool>();
  level.lease_token = row[6].as<std::int64_t>();
  level.leased = row[7].as<bool>();
  level.lease_expires_at_us = row[8].as<std::int64_t>();
  if (!row[9].is_null()) level.low_stock = row[9].as<std::int64_t>();
  level.active_slots = row[10].as<int>();
  level.safety_stock = row[11].as<std::int64_t>();
  level.damaged = row[12].as<std::int64_t>();
  level.quality_control = row[13].as<std::int64_t>();
  level.incoming = row[14].as<std::int64_t>();
  STOCKADE_ASSERT_ROW(level.on_hand, level.reserved, level.backorder_limit);
  return level;
}

namespace {

std::int64_t elapsed_us(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               since)
      .count();
}

}  // namespace

std::int64_t PostgresStore::advisory_key(const SkuKey& key) const {
  // A hot-row slot's row is a row of its own: its lock is not its SKU's.
  if (key.slot == 0) {
    return static_cast<std::int64_t>(stable_hash64({options_.schema, key.sku, key.location}));
  }
  return static_cast<std::int64_t>(
      stable_hash64({options_.schema, key.sku, key.location, "slot", std::to_string(key.slot)}));
}

PostgresStore::Level PostgresStore::read_row(Tx& tx, Stmt s, const SkuKey& key) {
  const pqxx::result rows = tx.exec_on(shard_of(key), s, key.sku, key.location, key.slot);
  if (rows.empty()) return std::nullopt;
  return level_from(key, rows[0]);
}

void PostgresStore::lock_advisory(Tx& tx, const SkuKey& key, const WriteOptions& options) {
  const std::int64_t lock_key = advisory_key(key);
  if (tx.exec(Stmt::advisory_try_lock, lock_key)[0][0].as<bool>()) return;
  if (options.nowait) {
    throw Error(ErrorCode::lock_not_available,
                "advisory lock not available (NOWAIT) for " + describe(key), context_of(key));
  }
  StrategyCounters& counters = telemetry().of(options.strategy);
  bump(counters.lock_waits);
  telemetry().count(key, SkuEvent::lock_wait);
  const auto start = std::chrono::steady_clock::now();
  tx.exec(Stmt::advisory_lock, lock_key);  // bounded by lock_timeout
  bump(counters.lock_wait_us, static_cast<std::uint64_t>(elapsed_us(start)));
}

StockLevel PostgresStore::lock_row(Tx& tx, const SkuKey& key, const WriteOptions& options) {
  Level row;
  switch (options.strategy) {
    case Strategy::pessimistic:
      if (options.nowait) {
        row = read_row(tx, Stmt::stock_lock_nowait, key);
        break;
      }
      // SKIP LOCKED first, to see (and count) whether the lock is taken; then wait for it.
      row = read_row(tx, Stmt::stock_lock_skip, key);
      if (!row) {
        const auto start = std::chrono::steady_clock::now();
        row = read_row(tx, Stmt::stock_lock, key);
        if (row) {
          StrategyCounters& counters = telemetry().of(options.strategy);
          bump(counters.lock_waits);
          telemetry().count(key, SkuEvent::lock_wait);
          bump(counters.lock_wait_us, static_cast<std::uint64_t>(elapsed_us(start)));
        }
      }
      break;
    case Strategy::advisory:
      lock_advisory(tx, key, options);
      row = read_row(tx, Stmt::stock_get, key);
      break;
    default:
      row = read_row(tx, Stmt::stock_get, key);
      break;
  }
  if (!row) throw_stock_not_found(key);
  return *row;
}

StockLevel PostgresStore::write_row(Tx& tx, const StockLevel& read, Quantity sold, Quantity held,
                                    const WriteOptions& options) {
  const SkuKey& key = read.key;
  if (options.strategy == Strategy::optimistic) {
    // UPDATE ... SET <values computed from the read> WHERE version = :read_version
    const pqxx::result rows =
        tx.exec_on(shard_of(key), Stmt::stock_cas, key.sku, key.location, read.on_hand - sold,
                   read.reserved + held, read.version, key.slot);
    if (rows.empty()) throw OptimisticRace{};
    return observed_write(level_from(key, rows[0]));
  }
  // Under the row lock (pessimistic) the guard always holds; under an advisory lock it
  // protects the row from writers that do not take that lock (another strategy).
  const Quantity qty = sold + held;
  const pqxx::result rows = tx.exec_on(shard_of(key), Stmt::stock_delta, key.sku, key.location,
                                       sold, held, qty, options.expected_version.value_or(-1),
                                       options.fencing_token.value_or(-1), key.slot);
  if (rows.empty()) {
    refuse(tx, key, qty, options.expected_version, options.fencing_token, options.count_refusal);
  }
  return observed_write(level_from(key, rows[0]));
}

// Every write of this process to a stock row reports the version it left, for `auto`
// (Store::report_write, RowWriteObserver): what the row moved beyond these is other
// processes' writes. (Restocks and the other writes of one row's properties too: unreported,
// a process that restocks a row as often as it reserves on it would read as two writers.)
StockLevel PostgresStore::observed_write(StockLevel level) {
  report_write(level.key, level.version);
  return level;
}

std::nullopt_t PostgresStore::refused_by_read(const SkuKey& key, Quantity qty,
                                              const WriteOptions& options,
                                              const std::optional<FencingToken>& token) {
  run_on<RunMode::read>(shard_of(key), &options, context_of(key), [&](Tx& tx) -> bool {
    refuse(tx, key, qty, options.expected_version, token, options.count_refusal);
  });
  return std::nullopt;  // not reached: refuse() throws
}

void PostgresStore::refuse(Tx& tx, const SkuKey& key, Quantity qty,
                           const std::optional<Version>& expected,
                           const std::optional<FencingToken>& token, bool count) {
  const Level row = read_row(tx, Stmt::stock_get, key);
  if (!row) throw_stock_not_found(key);
  check_writable(*row, expected, token);
  if (count) telemetry().count(key, SkuEvent::refused);
  throw_out_of_stock(key, row->available(), qty, row->version);
}

StockLevel PostgresStore::upsert(const SkuKey& key, Quantity value, bool add,
                                 std::optional<Version> expected, std::optional<FencingToken> token,
                                 const std::optional<std::string>& idempotency_key) {
  std::optional<KeyedWrite> k;
  if (idempotency_key) {
    k = KeyedWrite{*idempotency_key, stock_fingerprint(key, value, add, expected, token),
                   shard_of(key)};
  }
  return keyed<StockLevel>(
      k, nullptr, context_of(key),
      [&](Tx& tx) { return upsert_in(tx, key, value, add, expected, token); }, shard_of(key));
}

StockLevel PostgresStore::upsert_in(Tx& tx, const SkuKey& key, Quantity value, bool add,
                                    std::optional<Version> expected,
                                    std::optional<FencingToken> token) {
  for (;;) {
    const Level row = read_row(tx, Stmt::stock_lock, key);
    if (!row) {
      // A version was expected, or a token (a lease makes its row): the row must exist.
      if (expected || token) throw_stock_not_found(key);
      const pqxx::result made =
          tx.exec_on(shard_of(key), Stmt::stock_insert, key.sku, key.location, value, key.slot);
      if (!made.empty()) return level_from(key, made[0]);
      continue;  // created by someone else since our read: update theirs
    }
    check_writable(*row, expected, token);
    Quantity on_hand = value;
    if (add) {
      on_hand = checked_on_hand(row->on_hand, value, "restock");
    } else {
      check_covers(key, value, row->reserved, row->backorder_limit,
                   row->damaged + row->quality_control);
    }
    return observed_write(level_from(key, tx.exec_on(shard_of(key), Stmt::stock_set_on_hand,
                                                     key.sku, key.location, on_hand, key.slot)[0]));
  }
}

StockLevel PostgresStore::restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                                  std::optional<FencingToken> token,
                                  const std::optional<std::string>& idempotency_key) {
  return upsert(key, qty, /*add=*/true, expected, token, idempotency_key);
}

StockLevel PostgresStore::set_on_hand(const SkuKey& key, Quantity on_hand,
                                      std::optional<Version> expected,
                                      std::optional<FencingToken> token,
                                      const std::optional<std::string>& idempotency_key) {
  return upsert(key, on_hand, /*add=*/false, expected, token, idempotency_key);
}

std::vector<StockLevel> PostgresStore::sku_rows(const SkuKey& base) {
  return run_on<RunMode::read>(shard_of(base), nullptr, context_of(base),
                               [&](Tx& tx) { return read_sku_rows(tx, base); });
}

// `base` and its slot rows that exist, in key order (the own row first), read in `tx`.
// Under the own row's lock the list is whole: reshape makes slot rows only while it holds
// that lock.
std::vector<StockLevel> PostgresStore::read_sku_rows(Tx& tx, const SkuKey& base) {
  const pqxx::result rows = tx.exec_on(shard_of(base), Stmt::sku_rows, base.sku, base.location);
  std::vector<StockLevel> out;
  for (const auto& row : rows) {
    out.push_back(level_from(slot_key(base, row[stock_column_count].as<int>()), row));
  }
  std::sort(out.begin(), out.end(),
            [](const StockLevel& a, const StockLevel& b) { return a.key < b.key; });
  return out;
}

std::vector<StockLevel> PostgresStore::reshape(const std::vector<SkuKey>& keys, bool create,
                                               bool write_all, std::int64_t lock_timeout_ms,
                                               const ReshapePlan& plan, int active_slots) {
  WriteOptions wait;
  wait.strategy = Strategy::pessimistic;
  wait.lock_timeout_ms = lock_timeout_ms;
  std::vector<std::size_t> order(keys.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
  return run(&wait, context_of(keys.front()), [&](Tx& tx) {
    std::vector<StockLevel> levels(keys.size());
    bool made = false;
    for (std::size_t i : order) {  // each row locked by a statement of its own, in key order
      const SkuKey& key = keys[i];
      Level row = read_row(tx, Stmt::stock_lock, key);
      while (!row && create) {
        const pqxx::result inserted =
            tx.exec_on(shard_of(key), Stmt::stock_insert, key.sku, key.location, 0, key.slot);
        if (!inserted.empty()) {
          made = true;
          row = level_from(key, inserted[0]);  // ours until we commit
        } else {
          row = read_row(tx, Stmt::stock_lock, key);  // made by another since our read
        }
      }
      if (!row) throw_stock_not_found(key);
      levels[i] = *row;
    }
    const std::vector<Quantity> on_hand = plan(levels);
    if (on_hand.size() != keys.size()) {
      throw Error(ErrorCode::invariant_violation,
                  "a reshape plan returned " + std::to_string(on_hand.size()) + " quantities for " +
                      std::to_string(keys.size()) + " rows");
    }
    for (std::size_t i = 0; i < keys.size(); ++i) {
      const StockLevel& l = levels[i];
      if (on_hand[i] != l.on_hand && l.reserved > on_hand[i] + l.backorder_limit) {
        throw Error(ErrorCode::invariant_violation,
                    "a reshape would leave " + describe(keys[i]) + " with " +
                        std::to_string(l.reserved) + " units reserved and " +
                        std::to_string(on_hand[i]) + " on hand",
                    context_of(keys[i]));
      }
    }
    for (std::size_t i : order) {
      const SkuKey& key = keys[i];
      if (i == order.front() && active_slots > 0) {  // the own row takes the slot count
        levels[i] =
            level_from(key, tx.exec_on(shard_of(key), Stmt::stock_set_slots, key.sku, key.location,
                                       on_hand[i], active_slots, key.slot)[0]);
        continue;
      }
      // Rows made: every row is written, so the first in key order moves its version.
      if (on_hand[i] == levels[i].on_hand && !write_all && !made) continue;
      levels[i] = level_from(key, tx.exec_on(shard_of(key), Stmt::stock_set_on_hand, key.sku,
                                             key.location, on_hand[i], key.slot)[0]);
    }
    return levels;
  });
}

template <class Check, class Write>
StockLevel PostgresStore::admin_write(const SkuKey& key, Check&& check, Write&& write) {
  return run(nullptr, context_of(key), [&](Tx& tx) {
    const Level row = read_row(tx, Stmt::stock_lock, key);
    if (!row) throw_stock_not_found(key);
    if (!check(*row)) return *row;  // nothing to change
    return observed_write(level_from(key, write(tx)[0]));
  });
}

StockLevel PostgresStore::set_backorder_limit(const SkuKey& key, Quantity limit,
                                              std::optional<Version> expected,
                                              std::optional<FencingToken> token) {
  return admin_write(
      key,
      [&](const StockLevel& row) {
        check_writable(row, expected, token);
        check_covers(key, row.on_hand, row.reserved, limit, row.damaged + row.quality_control);
        return true;
      },
      [&](Tx& tx) {
        refuse_if_slotted(tx, key, "a backorder limit");
        return tx.exec_on(shard_of(key), Stmt::stock_set_backorder_limit, key.sku, key.location,
                          limit, key.slot);
      });
}

StockLevel PostgresStore::set_safety_stock(const SkuKey& key, Quantity units,
                                           std::optional<Version> expected,
                                           std::optional<FencingToken> token) {
  return admin_write(
      key,
      [&](const StockLevel& row) {
        check_writable(row, expected, token);
        return true;
      },
      [&](Tx& tx) {
        refuse_if_slotted(tx, key, "safety stock");
        return tx.exec_on(shard_of(key), Stmt::stock_set_safety_stock, key.sku, key.location, units,
                          key.slot);
      });
}

StockLevel PostgresStore::move_units(const MoveRequest& request) {
  const SkuKey& key = request.key;
  std::optional<KeyedWrite> k;
  if (request.idempotency_key) {
    k = KeyedWrite{*request.idempotency_key, fingerprint(request), shard_of(key)};
  }
  return keyed<StockLevel>(
      k, nullptr, context_of(key),
      [&](Tx& tx) {
        const Level row = read_row(tx, Stmt::stock_lock, key);
        if (!row) throw_stock_not_found(key);
        check_writable(*row, request.expected_version, request.fencing_token);
        // Units in a bucket stay on their row: a slotted SKU would spread them as free units.
        refuse_if_slotted(tx, key, "moving units between states");
        const UnitCounts counts = plan_move(*row, request);
        return observed_write(level_from(
            key, tx.exec_on(shard_of(key), Stmt::stock_set_units, key.sku, key.location,
                            counts.on_hand, counts.damaged, counts.quality_control, key.slot)[0]));
      },
      shard_of(key));
}

// The engine refuses leases and backorder limits on a slotted SKU after reading its rows;
// this check, under the own row's lock, closes the window in which another engine slots
// the SKU between that read and the write (set_slots, in turn, refuses a leased row or
// one with a limit under the same lock).
void PostgresStore::refuse_if_slotted(Tx& tx, const SkuKey& key, const char* feature) {
  refuse_if_slots(key, feature, read_sku_rows(tx, key));
}

std::vector<StockLevel> PostgresStore::set_discontinued(const SkuKey& key, bool discontinued,
                                                        std::int64_t lock_timeout_ms,
                                                        const RowsCheck& check) {
  WriteOptions wait;
  wait.strategy = Strategy::pessimistic;
  wait.lock_timeout_ms = lock_timeout_ms;
  return run(&wait, context_of(key), [&](Tx& tx) {
    std::vector<StockLevel> levels;
    const Level own = read_row(tx, Stmt::stock_lock, key);
    if (!own) throw_stock_not_found(key);
    levels.push_back(*own);
    const std::vector<StockLevel> listed = read_sku_rows(tx, key);  // under the own row's lock
    for (std::size_t i = 1; i < listed.size(); ++i) {               // the slot rows, in key order
      if (Level row = read_row(tx, Stmt::stock_lock, listed[i].key)) levels.push_back(*row);
    }
    check(levels);
    for (StockLevel& level : levels) {
      if (level.discontinued == discontinued) continue;
      const SkuKey row = level.key;
      level = observed_write(
          level_from(row, tx.exec_on(shard_of(row), Stmt::stock_set_discontinued, row.sku,
                                     row.location, discontinued, row.slot)[0]));
    }
    return levels;
  });
}

Lease PostgresStore::acquire_lease(const SkuKey& key, std::int64_t ttl_us,
                                   const std::string& owner) {
  return run(nullptr, context_of(key), [&](Tx& tx) {
    for (;;) {
      Level row = read_row(tx, Stmt::stock_lock, key);
      if (!row) {  // a lease makes its row, at zero units; then lock it
        tx.exec_on(shard_of(key), Stmt::stock_insert, key.sku, key.location, Quantity{0}, key.slot);
        continue;
      }
      row->discontinued = false;  // a discontinued row can be leased (to reinstate it)
      check_writable(*row, std::nullopt, std::nullopt);  // LeaseHeld while one is live
      refuse_if_slotted(tx, key, "a lease");
      const std::int64_t token = tx.exec(Stmt::lease_next_token)[0][0].as<std::int64_t>();
      const pqxx::row made = tx.exec_on(shard_of(key), Stmt::lease_acquire, key.sku, key.location,
                                        owner, ttl_us, token, key.slot)[0];
      return Lease{key, owner, made[0].as<std::int64_t>(), made[1].as<std::int64_t>()};
    }
  });
}

Lease PostgresStore::renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us) {
  return run(nullptr, context_of(key), [&](Tx& tx) {
    const pqxx::result renewed = tx.exec_on(shard_of(key), Stmt::lease_renew, key.sku, key.location,
                                            token, ttl_us, key.slot);
    if (!renewed.empty()) {
      return Lease{key, renewed[0][0].as<std::string>(), token, renewed[0][1].as<std::int64_t>()};
    }
    Level row = read_row(tx, Stmt::stock_get, key);
    if (!row) throw_stock_not_found(key);
    row->discontinued = false;
    check_writable(*row, std::nullopt, token);  // FencingTokenStale: superseded
    throw_lease_lapsed(key, token);
  });
}

bool PostgresStore::release_lease(const SkuKey& key, FencingToken token) {
  return run(nullptr, context_of(key), [&](Tx& tx) {
    return !tx.exec_on(shard_of(key), Stmt::lease_release, key.sku, key.location, token, key.slot)
                .empty();
  });
}

StockLevel PostgresStore::stock(const SkuKey& key) {
  return run_on<RunMode::read>(shard_of(key), nullptr, context_of(key), [&](Tx& tx) {
    const Level row = read_row(tx, Stmt::stock_get, key);
    if (!row) throw_stock_not_found(key);
    return *row;
  });
}

StockLevel PostgresStore::sell(const SellRequest& request) {
  const CallDeadline deadline(options_.call_timeout_ms);  // one bound over every attempt
  const WriteOptions& options = request.options;
  const SkuKey& key = request.key;
  if (options.count_request) telemetry().count(key, SkuEvent::request);
  std::optional<KeyedWrite> k;
  if (request.idempotency_key) {
    k = KeyedWrite{*request.idempotency_key, fingerprint(request), shard_of(key)};
  }
  auto attempt = [&] {
    return keyed<StockLevel>(
        k, &options, context_of(key),
        [&](Tx& tx) {
          if (options.strategy == Strategy::atomic) {
            const pqxx::result rows =
                tx.exec_on(shard_of(key), Stmt::stock_delta, key.sku, key.location, request.qty,
                           Quantity{0}, request.qty, options.expected_version.value_or(-1),
                           options.fencing_token.value_or(-1), key.slot);
            if (rows.empty()) {
              refuse(tx, key, request.qty, options.expected_version, options.fencing_token,
                     options.count_refusal);
            }
            return observed_write(level_from(key, rows[0]));
          }
          const StockLevel read = lock_row(tx, key, options);
          check_writable(read, options.expected_version, options.fencing_token);
          if (read.available() < request.qty) {
            if (options.count_refusal) telemetry().count(key, SkuEvent::refused);
            throw_out_of_stock(key, read.available(), request.qty, read.version);
          }
          return write_row(tx, read, request.qty, 0, options);
        },
        shard_of(key));
  };
  if (options.strategy == Strategy::optimistic) return optimistic_retry(&key, options, attempt);
  if (std::optional<StockLevel> sold = sell_delegated(request)) return *sold;
  return attempt();
}

std::vector<Reservation> PostgresStore::hold(Tx& tx, const std::vector<OrderLine>& lines,
                                             const std::vector<Uuid>& ids, std::int64_t ttl_us,
                                             const std::optional<std::string>& idempotency_key,
                                             const WriteOptions& options,
                                             const std::optional<Uuid>& order_id) {
  std::vector<Reservation> made;
  made.reserve(lines.size());
  const std::string key_name = idempotency_key.value_or(std::string());
  // Purchase limits first: the parent rows are locked before any stock row.
  const LineGroups groups =
      options.buyer ? take_allowances(tx, lines, *options.buyer) : LineGroups(lines.size());
  if (options.strategy == Strategy::atomic && lines.size() == 1 && !options.buyer && !order_id &&
      !options.ref && !options.metadata && !statements_->citus()) {
    // One statement: the conditional UPDATE and the reservation row together. (Citus
    // would run its INSERT ... SELECT by pulling the row to the coordinator first, at
    // half the speed of the two statements below, in one transaction there.)
    const OrderLine& line = lines.front();
    const pqxx::result rows =
        tx.exec_on(shard_of(line.key), Stmt::hold_atomic, line.key.sku, line.key.location, line.qty,
                   options.expected_version.value_or(-1), ids.front().to_string(), ttl_us, key_name,
                   line.key.slot);
    if (rows.empty()) {
      refuse(tx, line.key, line.qty, options.expected_version, std::nullopt, options.count_refusal);
    }
    report_write(line.key, rows[0][2].as<Version>());
    made.push_back(new_hold(ids.front(), line.key, line.qty, idempotency_key, rows[0]));
    return made;
  }
  if (options.strategy == Strategy::atomic) {
    for (const OrderLine& line : lines) {  // sorted: rows are locked in key order
      const pqxx::result rows =
          tx.exec_on(shard_of(line.key), Stmt::stock_delta, line.key.sku, line.key.location,
                     Quantity{0}, line.qty, line.qty, options.expected_version.value_or(-1),
                     std::int64_t{-1}, line.key.slot);
      if (rows.empty()) {
        refuse(tx, line.key, line.qty, options.expected_version, std::nullopt,
               options.count_refusal);
      }
      observed_write(level_from(line.key, rows[0]));
    }
  } else {
    // Read (and lock) every row first, in key order; decide on the reads; then write.
    std::vector<StockLevel> reads;
    reads.reserve(lines.size());
    for (const OrderLine& line : lines) reads.push_back(lock_row(tx, line.key, options));
    for (std::size_t i = 0; i < lines.size(); ++i) {
      check_writable(reads[i], options.expected_version, std::nullopt);
      if (reads[i].available() < lines[i].qty) {
        if (options.count_refusal) telemetry().count(lines[i].key, SkuEvent::refused);
        throw_out_of_stock(lines[i].key, reads[i].available(), lines[i].qty, reads[i].version);
      }
    }
    for (std::size_t i = 0; i < lines.size(); ++i) {
      write_row(tx, reads[i], 0, lines[i].qty, options);
    }
  }
  for (std::size_t i = 0; i < lines.size(); ++i) {
    made.push_back(insert_reservation(tx, ids[i], lines[i].key, lines[i].qty, ttl_us,
                                      idempotency_key, options.buyer, groups[i], order_id,
                                      options.ref, options.metadata));
  }
  return made;
}

Reservation PostgresStore::reserve(const ReserveRequest& request) {
  const CallDeadline deadline(options_.call_timeout_ms);  // one bound over every attempt
  const WriteOptions& options = request.options;
  if (options.count_request) telemetry().count(request.key, SkuEvent::request);
  const std::vector<OrderLine> lines{{request.key, request.qty}};
  const std::vector<Uuid> ids{make_uuid_v7(SystemClock().now_us() / 1000,
                                           row_shard_key(request.key.sku, request.key.location))};
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  auto attempt = [&] {
    return run_on(shard_of(request.key), &options, context_of(request.key), [&](Tx& tx) {
      if (!request.idempotency_key) {
        return hold(tx, lines, ids, request.ttl_us, std::nullopt, options);
      }
      return with_idempotency(tx, *request.idempotency_key, print, asked_by(request), ids, [&] {
        return hold(tx, lines, ids, request.ttl_us, request.idempotency_key, options);
      });
    });
  };
  // A commit whose connection was lost is resolved by looking for the reservation (see
  // run_resolving); the one-statement and delegated forms are resolved the same way.
  return run_resolving(ids, context_of(request.key),
                       [&] {
                         if (options.strategy == Strategy::optimistic) {
                           return optimistic_retry(&request.key, options, attempt);
                         }
                         if (std::optional<Reservation> made =
                                 reserve_in_one_call(request, ids.front(), print)) {
                           return std::vector<Reservation>{*made};
                         }
                         return attempt();
                       })
      .front();
}

// The forms of an atomic reserve that are one statement, or one call, where they apply;
// nothing where none does, or (the limited form) where it could not apply in full.
std::optional<Reservation> PostgresStore::reserve_in_one_call(const ReserveRequest& request,
                                                              const Uuid& id,
                                                              const std::string& print) {
  const WriteOptions& options = request.options;
  // Not with a ref or metadata: their statements do not carry them.
  if (options.strategy != Strategy::atomic || options.ref || options.metadata) return {};
  const bool citus = statements_->citus();
  if (options.buyer) {
    // Not on Citus, which cannot run that statement on one shard: the buyer's count may
    // lie on another.
    if (request.idempotency_key || options.expected_version || citus) return {};
    return reserve_limited_in_one_statement(request, id);
  }
  // On Citus, a call delegated to the row's worker, without a journal note (which would
  // need a setting of the transaction).
  if (citus) return note_in_scope() ? std::nullopt : reserve_delegated(request, id, print);
  if (!request.idempotency_key) return reserve_in_one_statement(request, id);
  return {};
}

// atomic without a key: the conditional UPDATE and the reservation row are one statement,
// run in autocommit. One round trip instead of three, and the row lock is held only
// through the statement's own commit, not through a further round trip for COMMIT (on a
// hot row, the transaction form ran at 0.69x of the same SQL under pgbench). A refusal is
// classified by one read afterwards. A connection that broke while the statement ran
// raises LostCommit, which reserve() resolves like a transaction's.
std::optional<Reservation> PostgresStore::reserve_in_one_statement(const ReserveRequest& request,
                                                                   const Uuid& id) {
  const SkuKey& key = request.key;
  const ErrorContext context = context_of(key);
  const std::int64_t expected = request.options.expected_version.value_or(-1);
  const std::optional<Reservation> made = run<RunMode::one_statement>(
      &request.options, context, [&](Tx& tx) -> std::optional<Reservation> {
        const pqxx::result rows =
            tx.exec_on(shard_of(key), Stmt::hold_atomic, key.sku, key.location, request.qty,
                       expected, id.to_string(), request.ttl_us, std::string(), key.slot);
        if (rows.empty()) return std::nullopt;
        report_write(key, rows[0][2].as<Version>());
        return new_hold(id, key, request.qty, std::nullopt, rows[0]);
      });
  if (made) return made;
  return refused_by_read(key, request.qty, request.options, std::nullopt);
}

std::optional<Reservation> PostgresStore::reserve_limited_in_one_statement(
    const ReserveRequest& request, const Uuid& id) {
  const SkuKey& key = request.key;
  const std::string ids = text_array({id.to_string()});
  const std::string qtys = int_array({request.qty});
  const std::string ttls = int_array({request.ttl_us});
  const std::string buyers = text_array({*request.options.buyer});
  try {
    return run<RunMode::one_statement>(
        &request.options, context_of(key), [&](Tx& tx) -> std::optional<Reservation> {
          const pqxx::result rows = tx.exec_on(
              shard_of(key), Stmt::batch_fast_one_limited, key.sku, key.location, Quantity{0},
              request.qty, std::int64_t{1}, ids, qtys, ttls, text_array({""}), buyers, key.slot);
          if (rows.empty()) return std::nullopt;
          // The row's values right after this hold, and the database's now().
          Reservation r;
          r.id = id;
          r.key = key;
          r.qty = request.qty;
          r.state = ReservationState::held;
          r.version = 1;
          r.created_at_us = r.updated_at_us = rows[0][5].as<std::int64_t>();
          r.expires_at_us = r.created_at_us + request.ttl_us;
          r.buyer = request.options.buyer;
          const std::string group = rows[0][7].as<std::string>();
          if (!group.empty()) r.limit_group = group;
          return r;
        });
  } catch (const Error& e) {
    if (e.context().sqlstate == statement_aborted) return std::nullopt;
    throw;
  }
}

std::vector<Reservation> PostgresStore::reserve_order(const OrderRequest& request) {
  const CallDeadline deadline(options_.call_timeout_ms);  // one bound over every attempt
  const WriteOptions& options = request.options;
  // Locks go in sorted (sku, location) order; results come back in the caller's order.
  std::vector<std::size_t> order(request.lines.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return request.lines[a].key < request.lines[b].key;
  });
  std::vector<OrderLine> sorted;
  std::vector<Uuid> ids;
  const std::int64_t now_ms = SystemClock().now_us() / 1000;
  for (std::size_t i : order) {
    const OrderLine& line = request.lines[i];
    if (request.options.count_request) telemetry().count(line.key, SkuEvent::request);
    sorted.push_back(line);
    ids.push_back(make_uuid_v7(now_ms, row_shard_key(line.key.sku, line.key.location)));
  }
  // The order's id carries its first line's shard key: on the Citus layout, the key of a
  // step of the order lives there, with the key that made it.
  const Uuid order_id = make_uuid_v7(now_ms, ids.front().shard_key());
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  auto attempt = [&] {
    return run(&options, ErrorContext{}, [&](Tx& tx) {
      if (!request.idempotency_key) {
        return hold(tx, sorted, ids, request.ttl_us, std::nullopt, options, order_id);
      }
      return with_idempotency(tx, *request.idempotency_key, print, asked_by(request), ids, [&] {
        return hold(tx, sorted, ids, request.ttl_us, request.idempotency_key, options, order_id);
      });
    });
  };
  std::vector<Reservation> made = run_resolving(ids, ErrorContext{}, [&] {
    return options.strategy == Strategy::optimistic ? optimistic_retry(nullptr, options, attempt)
                                                    : attempt();
  });
  // made (or replayed: the fingerprint covers every line) in sorted order, one per line
  if (made.size() != order.size()) {
    throw Error(ErrorCode::invariant_violation, "an order of " + std::to_string(order.size()) +
                                                    " lines came back with " +
                                                    std::to_string(made.size()) + " reservations");
  }
  std::vector<Reservation> out(made.size());
  for (std::size_t k = 0; k < order.size(); ++k) out[order[k]] = std::move(made[k]);
  return out;
}

}  // namespace stockade::detail::pg
