// stockade._core.Engine's stats(), metrics() and recommend(): the engine's counters as the
// dicts the Python layer reads (stockade.stats wraps them).
#include <pybind11/stl.h>

#include "bindings.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace stockade::bindings {
namespace {

py::dict counters_dict(const StrategyCountersSnapshot& s) {
  py::dict d;
  d["requests"] = s.requests;
  d["granted"] = s.granted;
  d["refused"] = s.refused;
  d["failed"] = s.failed;
  d["conflicts"] = s.conflicts;
  d["retries"] = s.retries;
  d["version_conflicts"] = s.version_conflicts;
  d["lock_waits"] = s.lock_waits;
  d["lock_wait_us"] = s.lock_wait_us;
  d["lock_not_available"] = s.lock_not_available;
  d["lock_timeouts"] = s.lock_timeouts;
  return d;
}

py::dict slots_dict(const SlotStats& s) {
  py::dict out;
  out["auto_slots_max"] = s.auto_slots_max;
  out["auto_splits"] = s.auto_splits;
  out["learned"] = s.learned;
  out["kept"] = s.kept;
  out["auto_merges"] = s.auto_merges;
  py::list recent;
  for (const SlotDecisionStats& d : s.recent) {
    py::dict r;
    r["sku"] = d.key.sku;
    r["location"] = d.key.location;
    r["slots"] = d.slots;
    r["split"] = d.split;
    r["merged"] = d.merged;
    r["why"] = d.why;
    r["age_s"] = d.age_s;
    recent.append(r);
  }
  out["recent"] = recent;
  return out;
}

py::dict pool_dict(const PoolStats& p) {
  py::dict pool;
  pool["size"] = p.size;
  pool["in_use"] = p.in_use;
  pool["idle"] = p.idle;
  pool["waiting"] = p.waiting;
  pool["pooled"] = p.pooled;
  pool["routines"] = p.routines;
  pool["server"] = p.server;
  pool["server_changes"] = p.server_changes;
  py::dict routing;
  routing["mode"] = p.routing.mode;
  routing["nodes"] = p.routing.nodes;
  routing["routed"] = p.routing.routed;
  routing["misses"] = p.routing.misses;
  routing["fallbacks"] = p.routing.fallbacks;
  routing["reloads"] = p.routing.reloads;
  pool["routing"] = routing;
  return pool;
}

py::dict stats_dict(const StoreStats& s) {
  py::dict strategies;
  for (std::size_t i = 0; i < strategy_count; ++i) {
    strategies[strategy_name(static_cast<Strategy>(i))] = counters_dict(s.strategies[i]);
  }
  py::list skus;
  for (const SkuStats& k : s.hottest_skus) {
    py::dict d;
    d["sku"] = k.key.sku;
    d["location"] = k.key.location;
    d["requests"] = k.requests;
    d["refused"] = k.refused;
    d["conflicts"] = k.conflicts;
    d["lock_waits"] = k.lock_waits;
    d["mode"] = strategy_name(k.mode);
    d["in_flight"] = k.in_flight;
    d["peak_in_flight"] = k.peak_in_flight;
    d["row_queue"] = k.row_queue;
    d["slots"] = k.slots;
    skus.append(d);
  }
  py::dict out;
  out["backend"] = s.backend;
  out["strategies"] = strategies;
  out["hottest_skus"] = skus;
  out["sku_count"] = s.sku_count;
  out["reservation_count"] = s.reservation_count;
  out["held_count"] = s.held_count;
  py::dict sweeper;
  sweeper["enabled"] = s.sweeper.enabled;
  sweeper["leader"] = s.sweeper.leader;
  sweeper["runs"] = s.sweeper.runs;
  sweeper["expired"] = s.sweeper.expired;
  sweeper["errors"] = s.sweeper.errors;
  sweeper["last_error"] = s.sweeper.last_error;
  sweeper["purged_reservations"] = s.sweeper.purged_reservations;
  sweeper["purged_keys"] = s.sweeper.purged_keys;
  sweeper["freed_on_refusal"] = s.sweeper.freed_on_refusal;
  sweeper["round_seconds"] = s.sweeper.round_seconds;
  sweeper["last_round_seconds"] = s.sweeper.last_round_seconds;
  out["counts_exact"] = s.counts_exact;
  out["sweeper"] = sweeper;
  out["pool"] = pool_dict(s.pool);
  py::dict batcher;
  batcher["started"] = s.batcher.started;
  batcher["shards"] = s.batcher.shards;
  batcher["batches"] = s.batcher.batches;
  batcher["requests"] = s.batcher.requests;
  batcher["failed_batches"] = s.batcher.failed_batches;
  batcher["batch_size_max"] = s.batcher.batch_size_max;
  batcher["shared_row_batches"] = s.batcher.shared_row_batches;
  batcher["lingered_batches"] = s.batcher.lingered_batches;
  batcher["gathered_batches"] = s.batcher.gathered_batches;
  batcher["batch_size_mean"] = s.batcher.batches == 0 ? 0.0
                                                      : static_cast<double>(s.batcher.requests) /
                                                            static_cast<double>(s.batcher.batches);
  batcher["queued"] = s.batcher.queued;
  out["batcher"] = batcher;
  out["slots"] = slots_dict(s.slots);
  return out;
}

py::dict metrics_dict(const MetricsSnapshot& m) {
  py::list calls;
  for (const CallSeries& c : m.calls) {
    py::dict outcomes;
    if (c.outcomes[0] > 0) outcomes["ok"] = c.outcomes[0];
    for (std::size_t k = 0; k < error_code_count; ++k) {
      if (c.outcomes[1 + k] > 0) {
        outcomes[error_code_name(static_cast<ErrorCode>(k))] = c.outcomes[1 + k];
      }
    }
    py::dict series;
    series["op"] = op_name(c.op);
    series["strategy"] =
        c.strategy ? py::object(py::str(strategy_name(*c.strategy))) : py::object(py::none());
    series["outcomes"] = outcomes;
    series["latency_buckets"] =
        std::vector<std::uint64_t>(c.latency_buckets.begin(), c.latency_buckets.end());
    series["latency_sum_seconds"] = static_cast<double>(c.latency_sum_us) / 1e6;
    series["count"] = c.count;
    calls.append(series);
  }
  std::vector<double> latency_bounds;
  for (std::int64_t us : latency_bounds_us) latency_bounds.push_back(static_cast<double>(us) / 1e6);
  py::dict out;
  out["calls"] = calls;
  out["latency_bounds_seconds"] = latency_bounds;
  out["batch_size_bounds"] =
      std::vector<std::uint64_t>(batch_size_bounds.begin(), batch_size_bounds.end());
  out["batch_size_buckets"] =
      std::vector<std::uint64_t>(m.batch_size_buckets.begin(), m.batch_size_buckets.end());
  out["batch_size_sum"] = m.batch_size_sum;
  out["batch_count"] = m.batch_count;
  return out;
}

// Leases: the offline lock on a stock row, with its fencing token.
}  // namespace

void register_stats(py::class_<Engine>& c) {
  c.def(
      "stats",
      [](const Engine& e, std::size_t sku_limit) {
        StoreStats s;
        {
          py::gil_scoped_release release;
          s = e.stats(sku_limit);
        }
        return stats_dict(s);
      },
      py::arg("sku_limit"));
  c.def("metrics", [](Engine& e) { return metrics_dict(e.telemetry().metrics()); });
  c.def(
      "recommend",
      [](const Engine& e, const std::string& sku, const std::string& location) {
        const Advice advice = e.recommend({sku, location});
        return std::make_pair(std::string(strategy_name(advice.strategy)), advice.reasons);
      },
      py::arg("sku"), py::arg("location"));
}

}  // namespace stockade::bindings
