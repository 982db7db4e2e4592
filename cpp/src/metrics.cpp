#include "stockade/metrics.hpp"

#include <algorithm>

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

StoreStats stats_of(const char* backend, const Metrics& metrics) {
  StoreStats out;
  out.backend = backend;
  for (std::size_t i = 0; i < strategy_count; ++i) {
    out.strategies[i] = metrics.of(static_cast<Strategy>(i)).snapshot();
  }
  return out;
}

SkuStats sku_stats(const SkuKey& key, const SkuCounters& c) {
  auto read = [](const std::atomic<std::uint64_t>& n) { return n.load(std::memory_order_relaxed); };
  return SkuStats{key, read(c.requests), read(c.refused), read(c.conflicts), read(c.lock_waits)};
}

void keep_hottest(std::vector<SkuStats>& skus, std::size_t limit) {
  const std::size_t keep = std::min(limit, skus.size());
  std::partial_sort(skus.begin(), skus.begin() + static_cast<std::ptrdiff_t>(keep), skus.end(),
                    [](const SkuStats& a, const SkuStats& b) {
                      return a.requests != b.requests ? a.requests > b.requests : a.key < b.key;
                    });
  skus.resize(keep);
}

}  // namespace stockade
