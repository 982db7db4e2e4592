// Maps stockade::Error to the exception classes of stockade.errors, defined in Python so
// that they can inherit from ValueError, TypeError and NotImplementedError where that
// helps callers. The mapping itself (code -> class) lives in Python too, in one place.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "stockade/errors.hpp"

namespace stockade::bindings {
namespace {

py::object optional_version(const std::optional<std::int64_t>& v) {
  return v ? py::object(py::int_(*v)) : py::object(py::none());
}

void raise_python(const Error& e) {
  py::object exc = error_object(e);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace

py::object error_object(const Error& e) {
  // Looked up on each error, not cached: errors are rare and this keeps module teardown
  // free of dangling references.
  py::object from_core = py::module_::import("stockade.errors").attr("_from_core");
  const ErrorContext& c = e.context();
  py::object rid = c.reservation_id ? py::object(to_bytes(*c.reservation_id)) : py::none();
  return from_core(error_code_name(e.code()), e.what(), c.sku, c.location, rid, c.sqlstate,
                   optional_version(c.expected_version), optional_version(c.actual_version),
                   c.state, c.pool);
}

void register_errors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      raise_python(e);
    }
  });
  py::list codes;
  for (std::size_t i = 0; i < error_code_count; ++i) {
    codes.append(error_code_name(static_cast<ErrorCode>(i)));
  }
  m.attr("ERROR_CODES") = py::tuple(codes);
}

}  // namespace stockade::bindings
