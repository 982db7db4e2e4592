// The engine's async calls: each runs through the batcher (queued for its sink) or on an
// async worker, and completes on its CompletionSink; none blocks the caller.
#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "store/error_helpers.hpp"

namespace stockade {

using namespace detail::engine;  // NOLINT(google-build-using-namespace): the engine's helpers

// Runs fn() on an async worker and posts its outcome (or error) to `sink`.
template <class Fn>
void Engine::run_async(std::shared_ptr<CompletionSink> sink, std::uint64_t token, Fn fn) {
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  executor().submit([sink = std::move(sink), token, fn = std::move(fn)]() mutable {
    std::vector<Completion> out(1);
    out[0].token = token;
    try {
      out[0].value = fn();
    } catch (const Error& e) {
      out[0].error = e;
    } catch (const std::exception& e) {
      out[0].error = Error(ErrorCode::in_doubt,
                           std::string("an async call failed unexpectedly; its outcome is "
                                       "unknown: ") +
                               e.what());
    }
    sink->post(out);
  });
}

void Engine::submit_reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call,
                            std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  const std::int64_t ttl = ttl_us.value_or(options_.default_ttl_us);
  if (call.expected_version) {
    // If-Match may name a slotted SKU's summed version: the blocking path, on a worker,
    // which knows slots.
    (void)resolve(call);  // bad options raise here, not in the sink
    run_async(std::move(sink), token, [this, key, qty, ttl_us, idempotency_key, call] {
      return reserve(key, qty, ttl_us, idempotency_key, call);
    });
    return;
  }
  // This engine's slot of a slotted SKU (a batched call: the row the batcher picks; else
  // the SKU's own row). A refusal there, or
  // from a SKU with slots this engine has not seen yet, is checked by the sink before
  // it answers: the blocking path then fills the slot and runs again. Until then the
  // refusal is not recorded (see on_slots): whichever ends the call records it.
  Route r = route(key, call, BatchOp::reserve);
  const SkuKey row = slots_->first_row(key, r.batched);
  r.options.count_refusal = false;
  sink = slot_checked_sink(
      std::move(sink),
      [this, key, qty, ttl, idempotency_key, call, asked = r.asked, started = r.started_us](
          std::uint64_t t, std::shared_ptr<CompletionSink> inner, const Error& refusal) {
        run_async(std::move(inner), t,
                  [this, key, qty, ttl, idempotency_key, call, asked, started, refusal] {
                    throw_if_refusal_stands(key, refusal, Op::reserve, asked, started);
                    return reserve_on_slots(key, qty, ttl, idempotency_key, call,
                                            /*continued=*/true, started);
                  });
      },
      Op::reserve, r.asked, r.started_us);
  if (r.batched) {
    BatchItem item = reserve_item(row, qty, ttl, std::move(idempotency_key), r.asked);
    item.buyer = r.options.buyer;
    item.ref = r.options.ref;
    item.metadata = r.options.metadata;
    through_batcher(item, r, std::move(sink), token);
    return;
  }
  try {  // reserve_checked leaves the tracker when the call ends
    run_async(std::move(sink), token,
              [this, row, qty, ttl, idempotency_key = std::move(idempotency_key), r] {
                return reserve_checked(row, qty, ttl, idempotency_key, r);
              });
  } catch (...) {
    tracker_.leave(key);
    throw;
  }
}

void Engine::submit_sell(const SkuKey& key, Quantity qty, const CallOptions& call,
                         std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  refuse_buyer(call);
  validate_idempotency_key(call.idempotency_key);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  if (slots_->known_slots(key) > 1 || call.expected_version || call.idempotency_key || call.ref) {
    (void)resolve(call);
    run_async(std::move(sink), token, [this, key, qty, call] { return sell(key, qty, call); });
    return;
  }
  Route r = route(key, call, BatchOp::sell);
  r.options.count_refusal = false;  // as submit_reserve
  sink = slot_checked_sink(
      std::move(sink),
      [this, key, qty, call, asked = r.asked, started = r.started_us](
          std::uint64_t t, std::shared_ptr<CompletionSink> inner, const Error& refusal) {
        run_async(std::move(inner), t, [this, key, qty, call, asked, started, refusal] {
          throw_if_refusal_stands(key, refusal, Op::sell, asked, started);
          return sell_on_slots(key, qty, call, /*continued=*/true, started);
        });
      },
      Op::sell, r.asked, r.started_us);
  if (r.batched) {
    BatchItem item = sell_item(key, qty, r.asked, r.idempotency_key);
    through_batcher(item, r, std::move(sink), token);
    return;
  }
  try {  // sell_checked leaves the tracker when the call ends
    run_async(std::move(sink), token, [this, key, qty, r] { return sell_checked(key, qty, r); });
  } catch (...) {
    tracker_.leave(key);
    throw;
  }
}

void Engine::submit_reserve_order(const std::vector<OrderLine>& lines,
                                  std::optional<std::int64_t> ttl_us,
                                  std::optional<std::string> idempotency_key,
                                  const CallOptions& call, std::shared_ptr<CompletionSink> sink,
                                  std::uint64_t token) {
  check_process();
  order_request(lines, ttl_us, idempotency_key, call);  // bad input raises here
  run_async(std::move(sink), token,
            [this, lines, ttl_us, idempotency_key = std::move(idempotency_key), call] {
              return reserve_order(lines, ttl_us, idempotency_key, call);
            });
}

void Engine::submit_allocate(const std::vector<AllocationWant>& wants,
                             const std::vector<std::string>& locations, AllocationPolicy policy,
                             bool split, std::optional<std::int64_t> ttl_us,
                             std::optional<std::string> idempotency_key, const CallOptions& call,
                             std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  allocate_request(wants, locations, policy, split, ttl_us, idempotency_key, call);  // bad input
  run_async(
      std::move(sink), token,
      [this, wants, locations, policy, split, ttl_us, idempotency_key = std::move(idempotency_key),
       call] { return allocate(wants, locations, policy, split, ttl_us, idempotency_key, call); });
}

void Engine::submit_transition(const TransitionRequest& request,
                               std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_transition(request);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  if (batches(request)) {
    tracker_.enter(request.id.shard_key());  // the batcher leaves
    BatchItem item = transition_item(request);
    through_batcher(item, transition_route(), std::move(sink), token);
    return;
  }
  run_async(std::move(sink), token, [this, request] { return transition(request); });
}

}  // namespace stockade
