// HotRowBatcher: see the essay in stockade/batcher.hpp.
#include "stockade/batcher.hpp"

#include "base/invariant.hpp"
#include "stockade/log.hpp"
#include "stockade/testing.hpp"

#include <algorithm>
#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/stack.hpp>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <thread>
#include <utility>

namespace stockade {
namespace {

// The operation a batched request records as (telemetry.hpp's Op).
Op op_of(BatchOp op) {
  switch (op) {
    case BatchOp::reserve:
      return Op::reserve;
    case BatchOp::sell:
      return Op::sell;
    case BatchOp::confirm:
      return Op::confirm;
    case BatchOp::release:
      break;
  }
  return Op::release;
}

// Faults that would otherwise be logged once per request under load.
LogLimiter queue_full_log;
LogLimiter batch_failure_log;

}  // namespace

namespace {

// How long an idle flusher sleeps before it looks at its queue again on its own. Wake-ups
// do not depend on it (a producer wakes a sleeping flusher); it only bounds the damage of
// a lost wake-up, should one ever happen.
constexpr auto idle_recheck = std::chrono::milliseconds(100);
// While a producer waits for a free record.
constexpr auto record_poll = std::chrono::microseconds(200);
// The longest a flusher waits for a wave of callers to come back (see gather()), and the
// share of its last batch's time it may spend on that.
constexpr auto gather_max = std::chrono::milliseconds(1);
constexpr int gather_share = 8;
// After a wait for a wave that counted queued requests and timed out short of it, the
// gathers (one a batch) that count the last batch alone (see gather()).
constexpr int queued_skips_after_miss = 8;

using SteadyClock = std::chrono::steady_clock;

// `base` about `item`'s call: its reservation (a confirm or release) or its row.
ErrorContext context_of_request(const BatchItem& item, ErrorContext base = {}) {
  if (is_transition(item.op)) {
    base.sku.clear();
    base.location.clear();
    base.reservation_id = item.id;
    base.keyed = item.idempotency_key.has_value();
  } else {
    base.sku = item.key.sku;
    base.location = item.key.location;
    base.reservation_id.reset();
    base.keyed = item.idempotency_key.has_value();  // a retry with its key settles it
  }
  return base;
}

Error closed_error() {
  return Error(ErrorCode::unavailable, "the engine is closed");
}

Completion completion_of(BatchItem& item, std::uint64_t token) {
  Completion c;
  c.token = token;
  if (!item.ok) {
    c.error = std::move(item.error);
  } else if (item.op == BatchOp::sell) {
    c.value = std::move(item.level);
  } else {
    c.value = std::move(item.reservation);
  }
  return c;
}

}  // namespace

void validate_batcher_options(const BatcherOptions& o) {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw_invalid_argument(what);
  };
  check(o.shards >= 1 && o.shards <= batcher_shards_max,
        "batch shards must be between 1 and " + std::to_string(batcher_shards_max));
  check(o.batch_max >= 1 && o.batch_max <= batch_size_limit,
        "batch_max must be between 1 and " + std::to_string(batch_size_limit));
  check(o.queue_capacity >= o.batch_max && o.queue_capacity <= batcher_queue_capacity_max,
        "the batch queue capacity must be between batch_max and " +
            std::to_string(batcher_queue_capacity_max));
  check(o.result_timeout_ms >= 1 && o.result_timeout_ms <= lock_timeout_ms_max,
        "the batch result timeout must be between 1 and " + std::to_string(lock_timeout_ms_max) +
            " ms");
  check(
      o.lock_slice_ms >= 1 && o.lock_slice_ms <= lock_timeout_ms_max,
      "the batch lock slice must be between 1 and " + std::to_string(lock_timeout_ms_max) + " ms");
  check(o.contended_linger_us >= 0 && o.contended_linger_us <= batch_linger_us_max,
        "batch_linger must be between 0 and " + seconds_text(batch_linger_us_max) + ", got " +
            seconds_text(o.contended_linger_us));
  check(o.enqueue_timeout_ms >= 0 && o.enqueue_timeout_ms <= lock_timeout_ms_max,
        "the batch enqueue timeout must be between 0 and " + std::to_string(lock_timeout_ms_max) +
            " ms");
}

struct HotRowBatcher::Record {
  BatchItem item;
  std::int64_t lock_timeout_ms = 0;
  SteadyClock::time_point lock_deadline;  // queued at + lock_timeout: the request's own bound
  std::shared_ptr<CompletionSink> sink;   // empty: a blocked caller waits on `done`
  std::uint64_t token = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  bool abandoned = false;  // the blocked caller stopped waiting: the completer frees it
};

struct HotRowBatcher::Shard {
  explicit Shard(std::size_t capacity)
      // One node more than records: a queue keeps a dummy node.
      : records(new Record[capacity]), free(capacity + 1), ready(capacity + 1) {
    for (std::uint32_t i = 0; i < capacity; ++i) {
      const bool pushed = free.bounded_push(i);
      assert(pushed);
      (void)pushed;
    }
  }

  std::unique_ptr<Record[]> records;
  boost::lockfree::stack<std::uint32_t> free;
  boost::lockfree::queue<std::uint32_t> ready;
  // Requests queued and not yet in a batch (the flusher subtracts those it took once
  // take() returns, so during take() they still count). Producers count before they push,
  // so a flusher that sees zero (and then `closing`) can stop: any later producer sees
  // `closing`.
  alignas(cache_line_size) std::atomic<std::int64_t> pending{0};
  alignas(cache_line_size) std::atomic<bool> sleeping{false};
  // For pick_slot(), read by producers: whether a batch is being applied, and until when
  // (steady_now_us) the watched row counts as shared with another writer.
  alignas(cache_line_size) std::atomic<bool> applying{false};
  std::atomic<std::int64_t> shared_until_us{0};
  std::mutex wake_mutex;
  std::condition_variable wake;
  // Applied batches on their way to the completer, and emptied index vectors on their way
  // back to the flusher (so that no batch allocates).
  std::mutex handoff_mutex;
  std::condition_variable handoff_ready;
  std::deque<std::vector<std::uint32_t>> applied;
  std::vector<std::vector<std::uint32_t>> spare;
  bool flusher_done = false;
  // The flusher's scratch: the records of the batch being applied (reused, no allocation).
  std::vector<Record*> batch_records;
  // The flusher's view of the row it batches most recently, alone in a batch: the version
  // its last batch left it at, and until when it counts as shared with another writer.
  SkuKey watched;
  Version watched_left = 0;
  std::size_t watched_batch = 0;  // requests on it in the last batch that touched it
  SteadyClock::time_point shared_until{};
  SteadyClock::duration last_apply{};  // how long the last batch took
  std::size_t last_batch = 0;          // requests it decided
  std::size_t last_callers = 0;        // its requests and those queued when it ended
  int queued_skips = 0;                // gathers left that count the last batch alone
  bool last_reported = false;          // whether it reported row versions (a durable store)
  std::thread flusher;
  std::thread completer;
};

HotRowBatcher::HotRowBatcher(std::shared_ptr<Store> store, BatcherOptions options,
                             std::shared_ptr<ContentionTracker> tracker, RowShared on_shared)
    : store_(std::move(store)),
      options_(options),
      telemetry_(store_ ? store_->shared_telemetry() : nullptr),
      tracker_(tracker ? std::move(tracker) : std::make_shared<ContentionTracker>()),
      on_shared_(std::move(on_shared)) {
  if (!store_) throw_invalid_argument("a batcher needs a store");
  validate_batcher_options(options_);
  telemetry_->batcher_started(options_.shards);
  for (std::size_t i = 0; i < options_.shards; ++i) {
    shards_.push_back(std::make_unique<Shard>(options_.queue_capacity));
  }
  for (auto& shard : shards_) {
    Shard* s = shard.get();
    s->flusher = std::thread([this, s] { flush_loop(*s); });
    s->completer = std::thread([this, s] { complete_loop(*s); });
  }
}

HotRowBatcher::~HotRowBatcher() {
  close();
}

// By the row's 16-bit shard key, which a reservation id carries too: a confirm or release
// reaches the shard of its SKU without reading the reservation first. A slotted SKU's rows
// take consecutive shards, so that their batches are in flight at once (a transition,
// which names no slot, goes with the SKU's own row: it is ordered by its reservation's
// existence, not by the queue).
HotRowBatcher::Shard& HotRowBatcher::shard_for(const BatchItem& item) {
  return shard_of_row(item.shard_key(), is_transition(item.op) ? 0 : item.key.slot);
}

HotRowBatcher::Shard& HotRowBatcher::shard_of_row(std::uint16_t shard_key, int slot) const {
  const std::size_t at = (static_cast<std::size_t>(shard_key) + static_cast<std::size_t>(slot));
  return *shards_[at % shards_.size()];
}

int HotRowBatcher::pick_slot(const SkuKey& key, int slots, int home) const {
  if (slots <= 1) return 0;
  home = ((home % slots) + slots) % slots;
  const std::uint16_t shard_key = row_shard_key(key.sku, key.location);
  const std::int64_t now = steady_now_us();
  int best = home;
  std::int64_t fewest = std::numeric_limits<std::int64_t>::max();
  for (int i = 0; i < slots; ++i) {
    const int slot = (home + i) % slots;
    const Shard& shard = shard_of_row(shard_key, slot);
    if (slot != home && shard.shared_until_us.load(std::memory_order_relaxed) > now) continue;
    if (!shard.applying.load(std::memory_order_relaxed)) return slot;
    const std::int64_t pending = shard.pending.load(std::memory_order_relaxed);
    if (pending < fewest) {
      fewest = pending;
      best = slot;
    }
  }
  return best;
}

std::uint32_t HotRowBatcher::acquire(Shard& shard) {
  std::uint32_t index = 0;
  if (closing_.load()) throw closed_error();
  if (shard.free.pop(index)) return index;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.enqueue_timeout_ms);
  while (!shard.free.pop(index)) {
    if (closing_.load()) throw closed_error();
    if (std::chrono::steady_clock::now() >= deadline) {
      Error error(ErrorCode::overloaded, "the hot-row batch queue is full (" +
                                             std::to_string(options_.queue_capacity) +
                                             " requests per shard) and stayed full for " +
                                             std::to_string(options_.enqueue_timeout_ms) + " ms");
      queue_full_log.log(LogLevel::warning, "stockade.batcher", error.what());
      throw error;
    }
    std::this_thread::sleep_for(record_poll);
  }
  return index;
}

void HotRowBatcher::enqueue(Shard& shard, std::uint32_t index) {
  shard.pending.fetch_add(1);
  if (closing_.load()) {
    shard.pending.fetch_sub(1);
    shard.records[index].sink.reset();
    shard.free.bounded_push(index);
    throw closed_error();
  }
  // Cannot fail: the queue has a node for every record, and this record is not in it.
  while (!shard.ready.bounded_push(index)) std::this_thread::yield();
  if (shard.sleeping.load()) {
    std::lock_guard<std::mutex> lock(shard.wake_mutex);
    shard.wake.notify_one();
  }
}

void HotRowBatcher::finish(const BatchItem& item) {
  if (item.in_flight) tracker_->leave(item.shard_key());
  const Error* error = item.ok || !item.error ? nullptr : &*item.error;
  if (error != nullptr && error->code() == ErrorCode::out_of_stock && !item.count_refusal) {
    return;  // not yet the call's outcome: the engine records the call
  }
  if (item.counted_as) {
    bump(telemetry_->of(*item.counted_as).requests);
    telemetry_->count_outcome(*item.counted_as, error);
  }
  if (item.started_us != 0) {
    telemetry_->record_call(op_of(item.op), item.counted_as, error,
                            steady_now_us() - item.started_us);
  }
}

// A request that could not be queued has its final outcome too, and is finished.
template <class Fn>
void HotRowBatcher::queue_or_report(const BatchItem& item, Fn&& queue) {
  try {
    queue();
  } catch (const Error& e) {
    BatchItem report;
    report.assign(item);
    report.error = e;
    finish(report);
    throw;
  }
}

namespace {
thread_local std::uint32_t last_batch_size = 0;  // of this thread's last run()
}  // namespace

std::uint32_t HotRowBatcher::take_last_batch_size() noexcept {
  return std::exchange(last_batch_size, 0U);
}

void HotRowBatcher::run(BatchItem& item, std::int64_t lock_timeout_ms) {
  Shard& shard = shard_for(item);
  std::uint32_t index = 0;
  queue_or_report(item, [&] {
    index = acquire(shard);
    Record& record = shard.records[index];
    record.item.assign(item);
    record.lock_timeout_ms = lock_timeout_ms;
    record.lock_deadline = SteadyClock::now() + std::chrono::milliseconds(lock_timeout_ms);
    record.sink.reset();
    record.done = false;
    record.abandoned = false;
    enqueue(shard, index);
  });
  Record& record = shard.records[index];
  {
    std::unique_lock<std::mutex> lock(record.mutex);
    const auto bound = std::chrono::milliseconds(lock_timeout_ms + options_.result_timeout_ms);
    if (!record.cv.wait_for(lock, bound, [&] { return record.done; })) {
      record.abandoned = true;
      ErrorContext context = context_of_request(item);
      const std::string hint = in_doubt_hint(context);
      throw Error(ErrorCode::in_doubt,
                  "the batch of this request gave no outcome within " +
                      std::to_string(lock_timeout_ms + options_.result_timeout_ms) +
                      " ms (lock_timeout + result_timeout); it may still be applied." +
                      in_doubt_hint_lead + hint + ".",
                  std::move(context));
    }
  }
  item.ok = record.item.ok;
  last_batch_size = record.item.batch_size;
  item.reservation = std::move(record.item.reservation);
  item.level = std::move(record.item.level);
  item.error = std::move(record.item.error);
  shard.free.bounded_push(index);
  if (!item.ok) throw *item.error;
}

void HotRowBatcher::submit(const BatchItem& item, std::int64_t lock_timeout_ms,
                           std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  if (!sink) throw_invalid_argument("an async request needs a completion sink");
  Shard& shard = shard_for(item);
  queue_or_report(item, [&] {
    const std::uint32_t index = acquire(shard);
    Record& record = shard.records[index];
    record.item.assign(item);
    record.lock_timeout_ms = lock_timeout_ms;
    record.lock_deadline = SteadyClock::now() + std::chrono::milliseconds(lock_timeout_ms);
    record.sink = std::move(sink);
    record.token = token;
    enqueue(shard, index);
  });
}

void HotRowBatcher::flush_loop(Shard& shard) {
  std::vector<std::uint32_t> indices;
  std::vector<std::uint32_t> deferred;  // waiting for a row lock, within their own bounds
  std::vector<BatchItem*> items;
  std::vector<Completion> completions;
  indices.reserve(options_.batch_max);
  deferred.reserve(options_.batch_max);
  items.reserve(options_.batch_max);
  shard.batch_records.reserve(options_.batch_max);
  for (;;) {
    // Deferred requests go first: they were queued before anything still in the queue,
    // so a SKU's requests are still decided in arrival order.
    indices.swap(deferred);
    const std::size_t carried = indices.size();
    take(shard, indices, carried == 0);
    if (!indices.empty()) {
      shard.pending.fetch_sub(static_cast<std::int64_t>(indices.size() - carried));
      shard.applying.store(true, std::memory_order_relaxed);
      const SteadyClock::time_point began = SteadyClock::now();
      apply(shard, indices, items, deferred);
      shard.last_apply = SteadyClock::now() - began;
      shard.last_batch = indices.size();
      // This batch's requests (decided or deferred) and those that queued meanwhile: the
      // wave gather() waits for next (see there).
      shard.last_callers =
          indices.size() + deferred.size() +
          static_cast<std::size_t>(std::max<std::int64_t>(0, shard.pending.load()));
      shard.applying.store(false, std::memory_order_relaxed);
      if (indices.empty()) {  // every request is still waiting for a lock
        if (carried > 0) std::this_thread::sleep_for(record_poll);
        continue;
      }
      if (shard.pending.load() > 0 || !deferred.empty()) {
        hand_off(shard, indices);  // the next batch is waiting: complete in parallel
      } else {
        complete(shard, indices, completions);  // nothing to overlap: skip the hop
        indices.clear();
      }
      continue;
    }
    // Stop once closing and drained. `closing` is read before `pending`: a producer that
    // counted its request before it saw `closing` unset is visible in `pending` now (both
    // are sequentially consistent), and any later one sees `closing` and backs out. Read
    // the other way round, a producer could slip in between the two reads and be left
    // queued with nobody to apply its request.
    const bool closing = closing_.load();
    batcher_test_points().before_drain_check.load()();
    if (shard.pending.load() > 0) {  // a producer counted its request and is pushing it
      std::this_thread::yield();
      continue;
    }
    if (closing) break;
    // Sleep until a producer wakes us. The producer counts `pending` before it reads
    // `sleeping`, and we set `sleeping` before we read `pending`: one of us sees the other.
    shard.sleeping.store(true);
    {
      std::unique_lock<std::mutex> lock(shard.wake_mutex);
      shard.wake.wait_for(lock, idle_recheck,
                          [&] { return shard.pending.load() > 0 || closing_.load(); });
    }
    shard.sleeping.store(false);
  }
  std::lock_guard<std::mutex> lock(shard.handoff_mutex);
  shard.flusher_done = true;
  shard.handoff_ready.notify_one();
}

void HotRowBatcher::take(Shard& shard, std::vector<std::uint32_t>& indices, bool may_wait) {
  const auto take_ready = [&] {
    std::uint32_t index = 0;
    while (indices.size() < options_.batch_max && shard.ready.pop(index)) {
      indices.push_back(index);
    }
  };
  take_ready();
  if (!may_wait || indices.empty() || indices.size() >= options_.batch_max) return;
  if (should_linger(shard, indices.front())) {
    telemetry_->batch_lingered();
    std::this_thread::sleep_for(std::chrono::microseconds(options_.contended_linger_us));
    take_ready();
  } else if (gather(shard, indices)) {
    telemetry_->batch_gathered();
    take_ready();
  }
}

// Passes an applied batch to the completer and takes an empty vector for the next one.
// Waking a batch's blocked callers costs a system call each; on the completer's thread
// that work overlaps the next batch's transaction instead of delaying it.
void HotRowBatcher::hand_off(Shard& shard, std::vector<std::uint32_t>& indices) {
  std::lock_guard<std::mutex> lock(shard.handoff_mutex);
  shard.applied.push_back(std::move(indices));
  if (shard.spare.empty()) {
    indices = std::vector<std::uint32_t>();
    indices.reserve(options_.batch_max);
  } else {
    indices = std::move(shard.spare.back());
    shard.spare.pop_back();
  }
  shard.handoff_ready.notify_one();
}

void HotRowBatcher::complete_loop(Shard& shard) {
  std::vector<Completion> completions;
  std::unique_lock<std::mutex> lock(shard.handoff_mutex);
  for (;;) {
    shard.handoff_ready.wait(lock, [&] { return !shard.applied.empty() || shard.flusher_done; });
    if (shard.applied.empty()) return;  // the flusher stopped and everything is completed
    std::vector<std::uint32_t> indices = std::move(shard.applied.front());
    shard.applied.pop_front();
    lock.unlock();
    complete(shard, indices, completions);
    indices.clear();
    lock.lock();
    shard.spare.push_back(std::move(indices));
  }
}

// One attempt at the requests `items` (at `records`) as one batch. It waits for row locks
// no longer than the most urgent of them has left (at least 1 ms, so that a request late
// out of the queue still gets one try) and never longer than lock_slice_ms, so that a row
// locked elsewhere holds the shard up for one slice at most. A failure of the whole batch
// becomes each request's error.
void HotRowBatcher::attempt(std::vector<BatchItem*>& items, const std::vector<Record*>& records) {
  const SteadyClock::time_point now = SteadyClock::now();
  std::int64_t wait_ms = options_.lock_slice_ms;
  for (const Record* record : records) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(record->lock_deadline - now).count();
    wait_ms = std::min<std::int64_t>(wait_ms, std::max<std::int64_t>(left, 1));
  }
  std::optional<Error> failure;
  try {
    store_->apply_batch(items, BatchOptions{wait_ms});
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {
    // Not a stockade error, so nothing says whether the transaction committed.
    failure =
        Error(ErrorCode::in_doubt,
              std::string("a batch failed unexpectedly; its outcome is unknown: ") + e.what());
  }
  for (BatchItem* item : items) {
    item->batch_size = static_cast<std::uint32_t>(items.size());
    STOCKADE_ASSERT(failure || !(item->ok && item->error));  // decided one way, not both
    if (failure) {
      item->ok = false;
      // A shared InDoubt names what each call can do: a transition's reservation, a
      // reserve's key, or another write's row.
      item->error = failure->code() == ErrorCode::in_doubt
                        ? rehint_in_doubt(*failure, context_of_request(*item, failure->context()))
                        : *failure;
    } else if (!item->ok && !item->error) {
      item->error = Error(ErrorCode::invariant_violation,
                          "the store returned a batch with a request left undecided");
    } else if (item->error && item->error->code() == ErrorCode::in_doubt) {
      // A part of the batch in doubt (on Citus, one shard key's group): each call's hint.
      item->error =
          rehint_in_doubt(*item->error, context_of_request(*item, item->error->context()));
    }
  }
  telemetry_->batch_applied(items.size(), failure.has_value());
  if (failure && failure->code() != ErrorCode::lock_timeout) {  // a lock wait is routine
    batch_failure_log.log(
        LogLevel::warning, "stockade.batcher",
        "a batch of " + std::to_string(items.size()) +
            " requests failed as a whole; each gets its error: " + failure->what());
  }
}

namespace {

bool blocked(const BatchItem& item) {
  return !item.ok && item.error && item.error->code() == ErrorCode::lock_timeout;
}

// The row a request locks: its stock row, or (for a transition) its reservation's.
bool same_row(const BatchItem& a, const BatchItem& b) {
  if (is_transition(a.op) || is_transition(b.op)) {
    return is_transition(a.op) && is_transition(b.op) && a.id == b.id;
  }
  return a.key == b.key;
}

}  // namespace

// Applies a batch so that each request is held to its own lock_timeout only, and a row
// locked elsewhere delays or fails only the requests for that row:
//   1. the batch runs as one transaction (attempt());
//   2. if it timed out waiting for a lock and touches several rows, each row runs on its
//      own, so the rows that are free commit;
//   3. a request still blocked whose own deadline has not passed is deferred: it moves
//      from `indices` to `deferred` and runs again in the next round (first, ahead of
//      later arrivals); one whose deadline passed fails with LockTimeout.
void HotRowBatcher::apply(Shard& shard, std::vector<std::uint32_t>& indices,
                          std::vector<BatchItem*>& items, std::vector<std::uint32_t>& deferred) {
  items.clear();
  std::vector<Record*>& records = shard.batch_records;
  records.clear();
  for (std::uint32_t index : indices) {
    items.push_back(&shard.records[index].item);
    records.push_back(&shard.records[index]);
  }
  attempt(items, records);
  observe(shard, items);
  const bool whole_batch_blocked =
      items.size() > 1 &&
      std::all_of(items.begin(), items.end(), [](const BatchItem* item) { return blocked(*item); });
  if (whole_batch_blocked && !std::all_of(items.begin(), items.end(), [&](const BatchItem* item) {
        return same_row(*item, *items.front());
      })) {
    std::vector<bool> tried(items.size(), false);
    std::vector<BatchItem*> group_items;
    std::vector<Record*> group_records;
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (tried[i]) continue;
      group_items.clear();
      group_records.clear();
      for (std::size_t j = i; j < items.size(); ++j) {  // in arrival order within the row
        if (tried[j] || !same_row(*items[j], *items[i])) continue;
        tried[j] = true;
        group_items.push_back(items[j]);
        group_records.push_back(records[j]);
      }
      attempt(group_items, group_records);
    }
  }
  // Keep the decided requests in `indices` (in order), move the deferred ones out.
  const SteadyClock::time_point now = SteadyClock::now();
  std::size_t kept = 0;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    Record& record = *records[i];
    if (blocked(record.item)) {
      if (record.lock_deadline > now) {
        record.item.clear_outcome();
        deferred.push_back(indices[i]);
        continue;
      }
      ErrorContext context = record.item.error->context();
      record.item.error =
          Error(ErrorCode::lock_timeout,
                "waited " + std::to_string(record.lock_timeout_ms) +
                    " ms (the request's lock_timeout) for a lock on its row, held elsewhere",
                std::move(context));
    }
    indices[kept++] = indices[i];
  }
  indices.resize(kept);
}

// The row's version as the batch found it, against the one the engine's previous batch on
// it left: a gap is another writer's change. A batch that does not touch the watched row
// and is on one row alone makes that row the watched one.
void HotRowBatcher::observe(Shard& shard, const std::vector<BatchItem*>& items) {
  const BatchItem* watched = nullptr;  // the batch's first request on the watched row
  const BatchItem* single = nullptr;   // its row, if the batch reported on one row alone
  bool one_row = true;
  Version left = 0;
  std::size_t on_watched = 0;
  shard.last_reported = false;
  for (const BatchItem* item : items) {
    if (item->row_found == 0) continue;  // not reported: refused before a row, say
    shard.last_reported = true;
    if (single == nullptr) single = item;
    one_row = one_row && item->row_key() == single->row_key();
    if (item->row_key() == shard.watched) {
      if (watched == nullptr) watched = item;
      left = std::max(left, item->row_left);
      ++on_watched;
    }
  }
  if (watched != nullptr) {
    shard.watched_batch = on_watched;
    if (shard.watched_left != 0 && watched->row_found != shard.watched_left) {
      shard.shared_until = SteadyClock::now() + std::chrono::milliseconds(contention_memory_ms);
      shard.shared_until_us.store(steady_now_us() + contention_memory_ms * 1000,
                                  std::memory_order_relaxed);
      telemetry_->batch_found_row_shared();
      if (on_shared_) on_shared_(watched->row_key(), on_watched, watched->counted_as);
    }
    shard.watched_left = left;
    return;
  }
  if (single == nullptr || !one_row) return;
  shard.watched.sku.assign(single->row_key().sku);  // reuses the capacity
  shard.watched.location.assign(single->row_key().location);
  shard.watched.slot = single->row_key().slot;
  for (const BatchItem* item : items) left = std::max(left, item->row_left);
  shard.watched_left = left;
  shard.watched_batch = items.size();
  shard.shared_until = SteadyClock::time_point{};
  shard.shared_until_us.store(0, std::memory_order_relaxed);
}

bool HotRowBatcher::should_linger(Shard& shard, std::uint32_t first) const {
  if (options_.contended_linger_us == 0) return false;
  const BatchItem& item = shard.records[first].item;
  // A lone request per batch gains nothing from company that does not come: only a row
  // whose last batch carried several requests is worth the wait.
  return shard.watched_batch >= 2 && !is_transition(item.op) && item.key == shard.watched &&
         SteadyClock::now() < shard.shared_until;
}

bool HotRowBatcher::gather(Shard& shard, std::vector<std::uint32_t>& indices) {
  // The memory store reports no row versions: its batches take microseconds, and a wait
  // would cost more than it saves.
  // The wave is every caller seen around the last batch: the requests it took and those
  // that queued while it ran. With the batch alone as the target, two half waves that take
  // turns (one queues while the other's batch commits) each met the target of the other
  // and stayed split for good, each caller waiting two commits (docs/design.md, "Waves":
  // at a 2 ms flush, 64 blocked clients on one row sold 1.25x as fast counted this way).
  // Callers that do not come back (async callers, steady arrivals, callers that think
  // between calls) would make every batch wait its bound for them: after such a wait timed
  // out short, the next queued_skips_after_miss gathers (one a batch) count the last batch
  // alone.
  const bool count_queued = shard.queued_skips == 0;
  if (!count_queued) --shard.queued_skips;
  const std::size_t wave =
      std::min(count_queued ? shard.last_callers : shard.last_batch, options_.batch_max);
  if (!shard.last_reported || wave < 2 || indices.size() >= wave) return false;
  const auto bound = std::min<SteadyClock::duration>(shard.last_apply / gather_share, gather_max);
  // As an idle flusher sleeps: a producer that counted its request wakes us (enqueue()).
  shard.sleeping.store(true);
  {
    std::unique_lock<std::mutex> lock(shard.wake_mutex);
    shard.wake.wait_for(lock, bound, [&] {
      return shard.pending.load() >= static_cast<std::int64_t>(wave) || closing_.load();
    });
  }
  shard.sleeping.store(false);
  if (count_queued && wave > shard.last_batch &&
      shard.pending.load() < static_cast<std::int64_t>(wave)) {
    shard.queued_skips = queued_skips_after_miss;
  }
  return true;
}

void HotRowBatcher::complete(Shard& shard, const std::vector<std::uint32_t>& indices,
                             std::vector<Completion>& completions) {
  CompletionSink* current = nullptr;
  std::shared_ptr<CompletionSink> holder;
  auto post = [&] {
    if (current != nullptr) current->post(completions);
    completions.clear();
  };
  for (std::uint32_t index : indices) {
    Record& record = shard.records[index];
    finish(record.item);
    if (!record.sink) {  // a blocked caller: it reads the outcome and frees the record
      bool abandoned = false;
      {
        std::lock_guard<std::mutex> lock(record.mutex);
        abandoned = record.abandoned;
        record.done = true;
        if (!abandoned) record.cv.notify_one();
      }
      if (abandoned) shard.free.bounded_push(index);  // its caller gave up waiting
      continue;
    }
    if (record.sink.get() != current) {
      post();
      holder = record.sink;
      current = holder.get();
    }
    completions.push_back(completion_of(record.item, record.token));
    record.sink.reset();
    shard.free.bounded_push(index);
  }
  post();
}

void HotRowBatcher::close() {
  std::lock_guard<std::mutex> lock(close_mutex_);
  closing_.store(true);
  for (auto& shard : shards_) {
    {
      std::lock_guard<std::mutex> wake(shard->wake_mutex);
      shard->wake.notify_all();
    }
    if (shard->flusher.joinable()) shard->flusher.join();
    if (shard->completer.joinable()) shard->completer.join();
  }
}

std::uint64_t HotRowBatcher::queued() const {
  std::uint64_t queued = 0;
  for (const auto& shard : shards_) {
    queued += static_cast<std::uint64_t>(std::max<std::int64_t>(0, shard->pending.load()));
  }
  return queued;
}

}  // namespace stockade
