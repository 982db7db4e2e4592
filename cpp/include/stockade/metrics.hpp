// Counters per strategy, shared by the engine (outcomes) and the stores (mechanism:
// compare-and-set conflicts, retries, lock waits). Relaxed atomics on separate cache
// lines: they are written on every request from every thread, and read only by stats().
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "stockade/types.hpp"

namespace stockade {

struct StrategyCountersSnapshot {
  std::uint64_t requests = 0;           // reserve, reserve_order and sell calls
  std::uint64_t granted = 0;            // calls that committed
  std::uint64_t refused = 0;            // OutOfStock
  std::uint64_t failed = 0;             // any other error
  std::uint64_t conflicts = 0;          // compare-and-set attempts that lost a race
  std::uint64_t retries = 0;            // optimistic retries after a version conflict
  std::uint64_t version_conflicts = 0;  // VersionConflict raised to the caller
  std::uint64_t lock_waits = 0;         // lock acquisitions that had to wait
  std::uint64_t lock_wait_us = 0;       // total time spent waiting for locks
  std::uint64_t lock_not_available = 0;
  std::uint64_t lock_timeouts = 0;
};

struct alignas(64) StrategyCounters {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> granted{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> failed{0};
  std::atomic<std::uint64_t> conflicts{0};
  std::atomic<std::uint64_t> retries{0};
  std::atomic<std::uint64_t> version_conflicts{0};
  std::atomic<std::uint64_t> lock_waits{0};
  std::atomic<std::uint64_t> lock_wait_us{0};
  std::atomic<std::uint64_t> lock_not_available{0};
  std::atomic<std::uint64_t> lock_timeouts{0};

  StrategyCountersSnapshot snapshot() const;
};

inline void bump(std::atomic<std::uint64_t>& counter, std::uint64_t by = 1) {
  counter.fetch_add(by, std::memory_order_relaxed);
}

class Metrics {
 public:
  StrategyCounters& of(Strategy strategy) { return counters_[static_cast<std::size_t>(strategy)]; }
  const StrategyCounters& of(Strategy strategy) const {
    return counters_[static_cast<std::size_t>(strategy)];
  }

 private:
  std::array<StrategyCounters, strategy_count> counters_;
};

// Live per-SKU counters, kept by each store next to its rows.
struct alignas(64) SkuCounters {
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> refused{0};
  std::atomic<std::uint64_t> conflicts{0};
  std::atomic<std::uint64_t> lock_waits{0};
};

// Per-SKU figures: how hot a row is and how often writers collide on it. The store fills
// the counters; the engine adds what its contention tracker measured.
struct SkuStats {
  SkuKey key;
  std::uint64_t requests = 0;
  std::uint64_t refused = 0;
  std::uint64_t conflicts = 0;
  std::uint64_t lock_waits = 0;
  Strategy mode = Strategy::atomic;  // what `auto` runs this SKU as right now
  std::uint32_t in_flight = 0;       // requests in flight in this process
  std::uint32_t peak_in_flight = 0;  // in the tracker's last complete window
};

// The hot-row batcher's figures (all zero until a batched request starts it).
struct BatcherStats {
  bool started = false;
  std::uint64_t batches = 0;         // transactions applied
  std::uint64_t requests = 0;        // requests they carried
  std::uint64_t failed_batches = 0;  // batches whose transaction failed as a whole
  std::uint64_t batch_size_max = 0;  // the largest batch so far
  std::uint64_t queued = 0;          // requests waiting or being applied right now
  std::size_t shards = 0;
};

// The background sweeper of a store that has one (PostgreSQL, sweeper=true).
struct SweeperStats {
  bool enabled = false;
  bool leader = false;        // this engine holds the database's sweeper election
  std::uint64_t runs = 0;     // sweeps this engine ran as leader
  std::uint64_t expired = 0;  // holds it expired
  std::uint64_t errors = 0;   // failed rounds (it reconnects and stands again)
  std::string last_error;
};

struct StoreStats {
  std::string backend;
  std::array<StrategyCountersSnapshot, strategy_count> strategies{};
  std::vector<SkuStats> hottest_skus;  // by requests, most first
  std::uint64_t sku_count = 0;
  std::uint64_t reservation_count = 0;
  std::uint64_t held_count = 0;
  SweeperStats sweeper;
  BatcherStats batcher;
};

// The parts of StoreStats every store fills the same way.
StoreStats stats_of(const char* backend, const Metrics& metrics);
SkuStats sku_stats(const SkuKey& key, const SkuCounters& counters);
// Keeps the `limit` SKUs with the most requests, most first (ties by key).
void keep_hottest(std::vector<SkuStats>& skus, std::size_t limit);

}  // namespace stockade
