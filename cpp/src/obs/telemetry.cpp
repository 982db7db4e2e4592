#include "stockade/telemetry.hpp"

#include <algorithm>
#include <cassert>

#include "stockade/hash.hpp"

namespace stockade {
namespace {

std::uint64_t read(const std::atomic<std::uint64_t>& c) {
  return c.load(std::memory_order_relaxed);
}

void raise_to(std::atomic<std::uint64_t>& max, std::uint64_t value) {
  std::uint64_t seen = max.load(std::memory_order_relaxed);
  while (value > seen && !max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

// The histogram bucket of `value`: the first bound it does not exceed, or the last (+Inf)
// bucket past every bound.
template <class Bounds, class Value>
std::size_t bucket_of(const Bounds& bounds, Value value) {
  return static_cast<std::size_t>(std::lower_bound(bounds.begin(), bounds.end(), value) -
                                  bounds.begin());
}

}  // namespace

StrategyCountersSnapshot StrategyCounters::snapshot() const {
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

const char* op_name(Op op) noexcept {
  static const std::array<const char*, op_count> names = {
#define STOCKADE_OP_NAME(name) #name,
      STOCKADE_OPS(STOCKADE_OP_NAME)
#undef STOCKADE_OP_NAME
  };
  return names[static_cast<std::size_t>(op)];
}

// Calls by (operation, strategy or none, outcome), and latency by (operation, strategy or
// none): fixed arrays of relaxed atomics, about 25 KB whatever the traffic.
struct Telemetry::CallTable {
  static constexpr std::size_t strategy_slots = strategy_count + 1;  // the last: none
  struct Cell {
    std::array<std::atomic<std::uint64_t>, error_code_count + 1> outcomes{};
    std::array<std::atomic<std::uint64_t>, latency_bounds_us.size() + 1> buckets{};
    std::atomic<std::uint64_t> sum_us{0};
    std::atomic<std::uint64_t> count{0};
  };
  std::array<std::array<Cell, strategy_slots>, op_count> cells;

  static std::size_t slot(std::optional<Strategy> s) {
    return s ? static_cast<std::size_t>(*s) : strategy_count;
  }
};

// The per-SKU table: buckets of sku_probe entries. A SKU lives in the bucket its stable
// hash names, and its entry is found by that hash (its tag) without a lock: counting is a
// few relaxed atomics. Only taking an entry locks the bucket: a newcomer takes a free entry,
// or the entry with the fewest requests, whose counters restart from zero. A count that
// races with an eviction may land on the newcomer; figures are statistics, not ledgers.
struct Telemetry::SkuTable {
  struct Entry {
    std::atomic<std::uint64_t> tag{0};  // the key's hash; 0: free
    SkuKey key;                         // written and read under the bucket's mutex
    std::atomic<std::uint64_t> requests{0};
    std::atomic<std::uint64_t> refused{0};
    std::atomic<std::uint64_t> conflicts{0};
    std::atomic<std::uint64_t> lock_waits{0};
  };
  struct alignas(cache_line_size) Bucket {
    std::mutex mutex;
    std::array<Entry, sku_probe> entries;
  };

  explicit SkuTable(std::size_t entries) : buckets(entries / sku_probe) {}

  static Entry* find(Bucket& bucket, std::uint64_t tag) {
    for (Entry& entry : bucket.entries) {
      if (entry.tag.load(std::memory_order_acquire) == tag) return &entry;
    }
    return nullptr;
  }

  static Entry& take(Bucket& bucket, std::uint64_t tag, const SkuKey& key) {
    std::lock_guard<std::mutex> lock(bucket.mutex);
    if (Entry* found = find(bucket, tag)) return *found;  // another thread took it first
    Entry* coldest = &bucket.entries[0];
    for (Entry& entry : bucket.entries) {
      if (entry.tag.load(std::memory_order_relaxed) == 0) {
        coldest = &entry;
        break;
      }
      if (read(entry.requests) < read(coldest->requests)) coldest = &entry;
    }
    coldest->tag.store(0, std::memory_order_relaxed);
    coldest->key = key;
    for (auto* c :
         {&coldest->requests, &coldest->refused, &coldest->conflicts, &coldest->lock_waits}) {
      c->store(0, std::memory_order_relaxed);
    }
    coldest->tag.store(tag, std::memory_order_release);
    return *coldest;
  }

  std::vector<Bucket> buckets;
};

void validate_telemetry_options(const TelemetryOptions& options) {
  const std::size_t n = options.sku_entries;
  if (n < sku_probe || n > telemetry_sku_entries_max || (n & (n - 1)) != 0) {
    throw_invalid_argument("sku_entries must be a power of two between " +
                           std::to_string(sku_probe) + " and " +
                           std::to_string(telemetry_sku_entries_max));
  }
}

Telemetry::Telemetry(TelemetryOptions options)
    : options_((validate_telemetry_options(options), options)),
      skus_(std::make_unique<SkuTable>(options.sku_entries)),
      calls_(std::make_unique<CallTable>()) {}

Telemetry::~Telemetry() = default;

void Telemetry::count_outcome(Strategy strategy, const Error* error) {
  StrategyCounters& c = of(strategy);
  if (error == nullptr) {
    bump(c.granted);
    return;
  }
  switch (error->code()) {
    case ErrorCode::out_of_stock:
      bump(c.refused);
      return;
    case ErrorCode::version_conflict:
      bump(c.version_conflicts);
      break;
    case ErrorCode::lock_not_available:
      bump(c.lock_not_available);
      break;
    case ErrorCode::lock_timeout:
      bump(c.lock_timeouts);
      break;
    default:
      break;
  }
  bump(c.failed);
}

void Telemetry::count(const SkuKey& row_key, SkuEvent event, std::uint64_t n) {
  // A hot-row slot's row counts under its SKU (sku and location; callers never see a
  // slot). Tag 0 marks a free entry, so a key whose hash is 0 counts under 1.
  const std::uint64_t tag =
      std::max<std::uint64_t>(1, stable_hash64({row_key.sku, row_key.location}));
  SkuTable::Bucket& bucket = skus_->buckets[tag & (skus_->buckets.size() - 1)];
  SkuTable::Entry* entry = SkuTable::find(bucket, tag);
  if (entry == nullptr) entry = &SkuTable::take(bucket, tag, base_key(row_key));
  switch (event) {
    case SkuEvent::request:
      bump(entry->requests, n);
      break;
    case SkuEvent::refused:
      bump(entry->refused, n);
      break;
    case SkuEvent::conflict:
      bump(entry->conflicts, n);
      break;
    case SkuEvent::lock_wait:
      bump(entry->lock_waits, n);
      break;
  }
}

void Telemetry::record_call(Op op, std::optional<Strategy> strategy, const Error* error,
                            std::int64_t latency_us) {
  CallTable::Cell& cell = calls_->cells[static_cast<std::size_t>(op)][CallTable::slot(strategy)];
  bump(cell.outcomes[error == nullptr ? 0 : 1 + static_cast<std::size_t>(error->code())]);
  const std::int64_t us = std::max<std::int64_t>(latency_us, 0);
  bump(cell.buckets[bucket_of(latency_bounds_us, us)]);
  bump(cell.sum_us, static_cast<std::uint64_t>(us));
  bump(cell.count);
}

MetricsSnapshot Telemetry::metrics() const {
  MetricsSnapshot out;
  for (std::size_t o = 0; o < op_count; ++o) {
    for (std::size_t s = 0; s < CallTable::strategy_slots; ++s) {
      const CallTable::Cell& cell = calls_->cells[o][s];
      if (read(cell.count) == 0) continue;
      CallSeries series;
      series.op = static_cast<Op>(o);
      if (s < strategy_count) series.strategy = static_cast<Strategy>(s);
      for (std::size_t k = 0; k < series.outcomes.size(); ++k) {
        series.outcomes[k] = read(cell.outcomes[k]);
      }
      for (std::size_t k = 0; k < series.latency_buckets.size(); ++k) {
        series.latency_buckets[k] = read(cell.buckets[k]);
      }
      series.latency_sum_us = read(cell.sum_us);
      series.count = read(cell.count);
      out.calls.push_back(series);
    }
  }
  for (std::size_t k = 0; k < out.batch_size_buckets.size(); ++k) {
    out.batch_size_buckets[k] = read(batch_size_buckets_[k]);
  }
  out.batch_size_sum = read(batch_requests_);
  out.batch_count = read(batches_);
  return out;
}

void Telemetry::batch_applied(std::size_t size, bool failed) {
  bump(batch_size_buckets_[bucket_of(batch_size_bounds, static_cast<std::uint64_t>(size))]);
  bump(batches_);
  bump(batch_requests_, size);
  if (failed) bump(failed_batches_);
  raise_to(batch_size_max_, size);
}

void Telemetry::sweeper_enabled(bool enabled) {
  std::lock_guard<std::mutex> lock(sweeper_mutex_);
  sweeper_.enabled = enabled;
}

void Telemetry::purged(const PurgeCounts& counts) {
  std::lock_guard<std::mutex> lock(sweeper_mutex_);
  sweeper_.purged_reservations += counts.reservations;
  sweeper_.purged_keys += counts.keys;
}

void Telemetry::freed_on_refusal(std::uint64_t holds) {
  std::lock_guard<std::mutex> lock(sweeper_mutex_);
  sweeper_.freed_on_refusal += holds;
}

void Telemetry::sweeper_round(bool leader, std::uint64_t expired, const std::string& error,
                              double seconds) {
  std::lock_guard<std::mutex> lock(sweeper_mutex_);
  sweeper_.leader = leader;
  sweeper_.runs += leader ? 1 : 0;
  if (leader) {
    sweeper_.round_seconds += seconds;
    sweeper_.last_round_seconds = seconds;
  }
  sweeper_.expired += expired;
  if (!error.empty()) {
    ++sweeper_.errors;
    sweeper_.last_error = error;
  }
}

StoreStats Telemetry::snapshot(std::size_t sku_limit) const {
  StoreStats out;
  for (std::size_t i = 0; i < strategy_count; ++i) {
    out.strategies[i] = of(static_cast<Strategy>(i)).snapshot();
  }
  for (SkuTable::Bucket& bucket : skus_->buckets) {
    std::lock_guard<std::mutex> lock(bucket.mutex);
    for (const SkuTable::Entry& s : bucket.entries) {
      if (s.tag.load(std::memory_order_relaxed) != 0) {
        out.hottest_skus.push_back(SkuStats{s.key, read(s.requests), read(s.refused),
                                            read(s.conflicts), read(s.lock_waits)});
      }
    }
  }
  const std::size_t keep = std::min(sku_limit, out.hottest_skus.size());
  std::partial_sort(out.hottest_skus.begin(),
                    out.hottest_skus.begin() + static_cast<std::ptrdiff_t>(keep),
                    out.hottest_skus.end(), [](const SkuStats& a, const SkuStats& b) {
                      return a.requests != b.requests ? a.requests > b.requests : a.key < b.key;
                    });
  out.hottest_skus.resize(keep);
  out.batcher.shards = batcher_shards_.load(std::memory_order_relaxed);
  out.batcher.started = out.batcher.shards > 0;
  out.batcher.batches = read(batches_);
  out.batcher.requests = read(batch_requests_);
  out.batcher.failed_batches = read(failed_batches_);
  out.batcher.batch_size_max = read(batch_size_max_);
  out.batcher.shared_row_batches = read(shared_row_batches_);
  out.batcher.lingered_batches = read(lingered_batches_);
  out.batcher.gathered_batches = read(gathered_batches_);
  std::lock_guard<std::mutex> lock(sweeper_mutex_);
  out.sweeper = sweeper_;
  return out;
}

}  // namespace stockade
