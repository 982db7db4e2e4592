// Test hooks and tooling, bound apart from the engine's API: the oversell canary and
// hold_lock (stockade/testing.hpp), and the C++ load driver (stockade/tools/load.hpp).
// Python reaches them through stockade.testing and stockade.tools, never directly.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "stockade/engine.hpp"
#include "stockade/postgres_store.hpp"
#include "stockade/testing.hpp"
#include "stockade/tools/load.hpp"

namespace stockade::bindings {
namespace {

// A test-only lock held from Python; see TestHooks::hold_lock.
class LockHandle {
 public:
  explicit LockHandle(std::unique_ptr<LockHold> hold) : hold_(std::move(hold)) {}
  void release() { hold_.reset(); }
  bool held() const { return hold_ != nullptr; }

 private:
  std::unique_ptr<LockHold> hold_;
};

py::dict load_dict(const LoadResult& r) {
  py::dict out;
  out["requests"] = r.requests;
  out["granted"] = r.granted;
  out["refused"] = r.refused;
  out["failed"] = r.failed;
  out["seconds"] = r.seconds;
  out["p50_us"] = r.p50_us;
  out["p90_us"] = r.p90_us;
  out["p99_us"] = r.p99_us;
  out["p999_us"] = r.p999_us;
  out["max_us"] = r.max_us;
  out["mean_us"] = r.mean_us;
  return out;
}

Reservation naive_reserve(Engine& e, const std::string& sku, const std::string& location,
                          Quantity qty, std::int64_t ttl_us, std::int64_t window_us) {
  const SkuKey key{sku, location};
  validate_sku_key(key);
  validate_qty(qty);
  validate_ttl_us(ttl_us);
  return test_hooks(e.store()).naive_reserve_unsafe(key, qty, ttl_us, window_us);
}

Reservation limited_reserve(Engine& e, const std::string& sku, const std::string& location,
                            Quantity qty, const std::string& buyer, bool serializable,
                            std::int64_t window_us) {
  const SkuKey key{sku, location};
  validate_sku_key(key);
  validate_qty(qty);
  validate_buyer(buyer);
  return test_hooks(e.store()).limited_reserve_by_check(key, qty, buyer, serializable, window_us);
}

LockHandle hold_lock(Engine& e, const std::string& sku, const std::string& location,
                     const std::string& kind, std::int64_t timeout_ms) {
  const SkuKey key{sku, location};
  validate_sku_key(key);
  return LockHandle(test_hooks(e.store()).hold_lock(key, parse_strategy(kind), timeout_ms));
}

py::dict drive(Engine& engine, const std::vector<std::pair<std::string, std::string>>& skus,
               std::size_t clients, std::size_t window, std::int64_t duration_ms, Quantity qty,
               std::int64_t ttl_us, const OptStr& strategy, bool keyed, bool confirm,
               std::size_t buyers, bool sell, OptInt fencing_token, Quantity confirm_qty,
               bool release_rest, const std::vector<std::string>& pool) {
  LoadSpec spec;
  for (const auto& [sku, location] : skus) spec.keys.push_back({sku, location});
  spec.clients = clients;
  spec.window = window;
  spec.duration_ms = duration_ms;
  spec.qty = qty;
  spec.ttl_us = ttl_us;
  spec.call = call_options(strategy, false, {}, {});
  spec.keyed = keyed;
  spec.confirm = confirm;
  spec.confirm_qty = confirm_qty;
  spec.release_rest = release_rest;
  spec.buyers = buyers;
  spec.sell = sell;
  spec.pool = pool;
  spec.call.fencing_token = fencing_token;
  if (sell && (confirm || buyers > 0)) {
    throw_invalid_argument("a sell load takes no confirmations or buyers");
  }
  LoadResult r;
  {
    py::gil_scoped_release release;
    r = drive_load(engine, spec);
  }
  return load_dict(r);
}

}  // namespace

void register_testing(py::module_& m) {
  py::class_<LockHandle>(m, "LockHandle", "A lock held for a test; release() lets it go.")
      .def("release", &LockHandle::release, Release())
      .def_property_readonly("held", &LockHandle::held);
  m.def("naive_reserve_unsafe", &naive_reserve, py::arg("engine"), py::arg("sku"),
        py::arg("location"), py::arg("qty"), py::arg("ttl_us"), py::arg("window_us"), Release(),
        "TEST CANARY: a deliberately broken read-modify-write that oversells under load.");
  m.def("limited_reserve_by_check", &limited_reserve, py::arg("engine"), py::arg("sku"),
        py::arg("location"), py::arg("qty"), py::arg("buyer"), py::arg("serializable"),
        py::arg("window_us"), Release(),
        "TEST CANARY (READ COMMITTED) or MEASURE (SERIALIZABLE): a purchase limit checked by "
        "summing the buyer's reservations, with no parent row.");
  m.def("hold_lock", &hold_lock, py::arg("engine"), py::arg("sku"), py::arg("location"),
        py::arg("kind"), py::arg("timeout_ms"), Release(),
        "TEST FACILITY: holds the lock `kind` takes on a row, as another session would.");
  m.def("drive_load", &drive, py::arg("engine"), py::arg("skus"), py::arg("clients"),
        py::arg("window"), py::arg("duration_ms"), py::arg("qty"), py::arg("ttl_us"),
        py::arg("strategy"), py::arg("keyed") = false, py::arg("confirm") = false,
        py::arg("buyers") = 0, py::arg("sell") = false, py::arg("fencing_token") = py::none(),
        py::arg("confirm_qty") = 0, py::arg("release_rest") = false,
        py::arg("pool") = std::vector<std::string>{},
        "Drives reservations from C++ client threads (see stockade/tools/load.hpp); returns "
        "counts and latency percentiles.");
  m.def(
      "prepared_statements",
      [](const std::string& schema) {
        py::list out;
        for (const auto& s : prepared_statements(schema)) {
          py::dict d;
          d["name"] = s.name;
          d["sql"] = s.sql;
          d["parameters"] = s.parameters;
          d["routine"] = s.routine;
          out.append(d);
        }
        return out;
      },
      py::arg("schema"),
      "Every statement the PostgreSQL store prepares on the plain layout, for the plan audit.");
}

}  // namespace stockade::bindings
