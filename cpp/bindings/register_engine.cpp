// stockade._core.Engine: the engine facade, one method per call of the public API. This
// file binds the class, its construction and its lifecycle; each area adds its calls from
// a file of its own (register_calls, register_stats, register_async, register_record),
// all called from module.cpp. The GIL is released around every call that may block.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace stockade::bindings {

CallOptions call_options(const OptStr& strategy, bool nowait, OptInt lock_timeout_ms,
                         OptInt expected_version) {
  CallOptions call;
  if (strategy) call.strategy = parse_strategy(*strategy);
  call.nowait = nowait;
  call.lock_timeout_ms = lock_timeout_ms;
  call.expected_version = expected_version;
  return call;
}

CallOptions hold_options(const OptStr& strategy, bool nowait, OptInt lock_timeout_ms,
                         OptInt expected_version, OptStr buyer, OptStr ref, OptStr metadata) {
  CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
  call.buyer = std::move(buyer);
  call.ref = std::move(ref);
  call.metadata = std::move(metadata);
  return call;
}

py::class_<Engine> register_engine(py::module_& m) {
  py::class_<Engine> c(m, "Engine", "The engine facade over one store.");
  c.def_static(
       "memory",
       [](const EngineOptions& options, std::shared_ptr<Clock> clock, const MemoryOptions& memory) {
         return Engine::memory(options, std::move(clock), memory);
       },
       py::arg("options"), py::arg("clock"), py::arg("memory"),
       "An engine over an in-process memory store.")
      .def_static(
          "postgres",
          [](const PostgresOptions& postgres, const EngineOptions& options) {
            return Engine::postgres(postgres, options);
          },
          py::arg("postgres"), py::arg("options"), Release(),
          "An engine over PostgreSQL (connects at once).")
      .def("migrate", &Engine::migrate, py::arg("up_to"), Release())
      .def("migration_plan", &Engine::migration_plan, py::arg("up_to"), Release())
      .def("drop_schema", &Engine::drop_schema, Release())
      .def(
          "purge",
          [](Engine& e, std::int64_t older_than_us, std::optional<std::int64_t> limit) {
            return e.purge(older_than_us, limit).total();
          },
          py::arg("older_than_us"), py::arg("limit"), Release())
      .def("row_counts",
           [](const Engine& e) {
             StoreCounts counts;
             {
               py::gil_scoped_release release;
               counts = e.row_counts();
             }
             py::dict out;
             out["sku_count"] = counts.sku_count;
             out["reservation_count"] = counts.reservation_count;
             out["held_count"] = counts.held_count;
             return out;
           })
      .def("close", &Engine::close, Release())
      .def_property_readonly("backend", [](Engine& e) { return e.store().backend_name(); })
      .def_property_readonly("default_strategy", [](const Engine& e) {
        return strategy_name(e.options().default_strategy);
      });
  return c;
}

}  // namespace stockade::bindings
