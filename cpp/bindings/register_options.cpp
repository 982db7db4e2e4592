// The engine's option structs, bound as they are in C++ (engine.hpp, batcher.hpp,
// contention.hpp, memory_store.hpp, postgres_store.hpp): stockade.options fills them from
// the keywords of Engine.memory() and Engine.postgres(), and the core validates them.
// Enumerations cross by name, parsed here with the core's own messages.
#include "bindings.hpp"
#include "stockade/batcher.hpp"
#include "stockade/contention.hpp"
#include "stockade/memory_store.hpp"
#include "stockade/postgres_store.hpp"

namespace stockade::bindings {
namespace {

void register_layer_options(py::module_& m) {
  py::class_<BatcherOptions>(m, "BatcherOptions", "The hot-row batcher's options.")
      .def(py::init<>())
      .def_readwrite("shards", &BatcherOptions::shards)
      .def_readwrite("batch_max", &BatcherOptions::batch_max)
      .def_readwrite("queue_capacity", &BatcherOptions::queue_capacity)
      .def_readwrite("enqueue_timeout_ms", &BatcherOptions::enqueue_timeout_ms)
      .def_readwrite("result_timeout_ms", &BatcherOptions::result_timeout_ms)
      .def_readwrite("lock_slice_ms", &BatcherOptions::lock_slice_ms)
      .def_readwrite("contended_linger_us", &BatcherOptions::contended_linger_us);
  py::class_<AutoOptions>(m, "AutoOptions", "When `auto` switches a SKU between strategies.")
      .def(py::init<>())
      .def_readwrite("hot_in_flight", &AutoOptions::hot_in_flight)
      .def_readwrite("cool_in_flight", &AutoOptions::cool_in_flight)
      .def_readwrite("cool_windows", &AutoOptions::cool_windows)
      .def_readwrite("window_ms", &AutoOptions::window_ms)
      .def_readwrite("cells", &AutoOptions::cells);
  py::class_<EngineOptions>(m, "EngineOptions", "The engine's options, whatever its store.")
      .def(py::init<>())
      .def_property(
          "default_strategy",
          [](const EngineOptions& o) { return std::string(strategy_name(o.default_strategy)); },
          [](EngineOptions& o, const std::string& name) {
            o.default_strategy = parse_strategy(name);
          })
      .def_readwrite("retries_max", &EngineOptions::retries_max)
      .def_readwrite("lock_timeout_ms", &EngineOptions::lock_timeout_ms)
      .def_readwrite("default_ttl_us", &EngineOptions::default_ttl_us)
      .def_readwrite("batcher", &EngineOptions::batcher)
      .def_readwrite("automatic", &EngineOptions::automatic)
      .def_readwrite("sku_entries", &EngineOptions::sku_entries)
      .def_readwrite("async_workers", &EngineOptions::async_workers)
      .def_readwrite("async_queue_max", &EngineOptions::async_queue_max)
      .def_readwrite("home_slot", &EngineOptions::home_slot)
      .def_readwrite("slot_directory", &EngineOptions::slot_directory)
      .def_readwrite("auto_slots_max", &EngineOptions::auto_slots_max)
      .def_readwrite("auto_slots_cool_ms", &EngineOptions::auto_slots_cool_ms);
}

void register_store_options(py::module_& m) {
  py::class_<MemoryOptions>(m, "MemoryOptions", "The memory store's options.")
      .def(py::init<>())
      .def_readwrite("retention_us", &MemoryOptions::retention_us)
      .def_readwrite("journal_max", &MemoryOptions::journal_max)
      .def_readwrite("journal_retention_us", &MemoryOptions::journal_retention_us)
      .def_readwrite("feed_lag_max_us", &MemoryOptions::feed_lag_max_us)
      .def_readwrite("expire_lapsed", &MemoryOptions::expire_lapsed);
  py::class_<PostgresOptions>(m, "PostgresOptions", "The PostgreSQL store's options.")
      .def(py::init<>())
      .def_readwrite("dsn", &PostgresOptions::dsn)
      .def_readwrite("schema", &PostgresOptions::schema)
      .def_readwrite("pool_size", &PostgresOptions::pool_size)
      .def_readwrite("pool_timeout_ms", &PostgresOptions::pool_timeout_ms)
      .def_readwrite("resolve_timeout_ms", &PostgresOptions::resolve_timeout_ms)
      .def_readwrite("call_timeout_ms", &PostgresOptions::call_timeout_ms)
      .def_readwrite("cancel_grace_ms", &PostgresOptions::cancel_grace_ms)
      .def_readwrite("application_name", &PostgresOptions::application_name)
      .def_property(
          "pooler", [](const PostgresOptions& o) { return std::string(pooler_name(o.pooler)); },
          [](PostgresOptions& o, const std::string& name) { o.pooler = pooler_from_name(name); })
      .def_property(
          "layout", [](const PostgresOptions& o) { return std::string(layout_name(o.layout)); },
          [](PostgresOptions& o, const std::string& name) { o.layout = layout_from_name(name); })
      .def_property(
          "citus_routing",
          [](const PostgresOptions& o) { return std::string(citus_routing_name(o.citus_routing)); },
          [](PostgresOptions& o, const std::string& name) {
            o.citus_routing = citus_routing_from_name(name);
          })
      .def_readwrite("sweeper", &PostgresOptions::sweeper)
      .def_readwrite("sweep_interval_ms", &PostgresOptions::sweep_interval_ms)
      .def_readwrite("sweep_batch", &PostgresOptions::sweep_batch)
      .def_readwrite("retention_ms", &PostgresOptions::retention_ms)
      .def_readwrite("purge_batch", &PostgresOptions::purge_batch)
      .def_readwrite("journal_retention_ms", &PostgresOptions::journal_retention_ms)
      .def_readwrite("feed_lag_max_ms", &PostgresOptions::feed_lag_max_ms)
      .def_readwrite("feed_notify", &PostgresOptions::feed_notify);
}

}  // namespace

void register_options(py::module_& m) {
  register_layer_options(m);
  register_store_options(m);
}

}  // namespace stockade::bindings
