// stockade._core's async calls: each is queued in C++ and completes on an AsyncChannel,
// whose eventfd the asyncio glue (stockade.aio) watches; no Python thread waits.
#include <pybind11/stl.h>

#include <type_traits>
#include <variant>

#include "bindings.hpp"
#include "stockade/async.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace stockade::bindings {
namespace {

using Sink = std::shared_ptr<AsyncChannel>;

void register_async_calls(py::class_<Engine>& c) {
  c.def(
       "submit_reserve",
       [](Engine& e, Sink channel, std::uint64_t token, const std::string& sku,
          const std::string& location, Quantity qty, OptInt ttl_us, OptStr idempotency_key,
          const OptStr& strategy, bool nowait, OptInt lock_timeout_ms, OptInt expected_version,
          OptStr buyer, OptStr ref, OptStr metadata) {
         const CallOptions call =
             hold_options(strategy, nowait, lock_timeout_ms, expected_version, std::move(buyer),
                          std::move(ref), std::move(metadata));
         e.submit_reserve({sku, location}, qty, ttl_us, std::move(idempotency_key), call,
                          std::move(channel), token);
       },
       py::arg("channel"), py::arg("token"), py::arg("sku"), py::arg("location"), py::arg("qty"),
       py::arg("ttl_us"), py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
       py::arg("lock_timeout_ms"), py::arg("expected_version"), py::arg("buyer") = py::none(),
       py::arg("ref") = py::none(), py::arg("metadata") = py::none(), Release())
      .def(
          "submit_sell",
          [](Engine& e, Sink channel, std::uint64_t token, const std::string& sku,
             const std::string& location, Quantity qty, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptInt expected_version, OptInt fencing_token,
             OptStr idempotency_key, OptStr ref) {
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
            call.fencing_token = fencing_token;
            call.idempotency_key = std::move(idempotency_key);
            call.ref = std::move(ref);
            e.submit_sell({sku, location}, qty, call, std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("sku"), py::arg("location"), py::arg("qty"),
          py::arg("strategy"), py::arg("nowait"), py::arg("lock_timeout_ms"),
          py::arg("expected_version"), py::arg("fencing_token") = py::none(),
          py::arg("idempotency_key") = py::none(), py::arg("ref") = py::none(), Release())
      .def(
          "submit_reserve_order",
          [](Engine& e, Sink channel, std::uint64_t token, const std::vector<OrderLineIn>& lines,
             OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptStr buyer, OptStr ref, OptStr metadata) {
            const std::vector<OrderLine> order = order_lines(lines);
            const CallOptions call =
                hold_options(strategy, nowait, lock_timeout_ms, {}, std::move(buyer),
                             std::move(ref), std::move(metadata));
            e.submit_reserve_order(order, ttl_us, std::move(idempotency_key), call,
                                   std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("lines"), py::arg("ttl_us"),
          py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
          py::arg("lock_timeout_ms"), py::arg("buyer") = py::none(), py::arg("ref") = py::none(),
          py::arg("metadata") = py::none(), Release());
}

// An allocation from a pool of locations (on the C++ workers; a hot one walks the pool
// through the batcher from there).
void register_async_allocate(py::class_<Engine>& c) {
  c.def(
      "submit_allocate",
      [](Engine& e, Sink channel, std::uint64_t token,
         const std::vector<std::pair<std::string, Quantity>>& wants,
         const std::vector<std::string>& locations, const std::string& policy, bool split,
         OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
         OptInt lock_timeout_ms, OptStr buyer, OptStr ref, OptStr metadata) {
        const CallOptions call =
            hold_options(strategy, nowait, lock_timeout_ms, {}, std::move(buyer), std::move(ref),
                         std::move(metadata));
        e.submit_allocate(allocation_wants(wants), locations, allocation_policy(policy), split,
                          ttl_us, std::move(idempotency_key), call, std::move(channel), token);
      },
      py::arg("channel"), py::arg("token"), py::arg("wants"), py::arg("locations"),
      py::arg("policy"), py::arg("split"), py::arg("ttl_us"), py::arg("idempotency_key"),
      py::arg("strategy"), py::arg("nowait"), py::arg("lock_timeout_ms"),
      py::arg("buyer") = py::none(), py::arg("ref") = py::none(), py::arg("metadata") = py::none(),
      Release());
}

// The async steps of a reservation: confirm and release (batched where the engine batches
// them), extend.
void register_async_steps(py::class_<Engine>& c) {
  auto transition = [](Transition kind) {
    return [kind](Engine& e, Sink channel, std::uint64_t token, const Uuid& id,
                  OptInt expected_version, OptInt qty, bool release_rest, OptStr key) {
      e.submit_transition({id, kind, 0, expected_version, qty, release_rest, std::move(key)},
                          std::move(channel), token);
    };
  };
  c.def("submit_confirm", transition(Transition::confirm), py::arg("channel"), py::arg("token"),
        py::arg("id"), py::arg("expected_version"), py::arg("qty") = py::none(),
        py::arg("release_rest") = false, py::arg("idempotency_key") = py::none(), Release())
      .def("submit_release", transition(Transition::release), py::arg("channel"), py::arg("token"),
           py::arg("id"), py::arg("expected_version"), py::arg("qty") = py::none(),
           py::arg("release_rest") = false, py::arg("idempotency_key") = py::none(), Release())
      .def(
          "submit_extend",
          [](Engine& e, Sink channel, std::uint64_t token, const Uuid& id, std::int64_t ttl_us,
             OptInt expected_version, OptStr key) {
            e.submit_transition({id, Transition::extend, ttl_us, expected_version, std::nullopt,
                                 false, std::move(key)},
                                std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("id"), py::arg("ttl_us"),
          py::arg("expected_version"), py::arg("idempotency_key") = py::none(), Release());
}

// A completion's value as the Python layer receives it: the bound value types, or a list
// of reservations for an order.
py::object completion_value(Completion& c) {
  return std::visit(
      [](auto& v) -> py::object {
        using V = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<V, std::monostate>) {
          return py::none();
        } else {
          return py::cast(std::move(v));
        }
      },
      c.value);
}

void register_async_channel(py::module_& m) {
  py::class_<AsyncChannel, std::shared_ptr<AsyncChannel>>(
      m, "AsyncChannel",
      "Completions of async calls, delivered in bulk: fd becomes readable while some wait; "
      "drain() takes them all as (token, value, error) tuples.")
      .def(py::init<>())
      .def_property_readonly("fd", &AsyncChannel::fd)
      .def("waiting", &AsyncChannel::waiting)
      .def("drain", [](AsyncChannel& channel) {
        std::vector<Completion> done = channel.drain();
        py::list out(done.size());
        for (std::size_t i = 0; i < done.size(); ++i) {
          Completion& c = done[i];
          py::object error = c.error ? error_object(*c.error) : py::object(py::none());
          out[i] = py::make_tuple(c.token, completion_value(c), error);
        }
        return out;
      });
}

}  // namespace

void register_async(py::module_& m, py::class_<Engine>& c) {
  register_async_channel(m);
  register_async_calls(c);
  register_async_allocate(c);
  register_async_steps(c);
}

}  // namespace stockade::bindings
