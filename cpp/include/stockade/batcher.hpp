// HotRowBatcher: folds many concurrent reserve and sell requests into one transaction.
//
// Why: on a hot SKU every per-request strategy queues on one row lock and pays one commit
// per request. The batcher turns that queue into group commit: requests wait in memory,
// a flusher takes everything waiting (at most batch_max) and hands it to
// Store::apply_batch as one transaction, then completes every request.
//
// What it guarantees:
//   - Nothing is acknowledged before its batch committed. If the batch fails, every
//     request in it fails with the batch's error (InDoubt when the commit's outcome is
//     unknown); none completes twice, and none is dropped, including at close().
//   - Arrival order: a shard's queue is FIFO, and a batch is decided in the order its
//     requests were queued. One row always maps to one shard (by the 16-bit shard key of
//     its SKU, which its reservations' ids carry, plus its hot-row slot), so one flusher
//     decides it.
//   - Pipelined slots: the rows of a slotted SKU map to consecutive shards, so while one
//     flusher's batch waits for its commit flush, another's commits on the next row.
//     pick_slot() sends a request to a row whose flusher is idle, else to the one with
//     the fewest queued, avoiding rows another writer shares (another replica's home).
//   - Bounded everything: each shard owns `queue_capacity` preallocated request records;
//     a request that finds none free waits at most `enqueue_timeout_ms`, then raises
//     Overloaded. Batches hold at most `batch_max` requests.
//   - No fixed delay while the row is this engine's alone: an idle flusher sleeps, the
//     first request wakes it, and it flushes whatever is there, one request or thousands.
//     Under load, requests gather while the previous batch commits (and a wave of
//     returning callers is waited for briefly: see "waves stay whole").
//   - A short wait when another writer shares the row. Each batch learns the version its
//     row had before it and after it (BatchItem::row_found); when a row's version moved
//     between two of this engine's batches, someone else wrote it (another process, a
//     replica of this service), and batches of this engine and theirs take turns at the
//     row lock. Then the flusher lingers `contended_linger_us` before it takes a batch for
//     that row, so that each turn carries more requests (as commit_delay does for WAL
//     flushes), provided its last batch there carried several (a lone request per batch
//     would wait for company that does not come). It stops lingering once the row has gone
//     `contention_memory_ms` without another writer. Alone on a row a linger only delays:
//     the wait is never taken there.
//   - Waves stay whole. Blocked callers whose batch completed come back together, a few
//     microseconds apart; a flusher that took the first of them alone would split every
//     wave in two and pay two commits for it. So when its last batch and the requests that
//     queued while it ran came to at least two (the wave), and fewer are queued now, the
//     flusher waits until as many are queued again, for at most an eighth of its last
//     batch's time (and 1 ms): on a slow commit flush (a network disk, a synchronous
//     standby) that keeps batches whole, on a fast one it costs microseconds. The queued
//     ones count so that two half waves taking turns merge instead of each waiting for
//     the other's size. Only on a store that reports row versions (PostgreSQL): the memory
//     store's batches take microseconds. Counted as gathered_batches.
//
// How: requests are records in a per-shard pool, indexed by uint32; the free list and the
// ready queue are bounded boost::lockfree queues of those indices (trivially copyable, no
// allocation after start-up). Each shard has two threads: the flusher applies batches,
// one after another; when more requests wait, the completer delivers the applied batch's
// outcomes, so that waking its callers overlaps the next batch's transaction (an idle
// flusher completes a batch itself, sparing a lone request the extra thread hop). A
// blocked caller waits on its record's own condition variable; an async caller names a
// CompletionSink, and the completer posts a batch's completions to it in one call.
//
// What it does not do: retry. A failed batch is reported; the store's transaction runner
// has already retried what is safe to retry (serialization failures, a connection that
// broke before COMMIT).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "stockade/async.hpp"
#include "stockade/contention.hpp"
#include "stockade/store.hpp"

namespace stockade {

struct BatcherOptions {
  std::size_t shards = 4;        // flusher threads; a SKU maps to one by hash
  std::size_t batch_max = 4096;  // requests per transaction
  // Request records per shard, preallocated (about 750 bytes each: 4 shards of 4096 take
  // 12 MB, allocated when the first batched request starts the batcher).
  std::size_t queue_capacity = 4096;
  std::int64_t enqueue_timeout_ms = 5000;  // wait for a free record, then Overloaded
  // How long a blocked caller waits for its batch's outcome, beyond its own lock_timeout,
  // before it gives up with InDoubt (the batch may still commit). A batch waits for locks,
  // a connection and a lost session's end for bounded times each: this is a last resort.
  std::int64_t result_timeout_ms = 60000;
  // The longest one attempt at a batch waits for a row lock. A request waits for its row
  // as long as its own lock_timeout allows, in slices of this length, so that a row
  // locked elsewhere never holds up the shard's other rows for longer than one slice.
  std::int64_t lock_slice_ms = 50;
  // How long a flusher waits for more requests before a batch on a row that another
  // writer shares (see the class comment); 0 never waits.
  std::int64_t contended_linger_us = 300;
};

inline constexpr std::int64_t batch_linger_us_max = 100000;
// How long a row counts as shared after another writer's last trace on it.
inline constexpr std::int64_t contention_memory_ms = 100;

inline constexpr std::size_t batcher_shards_max = 64;
inline constexpr std::size_t batch_size_limit = 65536;
inline constexpr std::size_t batcher_queue_capacity_max = 1u << 20;
// What quantity_max promises: the quantities of one batch on one row cannot overflow.
static_assert(static_cast<double>(quantity_max) * batch_size_limit < 9.2e18 / 64,
              "a batch's summed quantities must stay far from the int64 range");

// Throws InvalidArgument naming the option out of range.
void validate_batcher_options(const BatcherOptions& options);

// Telemetry: the batcher writes to the store's Telemetry. When a request's outcome is
// final, and before its caller sees it, the batcher counts the outcome under the request's
// `counted_as` strategy and, if the engine entered it (`in_flight`), leaves the contention
// tracker for it: a request handed to the batcher is in flight until the batcher finishes
// it, queued or not.
class HotRowBatcher {
 public:
  // Told when a batch finds its row changed by another writer since this engine's last
  // batch there: the row, the requests on it in this batch, and the strategy its first
  // request was routed by. Runs on a flusher's thread, so it must not block.
  using RowShared =
      std::function<void(const SkuKey& row, std::size_t batch, std::optional<Strategy> routed)>;

  // `tracker`: the contention tracker the engine entered for each request it hands over
  // (a batcher of its own when none is given).
  HotRowBatcher(std::shared_ptr<Store> store, BatcherOptions options,
                std::shared_ptr<ContentionTracker> tracker = nullptr,
                RowShared on_shared = nullptr);
  ~HotRowBatcher();
  HotRowBatcher(const HotRowBatcher&) = delete;
  HotRowBatcher& operator=(const HotRowBatcher&) = delete;

  // Queues `item` (input fields only) and blocks until its batch completed; returns the
  // outcome in `item`, or throws the request's error.
  void run(BatchItem& item, std::int64_t lock_timeout_ms);
  // The batch size of the last request this thread ran through run(), or 0 if none ran
  // since the last take (for tracing: a span of a batched call carries its batch's size).
  static std::uint32_t take_last_batch_size() noexcept;
  // Queues `item` and returns at once; the outcome goes to `sink` under `token`. Throws
  // (Overloaded, InvalidState) only if the request could not be queued.
  void submit(const BatchItem& item, std::int64_t lock_timeout_ms,
              std::shared_ptr<CompletionSink> sink, std::uint64_t token);

  // Stops taking requests (later ones raise Unavailable "the engine is closed"), applies
  // every request already queued, and joins the flushers. Idempotent.
  void close();

  // Requests queued or being applied right now (a gauge; counters live in Telemetry).
  std::uint64_t queued() const;
  // Which of the `slots` rows of `key` a reserve or sell should go to: the first, from
  // `home` on, whose flusher has no batch in flight; else the one with the fewest
  // requests queued. A row other than `home` that another writer shares is skipped.
  int pick_slot(const SkuKey& key, int slots, int home) const;
  const BatcherOptions& options() const { return options_; }

 private:
  struct Record;
  struct Shard;

  Shard& shard_for(const BatchItem& item);
  Shard& shard_of_row(std::uint16_t shard_key, int slot) const;
  // A free record of `shard`, waiting at most enqueue_timeout_ms (then Overloaded).
  std::uint32_t acquire(Shard& shard);
  void enqueue(Shard& shard, std::uint32_t index);
  template <class Fn>
  void queue_or_report(const BatchItem& item, Fn&& queue);
  // Counts a final outcome and leaves the contention tracker (see the class comment).
  void finish(const BatchItem& item);
  void flush_loop(Shard& shard);
  // Takes what is queued into `indices` (up to batch_max); with `may_wait` (no deferred
  // requests carried), first waits as should_linger() or gather() say.
  void take(Shard& shard, std::vector<std::uint32_t>& indices, bool may_wait);
  void apply(Shard& shard, std::vector<std::uint32_t>& indices, std::vector<BatchItem*>& items,
             std::vector<std::uint32_t>& deferred);
  void attempt(std::vector<BatchItem*>& items, const std::vector<Record*>& records);
  // After a committed batch: whether another writer moved its row since the last one.
  void observe(Shard& shard, const std::vector<BatchItem*>& items);
  // Whether the next batch, starting with the record `first`, should wait for more.
  bool should_linger(Shard& shard, std::uint32_t first) const;
  // Waits (bounded) for the wave of callers of the row's last batch to be queued again;
  // then takes them into `indices` (see the class comment). Whether it waited.
  bool gather(Shard& shard, std::vector<std::uint32_t>& indices);
  void hand_off(Shard& shard, std::vector<std::uint32_t>& indices);
  void complete_loop(Shard& shard);
  void complete(Shard& shard, const std::vector<std::uint32_t>& indices,
                std::vector<Completion>& completions);

  const std::shared_ptr<Store> store_;
  const BatcherOptions options_;
  const std::shared_ptr<Telemetry> telemetry_;
  const std::shared_ptr<ContentionTracker> tracker_;
  const RowShared on_shared_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::atomic<bool> closing_{false};
  std::mutex close_mutex_;  // one close() joins the flushers; a concurrent one waits
};

}  // namespace stockade
