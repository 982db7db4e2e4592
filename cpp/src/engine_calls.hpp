// The engine's call wrappers (engine.cpp, slots.cpp): counting and recording outcomes.
#pragma once

#include "stockade/engine.hpp"

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
