#include <pybind11/stl.h>

#include <cstring>

#include "bindings.hpp"
#include "stockade/batcher.hpp"
#include "stockade/clock.hpp"
#include "stockade/contention.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"
#include "stockade/hash.hpp"
#include "stockade/log.hpp"
#include "stockade/postgres_store.hpp"

namespace stockade::bindings {

py::bytes to_bytes(const Uuid& id) {
  return py::bytes(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
}

Uuid uuid_from(const py::bytes& raw) {
  char* data = nullptr;
  Py_ssize_t size = 0;
  if (PyBytes_AsStringAndSize(raw.ptr(), &data, &size) != 0) throw py::error_already_set();
  return Uuid::from_bytes(std::string_view(data, static_cast<std::size_t>(size)));
}

namespace {

// The values the engine returns: raw fields, times in microseconds.
void register_values(py::module_& m) {
  py::class_<StockLevel>(m, "StockLevel", "A stock row as committed: raw fields, times in us.")
      .def_property_readonly("sku", [](const StockLevel& s) { return s.key.sku; })
      .def_property_readonly("location", [](const StockLevel& s) { return s.key.location; })
      .def_readonly("on_hand", &StockLevel::on_hand)
      .def_readonly("reserved", &StockLevel::reserved)
      .def_property_readonly("available", &StockLevel::available)
      .def_readonly("version", &StockLevel::version)
      .def_readonly("updated_at_us", &StockLevel::updated_at_us)
      .def_readonly("backorder_limit", &StockLevel::backorder_limit)
      .def_property_readonly("backordered", &StockLevel::backordered)
      .def_readonly("discontinued", &StockLevel::discontinued)
      .def_readonly("leased", &StockLevel::leased)
      .def_readonly("lease_expires_at_us", &StockLevel::lease_expires_at_us)
      .def_readonly("low_stock", &StockLevel::low_stock)
      .def_readonly("safety_stock", &StockLevel::safety_stock)
      .def_readonly("damaged", &StockLevel::damaged)
      .def_readonly("quality_control", &StockLevel::quality_control)
      .def_readonly("incoming", &StockLevel::incoming);

  py::class_<Lease>(m, "Lease", "A lease on a stock row, with its fencing token; times in us.")
      .def_property_readonly("sku", [](const Lease& l) { return l.key.sku; })
      .def_property_readonly("location", [](const Lease& l) { return l.key.location; })
      .def_readonly("owner", &Lease::owner)
      .def_readonly("token", &Lease::token)
      .def_readonly("expires_at_us", &Lease::expires_at_us);

  py::class_<Reservation>(m, "Reservation", "A reservation as committed: raw fields, times in us.")
      .def_property_readonly("id", [](const Reservation& r) { return to_bytes(r.id); })
      .def_property_readonly("sku", [](const Reservation& r) { return r.key.sku; })
      .def_property_readonly("location", [](const Reservation& r) { return r.key.location; })
      .def_readonly("qty", &Reservation::qty)
      .def_property_readonly("held", &Reservation::held)
      .def_readonly("confirmed", &Reservation::confirmed)
      .def_readonly("released", &Reservation::released)
      .def_readonly("expired", &Reservation::expired)
      .def_readonly("returned", &Reservation::returned)
      .def_property_readonly("state",
                             [](const Reservation& r) { return reservation_state_name(r.state); })
      .def_readonly("version", &Reservation::version)
      .def_readonly("expires_at_us", &Reservation::expires_at_us)
      .def_readonly("created_at_us", &Reservation::created_at_us)
      .def_readonly("updated_at_us", &Reservation::updated_at_us)
      .def_readonly("idempotency_key", &Reservation::idempotency_key)
      .def_readonly("buyer", &Reservation::buyer)
      .def_readonly("limit_group", &Reservation::limit_group)
      .def_property_readonly("order_id",
                             [](const Reservation& r) -> py::object {
                               if (!r.order_id) return py::none();
                               return to_bytes(*r.order_id);
                             })
      .def_readonly("ref", &Reservation::ref)
      .def_readonly("metadata", &Reservation::metadata);
}

void register_clocks(py::module_& m) {
  py::class_<Transfer>(m, "Transfer", "A transfer as committed: raw fields, times in us.")
      .def_property_readonly("id", [](const Transfer& t) { return to_bytes(t.id); })
      .def_readonly("sku", &Transfer::sku)
      .def_readonly("source", &Transfer::source)
      .def_readonly("destination", &Transfer::destination)
      .def_readonly("qty", &Transfer::qty)
      .def_readonly("received", &Transfer::received)
      .def_readonly("rejected", &Transfer::rejected)
      .def_readonly("cancelled", &Transfer::cancelled)
      .def_property_readonly("in_transit", &Transfer::in_transit)
      .def_property_readonly("state",
                             [](const Transfer& t) { return transfer_state_name(t.state); })
      .def_readonly("version", &Transfer::version)
      .def_readonly("created_at_us", &Transfer::created_at_us)
      .def_readonly("updated_at_us", &Transfer::updated_at_us)
      .def_readonly("reason", &Transfer::reason)
      .def_readonly("actor", &Transfer::actor);

  py::class_<Clock, std::shared_ptr<Clock>>(m, "Clock", "Where a memory store reads the time.");
  py::class_<ManualClock, Clock, std::shared_ptr<ManualClock>>(
      m, "ManualClock", "A clock that moves only when told to (microseconds since the epoch).")
      .def(py::init<TimestampUs>(), py::arg("start_us"))
      .def("now_us", &ManualClock::now_us)
      .def("set_us", &ManualClock::set_us, py::arg("value_us"))
      .def("advance_us", &ManualClock::advance_us, py::arg("delta_us"));
}

// Ids, hashes and the bounds the Python layer checks options against.
void register_ids_and_limits(py::module_& m) {
  m.def(
      "make_uuid_v7",
      [](std::int64_t unix_ms, std::uint16_t shard_key) {
        return to_bytes(make_uuid_v7(unix_ms, shard_key));
      },
      py::arg("unix_ms"), py::arg("shard_key"), "Makes a UUIDv7 (16 bytes) carrying shard_key.");
  m.def(
      "uuid_shard_key", [](const py::bytes& raw) { return uuid_from(raw).shard_key(); },
      py::arg("id"), "The 16-bit shard key carried inside a stockade UUIDv7.");
  m.def("shard_key_of", &shard_key_of, py::arg("sku"), py::arg("location"),
        "The 16-bit shard key of a stock row.");
  m.def(
      "stable_hash64",
      [](const std::string& sku, const std::string& location) {
        return stable_hash64({sku, location});
      },
      py::arg("sku"), py::arg("location"), "The stable 64-bit hash of (sku, location).");
  // The input limits a caller can reach (stockade.limits exports them).
  m.attr("QUANTITY_MAX") = quantity_max;
  m.attr("ON_HAND_MAX") = on_hand_max;
  m.attr("LIMIT_GROUP_SKUS_MAX") = limit_group_skus_max;
  m.attr("SKU_BYTES_MAX") = sku_bytes_max;
  m.attr("LOCATION_BYTES_MAX") = location_bytes_max;
  m.attr("IDEMPOTENCY_KEY_BYTES_MAX") = idempotency_key_bytes_max;
  m.attr("LEASE_OWNER_BYTES_MAX") = lease_owner_bytes_max;
  m.attr("BUYER_BYTES_MAX") = buyer_bytes_max;
  m.attr("REF_BYTES_MAX") = ref_bytes_max;
  m.attr("METADATA_BYTES_MAX") = metadata_bytes_max;
  m.attr("RESERVATIONS_LIMIT_MAX") = reservations_limit_max;
  m.attr("LIMIT_GROUP_BYTES_MAX") = limit_group_bytes_max;
  m.attr("ORDER_LINES_MAX") = order_lines_max;
  m.attr("ALLOCATE_LOCATIONS_MAX") = allocate_locations_max;
  m.attr("LOCATIONS_LIMIT_MAX") = locations_limit_max;
  m.attr("TRANSFERS_LIMIT_MAX") = transfers_limit_max;
  m.attr("TTL_US_MAX") = ttl_us_max;
  m.attr("SLOTS_MAX") = slots_max;
  // The largest value of each count option, so that Python refuses a value out of range
  // with InvalidArgument before it reaches a C++ integer.
  py::dict limits;
  limits["retries_max"] = retries_max_limit;
  limits["pool_size"] = pool_size_max;
  limits["sweep_batch"] = expire_batch_max;
  limits["purge_batch"] = expire_batch_max;
  limits["batch_max"] = batch_size_limit;
  limits["batch_shards"] = batcher_shards_max;
  limits["async_workers"] = async_workers_max;
  limits["slots"] = slots_max;
  limits["slot_directory"] = slot_directory_max;
  limits["expire_limit"] = expire_batch_max;
  m.attr("OPTION_LIMITS") = limits;
}

// The core's log ring, which stockade.logs drains into Python's logging.
void register_logs(py::module_& m) {
  m.def("take_last_batch_size", &HotRowBatcher::take_last_batch_size,
        "The batch size of this thread's last batched call (0 if none since the last take).");
  m.def(
      "take_logs",
      [](std::size_t max, std::int64_t timeout_ms) {
        std::uint64_t dropped = 0;
        std::vector<LogRecord> records;
        {
          py::gil_scoped_release release;
          records = take_logs(max, timeout_ms, &dropped);
        }
        py::list out(records.size());
        for (std::size_t i = 0; i < records.size(); ++i) {
          const LogRecord& r = records[i];
          out[i] =
              py::make_tuple(static_cast<int>(r.level), r.logger,
                             py::bytes(r.message).attr("decode")("utf-8", "replace"), r.unix_us);
        }
        return py::make_tuple(out, dropped);
      },
      py::arg("max"), py::arg("timeout_ms"),
      "Takes up to `max` log records of the core, waiting at most `timeout_ms` for one: "
      "([(level, logger, message, unix_us)], dropped).");
  m.def("stop_taking_logs", &stop_taking_logs,
        "Makes take_logs return at once from now on (called at exit).");
  m.def(
      "set_log_level", [](int level) { set_log_level(static_cast<LogLevel>(level)); },
      py::arg("level"), "The least level (a logging level number) the core keeps.");
  m.def(
      "log_for_test",
      [](int level, const std::string& message) {
        log(static_cast<LogLevel>(level), "stockade", message);
      },
      py::arg("level"), py::arg("message"), "TEST FACILITY: appends a record to the log ring.");
}

}  // namespace

void register_types(py::module_& m) {
  register_values(m);
  register_clocks(m);
  register_ids_and_limits(m);
  register_logs(m);
  m.def("parse_conninfo", &parse_conninfo, py::arg("dsn"),
        "The keyword/value pairs of a libpq connection string (InvalidArgument, without "
        "quoting it, if libpq cannot parse it).");
  m.attr("LOW_CONFLICT_RATE") = low_conflict_rate;
  m.attr("HOT_CONFLICT_RATE") = hot_conflict_rate;
}

}  // namespace stockade::bindings
