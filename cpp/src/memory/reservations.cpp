// MemoryStore: reservations, their lifecycle, expiry and idempotency keys.
#include <algorithm>
#include <chrono>

#include "memory/memory_store_impl.hpp"
#include "stockade/log.hpp"
#include "store/error_helpers.hpp"
#include "store/fingerprint.hpp"

namespace stockade::detail {

TimestampUs expiry_of(TimestampUs now, std::int64_t ttl_us, const char* what) {
  if (now > timestamp_us_max - ttl_us) {
    throw_invalid_argument(std::string(what) +
                           " would expire after 9999-12-31T23:59:59.999999Z, the last instant a "
                           "timestamp can hold (is a ManualClock set near the year 9999?)");
  }
  return now + ttl_us;
}

Reservation MemoryStore::new_reservation(const StockRow& row, Quantity qty, std::int64_t ttl_us,
                                         TimestampUs now,
                                         const std::optional<std::string>& key) const {
  Reservation r;
  r.id = make_uuid_v7(now / 1000, row.shard_key);
  r.key = row.key;
  r.qty = qty;
  r.state = ReservationState::held;
  r.version = 1;
  r.expires_at_us = expiry_of(now, ttl_us, "the hold");
  r.created_at_us = now;
  r.updated_at_us = now;
  r.idempotency_key = key;
  return r;
}

MemoryStore::ReservationShard& MemoryStore::shard_of(const Uuid& id) const {
  return (*reservations_)[UuidHash{}(id) % reservation_shards];
}

void MemoryStore::insert_reservation(const Reservation& reservation, StockRow* row) {
  ReservationShard& shard = shard_of(reservation.id);
  std::lock_guard<std::mutex> lock(shard.mutex);
  shard.records.emplace(reservation.id, ReservationRecord{reservation, row});
  shard.held_by_expiry.emplace(reservation.expires_at_us, reservation.id);
  note_expiry(reservation.expires_at_us);
}

void MemoryStore::note_expiry(TimestampUs at) {
  TimestampUs seen = earliest_expiry_.load(std::memory_order_relaxed);
  while (at < seen && !earliest_expiry_.compare_exchange_weak(seen, at)) {
  }
}

void MemoryStore::release_stock(StockRow& row, Quantity sold, Quantity freed, TimestampUs now) {
  const auto decide = [&](const RowValues& v) {
    // A held hold's units are reserved.
    STOCKADE_ASSERT(sold >= 0 && freed >= 0 && sold + freed > 0 && sold + freed <= v.reserved);
    RowValues next = changed(v, now);
    next.on_hand -= sold;
    next.reserved -= sold + freed;
    STOCKADE_ASSERT_ROW(next.on_hand, next.reserved, next.backorder_limit);
    return next;
  };
  compare_and_set(row, decide, nullptr);
}

Reservation MemoryStore::reserve_now(StockRow& row, const ReserveRequest& request,
                                     const std::optional<std::string>& group) {
  const TimestampUs now = clock_->now_us();
  // Made before the write, so that only the record's insertion (which fails only when
  // memory is exhausted) stands between the commit and the acknowledgement.
  Reservation reservation =
      new_reservation(row, request.qty, request.ttl_us, now, request.idempotency_key);
  reservation.buyer = request.options.buyer;
  reservation.ref = request.options.ref;
  reservation.metadata = request.options.metadata;
  reservation.limit_group = group;
  reservation.order_id = request.order_id;
  const auto decide = [&](const RowValues& v) {
    check_row(row.key, v, now, request.options.expected_version, std::nullopt);
    return hold_units(request.options.count_refusal ? &telemetry() : nullptr, row, v, request.qty,
                      now);
  };
  apply(row, request.options, decide);
  insert_reservation(reservation, &row);
  if (reservation.order_id) note_order(*reservation.order_id, {reservation});
  return reservation;
}

Reservation MemoryStore::reserve(const ReserveRequest& request) {
  StockRow& row = require_row(request.key);
  expire_lapsed();
  purge_as_you_go();
  const auto run = [&] {
    if (!request.options.buyer) {
      return std::vector<Reservation>{reserve_now(row, request, std::nullopt)};
    }
    return within_limits({OrderLine{request.key, request.qty}}, *request.options.buyer,
                         [&](const LineGroups& groups) {
                           return std::vector<Reservation>{reserve_now(row, request, groups[0])};
                         });
  };
  if (!request.idempotency_key) return run().front();
  return with_idempotency(*request.idempotency_key, fingerprint(request), asked_by(request),
                          request.options, run)
      .front();
}

std::vector<Reservation> MemoryStore::within_limits(
    const std::vector<OrderLine>& lines, const std::string& buyer,
    const std::function<std::vector<Reservation>(const LineGroups&)>& make) {
  LineGroups groups;
  std::map<std::string, GroupAsk> asks;
  {
    std::shared_lock<std::shared_mutex> lock(limits_mutex_);
    asks = group_asks(
        lines,
        [&](const std::string& sku) -> std::optional<std::pair<std::string, Quantity>> {
          auto it = sku_group_.find(sku);
          if (it == sku_group_.end()) return std::nullopt;
          return std::make_pair(it->second, group_limits_.at(it->second));
        },
        groups);
  }
  if (asks.empty()) return make(groups);
  std::vector<std::size_t> stripes;
  for (const auto& [group, ask] : asks) {
    stripes.push_back(stable_hash64({group, buyer}) % buyer_stripes_->size());
  }
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  std::vector<std::unique_lock<std::mutex>> held_stripes;
  for (std::size_t stripe : stripes) held_stripes.emplace_back((*buyer_stripes_)[stripe]);
  {
    std::lock_guard<std::mutex> lock(allowance_mutex_);
    for (const auto& [group, ask] : asks) {
      auto it = allowances_.find(group + '\0' + buyer);
      const Quantity held = it == allowances_.end() ? 0 : it->second;
      if (held + ask.units > ask.per_buyer) {
        telemetry().count(*ask.first, SkuEvent::refused);
        throw limit_exceeded(*ask.first, group, buyer, held, ask.per_buyer, ask.units);
      }
    }
  }
  std::vector<Reservation> made = make(groups);  // throws: nothing was counted
  std::lock_guard<std::mutex> lock(allowance_mutex_);
  for (const auto& [group, ask] : asks) allowances_[group + '\0' + buyer] += ask.units;
  return made;
}

void MemoryStore::give_back(const Reservation& r, Quantity units) {
  if (!r.buyer || !r.limit_group) return;
  std::lock_guard<std::mutex> lock(allowance_mutex_);
  auto it = allowances_.find(*r.limit_group + '\0' + *r.buyer);
  if (it == allowances_.end()) return;  // the group was removed since
  it->second -= std::min(it->second, units);
  if (it->second == 0) allowances_.erase(it);
}

void MemoryStore::set_purchase_limit(const PurchaseLimit& limit) {
  std::unique_lock<std::shared_mutex> lock(limits_mutex_);
  for (const std::string& sku : limit.skus) {
    auto it = sku_group_.find(sku);
    if (it != sku_group_.end() && it->second != limit.group) {
      throw Error(ErrorCode::invalid_state,
                  "sku " + shown(sku) + " is already in purchase-limit group " + shown(it->second) +
                      "; a sku is in one group at most");
    }
  }
  for (auto it = sku_group_.begin(); it != sku_group_.end();) {
    it = it->second == limit.group ? sku_group_.erase(it) : std::next(it);
  }
  for (const std::string& sku : limit.skus) sku_group_[sku] = limit.group;
  group_limits_[limit.group] = limit.per_buyer;
}

bool MemoryStore::remove_purchase_limit(const std::string& group) {
  std::unique_lock<std::shared_mutex> lock(limits_mutex_);
  if (group_limits_.erase(group) == 0) return false;
  for (auto it = sku_group_.begin(); it != sku_group_.end();) {
    it = it->second == group ? sku_group_.erase(it) : std::next(it);
  }
  std::lock_guard<std::mutex> counts(allowance_mutex_);
  const std::string prefix = group + '\0';
  for (auto it = allowances_.begin(); it != allowances_.end();) {
    it = it->first.compare(0, prefix.size(), prefix) == 0 ? allowances_.erase(it) : std::next(it);
  }
  return true;
}

Quantity MemoryStore::buyer_held(const std::string& group, const std::string& buyer) {
  expire_lapsed();
  std::lock_guard<std::mutex> lock(allowance_mutex_);
  auto it = allowances_.find(group + '\0' + buyer);
  return it == allowances_.end() ? 0 : it->second;
}

std::vector<Reservation> MemoryStore::order_now(const OrderRequest& request,
                                                const LineGroups& groups) {
  // Lock order is sorted (sku, location); results come back in the caller's line order.
  std::vector<std::size_t> order(request.lines.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return request.lines[a].key < request.lines[b].key;
  });
  std::vector<StockRow*> rows;
  std::vector<Quantity> qtys;
  for (std::size_t i : order) {
    rows.push_back(&require_row(request.lines[i].key));
    qtys.push_back(request.lines[i].qty);
  }
  const TimestampUs now = clock_->now_us();
  std::vector<Reservation> made(request.lines.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    made[order[k]] =
        new_reservation(*rows[k], qtys[k], request.ttl_us, now, request.idempotency_key);
    made[order[k]].buyer = request.options.buyer;
    made[order[k]].ref = request.options.ref;
    made[order[k]].metadata = request.options.metadata;
    made[order[k]].limit_group = groups[order[k]];
  }
  // The order's id carries its first row's shard key, as on PostgreSQL (its key's shard).
  const Uuid order_id = make_uuid_v7(now / 1000, rows.front()->shard_key);
  for (Reservation& r : made) r.order_id = order_id;
  apply_order(rows, qtys, request.options, now);
  for (std::size_t k = 0; k < order.size(); ++k) insert_reservation(made[order[k]], rows[k]);
  note_order(order_id, made);
  return made;
}

std::vector<Reservation> MemoryStore::reserve_order(const OrderRequest& request) {
  for (const auto& line : request.lines) require_row(line.key);  // NotFound before any write
  expire_lapsed();
  purge_as_you_go();
  const auto run = [&] {
    if (!request.options.buyer) return order_now(request, LineGroups(request.lines.size()));
    return within_limits(request.lines, *request.options.buyer,
                         [&](const LineGroups& groups) { return order_now(request, groups); });
  };
  if (!request.idempotency_key) return run();
  std::vector<Reservation> made = with_idempotency(*request.idempotency_key, fingerprint(request),
                                                   asked_by(request), request.options, run);
  // A replay returns the reservations in this call's line order, whatever the first
  // call's order was (the fingerprint ignores line order).
  std::vector<Reservation> out;
  out.reserve(made.size());
  for (const OrderLine& line : request.lines) {
    for (const Reservation& r : made) {
      if (r.key == line.key) out.push_back(r);
    }
  }
  return out;
}

std::vector<Reservation> MemoryStore::fetch_all(const std::vector<Uuid>& ids) {
  std::vector<Reservation> out;
  out.reserve(ids.size());
  for (const Uuid& id : ids) out.push_back(get_reservation(id));
  return out;
}

void MemoryStore::expire_locked(ReservationShard& shard, ReservationRecord& record,
                                TimestampUs now) {
  Reservation& r = record.value;
  const Quantity units = r.held();  // a part may have been confirmed or released already
  {
    const NoteScope note({"expire", "", "", r.id.to_string()});
    release_stock(*record.row, 0, units, now);
  }
  give_back(r, units);
  shard.held_by_expiry.erase({r.expires_at_us, r.id});
  settle_units(r, Settle::expire, units);
  r.version += 1;
  r.updated_at_us = now;
  mark_terminal(shard, r);
}

void MemoryStore::mark_terminal(ReservationShard& shard, const Reservation& r) {
  shard.terminal_by_time.emplace(r.updated_at_us, r.id);
}

Reservation MemoryStore::transition(const TransitionRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<Reservation>(request.idempotency_key, print,
                            [&] { return transition_now(request); });
}

Reservation MemoryStore::transition_now(const TransitionRequest& request) {
  const Uuid& id = request.id;
  const Transition kind = request.kind;
  ReservationShard& shard = shard_of(id);
  std::lock_guard<std::mutex> lock(shard.mutex);
  TimestampUs now = 0;
  ReservationRecord& record = live_hold(shard, id, request.expected_version, now);
  Reservation& r = record.value;
  const TimestampUs extended =
      kind == Transition::extend ? expiry_of(now, request.ttl_us, "the hold") : 0;
  if (kind == Transition::extend) {
    shard.held_by_expiry.erase({r.expires_at_us, r.id});
    r.expires_at_us = extended;
    shard.held_by_expiry.emplace(r.expires_at_us, r.id);
    note_expiry(r.expires_at_us);
  } else {
    Reservation next = r;  // decided first: a refusal changes nothing
    const Settlement moved = settle_transition(next, kind == Transition::confirm,
                                               request.qty.value_or(0), request.release_rest);
    settle_locked(record, std::move(next), moved, now);
  }
  r.version += 1;
  r.updated_at_us = now;
  if (r.state != ReservationState::held) {  // nothing is held any more
    shard.held_by_expiry.erase({r.expires_at_us, r.id});
    mark_terminal(shard, r);
  }
  return r;
}

// Writes what a step decided for a reservation, under its lock: `next` (its new units and
// state, checked first), the row's units and the buyer's count. Not the version.
void MemoryStore::settle_locked(ReservationRecord& record, Reservation next,
                                const Settlement& moved, TimestampUs now) {
  check_units(next);
  release_stock(*record.row, moved.sold, moved.freed, now);
  give_back(record.value, moved.freed);
  record.value = std::move(next);
}

// Under the reservation's lock: decided on a copy, then the units go back on hand (a
// restock of the row, which may refuse: a discontinued or leased row), then the buyer's
// count and the reservation change. A refusal changes nothing.
Reservation MemoryStore::return_units(const ReturnRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<Reservation>(request.idempotency_key, print, [&] { return return_now(request); });
}

Reservation MemoryStore::return_now(const ReturnRequest& request) {
  ReservationShard& shard = shard_of(request.id);
  std::lock_guard<std::mutex> lock(shard.mutex);
  auto it = shard.records.find(request.id);
  if (it == shard.records.end()) throw_reservation_not_found(request.id);
  Reservation& r = it->second.value;
  check_expected(r, request.expected_version);
  Reservation next = r;
  take_return(next, request.qty);
  check_units(next);
  if (request.restock) restock(return_row(r, request.location), request.qty, {}, {});
  give_back(r, request.qty);
  next.version += 1;
  next.updated_at_us = clock_->now_us();
  if (r.state != ReservationState::held) {  // retention reads its last change from here
    shard.terminal_by_time.erase({r.updated_at_us, r.id});
    mark_terminal(shard, next);
  }
  r = std::move(next);
  return r;
}

// A held, unlapsed reservation under its shard's lock, as every step finds it (confirm,
// release, extend, resize): checks the expected version and the state (check_live), and
// expires it lazily if it lapsed, as the sweeper would have (then throws). `now` is the
// time it was found live at, which the step writes with: a later reading could pass the
// hold's expiry.
ReservationRecord& MemoryStore::live_hold(ReservationShard& shard, const Uuid& id,
                                          const std::optional<Version>& expected,
                                          TimestampUs& now) {
  auto it = shard.records.find(id);
  if (it == shard.records.end()) throw_reservation_not_found(id);
  ReservationRecord& record = it->second;
  check_live(record.value, expected);
  now = clock_->now_us();
  if (now >= record.value.expires_at_us) {
    expire_locked(shard, record, now);
    throw not_holdable(record.value);
  }
  return record;
}

// A shrink is decided and written under the reservation's lock. A growth counts against
// the buyer's purchase limit first (within_limits takes the buyer's locks before any
// reservation's, as a reserve does), then decides again under the reservation's lock: if
// the hold changed in between (another step), it starts over.
Reservation MemoryStore::resize(const ResizeRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<Reservation>(request.idempotency_key, print, [&] { return resize_now(request); });
}

Reservation MemoryStore::resize_now(const ResizeRequest& request) {
  expire_lapsed();
  ReservationShard& shard = shard_of(request.id);
  for (;;) {
    Reservation seen;
    {
      std::lock_guard<std::mutex> lock(shard.mutex);
      TimestampUs now = 0;
      ReservationRecord& record = live_hold(shard, request.id, request.expected_version, now);
      Reservation& r = record.value;
      const Quantity delta = resize_delta(r, request.qty);
      if (delta == 0) return r;
      if (delta < 0) {  // a release of the units it no longer holds
        Reservation next = r;
        const Settlement moved = settle_transition(next, /*confirm=*/false, -delta, false);
        settle_locked(record, std::move(next), moved, now);
        r.version += 1;
        r.updated_at_us = now;
        return r;
      }
      seen = r;
    }
    const Quantity delta = resize_delta(seen, request.qty);
    struct HoldChanged {};  // thrown through within_limits, which then counts nothing
    const auto grow = [&](const LineGroups& groups) {
      if (groups.at(0) != seen.limit_group) throw group_changed(seen);
      std::lock_guard<std::mutex> lock(shard.mutex);
      TimestampUs now = 0;
      ReservationRecord& record = live_hold(shard, request.id, request.expected_version, now);
      Reservation& r = record.value;
      if (r.version != seen.version) throw HoldChanged{};
      Reservation next = r;
      grow_hold(next, delta);
      check_units(next);
      compare_and_set(
          *record.row,
          [&](const RowValues& v) { return hold_units(&telemetry(), *record.row, v, delta, now); },
          nullptr);
      r = std::move(next);
      r.version += 1;
      r.updated_at_us = now;
      return std::vector<Reservation>{r};
    };
    try {
      if (!seen.buyer) return grow(LineGroups{std::nullopt}).front();
      return within_limits({OrderLine{seen.key, delta}}, *seen.buyer, grow).front();
    } catch (const HoldChanged&) {
      continue;  // another step of this hold came between: decide again
    }
  }
}

Reservation MemoryStore::get_reservation(const Uuid& id) {
  ReservationShard& shard = shard_of(id);
  std::lock_guard<std::mutex> lock(shard.mutex);
  auto it = shard.records.find(id);
  if (it == shard.records.end()) throw_reservation_not_found(id);
  ReservationRecord& record = it->second;
  if (options_.expire_lapsed && record.value.state == ReservationState::held) {
    const TimestampUs now = clock_->now_us();
    if (now >= record.value.expires_at_us) expire_locked(shard, record, now);  // it lapsed
  }
  return record.value;
}

std::size_t MemoryStore::expire_due(std::size_t limit) {
  TimestampUs next = 0;
  return expire_until(clock_->now_us(), limit, &next);
}

std::size_t MemoryStore::expire_until(TimestampUs now, std::size_t limit, TimestampUs* next) {
  std::size_t expired = 0;
  *next = std::numeric_limits<TimestampUs>::max();
  // Start at a rotating shard so that small limits do not always favour shard 0.
  const std::size_t first = expire_cursor_.fetch_add(1, std::memory_order_relaxed);
  for (std::size_t n = 0; n < reservation_shards; ++n) {
    if (expired >= limit) {
      *next = std::min(*next, now);  // shards not gone through may have due holds
      break;
    }
    ReservationShard& shard = (*reservations_)[(first + n) % reservation_shards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    while (expired < limit && !shard.held_by_expiry.empty() &&
           shard.held_by_expiry.begin()->first <= now) {
      const Uuid id = shard.held_by_expiry.begin()->second;
      expire_locked(shard, shard.records.at(id), now);
      ++expired;
    }
    if (!shard.held_by_expiry.empty()) {
      *next = std::min(*next, shard.held_by_expiry.begin()->first);
    }
  }
  return expired;
}

void MemoryStore::expire_lapsed() {
  if (!options_.expire_lapsed) return;
  const TimestampUs now = clock_->now_us();
  if (now < earliest_expiry_.load(std::memory_order_acquire)) return;
  // Raised first, so that a hold made during the pass lowers it again (note_expiry).
  earliest_expiry_.store(std::numeric_limits<TimestampUs>::max(), std::memory_order_release);
  TimestampUs next = 0;
  try {
    expire_until(now, expire_lapsed_batch, &next);
  } catch (const Error& e) {
    // The pass is housekeeping of someone else's holds: the caller's own call goes on, and
    // the next one tries again (the hint stays due).
    note_expiry(now);
    log(LogLevel::debug, "stockade", std::string("expiring lapsed holds failed: ") + e.what());
    return;
  }
  note_expiry(next);
}

std::size_t MemoryStore::free_lapsed(std::size_t limit) {
  if (!options_.expire_lapsed) return 0;
  const std::size_t freed = expire_due(limit);
  if (freed > 0) telemetry().freed_on_refusal(freed);
  return freed;
}

StoreCounts MemoryStore::counts() const {
  StoreCounts out;
  for (const StockShard& shard : *stock_) {
    std::shared_lock<std::shared_mutex> lock(shard.mutex);
    out.sku_count += shard.rows.size();
  }
  for (const ReservationShard& shard : *reservations_) {
    std::lock_guard<std::mutex> lock(shard.mutex);
    out.reservation_count += shard.records.size();
    out.held_count += shard.held_by_expiry.size();
  }
  return out;
}

}  // namespace stockade::detail

namespace stockade {

std::shared_ptr<Store> make_memory_store(std::shared_ptr<Clock> clock,
                                         std::shared_ptr<Telemetry> telemetry,
                                         MemoryOptions options) {
  if (!clock) clock = system_clock();
  if (options.retention_us < 0) throw_invalid_argument("retention must not be negative");
  return std::make_shared<detail::MemoryStore>(std::move(clock), std::move(telemetry), options);
}

}  // namespace stockade

namespace stockade::detail {

// A memory "transaction" is one compare-and-set, so there is no commit to amortize: the
// batch is applied request by request, in arrival order, through the atomic path. That
// keeps the batch's semantics (arrival-order decisions, idempotency inside the batch,
// per-request errors) identical to PostgreSQL's, which is what the memory store is for.
void MemoryStore::apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) {
  expire_lapsed();
  WriteOptions write;
  write.strategy = Strategy::atomic;
  write.lock_timeout_ms = options.lock_timeout_ms;
  for (BatchItem* item : items) {
    item->clear_outcome();
    write.count_request = item->count_request;
    write.count_refusal = item->count_refusal;
    try {
      switch (item->op) {
        case BatchOp::reserve: {
          ReserveRequest request{item->key, item->qty,     item->ttl_us, item->idempotency_key,
                                 write,     item->order_id};
          request.options.buyer = item->buyer;
          request.options.ref = item->ref;
          request.options.metadata = item->metadata;
          item->reservation = reserve(request);
          break;
        }
        case BatchOp::sell:
          item->level = sell(SellRequest{item->key, item->qty, write, item->idempotency_key});
          break;
        case BatchOp::confirm:
        case BatchOp::release:
          item->reservation = transition(
              {item->id, item->op == BatchOp::confirm ? Transition::confirm : Transition::release,
               0, item->expected_version,
               item->qty > 0 ? std::optional<Quantity>(item->qty) : std::nullopt,
               item->release_rest, item->idempotency_key});
          break;
      }
      item->ok = true;
    } catch (const Error& e) {
      item->error = e;
    }
  }
}

}  // namespace stockade::detail
