#include "stockade/contention.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "stockade/errors.hpp"

namespace stockade {
namespace {

// A window needs this many requests before its rate stands for the SKU; below it, the
// counts since start do.
constexpr std::uint64_t window_requests_min = 20;

// The span of this process's writes over which the row's version velocity is measured:
// estimates start at its 4th report (a write, or a batch of them) and the span starts over
// after 64 reports or 4 windows, so the estimate follows the row's present load.
constexpr std::uint32_t span_reports_min = 4;
constexpr std::uint32_t span_reports_max = 64;
constexpr std::int64_t span_windows_max = 4;

// Tells apart the rows that share a cell, whose versions are unrelated counters. Never 0,
// which marks a cell no write has been observed in.
std::uint32_t row_tag(const SkuKey& key) {
  return static_cast<std::uint32_t>(stable_hash64({"row-tag", key.sku, key.location}) >> 32) | 1u;
}

void store_min(std::atomic<std::int64_t>& a, std::int64_t v) {
  std::int64_t cur = a.load(std::memory_order_relaxed);
  while (v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void store_max(std::atomic<std::int64_t>& a, std::int64_t v) {
  std::int64_t cur = a.load(std::memory_order_relaxed);
  while (v > cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

std::int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string percent(double rate) {
  char out[32];
  std::snprintf(out, sizeof(out), "%.1f%%", rate * 100.0);
  return out;
}

}  // namespace

struct alignas(cache_line_size) ContentionTracker::Cell {
  std::atomic<std::uint32_t> in_flight{0};
  std::atomic<std::uint32_t> peak{0};
  std::atomic<std::int64_t> window_start_us{0};
  std::atomic<std::uint64_t> requests{0};
  std::atomic<std::uint64_t> collisions{0};
  std::atomic<std::uint64_t> window_requests{0};
  std::atomic<std::uint64_t> window_collisions{0};
  // Switched to batched by a burst in enter(), back by the thread that rolls a window.
  std::atomic<std::uint8_t> mode{static_cast<std::uint8_t>(Strategy::atomic)};
  std::atomic<std::uint32_t> cool_streak{0};
  std::atomic<std::uint32_t> last_peak{0};
  std::atomic<std::uint64_t> last_window_requests{0};
  std::atomic<std::uint64_t> last_window_collisions{0};
  std::atomic<std::uint64_t> switches{0};
  // The span of observed versions (observe_version): whose row, since when, the lowest
  // and highest version seen, and how many writes; the last estimate it gave.
  std::atomic<std::uint32_t> span_tag{0};
  std::atomic<std::uint32_t> span_reports{0};
  std::atomic<std::uint64_t> span_own{0};  // this process's writes after the first report
  std::atomic<std::int64_t> span_start_us{0};
  std::atomic<std::int64_t> span_low{0};
  std::atomic<std::int64_t> span_high{0};
  std::atomic<std::uint32_t> row_queue{0};
  std::atomic<std::uint64_t> shared_switches{0};
};

void validate_auto_options(const AutoOptions& o) {
  if (o.hot_in_flight < 2) throw_invalid_argument("auto: hot_in_flight must be at least 2");
  if (o.cool_in_flight >= o.hot_in_flight) {
    throw_invalid_argument("auto: cool_in_flight must be below hot_in_flight");
  }
  if (o.cool_windows < 1 || o.cool_windows > 1000) {
    throw_invalid_argument("auto: cool_windows must be between 1 and 1000");
  }
  if (o.window_ms < 1 || o.window_ms > 60'000) {
    throw_invalid_argument("auto: window_ms must be between 1 and 60000");
  }
  if (o.cells < 1 || o.cells > (1u << 16) || (o.cells & (o.cells - 1)) != 0) {
    throw_invalid_argument("auto: cells must be a power of two up to 65536");
  }
}

ContentionTracker::ContentionTracker(AutoOptions options)
    : options_(options), cells_((validate_auto_options(options), new Cell[options.cells])) {}

ContentionTracker::~ContentionTracker() = default;

ContentionTracker::Cell& ContentionTracker::cell_of(std::uint16_t shard_key) const {
  return cells_[shard_key & (options_.cells - 1)];
}

Strategy ContentionTracker::enter(std::uint16_t shard_key) {
  Cell& c = cell_of(shard_key);
  const std::uint32_t before = c.in_flight.fetch_add(1, std::memory_order_relaxed);
  c.requests.fetch_add(1, std::memory_order_relaxed);
  c.window_requests.fetch_add(1, std::memory_order_relaxed);
  if (before > 0) {
    c.collisions.fetch_add(1, std::memory_order_relaxed);
    c.window_collisions.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint32_t peak = c.peak.load(std::memory_order_relaxed);
  while (before + 1 > peak && !c.peak.compare_exchange_weak(peak, before + 1)) {
  }
  // A burst switches at once, without waiting for its window to close: the requests
  // arriving now are the ones that need batching.
  if (before + 1 >= options_.hot_in_flight) {
    auto cold = static_cast<std::uint8_t>(Strategy::atomic);
    if (c.mode.compare_exchange_strong(cold, static_cast<std::uint8_t>(Strategy::batched))) {
      c.switches.fetch_add(1, std::memory_order_relaxed);
      c.cool_streak.store(0, std::memory_order_relaxed);
    }
  }
  const std::int64_t now = steady_us();
  std::int64_t start = c.window_start_us.load(std::memory_order_relaxed);
  if (now - start >= options_.window_ms * 1000 &&
      c.window_start_us.compare_exchange_strong(start, now)) {
    roll(c, now, start);
  }
  return static_cast<Strategy>(c.mode.load(std::memory_order_relaxed));
}

void ContentionTracker::leave(std::uint16_t shard_key) {
  cell_of(shard_key).in_flight.fetch_sub(1, std::memory_order_relaxed);
}

// Versions are counters of one row each, so a span only ever holds one row's: a write to
// another row of the same cell starts the span over (two rows that share a cell and are
// both written keep restarting it, and get no estimate: the local signal still works).
// Threads that observe at once may mix a restart with an update, which skews one
// estimate; at worst that batches a SKU that did not need it, which is correct.
void ContentionTracker::observe_version(const SkuKey& key, Version version, std::uint32_t writes) {
  if (writes == 0) return;
  Cell& c = cell_of(row_shard_key(key.sku, key.location));
  const std::uint32_t tag = row_tag(key);
  const std::int64_t now = steady_us();
  const std::uint32_t reports = c.span_reports.load(std::memory_order_relaxed);
  if (c.span_tag.load(std::memory_order_relaxed) != tag || reports == 0 ||
      reports >= span_reports_max ||
      now - c.span_start_us.load(std::memory_order_relaxed) >
          span_windows_max * options_.window_ms * 1000) {
    c.span_tag.store(tag, std::memory_order_relaxed);
    c.span_start_us.store(now, std::memory_order_relaxed);
    c.span_low.store(version, std::memory_order_relaxed);
    c.span_high.store(version, std::memory_order_relaxed);
    c.span_own.store(0, std::memory_order_relaxed);
    c.span_reports.store(1, std::memory_order_relaxed);
    return;
  }
  store_min(c.span_low, version);
  store_max(c.span_high, version);
  const std::uint64_t own = c.span_own.fetch_add(writes, std::memory_order_relaxed) + writes;
  const std::uint32_t seen = c.span_reports.fetch_add(1, std::memory_order_relaxed) + 1;
  if (seen < span_reports_min) return;
  const std::int64_t moved =
      c.span_high.load(std::memory_order_relaxed) - c.span_low.load(std::memory_order_relaxed);
  // The row's writes per write of this process (at least 1: ours are among them).
  const double share = std::max(1.0, static_cast<double>(moved) / static_cast<double>(own));
  const std::uint32_t local =
      std::max(c.peak.load(std::memory_order_relaxed), c.in_flight.load(std::memory_order_relaxed));
  const double queue = std::min(share * static_cast<double>(local), 1e9);
  c.row_queue.store(static_cast<std::uint32_t>(queue + 0.5), std::memory_order_relaxed);
  if (local < 2 || queue < static_cast<double>(options_.hot_in_flight)) return;
  auto cold = static_cast<std::uint8_t>(Strategy::atomic);
  if (c.mode.compare_exchange_strong(cold, static_cast<std::uint8_t>(Strategy::batched))) {
    c.switches.fetch_add(1, std::memory_order_relaxed);
    c.shared_switches.fetch_add(1, std::memory_order_relaxed);
    c.cool_streak.store(0, std::memory_order_relaxed);
  }
}

// Closes the window that began at `start`: its peak decides the mode. Windows that passed
// with no request at all (an idle gap) count as cool.
void ContentionTracker::roll(Cell& c, std::int64_t now, std::int64_t start) {
  const std::uint32_t in_flight = c.in_flight.load(std::memory_order_relaxed);
  const std::uint32_t peak = c.peak.exchange(in_flight);
  c.last_peak.store(peak, std::memory_order_relaxed);
  c.last_window_requests.store(c.window_requests.exchange(0), std::memory_order_relaxed);
  c.last_window_collisions.store(c.window_collisions.exchange(0), std::memory_order_relaxed);
  if (start == 0) return;  // the first request: no window behind it
  const std::int64_t windows = (now - start) / (options_.window_ms * 1000);
  const auto mode = static_cast<Strategy>(c.mode.load(std::memory_order_relaxed));
  if (mode == Strategy::atomic) {
    c.cool_streak.store(0, std::memory_order_relaxed);
    return;
  }
  std::uint32_t streak = c.cool_streak.load(std::memory_order_relaxed);
  streak = peak <= options_.cool_in_flight ? streak + 1 : 0;
  if (windows > 1 && in_flight <= options_.cool_in_flight + 1) {
    streak +=
        static_cast<std::uint32_t>(std::min<std::int64_t>(windows - 1, options_.cool_windows));
  }
  if (mode == Strategy::batched && streak >= options_.cool_windows) {
    auto hot = static_cast<std::uint8_t>(Strategy::batched);
    if (c.mode.compare_exchange_strong(hot, static_cast<std::uint8_t>(Strategy::atomic))) {
      c.switches.fetch_add(1, std::memory_order_relaxed);
    }
    streak = 0;
  }
  c.cool_streak.store(streak, std::memory_order_relaxed);
}

Strategy ContentionTracker::mode(std::uint16_t shard_key) const {
  return static_cast<Strategy>(cell_of(shard_key).mode.load(std::memory_order_relaxed));
}

SkuHeat ContentionTracker::heat(std::uint16_t shard_key) const {
  const Cell& c = cell_of(shard_key);
  SkuHeat h;
  h.mode = static_cast<Strategy>(c.mode.load(std::memory_order_relaxed));
  h.in_flight = c.in_flight.load(std::memory_order_relaxed);
  h.peak_in_flight = c.last_peak.load(std::memory_order_relaxed);
  h.requests = c.requests.load(std::memory_order_relaxed);
  h.collisions = c.collisions.load(std::memory_order_relaxed);
  h.window_requests = c.last_window_requests.load(std::memory_order_relaxed);
  h.window_collisions = c.last_window_collisions.load(std::memory_order_relaxed);
  h.switches = c.switches.load(std::memory_order_relaxed);
  h.shared_switches = c.shared_switches.load(std::memory_order_relaxed);
  // A row that is written keeps starting spans (one at least every span_windows_max
  // windows); an estimate whose span has not started over in 5 times that is stale.
  const bool fresh = steady_us() - c.span_start_us.load(std::memory_order_relaxed) <=
                     5 * span_windows_max * options_.window_ms * 1000;
  h.row_queue = fresh ? c.row_queue.load(std::memory_order_relaxed) : 0;
  return h;
}

Advice advise(const SkuKey& key, const SkuHeat& heat, const AutoOptions& options) {
  Advice advice;
  const std::string zero =
      "question zero: a reservation is one conditional UPDATE, so no lock is needed to be "
      "correct; what remains is cost";
  if (heat.requests == 0) {
    advice.strategy = Strategy::atomic;
    advice.reasons = {"no requests for sku " + shown(key.sku) + " measured in this process yet",
                      zero};
    return advice;
  }
  const bool recent = heat.window_requests >= window_requests_min;
  const std::uint64_t requests = recent ? heat.window_requests : heat.requests;
  const std::uint64_t collisions = recent ? heat.window_collisions : heat.collisions;
  const double rate = static_cast<double>(collisions) / static_cast<double>(requests);
  const bool shared_hot = heat.row_queue >= options.hot_in_flight && heat.peak_in_flight >= 2;
  const bool hot =
      rate >= hot_conflict_rate || heat.peak_in_flight >= options.hot_in_flight || shared_hot;
  advice.strategy = hot ? Strategy::batched : Strategy::atomic;
  advice.reasons.push_back(zero);
  advice.reasons.push_back("odds: " + std::to_string(collisions) + " of " +
                           std::to_string(requests) + " requests (" + percent(rate) + ")" +
                           (recent ? " in the last window" : " so far") +
                           " arrived while another request for this row was in flight; peak " +
                           std::to_string(heat.peak_in_flight) + " in flight");
  if (heat.row_queue > heat.peak_in_flight) {
    advice.reasons.push_back(
        "other writers: the row's version says about " + std::to_string(heat.row_queue) +
        " requests are in flight on it across every process, against a peak of " +
        std::to_string(heat.peak_in_flight) + " here" +
        (shared_hot ? ": the row is a queue that no one process sees whole" : ""));
  }
  advice.reasons.push_back(
      hot ? "cost: the row is a queue; batching folds the queue into one transaction per batch"
          : "cost: collisions are rare; one conditional statement per request is cheapest");
  advice.reasons.push_back(std::string("auto runs it as ") + strategy_name(heat.mode) + " now (" +
                           std::to_string(heat.switches) + " switches so far)");
  return advice;
}

}  // namespace stockade
