// Shared declarations of the stockade._core bindings: one register_<area> per area.
#pragma once

#include <pybind11/pybind11.h>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::bindings {

namespace py = pybind11;

void register_errors(py::module_& m);
void register_types(py::module_& m);
void register_engine(py::module_& m);

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
