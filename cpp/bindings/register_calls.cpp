// stockade._core.Engine's blocking calls on stock rows, leases and reservations. The GIL is
// released around every call that may block (locks, backoff, contention), so Python
// threads run the engine in parallel. Arguments arrive already type-checked and converted
// by the Python layer (stockade._calls); values are checked here, in C++.
#include <pybind11/stl.h>

#include <tuple>

#include "bindings.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace stockade::bindings {

std::vector<OrderLine> order_lines(const std::vector<OrderLineIn>& lines) {
  std::vector<OrderLine> order;
  order.reserve(lines.size());
  for (const auto& [sku, location, qty] : lines) order.push_back({{sku, location}, qty});
  return order;
}

std::vector<AllocationWant> allocation_wants(
    const std::vector<std::pair<std::string, Quantity>>& wants) {
  std::vector<AllocationWant> out;
  out.reserve(wants.size());
  for (const auto& [sku, qty] : wants) out.push_back({sku, qty});
  return out;
}

namespace {

void register_lease_calls(py::class_<Engine>& c) {
  c.def(
       "acquire_lease",
       [](Engine& e, const std::string& sku, const std::string& location, std::int64_t ttl_us,
          const std::string& owner) { return e.acquire_lease({sku, location}, ttl_us, owner); },
       py::arg("sku"), py::arg("location"), py::arg("ttl_us"), py::arg("owner"), Release())
      .def(
          "renew_lease",
          [](Engine& e, const std::string& sku, const std::string& location, FencingToken token,
             std::int64_t ttl_us) { return e.renew_lease({sku, location}, token, ttl_us); },
          py::arg("sku"), py::arg("location"), py::arg("token"), py::arg("ttl_us"), Release())
      .def(
          "release_lease",
          [](Engine& e, const std::string& sku, const std::string& location, FencingToken token) {
            return e.release_lease({sku, location}, token);
          },
          py::arg("sku"), py::arg("location"), py::arg("token"), Release());
}

// Backorder limits, quantity states and soft delete.
void register_stock_admin_calls(py::class_<Engine>& c) {
  c.def(
       "set_backorder_limit",
       [](Engine& e, const std::string& sku, const std::string& location, Quantity limit,
          OptInt expected_version, OptInt fencing_token) {
         return e.set_backorder_limit({sku, location}, limit, expected_version, fencing_token);
       },
       py::arg("sku"), py::arg("location"), py::arg("limit"), py::arg("expected_version"),
       py::arg("fencing_token"), Release())
      .def(
          "set_safety_stock",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity units,
             OptInt expected_version, OptInt fencing_token) {
            return e.set_safety_stock({sku, location}, units, expected_version, fencing_token);
          },
          py::arg("sku"), py::arg("location"), py::arg("units"), py::arg("expected_version"),
          py::arg("fencing_token"), Release())
      .def(
          "move_units",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
             const std::string& from_state, const std::string& to_state, const std::string& reason,
             const std::string& actor, OptStr idempotency_key, OptInt expected_version,
             OptInt fencing_token) {
            MoveRequest request;
            request.key = {sku, location};
            request.qty = qty;
            request.from = parse_unit_state(from_state);
            request.to = parse_unit_state(to_state);
            request.idempotency_key = idempotency_key;
            request.expected_version = expected_version;
            request.fencing_token = fencing_token;
            return e.move_units(std::move(request), reason, actor);
          },
          py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("from_state"),
          py::arg("to_state"), py::arg("reason"), py::arg("actor"), py::arg("idempotency_key"),
          py::arg("expected_version"), py::arg("fencing_token"), Release())
      .def(
          "set_discontinued",
          [](Engine& e, const std::string& sku, const std::string& location, bool discontinued,
             OptInt expected_version, OptInt fencing_token) {
            return discontinued ? e.discontinue({sku, location}, expected_version, fencing_token)
                                : e.reinstate({sku, location}, expected_version, fencing_token);
          },
          py::arg("sku"), py::arg("location"), py::arg("discontinued"), py::arg("expected_version"),
          py::arg("fencing_token"), Release());
}

void register_stock_calls(py::class_<Engine>& c) {
  c.def(
       "set_slots",
       [](Engine& e, const std::string& sku, const std::string& location, int slots) {
         return e.set_slots({sku, location}, slots);
       },
       py::arg("sku"), py::arg("location"), py::arg("slots"), Release())
      .def(
          "slot_count",
          [](Engine& e, const std::string& sku, const std::string& location) {
            return e.slot_count({sku, location});
          },
          py::arg("sku"), py::arg("location"), Release());
  c.def(
       "restock",
       [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
          OptInt expected_version, OptInt fencing_token, const std::string& reason,
          const std::string& actor, const OptStr& idempotency_key) {
         return e.restock({sku, location}, qty, expected_version, fencing_token, reason, actor,
                          idempotency_key);
       },
       py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("expected_version"),
       py::arg("fencing_token") = py::none(), py::arg("reason") = "", py::arg("actor") = "",
       py::arg("idempotency_key") = py::none(), Release())
      .def(
          "set_on_hand",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity on_hand,
             OptInt expected_version, OptInt fencing_token, const std::string& reason,
             const std::string& actor, const OptStr& idempotency_key) {
            return e.set_on_hand({sku, location}, on_hand, expected_version, fencing_token, reason,
                                 actor, idempotency_key);
          },
          py::arg("sku"), py::arg("location"), py::arg("on_hand"), py::arg("expected_version"),
          py::arg("fencing_token") = py::none(), py::arg("reason") = "", py::arg("actor") = "",
          py::arg("idempotency_key") = py::none(), Release())
      .def(
          "stock",
          [](Engine& e, const std::string& sku, const std::string& location) {
            return e.stock({sku, location});
          },
          py::arg("sku"), py::arg("location"), Release())
      .def(
          "sell",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
             const OptStr& strategy, bool nowait, OptInt lock_timeout_ms, OptInt expected_version,
             OptInt fencing_token, OptStr idempotency_key, OptStr ref) {
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
            call.fencing_token = fencing_token;
            call.idempotency_key = std::move(idempotency_key);
            call.ref = std::move(ref);
            return e.sell({sku, location}, qty, call);
          },
          py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("strategy"),
          py::arg("nowait"), py::arg("lock_timeout_ms"), py::arg("expected_version"),
          py::arg("fencing_token") = py::none(), py::arg("idempotency_key") = py::none(),
          py::arg("ref") = py::none(), Release());
}

void register_reservation_calls(py::class_<Engine>& c) {
  c.def(
       "reserve",
       [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
          OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
          OptInt lock_timeout_ms, OptInt expected_version, OptStr buyer, OptStr ref,
          OptStr metadata) {
         const CallOptions call =
             hold_options(strategy, nowait, lock_timeout_ms, expected_version, std::move(buyer),
                          std::move(ref), std::move(metadata));
         return e.reserve({sku, location}, qty, ttl_us, std::move(idempotency_key), call);
       },
       py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("ttl_us"),
       py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
       py::arg("lock_timeout_ms"), py::arg("expected_version"), py::arg("buyer") = py::none(),
       py::arg("ref") = py::none(), py::arg("metadata") = py::none(), Release())
      .def(
          "reserve_order",
          [](Engine& e, const std::vector<OrderLineIn>& lines, OptInt ttl_us,
             OptStr idempotency_key, const OptStr& strategy, bool nowait, OptInt lock_timeout_ms,
             OptStr buyer, OptStr ref, OptStr metadata) {
            const std::vector<OrderLine> order = order_lines(lines);
            const CallOptions call =
                hold_options(strategy, nowait, lock_timeout_ms, {}, std::move(buyer),
                             std::move(ref), std::move(metadata));
            return e.reserve_order(order, ttl_us, std::move(idempotency_key), call);
          },
          py::arg("lines"), py::arg("ttl_us"), py::arg("idempotency_key"), py::arg("strategy"),
          py::arg("nowait"), py::arg("lock_timeout_ms"), py::arg("buyer") = py::none(),
          py::arg("ref") = py::none(), py::arg("metadata") = py::none(), Release())
      .def("stock_by_location", &Engine::stock_by_location, py::arg("sku"), py::arg("after"),
           py::arg("limit"), Release())
      .def(
          "allocate",
          [](Engine& e, const std::vector<std::pair<std::string, Quantity>>& wants,
             const std::vector<std::string>& locations, const std::string& policy, bool split,
             OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptStr buyer, OptStr ref, OptStr metadata) {
            const CallOptions call =
                hold_options(strategy, nowait, lock_timeout_ms, {}, std::move(buyer),
                             std::move(ref), std::move(metadata));
            return e.allocate(allocation_wants(wants), locations, allocation_policy(policy), split,
                              ttl_us, std::move(idempotency_key), call);
          },
          py::arg("wants"), py::arg("locations"), py::arg("policy"), py::arg("split"),
          py::arg("ttl_us"), py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
          py::arg("lock_timeout_ms"), py::arg("buyer") = py::none(), py::arg("ref") = py::none(),
          py::arg("metadata") = py::none(), Release())
      .def(
          "set_purchase_limit",
          [](Engine& e, const std::string& group, Quantity per_buyer,
             const std::vector<std::string>& skus) {
            e.set_purchase_limit(PurchaseLimit{group, per_buyer, skus});
          },
          py::arg("group"), py::arg("per_buyer"), py::arg("skus"), Release())
      .def("remove_purchase_limit", &Engine::remove_purchase_limit, py::arg("group"), Release())
      .def("buyer_held", &Engine::buyer_held, py::arg("group"), py::arg("buyer"), Release());
}

// The steps of a reservation after it is made: transitions, resize, return, read-back.
void register_hold_calls(py::class_<Engine>& c) {
  c.def(
       "confirm",
       [](Engine& e, const Uuid& id, OptInt expected_version, OptInt qty, bool release_rest,
          const OptStr& idempotency_key) {
         return e.confirm(id, expected_version, qty, release_rest, idempotency_key);
       },
       py::arg("id"), py::arg("expected_version"), py::arg("qty") = py::none(),
       py::arg("release_rest") = false, py::arg("idempotency_key") = py::none(), Release())
      .def(
          "release",
          [](Engine& e, const Uuid& id, OptInt expected_version, OptInt qty,
             const OptStr& idempotency_key) {
            return e.release(id, expected_version, qty, idempotency_key);
          },
          py::arg("id"), py::arg("expected_version"), py::arg("qty") = py::none(),
          py::arg("idempotency_key") = py::none(), Release())
      .def(
          "extend",
          [](Engine& e, const Uuid& id, std::int64_t ttl_us, OptInt expected_version,
             const OptStr& idempotency_key) {
            return e.extend(id, ttl_us, expected_version, idempotency_key);
          },
          py::arg("id"), py::arg("ttl_us"), py::arg("expected_version"),
          py::arg("idempotency_key") = py::none(), Release())
      .def(
          "resize",
          [](Engine& e, const Uuid& id, Quantity qty, OptInt expected_version,
             const OptStr& idempotency_key) {
            return e.resize(id, qty, expected_version, idempotency_key);
          },
          py::arg("id"), py::arg("qty"), py::arg("expected_version"),
          py::arg("idempotency_key") = py::none(), Release())
      .def(
          "return_units",
          [](Engine& e, const Uuid& id, Quantity qty, bool restock, OptStr location,
             OptInt expected_version, const std::string& reason, const std::string& actor,
             OptStr idempotency_key) {
            return e.return_units({id, qty, restock, std::move(location), expected_version,
                                   std::move(idempotency_key)},
                                  reason, actor);
          },
          py::arg("id"), py::arg("qty"), py::arg("restock"), py::arg("location"),
          py::arg("expected_version"), py::arg("reason"), py::arg("actor"),
          py::arg("idempotency_key") = py::none(), Release())
      .def(
          "get_reservation", [](Engine& e, const Uuid& id) { return e.get_reservation(id); },
          py::arg("id"), Release())

      .def(
          "expire_due", [](Engine& e, std::size_t limit) { return e.expire_due(limit); },
          py::arg("limit"), Release());
}

ReservationState state_named(const std::string& name) {
  for (ReservationState s : {ReservationState::held, ReservationState::confirmed,
                             ReservationState::released, ReservationState::expired}) {
    if (name == reservation_state_name(s)) return s;
  }
  throw_invalid_argument("state must be held, confirmed, released or expired");
}

// An order as one handle: a step of every line, and its lines read back.
void register_order_calls(py::class_<Engine>& c) {
  c.def(
       "order_step",
       [](Engine& e, const std::string& kind, const Uuid& order_id,
          std::vector<std::pair<Uuid, Quantity>> parts, std::int64_t ttl_us, bool release_rest,
          OptStr idempotency_key) {
         OrderStepRequest request;
         request.order_id = order_id;
         if (kind != "confirm" && kind != "release" && kind != "extend") {
           throw_invalid_argument("an order step is confirm, release or extend");
         }
         request.kind = kind == "confirm"   ? Transition::confirm
                        : kind == "release" ? Transition::release
                                            : Transition::extend;
         request.parts = std::move(parts);
         request.ttl_us = ttl_us;
         request.release_rest = release_rest;
         request.idempotency_key = std::move(idempotency_key);
         return e.order_step(request);
       },
       py::arg("kind"), py::arg("order_id"), py::arg("parts"), py::arg("ttl_us"),
       py::arg("release_rest"), py::arg("idempotency_key"), Release())
      .def(
          "get_order", [](Engine& e, const Uuid& order_id) { return e.get_order(order_id); },
          py::arg("order_id"), Release())
      .def(
          "find_reservations",
          [](Engine& e, OptStr ref, std::optional<Uuid> order_id, OptStr buyer, OptStr sku,
             OptStr location, OptStr state, std::optional<Uuid> after, std::size_t limit) {
            ReservationQuery q;
            q.ref = std::move(ref);
            q.order_id = order_id;
            q.buyer = std::move(buyer);
            q.sku = std::move(sku);
            q.location = std::move(location);
            if (state) q.state = state_named(*state);
            q.after = after;
            q.limit = limit;
            return e.reservations(q);
          },
          py::arg("ref"), py::arg("order_id"), py::arg("buyer"), py::arg("sku"),
          py::arg("location"), py::arg("state"), py::arg("after"), py::arg("limit"), Release())
      .def(
          "order_by_key",
          [](Engine& e, const std::string& idempotency_key) {
            return e.order_by_key(idempotency_key);
          },
          py::arg("idempotency_key"), Release());
}

// Transfers between locations.
void register_transfer_calls(py::class_<Engine>& c) {
  c.def(
       "transfer",
       [](Engine& e, const std::string& sku, Quantity qty, const std::string& source,
          const std::string& destination, OptStr reason, OptStr actor, OptStr idempotency_key) {
         TransferRequest request;
         request.sku = sku;
         request.qty = qty;
         request.source = source;
         request.destination = destination;
         request.reason = std::move(reason);
         request.actor = std::move(actor);
         request.idempotency_key = std::move(idempotency_key);
         return e.transfer(std::move(request));
       },
       py::arg("sku"), py::arg("qty"), py::arg("source"), py::arg("destination"), py::arg("reason"),
       py::arg("actor"), py::arg("idempotency_key"), Release())
      .def(
          "transfer_step",
          [](Engine& e, const Uuid& id, bool cancel, Quantity accepted, Quantity rejected,
             OptStr idempotency_key) {
            TransferStepRequest request;
            request.id = id;
            request.cancel = cancel;
            request.accepted = accepted;
            request.rejected = rejected;
            request.idempotency_key = std::move(idempotency_key);
            return e.transfer_step(request);
          },
          py::arg("id"), py::arg("cancel"), py::arg("accepted"), py::arg("rejected"),
          py::arg("idempotency_key"), Release())
      .def(
          "get_transfer", [](Engine& e, const Uuid& id) { return e.get_transfer(id); },
          py::arg("id"), Release())
      .def(
          "transfers",
          [](Engine& e, OptStr sku, OptStr state, std::optional<Uuid> after, std::size_t limit) {
            TransferQuery query;
            query.sku = std::move(sku);
            if (state) query.state = parse_transfer_state(*state);
            query.after = after;
            query.limit = limit;
            return e.transfers(query);
          },
          py::arg("sku"), py::arg("state"), py::arg("after"), py::arg("limit"), Release());
}

// The async twins: each queues its call and returns at once; the outcome reaches the
// channel under `token`. The GIL is released while queueing, which may wait (bounded)
// for room.
}  // namespace

void register_calls(py::class_<Engine>& c) {
  register_stock_calls(c);
  register_stock_admin_calls(c);
  register_lease_calls(c);
  register_reservation_calls(c);
  register_hold_calls(c);
  register_order_calls(c);
  register_transfer_calls(c);
}

}  // namespace stockade::bindings
