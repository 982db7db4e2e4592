// The movement journal, the change feed, stock alerts and the audit (docs/journal.md): their
// values and the Engine's calls.
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "stockade/engine.hpp"

namespace stockade::bindings {

namespace {

void register_record_values(py::module_& m) {
  py::class_<Movement>(m, "Movement", "One journal entry: one change of one stock row.")
      .def_readonly("position", &Movement::position)
      .def_property_readonly("sku", [](const Movement& x) { return x.key.sku; })
      .def_property_readonly("location", [](const Movement& x) { return x.key.location; })
      .def_property_readonly("slot", [](const Movement& x) { return x.key.slot; })
      .def_readonly("version_before", &Movement::version_before)
      .def_readonly("version_after", &Movement::version_after)
      .def_readonly("on_hand_delta", &Movement::on_hand_delta)
      .def_readonly("reserved_delta", &Movement::reserved_delta)
      .def_readonly("on_hand", &Movement::on_hand)
      .def_readonly("reserved", &Movement::reserved)
      .def_readonly("available", &Movement::available)
      .def_readonly("cause", &Movement::cause)
      .def_readonly("reason", &Movement::reason)
      .def_readonly("actor", &Movement::actor)
      .def_readonly("ref", &Movement::ref)
      .def_readonly("requests", &Movement::requests)
      .def_readonly("alerts", &Movement::alerts)
      .def_readonly("at_us", &Movement::at_us);
  py::class_<FeedPosition>(m, "FeedPosition", "Where a feed consumer stands (opaque).")
      .def(py::init<>())
      .def_readonly("after", &FeedPosition::after)
      .def("__eq__", [](const FeedPosition& a, const FeedPosition& b) { return a == b; });
  py::class_<FeedBatch>(m, "FeedBatch", "The changes of one poll and the position after them.")
      .def_readonly("changes", &FeedBatch::changes)
      .def_readonly("next", &FeedBatch::next);
  py::class_<AuditViolation>(m, "AuditViolation", "One broken invariant the audit found.")
      .def_readonly("check", &AuditViolation::check)
      .def_property_readonly("sku", [](const AuditViolation& v) { return v.key.sku; })
      .def_property_readonly("location", [](const AuditViolation& v) { return v.key.location; })
      .def_property_readonly("slot", [](const AuditViolation& v) { return v.key.slot; })
      .def_readonly("subject", &AuditViolation::subject)
      .def_readonly("expected", &AuditViolation::expected)
      .def_readonly("found", &AuditViolation::found);
  py::class_<AuditUnchecked>(m, "AuditUnchecked", "A part of the data a check did not cover.")
      .def_readonly("check", &AuditUnchecked::check)
      .def_readonly("reason", &AuditUnchecked::reason);
  py::class_<AuditReport>(m, "AuditReport", "What the audit checked and found.")
      .def_readonly("violations", &AuditReport::violations)
      .def_readonly("truncated", &AuditReport::truncated)
      .def_readonly("rows", &AuditReport::rows)
      .def_readonly("reservations", &AuditReport::reservations)
      .def_readonly("movements", &AuditReport::movements)
      .def_readonly("journal_checked", &AuditReport::journal_checked)
      .def_readonly("checks", &AuditReport::checks)
      .def_readonly("unchecked", &AuditReport::unchecked);
}

void register_feed_calls(py::class_<Engine>& c) {
  c.def("feed_open", &Engine::feed_open, py::arg("consumer"), py::arg("from_start"), Release())
      .def("feed_poll", &Engine::feed_poll, py::arg("consumer"), py::arg("position"),
           py::arg("limit"), Release())
      .def("feed_commit", &Engine::feed_commit, py::arg("consumer"), py::arg("position"), Release())
      .def("feed_drop", &Engine::feed_drop, py::arg("consumer"), Release())
      .def(
          "feed_wait",
          [](Engine& e, std::int64_t timeout_ms) {
            return std::string(feed_wake_name(e.feed_wait(timeout_ms)));
          },
          py::arg("timeout_ms"), Release());
}

}  // namespace

void register_record(py::module_& m, py::class_<Engine>& c) {
  register_record_values(m);
  c.def(
       "movements",
       [](Engine& e, const OptStr& sku, const OptStr& location, std::int64_t after,
          std::int64_t since_us, std::size_t limit) {
         MovementQuery q;
         q.sku = sku;
         q.location = location;
         q.after = after;
         q.since_us = since_us;
         q.limit = limit;
         return e.movements(q);
       },
       py::arg("sku"), py::arg("location"), py::arg("after"), py::arg("since_us"), py::arg("limit"),
       Release())
      .def(
          "set_low_stock",
          [](Engine& e, const std::string& sku, const std::string& location, OptInt threshold) {
            return e.set_low_stock({sku, location}, threshold);
          },
          py::arg("sku"), py::arg("location"), py::arg("threshold"), Release())
      .def(
          "audit",
          [](Engine& e, const OptStr& sku, std::size_t limit, std::int64_t expiry_lag_us) {
            AuditOptions o;
            o.sku = sku;
            o.limit = limit;
            o.expiry_lag_us = expiry_lag_us;
            return e.audit(o);
          },
          py::arg("sku"), py::arg("limit"), py::arg("expiry_lag_us"), Release())
      .def("purge_movements", &Engine::purge_movements, py::arg("older_than_us"), py::arg("limit"),
           Release())
      .def_property_readonly("last_audit_violations", &Engine::last_audit_violations);
  register_feed_calls(c);
}

}  // namespace stockade::bindings
