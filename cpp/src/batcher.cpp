// HotRowBatcher: see the essay in stockade/batcher.hpp.
#include "stockade/batcher.hpp"

#include "invariant.hpp"

#include <boost/lockfree/queue.hpp>
#include <boost/lockfree/stack.hpp>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>

namespace stockade {
namespace {

// How long an idle flusher sleeps before it looks at its queue again on its own. Wake-ups
// do not depend on it (a producer wakes a sleeping flusher); it only bounds the damage of
// a lost wake-up, should one ever happen.
constexpr auto idle_recheck = std::chrono::milliseconds(100);
// While a producer waits for a free record.
constexpr auto record_poll = std::chrono::microseconds(200);

Error closed_error() {
  return Error(ErrorCode::invalid_state, "the engine is closed");
}

void copy_input(BatchItem& to, const BatchItem& from) {
  to.op = from.op;
  to.key.sku.assign(from.key.sku);  // reuses the record's capacity
  to.key.location.assign(from.key.location);
  to.qty = from.qty;
  to.ttl_us = from.ttl_us;
  to.idempotency_key = from.idempotency_key;
  to.id = from.id;
  to.expected_version = from.expected_version;
  to.counted_as = from.counted_as;
  to.in_flight = from.in_flight;
  to.clear_outcome();
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
  check(o.enqueue_timeout_ms >= 0 && o.enqueue_timeout_ms <= lock_timeout_ms_max,
        "the batch enqueue timeout must be between 0 and " + std::to_string(lock_timeout_ms_max) +
            " ms");
}

struct HotRowBatcher::Slot {
  BatchItem item;
  std::int64_t lock_timeout_ms = 0;
  std::shared_ptr<CompletionSink> sink;  // empty: a blocked caller waits on `done`
  std::uint64_t token = 0;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
};

struct HotRowBatcher::Shard {
  explicit Shard(std::size_t capacity)
      // One node more than records: a queue keeps a dummy node.
      : slots(new Slot[capacity]), free(capacity + 1), ready(capacity + 1) {
    for (std::uint32_t i = 0; i < capacity; ++i) {
      const bool pushed = free.bounded_push(i);
      assert(pushed);
      (void)pushed;
    }
  }

  std::unique_ptr<Slot[]> slots;
  boost::lockfree::stack<std::uint32_t> free;
  boost::lockfree::queue<std::uint32_t> ready;
  // Requests queued or being applied. Producers count before they push, so a flusher
  // that sees zero (and then `closing`) can stop: any later producer sees `closing`.
  alignas(cache_line_size) std::atomic<std::int64_t> pending{0};
  alignas(cache_line_size) std::atomic<bool> sleeping{false};
  std::mutex wake_mutex;
  std::condition_variable wake;
  // Applied batches on their way to the completer, and emptied index vectors on their way
  // back to the flusher (so that no batch allocates).
  std::mutex handoff_mutex;
  std::condition_variable handoff_ready;
  std::deque<std::vector<std::uint32_t>> applied;
  std::vector<std::vector<std::uint32_t>> spare;
  bool flusher_done = false;
  std::thread flusher;
  std::thread completer;
};

HotRowBatcher::HotRowBatcher(std::shared_ptr<Store> store, BatcherOptions options)
    : store_(std::move(store)),
      options_(options),
      telemetry_(store_ ? store_->shared_telemetry() : nullptr) {
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
// reaches the shard of its SKU without reading the reservation first.
HotRowBatcher::Shard& HotRowBatcher::shard_for(const BatchItem& item) {
  return *shards_[item.shard_key() % shards_.size()];
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
      throw Error(ErrorCode::overloaded, "the hot-row batch queue is full (" +
                                             std::to_string(options_.queue_capacity) +
                                             " requests per shard) and stayed full for " +
                                             std::to_string(options_.enqueue_timeout_ms) + " ms");
    }
    std::this_thread::sleep_for(record_poll);
  }
  return index;
}

void HotRowBatcher::enqueue(Shard& shard, std::uint32_t index) {
  shard.pending.fetch_add(1);
  if (closing_.load()) {
    shard.pending.fetch_sub(1);
    shard.slots[index].sink.reset();
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
  if (item.in_flight) telemetry_->contention().leave(item.shard_key());
  if (item.counted_as) {
    telemetry_->count_outcome(*item.counted_as, item.ok ? nullptr : &*item.error);
  }
}

// A request that could not be queued has its final outcome too, and is finished.
template <class Fn>
void HotRowBatcher::queue_or_report(const BatchItem& item, Fn&& queue) {
  try {
    queue();
  } catch (const Error& e) {
    BatchItem report;
    report.op = item.op;
    report.key = item.key;
    report.id = item.id;
    report.counted_as = item.counted_as;
    report.in_flight = item.in_flight;
    report.error = e;
    finish(report);
    throw;
  }
}

void HotRowBatcher::run(BatchItem& item, std::int64_t lock_timeout_ms) {
  Shard& shard = shard_for(item);
  std::uint32_t index = 0;
  queue_or_report(item, [&] {
    index = acquire(shard);
    Slot& slot = shard.slots[index];
    copy_input(slot.item, item);
    slot.lock_timeout_ms = lock_timeout_ms;
    slot.sink.reset();
    slot.done = false;
    enqueue(shard, index);
  });
  Slot& slot = shard.slots[index];
  {
    std::unique_lock<std::mutex> lock(slot.mutex);
    slot.cv.wait(lock, [&] { return slot.done; });
  }
  item.ok = slot.item.ok;
  item.reservation = std::move(slot.item.reservation);
  item.level = std::move(slot.item.level);
  item.error = std::move(slot.item.error);
  shard.free.bounded_push(index);
  if (!item.ok) throw *item.error;
}

void HotRowBatcher::submit(const BatchItem& item, std::int64_t lock_timeout_ms,
                           std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  if (!sink) throw_invalid_argument("an async request needs a completion sink");
  Shard& shard = shard_for(item);
  queue_or_report(item, [&] {
    const std::uint32_t index = acquire(shard);
    Slot& slot = shard.slots[index];
    copy_input(slot.item, item);
    slot.lock_timeout_ms = lock_timeout_ms;
    slot.sink = std::move(sink);
    slot.token = token;
    enqueue(shard, index);
  });
}

void HotRowBatcher::flush_loop(Shard& shard) {
  std::vector<std::uint32_t> indices;
  std::vector<BatchItem*> items;
  std::vector<Completion> completions;
  indices.reserve(options_.batch_max);
  items.reserve(options_.batch_max);
  for (;;) {
    std::uint32_t index = 0;
    while (indices.size() < options_.batch_max && shard.ready.pop(index)) indices.push_back(index);
    if (!indices.empty()) {
      shard.pending.fetch_sub(static_cast<std::int64_t>(indices.size()));
      apply(shard, indices, items);
      if (shard.pending.load() > 0) {
        hand_off(shard, indices);  // the next batch is waiting: complete in parallel
      } else {
        complete(shard, indices, completions);  // nothing to overlap: skip the hop
        indices.clear();
      }
      continue;
    }
    if (shard.pending.load() > 0) {  // a producer counted its request and is pushing it
      std::this_thread::yield();
      continue;
    }
    if (closing_.load()) break;  // drained, and no producer can add more
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

void HotRowBatcher::apply(Shard& shard, const std::vector<std::uint32_t>& indices,
                          std::vector<BatchItem*>& items) {
  items.clear();
  std::int64_t lock_timeout_ms = lock_timeout_ms_max;
  for (std::uint32_t index : indices) {
    Slot& slot = shard.slots[index];
    items.push_back(&slot.item);
    // The batch waits for its row locks no longer than its most impatient request asked.
    lock_timeout_ms = std::min(lock_timeout_ms, slot.lock_timeout_ms);
  }
  std::optional<Error> failure;
  try {
    store_->apply_batch(items, BatchOptions{lock_timeout_ms});
  } catch (const Error& e) {
    failure = e;
  } catch (const std::exception& e) {
    // Not a stockade error, so nothing says whether the transaction committed.
    failure =
        Error(ErrorCode::in_doubt,
              std::string("a batch failed unexpectedly; its outcome is unknown: ") + e.what());
  }
  for (BatchItem* item : items) {
    STOCKADE_ASSERT(failure || !(item->ok && item->error));  // decided one way, not both
    if (failure) {
      item->ok = false;
      item->error = failure;
    } else if (!item->ok && !item->error) {
      item->error = Error(ErrorCode::invariant_violation,
                          "the store returned a batch with a request left undecided");
    }
  }
  telemetry_->batch_applied(indices.size(), failure.has_value());
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
    Slot& slot = shard.slots[index];
    finish(slot.item);
    if (!slot.sink) {  // a blocked caller: it reads the outcome and frees the record
      std::lock_guard<std::mutex> lock(slot.mutex);
      slot.done = true;
      slot.cv.notify_one();
      continue;
    }
    if (slot.sink.get() != current) {
      post();
      holder = slot.sink;
      current = holder.get();
    }
    completions.push_back(completion_of(slot.item, slot.token));
    slot.sink.reset();
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
