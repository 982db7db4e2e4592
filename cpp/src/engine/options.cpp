// The engine's options: their checks, and what the telemetry takes from them.
#include <limits>
#include <optional>
#include <string>

#include "engine/internal.hpp"
#include "hotrow/auto_slots.hpp"
#include "stockade/errors.hpp"

namespace stockade {

namespace detail::engine {

void validate_lock_timeout_ms(std::int64_t ms) {
  if (ms <= 0 || ms > lock_timeout_ms_max) {
    const bool fits = ms <= std::numeric_limits<std::int64_t>::max() / 1000 &&
                      ms >= std::numeric_limits<std::int64_t>::min() / 1000;
    throw_invalid_argument("lock_timeout must be between 0.001 s and " +
                           seconds_text(lock_timeout_ms_max * 1000) + ", got " +
                           (fits ? seconds_text(ms * 1000) : std::to_string(ms) + " ms"));
  }
}

std::uint64_t purge_limit(std::int64_t older_than_us, std::optional<std::int64_t> limit) {
  if (older_than_us < 0) {
    throw_invalid_argument("older_than must not be negative, got " + seconds_text(older_than_us));
  }
  if (!limit) return std::numeric_limits<std::uint64_t>::max();
  if (*limit < 1) {
    throw_invalid_argument("limit must be at least 1 (None: no bound), got " +
                           std::to_string(*limit));
  }
  return static_cast<std::uint64_t>(*limit);
}

}  // namespace detail::engine

void validate_engine_options(const EngineOptions& options) {
  if (options.retries_max < 0 || options.retries_max > retries_max_limit) {
    throw_invalid_argument("retries_max must be between 0 and " +
                           std::to_string(retries_max_limit));
  }
  detail::engine::validate_lock_timeout_ms(options.lock_timeout_ms);
  validate_ttl_us(options.default_ttl_us);
  validate_batcher_options(options.batcher);
  validate_telemetry_options(telemetry_options(options));
  validate_auto_options(options.automatic);
  if (options.async_workers < 1 || options.async_workers > async_workers_max) {
    throw_invalid_argument("async_workers must be between 1 and " +
                           std::to_string(async_workers_max));
  }
  if (options.home_slot < -1 || options.home_slot >= slots_max) {
    throw_invalid_argument("home_slot must be between 0 and " + std::to_string(slots_max - 1) +
                           ", or -1 (from the process id)");
  }
  if (options.slot_directory < 1 || options.slot_directory > slot_directory_max) {
    throw_invalid_argument("slot_directory must be between 1 and " +
                           std::to_string(slot_directory_max));
  }
  detail::validate_auto_slots_max(options.auto_slots_max);
  if (options.auto_slots_cool_ms < 0 || options.auto_slots_cool_ms > auto_slots_cool_ms_max) {
    throw_invalid_argument("auto_slots_cool_ms must be between 0 (never merge) and " +
                           std::to_string(auto_slots_cool_ms_max));
  }
  if (options.async_queue_max < 1 || options.async_queue_max > batcher_queue_capacity_max) {
    throw_invalid_argument("async_queue_max must be between 1 and " +
                           std::to_string(batcher_queue_capacity_max));
  }
}

TelemetryOptions telemetry_options(const EngineOptions& options) {
  TelemetryOptions out;
  out.sku_entries = options.sku_entries;
  return out;
}

}  // namespace stockade
