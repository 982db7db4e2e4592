// MemoryStore: orders as one handle (Store::order_step, get_order, order_by_key). The lines
// of an order share its id; orders_ finds them by it.
#include <algorithm>
#include <set>

#include "memory/memory_store_impl.hpp"
#include "store/allocation.hpp"
#include "store/error_helpers.hpp"
#include "store/orders.hpp"

namespace stockade::detail {

void MemoryStore::note_order(const Uuid& order_id, const std::vector<Reservation>& lines) {
  std::vector<Uuid> ids;
  for (const Reservation& r : lines) ids.push_back(r.id);
  std::lock_guard<std::mutex> lock(orders_mutex_);
  orders_[order_id] = std::move(ids);
}

void MemoryStore::forget_line(const Reservation& r) {
  if (!r.order_id) return;
  std::lock_guard<std::mutex> lock(orders_mutex_);
  auto it = orders_.find(*r.order_id);
  if (it == orders_.end()) return;
  auto& ids = it->second;
  ids.erase(std::remove(ids.begin(), ids.end(), r.id), ids.end());
  if (ids.empty()) orders_.erase(it);  // every line purged: the order is gone
}

std::vector<Uuid> MemoryStore::order_ids(const Uuid& order_id) const {
  std::lock_guard<std::mutex> lock(orders_mutex_);
  auto it = orders_.find(order_id);
  if (it == orders_.end()) throw_order_not_found(order_id);
  return it->second;
}

// The lines retention has not purged (it purges them one by one, as PostgreSQL's does).
std::vector<Reservation> MemoryStore::lines_of(const std::vector<Uuid>& ids) {
  std::vector<Reservation> lines;
  for (const Uuid& id : ids) {
    try {
      lines.push_back(get_reservation(id));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::not_found) throw;
    }
  }
  sort_lines(lines);
  return lines;
}

std::vector<Reservation> MemoryStore::get_order(const Uuid& order_id) {
  std::vector<Reservation> lines = lines_of(order_ids(order_id));
  if (lines.empty()) throw_order_not_found(order_id);
  return lines;
}

std::vector<Reservation> MemoryStore::order_by_key(const std::string& key) {
  std::vector<Uuid> ids;
  {
    std::lock_guard<std::mutex> lock(idempotency_mutex_);
    auto it = idempotency_.find(key);
    if (it != idempotency_.end() && !it->second.pending && !it->second.fingerprint.empty() &&
        (it->second.fingerprint[0] == 'o' || it->second.fingerprint[0] == 'a')) {
      ids = it->second.ids;
    }
  }
  if (ids.empty()) throw_no_order_for_key(key, /*purged=*/false);
  std::vector<Reservation> lines = lines_of(ids);
  if (lines.empty()) throw_no_order_for_key(key, /*purged=*/true);
  return lines;
}

// A scan of every reservation (the memory store keeps no index but the orders'): bounded by
// the reservations it holds, which retention bounds.
std::vector<Reservation> MemoryStore::find_reservations(const ReservationQuery& query) {
  expire_lapsed();
  std::vector<Reservation> found;
  for (const ReservationShard& shard : *reservations_) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    for (const auto& [id, record] : shard.records) {
      if ((!query.after || *query.after < id) && matches(record.value, query)) {
        found.push_back(record.value);
      }
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Reservation& a, const Reservation& b) { return a.id < b.id; });
  if (found.size() > query.limit) found.resize(query.limit);
  return found;
}

std::vector<Reservation> MemoryStore::order_step(const OrderStepRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<std::vector<Reservation>>(request.idempotency_key, print,
                                         [&] { return order_step_now(request); });
}

// Every line's shard locked, in shard order (a transition takes one of them; nothing takes
// two but this), then decided on as locked and written line by line: the stock rows and
// the buyers' counts take no lock that could wait on a reservation's.
std::vector<Reservation> MemoryStore::order_step_now(const OrderStepRequest& request) {
  const std::vector<Uuid> ids = order_ids(request.order_id);
  std::set<std::size_t> shards;
  for (const Uuid& id : ids) shards.insert(UuidHash{}(id) % reservation_shards);
  std::vector<std::unique_lock<std::mutex>> locks;
  for (std::size_t s : shards) locks.emplace_back((*reservations_)[s].mutex);
  std::vector<ReservationRecord*> records;
  std::vector<Reservation> lines;
  std::vector<bool> lapsed;
  const TimestampUs now = clock_->now_us();
  for (const Uuid& id : ids) {
    ReservationShard& shard = shard_of(id);
    auto it = shard.records.find(id);
    if (it == shard.records.end()) continue;  // purged: it had ended long ago
    records.push_back(&it->second);
    lines.push_back(it->second.value);
    lapsed.push_back(lines.back().state == ReservationState::held &&
                     now >= lines.back().expires_at_us);
  }
  if (lines.empty()) throw_order_not_found(request.order_id);  // every line purged
  const OrderPlan plan = plan_order_step(request, lines, lapsed);
  for (const PlannedLine& p : plan.lines) {
    if (p.changed) check_units(p.line);  // every line checked before any is written
  }
  const TimestampUs extended =
      request.kind == Transition::extend ? expiry_of(now, request.ttl_us, "the hold") : 0;
  std::vector<Reservation> out;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const PlannedLine& p = plan.lines[i];
    ReservationShard& shard = shard_of(p.line.id);
    ReservationRecord& record = *records[i];
    if (p.expires) {
      expire_locked(shard, record, now);
    } else if (p.extended) {
      Reservation& r = record.value;
      shard.held_by_expiry.erase({r.expires_at_us, r.id});
      r.expires_at_us = extended;
      shard.held_by_expiry.emplace(r.expires_at_us, r.id);
      note_expiry(r.expires_at_us);
    } else if (p.changed) {
      const NoteScope note({request.kind == Transition::confirm ? "confirm" : "release", "", "",
                            p.line.id.to_string()});
      settle_locked(record, p.line, p.moved, now);
    }
    Reservation& r = record.value;
    if (p.changed && !p.expires) {
      r.version += 1;
      r.updated_at_us = now;
      if (r.state != ReservationState::held) {
        shard.held_by_expiry.erase({r.expires_at_us, r.id});
        mark_terminal(shard, r);
      }
    }
    out.push_back(r);
  }
  if (plan.raise_after) throw *plan.raise_after;
  sort_lines(out);
  return out;
}

// Allocation from a pool: the pool's rows latched in key order (under the strategy's row
// locks first, as an order's), decided on the values under the latches, written before
// any latch is released. The buyer's count takes each SKU's whole quantity first, as an
// order's lines do.
std::vector<Reservation> MemoryStore::allocate(const AllocateRequest& request) {
  expire_lapsed();
  purge_as_you_go();
  const auto run = [&] {
    if (!request.options.buyer) return allocate_now(request, LineGroups(request.wants.size()));
    std::vector<OrderLine> asks;
    for (const AllocationWant& want : request.wants) {
      asks.push_back({SkuKey{want.sku, request.locations.front()}, want.qty});
    }
    return within_limits(asks, *request.options.buyer,
                         [&](const LineGroups& groups) { return allocate_now(request, groups); });
  };
  if (!request.idempotency_key) return run();
  return with_idempotency(*request.idempotency_key, fingerprint(request), asked_by(request),
                          request.options, run);
}

std::vector<Reservation> MemoryStore::allocate_now(const AllocateRequest& request,
                                                   const LineGroups& groups) {
  const std::vector<PoolRow> pool = pool_rows(request);
  std::vector<StockRow*> rows;
  std::vector<const PoolRow*> where;
  for (const PoolRow& p : pool) {
    if (StockRow* row = find_row(p.key)) {
      rows.push_back(row);
      where.push_back(&p);
    }
  }
  auto locks = lock_for(rows, request.options);
  std::vector<RowLatch> latches;
  latches.reserve(rows.size());
  for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
  const TimestampUs now = clock_->now_us();
  PoolLevels levels(request.wants.size(),
                    std::vector<std::optional<StockLevel>>(request.locations.size()));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    levels[where[i]->want][where[i]->location] = level_at(rows[i]->key, latches[i].values(), now);
  }
  std::vector<OrderLine> lines;
  try {
    lines = plan_allocation(request, levels);  // throws: every latch released unchanged
  } catch (const Error& e) {
    if (e.code() == ErrorCode::out_of_stock && request.options.count_refusal) {
      for (StockRow* row : rows) telemetry().count(row->key, SkuEvent::refused);
    }
    throw;
  }
  // Each line's row (lines name distinct rows), and the row as the line leaves it, decided
  // before anything is written.
  std::vector<std::size_t> at(lines.size());
  std::vector<RowValues> next;
  for (std::size_t k = 0; k < lines.size(); ++k) {
    while (rows[at[k]]->key != lines[k].key) ++at[k];
    next.push_back(hold_units(nullptr, *rows[at[k]], latches[at[k]].values(), lines[k].qty, now));
  }
  for (std::size_t k = 0; k < lines.size(); ++k) {
    if (request.options.count_request) telemetry().count(rows[at[k]]->key, SkuEvent::request);
    latches[at[k]].publish(next[k], rows[at[k]]->key);
  }
  const Uuid order_id = make_uuid_v7(now / 1000, rows[at.front()]->shard_key);
  std::vector<Reservation> made;
  made.reserve(lines.size());
  for (std::size_t k = 0; k < lines.size(); ++k) {
    StockRow& row = *rows[at[k]];
    Reservation r =
        new_reservation(row, lines[k].qty, request.ttl_us, now, request.idempotency_key);
    r.buyer = request.options.buyer;
    r.ref = request.options.ref;
    r.metadata = request.options.metadata;
    r.order_id = order_id;
    r.limit_group = groups[where[at[k]]->want];
    insert_reservation(r, &row);
    made.push_back(std::move(r));
  }
  note_order(order_id, made);
  return made;
}

}  // namespace stockade::detail
