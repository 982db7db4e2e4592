// Shared declarations of the stockade._core bindings: one register_<area> per area.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "stockade/engine.hpp"
#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::bindings {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_types(py::module_& m);
void register_options(py::module_& m);
// The Engine class with its construction and lifecycle; each area below adds its calls.
py::class_<Engine> register_engine(py::module_& m);
// The blocking calls on stock rows, leases and reservations (register_calls.cpp).
void register_calls(py::class_<Engine>& c);
// stats(), metrics() and recommend() (register_stats.cpp).
void register_stats(py::class_<Engine>& c);
// The async calls and their AsyncChannel (register_async.cpp).
void register_async(py::module_& m, py::class_<Engine>& c);
// Test hooks and tooling (the oversell canary, hold_lock, the C++ load driver): not part
// of the engine's API, bound apart so that the API's bindings stay the API.
void register_testing(py::module_& m);

using OptInt = std::optional<std::int64_t>;
using OptStr = std::optional<std::string>;
using Release = py::call_guard<py::gil_scoped_release>;
// The journal's, the feed's and the audit's values and calls (register_record.cpp).
void register_record(py::module_& m, py::class_<Engine>& c);

// An order's lines as the Python layer passes them, (sku, location, qty) each, and as the
// engine takes them (register_calls.cpp; the blocking and the async order share it).
using OrderLineIn = std::tuple<std::string, std::string, Quantity>;
// allocate's (sku, qty) pairs as the engine takes them.
std::vector<AllocationWant> allocation_wants(
    const std::vector<std::pair<std::string, Quantity>>& wants);
std::vector<OrderLine> order_lines(const std::vector<OrderLineIn>& lines);

// Per-call options as the Python layer passes them (strategy by name).
CallOptions call_options(const OptStr& strategy, bool nowait, OptInt lock_timeout_ms,
                         OptInt expected_version);
// The same for a call that makes holds (reserve, reserve_order, allocate): with the buyer
// whose purchase limits apply, and the reference and metadata kept with each hold.
CallOptions hold_options(const OptStr& strategy, bool nowait, OptInt lock_timeout_ms,
                         OptInt expected_version, OptStr buyer, OptStr ref, OptStr metadata);

// The stockade.errors exception object for `e` (not raised).
py::object error_object(const Error& e);

// Uuid <-> Python bytes (the Python layer wraps them in uuid.UUID).
py::bytes to_bytes(const Uuid& id);
Uuid uuid_from(const py::bytes& raw);

}  // namespace stockade::bindings

namespace pybind11::detail {

// stockade::Uuid crosses the boundary as a 16-byte `bytes` object, converted while the
// GIL is held (before a call guard releases it).
template <>
struct type_caster<stockade::Uuid> {
  PYBIND11_TYPE_CASTER(stockade::Uuid, const_name("bytes"));

  bool load(handle src, bool) {
    if (!PyBytes_Check(src.ptr()) || PyBytes_GET_SIZE(src.ptr()) != 16) return false;
    value = stockade::Uuid::from_bytes(std::string_view(PyBytes_AS_STRING(src.ptr()), 16));
    return true;
  }
  static handle cast(const stockade::Uuid& id, return_value_policy, handle) {
    return stockade::bindings::to_bytes(id).release();
  }
};

}  // namespace pybind11::detail
