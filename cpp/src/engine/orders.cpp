// Engine: an order as one handle (order_step, get_order, order_by_key). Each runs per
// request on the store, in one transaction; the lines come back with their SKU's own keys.
#include "store/orders.hpp"
#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "stockade/engine.hpp"
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

}  // namespace stockade
