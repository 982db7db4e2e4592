// Telemetry: the one owner of every counter the engine keeps. The engine (outcomes per
// strategy), the stores (mechanism: compare-and-set conflicts, retries, lock waits), the
// hot-row batcher (batches) and the sweeper all write here; stats() and any exporter read
// from here. Nothing else keeps counters.
//
// Memory is bounded by configuration, never by traffic:
//   - per strategy: a fixed array of relaxed atomics, one cache line per strategy;
//   - per SKU: a fixed table of `sku_entries` entries. A SKU takes a free entry among the
//     `sku_probe` entries its hash points to; when all are taken it evicts the one with the
//     fewest requests (so the hottest SKUs stay and cold ones come and go). A client that
//     invents SKUs churns the coldest entries but cannot grow the table;
//   - contention heat (the `auto` strategy's signal): the tracker's fixed table of cells.
//
// Writes are relaxed atomics (per SKU, under one of a fixed set of striped locks while the
// entry is found). A snapshot is exact per counter, not across counters.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "stockade/errors.hpp"
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

struct alignas(cache_line_size) StrategyCounters {
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

// The steady clock in microseconds, for latencies.
inline std::int64_t steady_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct SkuStats {
  SkuKey key;
  std::uint64_t requests = 0;
  std::uint64_t refused = 0;
  std::uint64_t conflicts = 0;
  std::uint64_t lock_waits = 0;
  Strategy mode = Strategy::atomic;  // what `auto` runs this SKU as right now
  std::uint32_t in_flight = 0;       // requests in flight in this process
  std::uint32_t peak_in_flight = 0;  // in the tracker's last complete window
  std::uint32_t row_queue = 0;       // in flight on the row across every process (estimate)
  int slots = 1;                     // rows its units are spread over, as this engine knows
};
// What `auto` did about hot-row slots (hotrow/auto_slots.hpp): SKUs it split, splits of
// other engines it learned, SKUs it kept on one row (set_slots refused), SKUs it merged
// back into one row when they cooled, and the last few
// of these decisions with their reasons, most recent last.
struct SlotDecisionStats {
  SkuKey key;
  int slots = 1;
  bool split = false;
  bool merged = false;
  std::string why;
  double age_s = 0;  // since the decision
};
struct SlotStats {
  int auto_slots_max = 1;
  std::uint64_t auto_splits = 0;
  std::uint64_t learned = 0;
  std::uint64_t kept = 0;
  std::uint64_t auto_merges = 0;
  std::vector<SlotDecisionStats> recent;
};
struct BatcherStats {
  bool started = false;
  std::uint64_t batches = 0;         // transactions applied
  std::uint64_t requests = 0;        // requests they carried
  std::uint64_t failed_batches = 0;  // batches whose transaction failed as a whole
  std::uint64_t batch_size_max = 0;  // the largest batch so far
  // Batches whose row another writer had changed since this engine's previous batch on it
  // (so the row is shared: another process, or calls outside the batcher), and batches
  // for which the flusher lingered on such a row to gather more requests.
  std::uint64_t shared_row_batches = 0;
  std::uint64_t lingered_batches = 0;
  // Batches whose flusher waited for the callers of its row's last batch to come back
  // (the batcher's "waves stay whole").
  std::uint64_t gathered_batches = 0;
  std::uint64_t queued = 0;  // requests waiting or being applied right now
  std::size_t shards = 0;
};
struct SweeperStats {
  bool enabled = false;
  bool leader = false;        // this engine holds the database's sweeper election
  std::uint64_t runs = 0;     // sweeps this engine ran as leader
  std::uint64_t expired = 0;  // holds it expired
  std::uint64_t errors = 0;   // failed rounds (it reconnects and stands again)
  std::string last_error;
  std::uint64_t purged_reservations = 0;  // rows this engine purged (purge() or retention)
  std::uint64_t purged_keys = 0;
  std::uint64_t freed_on_refusal = 0;  // lapsed holds a refused request expired first
  double round_seconds = 0;            // time spent in the rounds it ran as leader, in all
  double last_round_seconds = 0;       // the last such round's
};

// Row counts, which only the store knows. Store::counts() is cheap and may estimate (the
// PostgreSQL store reads the statistics collector's live-tuple figures, and counts holds
// up to held_count_cap); Store::exact_counts() counts every row.
struct StoreCounts {
  std::uint64_t sku_count = 0;
  std::uint64_t reservation_count = 0;
  std::uint64_t held_count = 0;
  bool exact = true;
};

// Direct routing on Citus (PostgresOptions::citus_routing, postgres/routes.hpp).
struct RoutingStats {
  std::string mode = "coordinator";  // "coordinator" or "direct"
  std::uint64_t nodes = 0;           // workers the map routes to
  std::uint64_t routed = 0;          // calls sent straight to a worker
  std::uint64_t misses = 0;          // of those, calls that ran on another node (stale map)
  std::uint64_t fallbacks = 0;       // calls whose worker was out of reach, run via the coordinator
  std::uint64_t reloads = 0;         // times the map was read from the coordinator
};

// The store's connection pool right now (all zero for a store without one).
struct PoolStats {
  std::uint64_t size = 0;    // connections it may open
  std::uint64_t in_use = 0;  // leased, or being opened
  std::uint64_t idle = 0;
  std::uint64_t waiting = 0;  // callers waiting for a connection
  // PostgreSQL: its connections run without session state, behind a transaction-mode
  // pooler (the pooler option, or one detected on a connection opened so far).
  bool pooled = false;
  // PostgreSQL, pooled: the newest connection calls the statement routines that
  // migrate() makes (PL/pgSQL functions that keep their plans per server session).
  bool routines = false;
  // PostgreSQL, direct: the server the newest connection reached, "<system identifier>/
  // <timeline>" (a standby shows "/in recovery"), and how many times a new connection
  // found a different one than the connection before it: a failover, or a DSN that
  // leads to another cluster. Each change is also logged (WARNING).
  std::string server;
  std::uint64_t server_changes = 0;
  RoutingStats routing;
};

// What one purge deleted.
struct PurgeCounts {
  std::uint64_t reservations = 0;
  std::uint64_t keys = 0;
  std::uint64_t transfers = 0;  // finished ones (received or cancelled)
  std::uint64_t total() const { return reservations + keys + transfers; }
};

struct StoreStats {
  std::string backend;
  std::array<StrategyCountersSnapshot, strategy_count> strategies{};
  std::vector<SkuStats> hottest_skus;  // by requests, most first
  std::uint64_t sku_count = 0;
  std::uint64_t reservation_count = 0;
  std::uint64_t held_count = 0;
  bool counts_exact = true;
  PoolStats pool;
  SweeperStats sweeper;
  BatcherStats batcher;
  SlotStats slots;
};

// The calls whose outcomes and latencies are recorded, by operation, once: the enum, its
// count and its names (the `op` label of the metrics) come from this list.
#define STOCKADE_OPS(X)    \
  X(reserve)               \
  X(reserve_order)         \
  X(allocate)              \
  X(sell)                  \
  X(confirm)               \
  X(release)               \
  X(extend)                \
  X(restock)               \
  X(set_on_hand)           \
  X(stock)                 \
  X(reservation)           \
  X(expire_due)            \
  X(purge)                 \
  X(set_backorder_limit)   \
  X(set_safety_stock)      \
  X(move_units)            \
  X(transfer)              \
  X(receive)               \
  X(cancel_transfer)       \
  X(transfers)             \
  X(discontinue)           \
  X(reinstate)             \
  X(acquire_lease)         \
  X(renew_lease)           \
  X(release_lease)         \
  X(set_purchase_limit)    \
  X(remove_purchase_limit) \
  X(buyer_held)            \
  X(set_slots)             \
  X(return_units)          \
  X(resize)                \
  X(confirm_order)         \
  X(release_order)         \
  X(extend_order)          \
  X(order)                 \
  X(reservations)

enum class Op : std::uint8_t {
#define STOCKADE_OP_ENUM(name) name,
  STOCKADE_OPS(STOCKADE_OP_ENUM)
#undef STOCKADE_OP_ENUM
};
#define STOCKADE_OP_COUNT(name) +1
inline constexpr std::size_t op_count = 0 STOCKADE_OPS(STOCKADE_OP_COUNT);
#undef STOCKADE_OP_COUNT
const char* op_name(Op op) noexcept;

// Histogram bucket bounds (upper, inclusive): latency in microseconds (100 us .. 10 s, and
// +Inf), batch sizes in requests (1 .. 4096, and +Inf).
inline constexpr std::array<std::int64_t, 16> latency_bounds_us = {
    100,   250,    500,    1000,   2500,    5000,    10000,   25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000};
inline constexpr std::array<std::uint64_t, 13> batch_size_bounds = {
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

// One series of calls: an operation under one strategy (none for calls that take none),
// with its outcomes and its latency histogram (per-bucket counts, the last is +Inf).
struct CallSeries {
  Op op = Op::reserve;
  std::optional<Strategy> strategy;
  std::array<std::uint64_t, error_code_count + 1> outcomes{};  // [0]: ok, [1 + code]: error
  std::array<std::uint64_t, latency_bounds_us.size() + 1> latency_buckets{};
  std::uint64_t latency_sum_us = 0;
  std::uint64_t count = 0;
};

struct MetricsSnapshot {
  std::vector<CallSeries> calls;  // the series that saw at least one call
  std::array<std::uint64_t, batch_size_bounds.size() + 1> batch_size_buckets{};
  std::uint64_t batch_size_sum = 0;
  std::uint64_t batch_count = 0;
};

// What a store counts per SKU.
enum class SkuEvent : std::uint8_t { request, refused, conflict, lock_wait };

struct TelemetryOptions {
  std::size_t sku_entries = 1024;  // per-SKU counters kept at most (a power of two)
};

inline constexpr std::size_t telemetry_sku_entries_max = 1u << 20;
inline constexpr std::size_t sku_probe = 8;  // slots a SKU may take, from its hash on

// Throws InvalidArgument naming the option out of range.
void validate_telemetry_options(const TelemetryOptions& options);

class Telemetry {
 public:
  explicit Telemetry(TelemetryOptions options = {});
  ~Telemetry();
  Telemetry(const Telemetry&) = delete;
  Telemetry& operator=(const Telemetry&) = delete;

  // Per strategy.
  StrategyCounters& of(Strategy strategy) {
    return strategies_[static_cast<std::size_t>(strategy)];
  }
  const StrategyCounters& of(Strategy strategy) const {
    return strategies_[static_cast<std::size_t>(strategy)];
  }
  // One outcome of a strategy-routed call (its request was counted when it began):
  // granted when `error` is null, else refused (OutOfStock) or failed, by kind.
  void count_outcome(Strategy strategy, const Error* error);

  // Per SKU, in the bounded table.
  void count(const SkuKey& key, SkuEvent event, std::uint64_t n = 1);

  // One call that ended (well, or with `error`) after `latency_us`: counted by operation,
  // strategy (none for calls that take none) and outcome, into fixed tables.
  void record_call(Op op, std::optional<Strategy> strategy, const Error* error,
                   std::int64_t latency_us);
  MetricsSnapshot metrics() const;

  // The hot-row batcher's figures.
  void batcher_started(std::size_t shards) { batcher_shards_.store(shards); }
  void batch_applied(std::size_t size, bool failed);
  void batch_found_row_shared() { bump(shared_row_batches_); }
  void batch_lingered() { bump(lingered_batches_); }
  void batch_gathered() { bump(gathered_batches_); }

  // The sweeper's rounds.
  void sweeper_enabled(bool enabled);
  // A round that took `seconds` (counted when this engine ran it as leader).
  void sweeper_round(bool leader, std::uint64_t expired, const std::string& error,
                     double seconds = 0);
  // Rows a purge deleted (the sweeper's, purge()'s, or the memory store's as it goes).
  void purged(const PurgeCounts& counts);
  // Lapsed holds a refused request expired before its refusal stood (Store::free_lapsed).
  void freed_on_refusal(std::uint64_t holds);

  const TelemetryOptions& options() const { return options_; }

  // Everything but the store's row counts: per strategy; the `sku_limit` SKUs with the
  // most requests (most first, ties by key) with their heat; the batcher; the sweeper.
  StoreStats snapshot(std::size_t sku_limit) const;

 private:
  struct SkuTable;
  struct CallTable;

  const TelemetryOptions options_;
  std::array<StrategyCounters, strategy_count> strategies_;
  std::unique_ptr<SkuTable> skus_;
  std::unique_ptr<CallTable> calls_;

  alignas(cache_line_size) std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> batch_requests_{0};
  std::atomic<std::uint64_t> failed_batches_{0};
  std::atomic<std::uint64_t> batch_size_max_{0};
  std::atomic<std::uint64_t> shared_row_batches_{0};
  std::atomic<std::uint64_t> lingered_batches_{0};
  std::atomic<std::uint64_t> gathered_batches_{0};
  std::atomic<std::size_t> batcher_shards_{0};
  std::array<std::atomic<std::uint64_t>, batch_size_bounds.size() + 1> batch_size_buckets_{};

  mutable std::mutex sweeper_mutex_;
  SweeperStats sweeper_;
};

}  // namespace stockade
