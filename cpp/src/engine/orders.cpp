// Engine: an order as one handle (order_step, get_order, order_by_key), and allocation
// from a pool of locations (allocate), which makes one. Each runs per request on the
// store, in one transaction; the lines come back with their SKU's own keys.
#include "store/orders.hpp"

#include <set>

#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "stockade/engine.hpp"
#include "store/allocation.hpp"
#include "store/error_helpers.hpp"

namespace stockade {
namespace {

using detail::step_name;

Op step_op(Transition kind) {
  return kind == Transition::confirm   ? Op::confirm_order
         : kind == Transition::release ? Op::release_order
                                       : Op::extend_order;
}

std::vector<Reservation> unslotted(std::vector<Reservation> lines) {
  for (Reservation& r : lines) detail::unslot(r);
  return lines;
}

}  // namespace

std::vector<Reservation> Engine::order_step(const OrderStepRequest& request) {
  check_process();
  if (request.kind == Transition::extend) {
    validate_ttl_us(request.ttl_us);
    if (!request.parts.empty()) {
      throw_invalid_argument("qty applies to confirm_order and release_order, not to extend_order");
    }
  }
  if (request.release_rest && request.kind != Transition::confirm) {
    throw_invalid_argument(std::string("release_rest applies to confirm_order, not to ") +
                           step_name(request.kind));
  }
  if (request.parts.size() > order_lines_max) {
    throw_invalid_argument("an order has at most " + std::to_string(order_lines_max) +
                           " lines; qty names " + std::to_string(request.parts.size()));
  }
  for (const auto& part : request.parts) validate_qty(part.second);
  validate_idempotency_key(request.idempotency_key);
  return unslotted(observed(step_op(request.kind), [&] { return store_->order_step(request); }));
}

std::vector<Reservation> Engine::get_order(const Uuid& order_id) {
  check_process();
  return unslotted(observed(Op::order, [&] { return store_->get_order(order_id); }));
}

std::vector<Reservation> Engine::order_by_key(const std::string& idempotency_key) {
  check_process();
  validate_idempotency_key(idempotency_key);
  return unslotted(observed(Op::order, [&] { return store_->order_by_key(idempotency_key); }));
}

std::vector<Reservation> Engine::reservations(const ReservationQuery& query) {
  check_process();
  if (!query.ref && !query.order_id && !query.buyer) {
    throw_invalid_argument("reservations() finds by ref, order or buyer: give one of them");
  }
  if (query.limit == 0 || query.limit > reservations_limit_max) {
    throw_invalid_argument("limit must be between 1 and " + std::to_string(reservations_limit_max) +
                           ", got " + std::to_string(query.limit));
  }
  if (query.ref) validate_ref(*query.ref);
  if (query.buyer) validate_buyer(*query.buyer);
  if (query.sku || query.location) {
    validate_sku_key({query.sku.value_or("sku"), query.location.value_or("location"), 0});
  }
  return unslotted(observed(Op::reservations, [&] { return store_->find_reservations(query); }));
}

AllocateRequest Engine::allocate_request(const std::vector<AllocationWant>& wants,
                                         const std::vector<std::string>& locations,
                                         AllocationPolicy policy, bool split,
                                         std::optional<std::int64_t> ttl_us,
                                         std::optional<std::string> idempotency_key,
                                         const CallOptions& call) const {
  if (wants.empty()) throw_invalid_argument("an allocation needs at least one sku");
  if (wants.size() > order_lines_max) {
    throw_invalid_argument("an allocation has at most " + std::to_string(order_lines_max) +
                           " skus (ORDER_LINES_MAX), got " + std::to_string(wants.size()));
  }
  if (locations.empty()) throw_invalid_argument("locations must name at least one location");
  if (locations.size() > allocate_locations_max) {
    throw_invalid_argument("a pool has at most " + std::to_string(allocate_locations_max) +
                           " locations (ALLOCATE_LOCATIONS_MAX), got " +
                           std::to_string(locations.size()));
  }
  std::set<std::string> seen;
  for (const std::string& location : locations) {
    validate_sku_key(SkuKey{wants.front().sku, location});
    if (!seen.insert(location).second) {
      throw_invalid_argument("locations names " + shown(location) + " twice");
    }
  }
  seen.clear();
  for (const AllocationWant& want : wants) {
    validate_sku_key(SkuKey{want.sku, locations.front()});
    validate_qty(want.qty);
    if (!seen.insert(want.sku).second) {
      throw_invalid_argument("the allocation names sku " + shown(want.sku) + " twice");
    }
  }
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  if (call.expected_version) throw_invalid_argument("allocate does not take expected_version");
  if (call.fencing_token) throw_invalid_argument("allocate does not take a fencing token");
  AllocateRequest request{wants,
                          locations,
                          policy,
                          split,
                          ttl_us.value_or(options_.default_ttl_us),
                          std::move(idempotency_key),
                          resolve(call)};
  // The store runs it per request whatever was asked, locking the pool's rows under every
  // strategy (a batched walk over the pool is the engine's: allocate_batched).
  if (request.options.strategy == Strategy::batched ||
      request.options.strategy == Strategy::automatic) {
    request.options.strategy = Strategy::atomic;
  }
  return request;
}

std::vector<Reservation> Engine::allocate(const std::vector<AllocationWant>& wants,
                                          const std::vector<std::string>& locations,
                                          AllocationPolicy policy, bool split,
                                          std::optional<std::int64_t> ttl_us,
                                          std::optional<std::string> idempotency_key,
                                          const CallOptions& call) {
  check_process();
  AllocateRequest request =
      allocate_request(wants, locations, policy, split, ttl_us, std::move(idempotency_key), call);
  const std::int64_t started = steady_now_us();
  // An allocation is a request on its first location's row: the heat `auto` reads there.
  const SkuKey first{request.wants.front().sku, request.locations.front()};
  const Route r = route(first, call, BatchOp::reserve);  // entered the tracker
  detail::engine::InFlight entry(tracker_, row_shard_key(first.sku, first.location));
  if (r.batched && request.wants.size() == 1 && request.policy == AllocationPolicy::priority &&
      !request.idempotency_key) {
    if (std::optional<Reservation> made = allocate_batched(request, r, entry, started)) {
      return {std::move(*made)};
    }
    entry.again();
    request.options.count_request = false;  // the walk counted the request per SKU
  }
  return allocate_locked(request, r.asked, started);
}

namespace {

// Whether a batched hold's failure at one location of a walk leaves the decision to the
// locked pool, which reads that row as giving nothing (no row, discontinued, leased), or
// reads it again (a slotted location that took too many rounds): no hold was made. Any
// other failure (InDoubt, a lost server, a deadline) ends the call.
bool row_gives_nothing(ErrorCode code) {
  return code == ErrorCode::not_found || code == ErrorCode::discontinued ||
         code == ErrorCode::lease_held || code == ErrorCode::fencing_token_stale ||
         code == ErrorCode::overloaded;
}

}  // namespace

// The hot path (priority, one SKU, no key): the pool's locations in order, each a batched
// hold of the whole quantity on its row (through the slot router, so a slotted location
// moves units between its rows as a reserve does), decided under that row's lock in its
// batch. It passes a location over only when its row had no free unit then (or, without
// split, not the whole quantity); a location with part of the quantity, or a row the
// locked pool reads as giving nothing, ends the walk: the locked path decides then, and
// when every location was passed over, so that a refusal is always the whole pool's at
// one moment.
std::optional<Reservation> Engine::allocate_batched(const AllocateRequest& request,
                                                    const Route& first,
                                                    detail::engine::InFlight& entry,
                                                    std::int64_t started) {
  const AllocationWant& want = request.wants.front();
  const Uuid order_id = make_uuid_v7(SystemClock().now_us() / 1000,
                                     row_shard_key(want.sku, request.locations.front()));
  CallOptions call;
  call.strategy = first.asked;
  call.lock_timeout_ms = first.options.lock_timeout_ms;
  for (std::size_t l = 0; l < request.locations.size(); ++l) {
    const SkuKey key{want.sku, request.locations[l]};
    Route r = first;
    bool entered = true;  // the tracker counts this location's request, not yet handed on
    if (l == 0) {
      entry.hand_over();  // the first attempt's batch leaves the tracker for it
    } else {
      r = route(key, call, BatchOp::reserve);
      if (!r.batched) {
        tracker_.leave(key);
        return std::nullopt;  // a location that is not hot: the locked path decides
      }
    }
    try {
      Reservation made = slots_->run<Reservation>(
          key, want.qty, std::nullopt, /*continued=*/false, /*spread=*/true,
          [&](const SkuKey& row, const detail::SlotAttempt& a) {
            if (!entered) tracker_.enter(key);
            entered = false;  // the batcher leaves the tracker however the attempt ends
            BatchItem item =
                detail::engine::reserve_item(row, want.qty, request.ttl_us, std::nullopt, r.asked);
            item.counted_as.reset();  // the engine counts and records the call, once
            item.started_us = 0;
            item.buyer = request.options.buyer;
            item.ref = request.options.ref;
            item.metadata = request.options.metadata;
            item.order_id = order_id;
            Route each = r;
            each.started_us = 0;
            each.options.count_request = a.count_request;
            each.options.count_refusal = false;
            through_batcher(item, each, nullptr, 0);
            return std::move(item.reservation);
          },
          [](const Error&, bool) {});  // not yet the call's outcome: recorded below
      detail::unslot(made);
      record_outcome(Op::allocate, first.asked, nullptr, started);
      return made;
    } catch (const Error& e) {
      if (entered) tracker_.leave(key);
      if (row_gives_nothing(e.code())) return std::nullopt;
      if (e.code() != ErrorCode::out_of_stock) {
        record_outcome(Op::allocate, first.asked, &e, started);
        throw;
      }
      const bool nothing_here = e.context().available && *e.context().available <= 0;
      if (request.split && !nothing_here) return std::nullopt;
    }
  }
  return std::nullopt;
}

std::vector<Reservation> Engine::allocate_locked(AllocateRequest request, Strategy asked,
                                                 std::int64_t started) {
  // A refusal frees lapsed holds once (as a reserve's does) and, on a location where this
  // engine knows the SKU has hot-row slots, moves their free units to the SKU's own row
  // there, which is the row an allocation takes from; then the allocation runs again.
  const bool count_request = request.options.count_request;
  for (int round = 1;; ++round) {
    request.options.count_request = count_request && round == 1;
    request.options.count_refusal = false;
    std::optional<Error> refusal;
    try {
      std::vector<Reservation> made =
          counted<std::vector<Reservation>>(Op::allocate, asked, /*refusal_final=*/false, started,
                                            [&] { return store_->allocate(request); });
      detail::allocation_order(request, made);
      return unslotted(std::move(made));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_stock) throw;  // counted() recorded it
      refusal = e;
    }
    try {
      bool again = round == 1 && slots_->freed_lapsed_holds();
      if (!again && round < slots_->rounds()) again = refilled_pool(request, *refusal);
      if (again) continue;
    } catch (const Error& e) {  // moving units failed: the call's outcome
      record_outcome(Op::allocate, asked, &e, started);
      throw;
    }
    const std::string& sku = refusal->context().sku;
    if (!sku.empty()) telemetry_->count(SkuKey{sku, request.locations.front()}, SkuEvent::refused);
    record_outcome(Op::allocate, asked, &*refusal, started);
    throw *refusal;
  }
}

// On each location of the pool where this engine knows the SKU has hot-row slots, moves
// into its own row as many of the location's free units as the SKU asks for (or all it
// has, when that is less: a split takes the rest elsewhere).
bool Engine::refilled_pool(const AllocateRequest& request, const Error& refusal) {
  bool moved = false;
  for (const AllocationWant& want : request.wants) {
    if (!refusal.context().sku.empty() && refusal.context().sku != want.sku) continue;
    for (const std::string& location : request.locations) {
      const SkuKey own{want.sku, location};
      if (slots_->known_slots(own) <= 1) continue;
      const Quantity free = slots_->stock(own).available();
      if (free <= 0) continue;
      try {
        slots_->refill_row(own, std::min(want.qty, free), refusal);
        moved = true;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::out_of_stock) throw;  // short there now: next location
      }
    }
  }
  return moved;
}

std::vector<StockLevel> Engine::stock_by_location(const std::string& sku,
                                                  const std::optional<std::string>& after,
                                                  std::size_t limit) {
  check_process();
  validate_sku_key(SkuKey{sku, after.value_or(default_location)});
  if (limit < 1 || limit > locations_limit_max) {
    throw_invalid_argument("limit must be between 1 and " + std::to_string(locations_limit_max) +
                           " (LOCATIONS_LIMIT_MAX), got " + std::to_string(limit));
  }
  return observed(Op::stock, [&] {
    std::vector<StockLevel> out;
    for (const std::string& location : store_->sku_locations(sku, after, limit)) {
      out.push_back(slots_->stock(SkuKey{sku, location}));
    }
    return out;
  });
}

}  // namespace stockade
