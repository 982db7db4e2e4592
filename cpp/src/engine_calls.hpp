// The engine's call wrappers (engine.cpp, slots.cpp): counting and recording outcomes.
#pragma once

#include "stockade/engine.hpp"

namespace stockade {

// Counts the outcome of one strategy-routed call.
template <class Result, class Fn>
Result Engine::counted(Op op, Strategy strategy, Fn&& fn) {
  bump(telemetry_->of(strategy).requests);
  const std::int64_t started = steady_now_us();
  try {
    Result result = fn();
    telemetry_->count_outcome(strategy, nullptr);
    telemetry_->record_call(op, strategy, nullptr, steady_now_us() - started);
    return result;
  } catch (const Error& e) {
    telemetry_->count_outcome(strategy, &e);
    telemetry_->record_call(op, strategy, &e, steady_now_us() - started);
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
