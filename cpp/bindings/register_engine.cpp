// stockade._core.Engine: the engine facade, one method per call of the public API. The
// GIL is released around every call that may block (locks, backoff, contention), so
// Python threads run the engine in parallel. Arguments arrive already type-checked and
// converted by the Python layer (stockade.engine); values are checked here, in C++.
#include <pybind11/stl.h>

#include <algorithm>
#include <tuple>
#include <type_traits>
#include <variant>

#include "bindings.hpp"
#include "stockade/async.hpp"
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
  sweeper["round_seconds"] = s.sweeper.round_seconds;
  sweeper["last_round_seconds"] = s.sweeper.last_round_seconds;
  out["counts_exact"] = s.counts_exact;
  out["sweeper"] = sweeper;
  py::dict pool;
  pool["size"] = s.pool.size;
  pool["in_use"] = s.pool.in_use;
  pool["idle"] = s.pool.idle;
  pool["waiting"] = s.pool.waiting;
  pool["pooled"] = s.pool.pooled;
  pool["routines"] = s.pool.routines;
  pool["server"] = s.pool.server;
  pool["server_changes"] = s.pool.server_changes;
  out["pool"] = pool;
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
void register_lease_calls(py::class_<Engine>& c) {
  c.def(
       "acquire_lease",
       [](Engine& e, const std::string& sku, const std::string& location, std::int64_t ttl_us,
          const std::string& owner) { return e.acquire_lease({sku, location}, ttl_us, owner); },
       py::arg("sku"), py::arg("location"), py::arg("ttl_us"), py::arg("owner"), Release())
      .def(
          "renew_lease",
          [](Engine& e, const std::string& sku, const std::string& location, FencingToken token,
             std::int64_t ttl_us) { return e.renew_lease({sku, location}, token, ttl_us); },
          py::arg("sku"), py::arg("location"), py::arg("token"), py::arg("ttl_us"), Release())
      .def(
          "release_lease",
          [](Engine& e, const std::string& sku, const std::string& location, FencingToken token) {
            return e.release_lease({sku, location}, token);
          },
          py::arg("sku"), py::arg("location"), py::arg("token"), Release());
}

void register_stock_calls(py::class_<Engine>& c) {
  c.def(
       "set_slots",
       [](Engine& e, const std::string& sku, const std::string& location, int slots) {
         return e.set_slots({sku, location}, slots);
       },
       py::arg("sku"), py::arg("location"), py::arg("slots"), Release())
      .def(
          "slot_count",
          [](Engine& e, const std::string& sku, const std::string& location) {
            return e.slot_count({sku, location});
          },
          py::arg("sku"), py::arg("location"), Release());
  c.def(
       "restock",
       [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
          OptInt expected_version, OptInt fencing_token, const std::string& reason,
          const std::string& actor) {
         return e.restock({sku, location}, qty, expected_version, fencing_token, reason, actor);
       },
       py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("expected_version"),
       py::arg("fencing_token") = py::none(), py::arg("reason") = "", py::arg("actor") = "",
       Release())
      .def(
          "set_on_hand",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity on_hand,
             OptInt expected_version, OptInt fencing_token, const std::string& reason,
             const std::string& actor) {
            return e.set_on_hand({sku, location}, on_hand, expected_version, fencing_token, reason,
                                 actor);
          },
          py::arg("sku"), py::arg("location"), py::arg("on_hand"), py::arg("expected_version"),
          py::arg("fencing_token") = py::none(), py::arg("reason") = "", py::arg("actor") = "",
          Release())
      .def(
          "set_backorder_limit",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity limit,
             OptInt expected_version, OptInt fencing_token) {
            return e.set_backorder_limit({sku, location}, limit, expected_version, fencing_token);
          },
          py::arg("sku"), py::arg("location"), py::arg("limit"), py::arg("expected_version"),
          py::arg("fencing_token"), Release())
      .def(
          "set_discontinued",
          [](Engine& e, const std::string& sku, const std::string& location, bool discontinued,
             OptInt expected_version, OptInt fencing_token) {
            return discontinued ? e.discontinue({sku, location}, expected_version, fencing_token)
                                : e.reinstate({sku, location}, expected_version, fencing_token);
          },
          py::arg("sku"), py::arg("location"), py::arg("discontinued"), py::arg("expected_version"),
          py::arg("fencing_token"), Release())
      .def(
          "stock",
          [](Engine& e, const std::string& sku, const std::string& location) {
            return e.stock({sku, location});
          },
          py::arg("sku"), py::arg("location"), Release())
      .def(
          "sell",
          [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
             const OptStr& strategy, bool nowait, OptInt lock_timeout_ms, OptInt expected_version,
             OptInt fencing_token) {
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
            call.fencing_token = fencing_token;
            return e.sell({sku, location}, qty, call);
          },
          py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("strategy"),
          py::arg("nowait"), py::arg("lock_timeout_ms"), py::arg("expected_version"),
          py::arg("fencing_token") = py::none(), Release());
}

void register_reservation_calls(py::class_<Engine>& c) {
  c.def(
       "reserve",
       [](Engine& e, const std::string& sku, const std::string& location, Quantity qty,
          OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
          OptInt lock_timeout_ms, OptInt expected_version, OptStr buyer) {
         CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
         call.buyer = std::move(buyer);
         return e.reserve({sku, location}, qty, ttl_us, std::move(idempotency_key), call);
       },
       py::arg("sku"), py::arg("location"), py::arg("qty"), py::arg("ttl_us"),
       py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
       py::arg("lock_timeout_ms"), py::arg("expected_version"), py::arg("buyer") = py::none(),
       Release())
      .def(
          "reserve_order",
          [](Engine& e, const std::vector<std::tuple<std::string, std::string, Quantity>>& lines,
             OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptStr buyer) {
            std::vector<OrderLine> order;
            order.reserve(lines.size());
            for (const auto& [sku, location, qty] : lines) order.push_back({{sku, location}, qty});
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, {});
            call.buyer = std::move(buyer);
            return e.reserve_order(order, ttl_us, std::move(idempotency_key), call);
          },
          py::arg("lines"), py::arg("ttl_us"), py::arg("idempotency_key"), py::arg("strategy"),
          py::arg("nowait"), py::arg("lock_timeout_ms"), py::arg("buyer") = py::none(), Release())
      .def(
          "set_purchase_limit",
          [](Engine& e, const std::string& group, Quantity per_buyer,
             const std::vector<std::string>& skus) {
            e.set_purchase_limit(PurchaseLimit{group, per_buyer, skus});
          },
          py::arg("group"), py::arg("per_buyer"), py::arg("skus"), Release())
      .def("remove_purchase_limit", &Engine::remove_purchase_limit, py::arg("group"), Release())
      .def("buyer_held", &Engine::buyer_held, py::arg("group"), py::arg("buyer"), Release())
      .def(
          "confirm",
          [](Engine& e, const Uuid& id, OptInt expected_version) {
            return e.confirm(id, expected_version);
          },
          py::arg("id"), py::arg("expected_version"), Release())
      .def(
          "release",
          [](Engine& e, const Uuid& id, OptInt expected_version) {
            return e.release(id, expected_version);
          },
          py::arg("id"), py::arg("expected_version"), Release())
      .def(
          "extend",
          [](Engine& e, const Uuid& id, std::int64_t ttl_us, OptInt expected_version) {
            return e.extend(id, ttl_us, expected_version);
          },
          py::arg("id"), py::arg("ttl_us"), py::arg("expected_version"), Release())
      .def(
          "get_reservation", [](Engine& e, const Uuid& id) { return e.get_reservation(id); },
          py::arg("id"), Release())
      .def(
          "expire_due", [](Engine& e, std::size_t limit) { return e.expire_due(limit); },
          py::arg("limit"), Release());
}

using Sink = std::shared_ptr<AsyncChannel>;

// The async twins: each queues its call and returns at once; the outcome reaches the
// channel under `token`. The GIL is released while queueing, which may wait (bounded)
// for room.
void register_async_calls(py::class_<Engine>& c) {
  c.def(
       "submit_reserve",
       [](Engine& e, Sink channel, std::uint64_t token, const std::string& sku,
          const std::string& location, Quantity qty, OptInt ttl_us, OptStr idempotency_key,
          const OptStr& strategy, bool nowait, OptInt lock_timeout_ms, OptInt expected_version,
          OptStr buyer) {
         CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
         call.buyer = std::move(buyer);
         e.submit_reserve({sku, location}, qty, ttl_us, std::move(idempotency_key), call,
                          std::move(channel), token);
       },
       py::arg("channel"), py::arg("token"), py::arg("sku"), py::arg("location"), py::arg("qty"),
       py::arg("ttl_us"), py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
       py::arg("lock_timeout_ms"), py::arg("expected_version"), py::arg("buyer") = py::none(),
       Release())
      .def(
          "submit_sell",
          [](Engine& e, Sink channel, std::uint64_t token, const std::string& sku,
             const std::string& location, Quantity qty, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptInt expected_version, OptInt fencing_token) {
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, expected_version);
            call.fencing_token = fencing_token;
            e.submit_sell({sku, location}, qty, call, std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("sku"), py::arg("location"), py::arg("qty"),
          py::arg("strategy"), py::arg("nowait"), py::arg("lock_timeout_ms"),
          py::arg("expected_version"), py::arg("fencing_token") = py::none(), Release())
      .def(
          "submit_reserve_order",
          [](Engine& e, Sink channel, std::uint64_t token,
             const std::vector<std::tuple<std::string, std::string, Quantity>>& lines,
             OptInt ttl_us, OptStr idempotency_key, const OptStr& strategy, bool nowait,
             OptInt lock_timeout_ms, OptStr buyer) {
            std::vector<OrderLine> order;
            order.reserve(lines.size());
            for (const auto& [sku, location, qty] : lines) order.push_back({{sku, location}, qty});
            CallOptions call = call_options(strategy, nowait, lock_timeout_ms, {});
            call.buyer = std::move(buyer);
            e.submit_reserve_order(order, ttl_us, std::move(idempotency_key), call,
                                   std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("lines"), py::arg("ttl_us"),
          py::arg("idempotency_key"), py::arg("strategy"), py::arg("nowait"),
          py::arg("lock_timeout_ms"), py::arg("buyer") = py::none(), Release());
  auto transition = [](Engine::Transition kind) {
    return [kind](Engine& e, Sink channel, std::uint64_t token, const Uuid& id,
                  OptInt expected_version) {
      e.submit_transition(kind, id, 0, expected_version, std::move(channel), token);
    };
  };
  c.def("submit_confirm", transition(Engine::Transition::confirm), py::arg("channel"),
        py::arg("token"), py::arg("id"), py::arg("expected_version"), Release())
      .def("submit_release", transition(Engine::Transition::release), py::arg("channel"),
           py::arg("token"), py::arg("id"), py::arg("expected_version"), Release())
      .def(
          "submit_extend",
          [](Engine& e, Sink channel, std::uint64_t token, const Uuid& id, std::int64_t ttl_us,
             OptInt expected_version) {
            e.submit_transition(Engine::Transition::extend, id, ttl_us, expected_version,
                                std::move(channel), token);
          },
          py::arg("channel"), py::arg("token"), py::arg("id"), py::arg("ttl_us"),
          py::arg("expected_version"), Release());
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

void register_engine(py::module_& m) {
  register_async_channel(m);
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
          [](Engine& e, std::int64_t older_than_us, std::uint64_t limit) {
            return e.purge(older_than_us, limit).total();
          },
          py::arg("older_than_us"), py::arg("limit"), Release())
      .def("row_counts",
           [](const Engine& e) {
             StoreCounts c;
             {
               py::gil_scoped_release release;
               c = e.row_counts();
             }
             py::dict out;
             out["sku_count"] = c.sku_count;
             out["reservation_count"] = c.reservation_count;
             out["held_count"] = c.held_count;
             return out;
           })
      .def("close", &Engine::close, Release())
      .def_property_readonly("backend", [](Engine& e) { return e.store().backend_name(); })
      .def_property_readonly(
          "default_strategy",
          [](const Engine& e) { return strategy_name(e.options().default_strategy); })
      .def(
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
  register_stock_calls(c);
  register_lease_calls(c);
  register_reservation_calls(c);
  register_async_calls(c);
  register_record(m, c);
}

}  // namespace stockade::bindings
