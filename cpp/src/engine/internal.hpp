// What the engine's source files share (engine/*.cpp): the batcher's requests of each kind,
// the contention tracker's guard for a per-request call, the option checks, and the
// templates that count a call's outcome.
#pragma once

#include <optional>
#include <string>

#include "stockade/contention.hpp"
#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace stockade::detail::engine {

inline bool waits_for_locks(Strategy s) {
  return s == Strategy::pessimistic || s == Strategy::advisory;
}

// The batcher's requests of each kind: a reserve or sell on a row, and a transition.
inline BatchRequest row_request(BatchOp op, const SkuKey& key, Quantity qty, Strategy asked) {
  BatchRequest request;
  request.op = op;
  request.started_us = steady_now_us();
  request.counted_as = asked;
  request.key = key;
  request.qty = qty;
  return request;
}

inline BatchItem reserve_item(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                              std::optional<std::string> idempotency_key, Strategy asked) {
  BatchItem item;
  item.assign(row_request(BatchOp::reserve, key, qty, asked));
  item.ttl_us = ttl_us;
  item.idempotency_key = std::move(idempotency_key);
  return item;
}

// Purchase limits count holds: a sell takes no buyer. Nor metadata: a sale leaves no
// reservation to keep it (its ref goes to the journal).
inline void refuse_buyer(const CallOptions& call) {
  if (call.buyer) {
    throw_invalid_argument("sell takes no buyer: purchase limits count holds (reserve)");
  }
  if (call.metadata) {
    throw_invalid_argument(
        "sell takes no metadata: it makes no reservation to keep it (its ref= goes to the "
        "journal)");
  }
}

inline BatchItem sell_item(const SkuKey& key, Quantity qty, Strategy asked,
                           std::optional<std::string> idempotency_key) {
  BatchItem item;
  item.assign(row_request(BatchOp::sell, key, qty, asked));
  item.idempotency_key = std::move(idempotency_key);
  return item;
}

// A confirm or release as the batcher's request (an extend is never batched).
inline BatchItem transition_item(const TransitionRequest& request) {
  BatchItem item;
  item.op = request.kind == Transition::confirm ? BatchOp::confirm : BatchOp::release;
  item.started_us = steady_now_us();
  item.id = request.id;
  item.expected_version = request.expected_version;
  item.qty = request.qty.value_or(0);  // 0: all that is held
  item.release_rest = request.release_rest;
  item.idempotency_key = request.idempotency_key;
  return item;
}

// Leaves the contention tracker when a per-request call ends, however it ends. A call
// that hands its request to the batcher (which leaves the tracker for it) says so with
// hand_over(); if it then runs on, again() counts it in the tracker anew.
class InFlight {
 public:
  InFlight(ContentionTracker& tracker, std::uint16_t shard_key)
      : tracker_(&tracker), shard_key_(shard_key) {}
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    if (on_) tracker_->leave(shard_key_);
  }
  void hand_over() { on_ = false; }
  void again() {
    if (on_) return;
    tracker_->enter(shard_key_);
    on_ = true;
  }

 private:
  ContentionTracker* tracker_;
  std::uint16_t shard_key_;
  bool on_ = true;
};

// InvalidArgument unless 1 ms <= ms <= lock_timeout_ms_max (engine/options.cpp).
void validate_lock_timeout_ms(std::int64_t ms);

// purge() and purge_movements(): InvalidArgument unless older_than_us >= 0 and limit (none:
// no bound) >= 1; returns the limit as the stores take it (engine/options.cpp).
std::uint64_t purge_limit(std::int64_t older_than_us, std::optional<std::int64_t> limit);

}  // namespace stockade::detail::engine

namespace stockade {

// Counts the outcome of one strategy-routed call.
template <class Result, class Fn>
Result Engine::counted(Op op, Strategy strategy, bool refusal_final, std::int64_t started_us,
                       Fn&& fn) {
  try {
    Result result = fn();
    record_outcome(op, strategy, nullptr, started_us);
    return result;
  } catch (const Error& e) {
    if (refusal_final || e.code() != ErrorCode::out_of_stock) {
      record_outcome(op, strategy, &e, started_us);
    }
    throw;
  }
}

template <class Fn>
auto Engine::observed(Op op, Fn&& fn) -> decltype(fn()) {
  const std::int64_t started = steady_now_us();
  try {
    auto result = fn();
    telemetry_->record_call(op, std::nullopt, nullptr, steady_now_us() - started);
    return result;
  } catch (const Error& e) {
    telemetry_->record_call(op, std::nullopt, &e, steady_now_us() - started);
    throw;
  }
}

}  // namespace stockade
