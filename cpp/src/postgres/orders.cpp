// PostgresStore: orders as one handle (Store::order_step, get_order, order_by_key). The
// lines of an order share its id (migration 012); store/orders.hpp decides a step.
#include <map>

#include "postgres/postgres_store_impl.hpp"
#include "store/orders.hpp"

namespace stockade::detail::pg {

// One server: the lines locked by one statement, in id order. Citus refuses FOR UPDATE
// across shards: the lines are read first (their ids never change), then each is locked on
// its own shard, in the same order. Either way every line is read as locked.
std::vector<Reservation> PostgresStore::lock_order(Tx& tx, const Uuid& order_id,
                                                   std::vector<bool>& lapsed) {
  std::vector<Reservation> lines;
  const auto take = [&](const pqxx::row& row) {
    bool late = false;
    lines.push_back(read_reservation(row, &late));
    lapsed.push_back(late && lines.back().state == ReservationState::held);
  };
  if (!statements_->citus()) {
    for (const auto& row : tx.exec(Stmt::order_lock, order_id.to_string())) take(row);
  } else {
    std::vector<Uuid> ids;
    for (const auto& row : tx.exec(Stmt::order_lines, order_id.to_string())) {
      ids.push_back(read_reservation(row).id);
    }
    std::sort(ids.begin(), ids.end());
    for (const Uuid& id : ids) {
      const pqxx::result rows = tx.exec_on(id.shard_key(), Stmt::reservation_lock, id.to_string());
      if (!rows.empty()) take(rows[0]);
    }
  }
  if (lines.empty()) throw_order_not_found(order_id);
  return lines;
}

// Decided on the lines as locked (plan_order_step), then written in the order of every
// transition: the reservations (locked already), the buyers' counts in (group, buyer)
// order, the stock rows in key order, each with the journal's note of its line.
std::vector<Reservation> PostgresStore::order_step_in(Tx& tx, const OrderStepRequest& request) {
  std::vector<bool> lapsed;
  const std::vector<Reservation> lines = lock_order(tx, request.order_id, lapsed);
  const OrderPlan plan = plan_order_step(request, lines, lapsed);
  std::map<std::pair<std::string, std::string>, Quantity> counts;
  std::map<SkuKey, const PlannedLine*> rows;  // an order has one line per row
  for (const PlannedLine& p : plan.lines) {
    if (!p.changed || p.extended) continue;
    const Reservation& r = p.line;
    if (frees_allowance(r, p.moved)) {
      counts[{*r.limit_group, *r.buyer}] += p.moved.freed;
    }
    rows[r.key] = &p;
  }
  for (const auto& [group_buyer, units] : counts) {
    const auto& [group, buyer] = group_buyer;
    tx.exec_on(shard_key_of(group, buyer), Stmt::allowance_give, group, buyer, units);
  }
  for (const auto& [key, p] : rows) {
    const char* cause = p->expires                            ? "expire"
                        : request.kind == Transition::confirm ? "confirm"
                                                              : "release";
    const NoteScope note({cause, "", "", p->line.id.to_string()});
    set_note(tx);
    move_stock(tx, key, p->moved.sold, p->moved.sold + p->moved.freed);
  }
  std::vector<Reservation> out;
  for (const PlannedLine& p : plan.lines) {
    out.push_back(p.changed ? write_units(tx, p.line, p.extended ? request.ttl_us : 0) : p.line);
  }
  if (plan.raise_after) throw CommitThenRaise{*plan.raise_after};
  sort_lines(out);
  return out;
}

std::vector<Reservation> PostgresStore::order_step(const OrderStepRequest& request) {
  ErrorContext context;
  context.reservation_id = request.order_id;
  std::optional<KeyedWrite> k;
  if (request.idempotency_key) {
    k = KeyedWrite{*request.idempotency_key, fingerprint(request), request.order_id.shard_key()};
  }
  return keyed<std::vector<Reservation>>(k, nullptr, context,
                                         [&](Tx& tx) { return order_step_in(tx, request); });
}

std::vector<Reservation> PostgresStore::get_order(const Uuid& order_id) {
  ErrorContext context;
  context.reservation_id = order_id;
  return run<RunMode::read>(nullptr, context, [&](Tx& tx) {
    std::vector<Reservation> lines;
    for (const auto& row : tx.exec(Stmt::order_lines, order_id.to_string())) {
      lines.push_back(read_reservation(row));
    }
    if (lines.empty()) throw_order_not_found(order_id);
    sort_lines(lines);
    return lines;
  });
}

std::vector<Reservation> PostgresStore::order_by_key(const std::string& key) {
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result found = tx.exec(Stmt::order_key_get, key);
    if (found.empty()) throw_no_order_for_key(key, /*purged=*/false);
    if (found.size() > 1) {  // the Citus layout: one key claimed on two shards
      throw Error(ErrorCode::invalid_state,
                  "idempotency key " + shown(key) + " names more than one order");
    }
    std::vector<Reservation> lines = read_many(tx, parse_ids(found[0][0].as<std::string>()));
    if (lines.empty()) throw_no_order_for_key(key, /*purged=*/true);
    sort_lines(lines);
    return lines;
  });
}

std::vector<Reservation> PostgresStore::find_reservations(const ReservationQuery& q) {
  const Stmt by = q.ref        ? Stmt::find_by_ref
                  : q.order_id ? Stmt::find_by_order
                               : Stmt::find_by_buyer;
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    std::vector<Reservation> found;
    for (const auto& row : tx.exec(
             by, q.ref.value_or(std::string()),
             q.order_id ? q.order_id->to_string() : std::string(), q.buyer.value_or(std::string()),
             q.sku.value_or(std::string()), q.location.value_or(std::string()),
             q.state ? std::string(reservation_state_name(*q.state)) : std::string(),
             q.after ? q.after->to_string() : std::string(), static_cast<std::int64_t>(q.limit))) {
      found.push_back(read_reservation(row));
    }
    return found;
  });
}

// Allocation from a pool: one transaction takes the buyer's counts (each SKU's whole
// quantity, parent rows first), locks the pool's rows in key order (one statement on one
// server; row by row on Citus, which refuses FOR UPDATE across shards), decides on them
// as locked, and writes the holds. Whatever strategy was asked, the rows are locked
// FOR UPDATE (NOWAIT with nowait): the decision reads several rows, and only their locks
// keep it true until COMMIT.
std::vector<Reservation> PostgresStore::allocate_in(Tx& tx, const AllocateRequest& request,
                                                    const std::vector<PoolRow>& pool,
                                                    const std::vector<Uuid>& ids,
                                                    const Uuid& order_id,
                                                    const WriteOptions& options) {
  LineGroups groups(request.wants.size());
  if (options.buyer) {
    std::vector<OrderLine> asks;
    for (const AllocationWant& want : request.wants) {
      asks.push_back({SkuKey{want.sku, request.locations.front()}, want.qty});
    }
    groups = take_allowances(tx, asks, *options.buyer);
  }
  std::vector<std::optional<StockLevel>> read(pool.size());
  if (!statements_->citus()) {
    std::vector<std::string> skus, locations;
    for (const PoolRow& p : pool) {
      skus.push_back(p.key.sku);
      locations.push_back(p.key.location);
    }
    for (const auto& row : tx.exec(options.nowait ? Stmt::pool_lock_nowait : Stmt::pool_lock,
                                   text_array(skus), text_array(locations))) {
      const SkuKey key{row[stock_column_count].as<std::string>(),
                       row[stock_column_count + 1].as<std::string>()};
      for (std::size_t i = 0; i < pool.size(); ++i) {
        if (pool[i].key == key) read[i] = level_from(key, row);
      }
    }
  } else {
    for (std::size_t i = 0; i < pool.size(); ++i) {
      read[i] =
          read_row(tx, options.nowait ? Stmt::stock_lock_nowait : Stmt::stock_lock, pool[i].key);
    }
  }
  PoolLevels levels(request.wants.size(),
                    std::vector<std::optional<StockLevel>>(request.locations.size()));
  for (std::size_t i = 0; i < pool.size(); ++i) levels[pool[i].want][pool[i].location] = read[i];
  std::vector<OrderLine> lines;
  try {
    lines = plan_allocation(request, levels);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::out_of_stock && options.count_refusal) {
      for (std::size_t i = 0; i < pool.size(); ++i) {
        if (read[i]) telemetry().count(pool[i].key, SkuEvent::refused);
      }
    }
    throw;
  }
  std::vector<Reservation> made;
  for (const OrderLine& line : lines) {
    std::size_t i = 0;
    while (pool[i].key != line.key) ++i;
    if (options.count_request) telemetry().count(line.key, SkuEvent::request);
    write_row(tx, *read[i], 0, line.qty, options);
    made.push_back(insert_reservation(tx, ids[i], line.key, line.qty, request.ttl_us,
                                      request.idempotency_key, options.buyer, groups[pool[i].want],
                                      order_id, options.ref, options.metadata));
  }
  return made;
}

std::vector<Reservation> PostgresStore::allocate(const AllocateRequest& request) {
  const CallDeadline deadline(options_.call_timeout_ms);  // one bound over every attempt
  WriteOptions options = request.options;
  options.strategy = Strategy::pessimistic;  // see allocate_in
  options.expected_version.reset();
  const std::vector<PoolRow> pool = pool_rows(request);
  // An id for each row of the pool, made before the first attempt: after a lost COMMIT,
  // those in the database are the allocation's.
  std::vector<Uuid> ids;
  const std::int64_t now_ms = SystemClock().now_us() / 1000;
  for (const PoolRow& p : pool) {
    ids.push_back(make_uuid_v7(now_ms, row_shard_key(p.key.sku, p.key.location)));
  }
  // On Citus the key lives on a shard of its own name's, whatever the pool (a request with
  // the same key and another pool meets it there, and conflicts), and so does the order's
  // id: a keyed step of the order keeps its key there too.
  const std::optional<std::string>& key = request.idempotency_key;
  const std::uint16_t key_shard = key ? shard_key_of(*key, "allocate") : ids.front().shard_key();
  const Uuid order_id = make_uuid_v7(now_ms, key_shard);
  const std::string print = key ? fingerprint(request) : std::string();
  auto attempt = [&] {
    return run(&options, ErrorContext{}, [&](Tx& tx) {
      if (!key) return allocate_in(tx, request, pool, ids, order_id, options);
      const auto body = [&] {
        std::vector<Reservation> made = allocate_in(tx, request, pool, ids, order_id, options);
        std::vector<Uuid> used;
        for (const Reservation& r : made) used.push_back(r.id);
        tx.exec_on(key_shard, Stmt::idempotency_ids_set, *key, uuid_array(used));
        return made;
      };
      return with_idempotency(tx, *key, print, asked_by(request), ids, body, key_shard);
    });
  };
  for (int lost = 0;; ++lost) {
    try {
      return attempt();
    } catch (const LostCommit& e) {
      if (lost > 0) throw;
      std::vector<Reservation> landed = find_landed(ids, e, ErrorContext{}, /*some=*/true);
      if (!landed.empty()) return landed;
    }
  }
}

std::vector<std::string> PostgresStore::sku_locations(const std::string& sku,
                                                      const std::optional<std::string>& after,
                                                      std::size_t limit) {
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    std::vector<std::string> out;
    // '' sorts before every location (a location is never empty).
    for (const auto& row : tx.exec(Stmt::sku_locations, sku, after.value_or(std::string()),
                                   static_cast<std::int64_t>(limit))) {
      out.push_back(row[0].as<std::string>());
    }
    return out;
  });
}

}  // namespace stockade::detail::pg
