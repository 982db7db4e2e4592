#include "stockade/metrics.hpp"

namespace stockade {

StrategyCountersSnapshot StrategyCounters::snapshot() const {
  auto read = [](const std::atomic<std::uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  StrategyCountersSnapshot s;
  s.requests = read(requests);
  s.granted = read(granted);
  s.refused = read(refused);
  s.failed = read(failed);
  s.conflicts = read(conflicts);
  s.retries = read(retries);
  s.version_conflicts = read(version_conflicts);
  s.lock_waits = read(lock_waits);
  s.lock_wait_us = read(lock_wait_us);
  s.lock_not_available = read(lock_not_available);
  s.lock_timeouts = read(lock_timeouts);
  return s;
}

}  // namespace stockade
