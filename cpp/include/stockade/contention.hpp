// ContentionTracker: how hot each SKU is, measured per process, and the mode the `auto`
// strategy runs it in.
//
// The signal is collisions on one row: a request that arrives while another request for
// the same (sku, location) is still in flight collides with it. On PostgreSQL such a
// request waits for the row lock (atomic, pessimistic), a lock (advisory) or a retry
// (optimistic); in every case it is the conflict the Claim Test's "odds" question asks
// about, measured per row rather than per second. Each SKU keeps, over a sliding window
// (`window_ms`), its requests, its collisions and its peak number of requests in flight.
//
// Modes, with hysteresis: a SKU runs `atomic` until `hot_in_flight` of its requests are
// in flight at once (it switches at that request, not at the end of a window, so a burst
// is batched from its start); then `batched`, until `cool_windows` windows in a row peak
// at no more than `cool_in_flight` (an idle gap counts as cool windows). The gap between the
// two thresholds and the run of cool windows keep a SKU at the edge from flapping.
//
// Other processes: a row that many processes write is a queue that no one process sees
// whole (16 processes with 2 requests each never reach 4 in flight in any of them). Their
// writes show in the row's version, which every write moves by one per request: the
// PostgreSQL store reports the version each of this process's writes on the request path
// (reserves and sells, confirms and releases, batches) left (observe_version). Over a span of such
// writes, the versions the row moved per write of this process are the row's writers per writer of
// ours, and this process's peak in flight times that share estimates the requests in flight on the
// row across every process (Little's law, with the same latency for all). At `hot_in_flight` of
// those, with at least 2 in flight here (batching has nothing to fold below that), the SKU switches
// to batched. Cooling stays local: a process whose own peak stays at `cool_in_flight` has nothing
// to fold, whatever the others do.
//
// Cost: SKUs map into a fixed table of cache-line-sized cells (`cells`, a power of two,
// indexed by the row's 16-bit shard key, which reservation ids carry too, so a confirm
// or release finds its SKU's cell without reading the reservation), so tracking
// allocates nothing and takes no lock; two SKUs that share a cell share their
// heat, which can batch a cold SKU (correct, just not needed) but never the reverse for
// long. Each request costs two atomic increments on its cell and one clock read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stockade/hash.hpp"
#include "stockade/store.hpp"
#include "stockade/types.hpp"

namespace stockade {

// The Claim Test's thresholds on conflicts per write to one row, written once here and
// exported to Python (stockade.claim reads them from _core). At or below the low rate an
// optimistic retry is rare and cheap; at or above the hot rate the row is a queue, and
// folding requests into batches beats any per-request lock.
inline constexpr double low_conflict_rate = 0.05;
inline constexpr double hot_conflict_rate = 0.5;
static_assert(0.0 < low_conflict_rate && low_conflict_rate < hot_conflict_rate &&
              hot_conflict_rate <= 1.0);

struct AutoOptions {
  std::uint32_t hot_in_flight = 4;   // this many in flight at once: batched
  std::uint32_t cool_in_flight = 1;  // window peaks at most this low ...
  std::uint32_t cool_windows = 4;    // ... this many windows in a row: back to atomic
  std::int64_t window_ms = 50;
  std::size_t cells = 4096;  // at most 65536: the shard key has 16 bits
};

// Throws InvalidArgument naming the option out of range.
void validate_auto_options(const AutoOptions& options);

struct SkuHeat {
  Strategy mode = Strategy::atomic;  // what `auto` runs this SKU as right now
  std::uint32_t in_flight = 0;
  std::uint32_t peak_in_flight = 0;     // in the last complete window
  std::uint64_t requests = 0;           // since the tracker started
  std::uint64_t collisions = 0;         // requests that arrived while another was in flight
  std::uint64_t window_requests = 0;    // in the last complete window
  std::uint64_t window_collisions = 0;  // in the last complete window
  std::uint64_t switches = 0;           // mode changes so far
  // Requests in flight on the row across every process, estimated from the versions
  // this process's writes left (0: not measured lately); and the switches to batched it
  // caused (counted in `switches` too).
  std::uint32_t row_queue = 0;
  std::uint64_t shared_switches = 0;
};

// Owned by the engine (the hot-row layer's policy, above the stores); the stores report
// their writes to it as a RowWriteObserver.
class ContentionTracker final : public RowWriteObserver {
 public:
  explicit ContentionTracker(AutoOptions options = {});
  ~ContentionTracker() override;

  // A request for the row with `shard_key` (see shard_key_of) starts; returns the mode
  // `auto` runs it in.
  Strategy enter(std::uint16_t shard_key);
  // That request finished (whatever its outcome).
  void leave(std::uint16_t shard_key);
  // `writes` changes of this process (a write, or a batch's writes to the row) left the
  // row at `version` (see "Other processes" above).
  void observe_version(const SkuKey& key, Version version, std::uint32_t writes = 1);
  void wrote(const SkuKey& row, Version left, std::uint32_t changes) override {
    observe_version(row, left, changes);
  }
  SkuHeat heat(std::uint16_t shard_key) const;
  // The mode `auto` runs the row in right now, without counting a request.
  Strategy mode(std::uint16_t shard_key) const;
  Strategy enter(const SkuKey& key) { return enter(row_shard_key(key.sku, key.location)); }
  void leave(const SkuKey& key) { leave(row_shard_key(key.sku, key.location)); }
  SkuHeat heat(const SkuKey& key) const { return heat(row_shard_key(key.sku, key.location)); }
  const AutoOptions& options() const { return options_; }

 private:
  struct Cell;
  Cell& cell_of(std::uint16_t shard_key) const;
  void roll(Cell& cell, std::int64_t now_us, std::int64_t window_start_us);

  const AutoOptions options_;
  std::unique_ptr<Cell[]> cells_;
};

// The strategy the measured figures of one SKU point to, with one reason per finding.
struct Advice {
  Strategy strategy = Strategy::atomic;
  std::vector<std::string> reasons;
};

Advice advise(const SkuKey& key, const SkuHeat& heat, const AutoOptions& options);

}  // namespace stockade
