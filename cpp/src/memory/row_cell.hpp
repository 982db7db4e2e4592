// RowCell: one stock row of the memory store, readable without locks and written by
// compare-and-set.
//
// What it guarantees. Readers always see a consistent (on_hand, reserved, version)
// triple, never a torn mix of two writes. A writer commits only through the latch, and
// the latch can be taken conditionally, "only if nothing was written since I read"
// (try_latch with the sequence number of the read). That is a compare-and-set over the
// whole row: the memory equivalent of `UPDATE ... WHERE on_hand - reserved >= :q`, with no
// window between the check and the write. Every publish checks 0 <= reserved <= on_hand +
// backorder_limit first, the memory store's CHECK constraint, so no strategy can commit
// an oversell.
//
// How. A sequence lock (seqlock): `seq_` is even when the row is stable and odd while a
// writer holds the latch. Readers read seq, the fields, then seq again, and retry when it
// moved or was odd. The fields are relaxed atomics, ordered by the fences of Boehm's
// "Can seqlocks get along with programming language memory models?" (2012), so the code
// is free of data races in the C++ memory model (and clean under ThreadSanitizer).
//
// What it does not do. It is not a queueing lock: waiters spin and then yield, which is
// right for a latch held for a few stores and wrong for anything longer. Work that must
// hold a row for longer (pessimistic, advisory) takes a separate mutex first.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>

#include "base/backoff.hpp"
#include "base/invariant.hpp"
#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::detail {

// A row's fields. Writers copy the values they read and change what they change, so a
// write never resets a field it does not own (the backorder limit, the tombstone, the
// lease). Every change moves the version.
struct RowValues {
  Quantity on_hand = 0;
  Quantity reserved = 0;
  Version version = 0;
  TimestampUs updated_at_us = 0;
  Quantity backorder_limit = 0;
  std::int64_t discontinued = 0;  // 0 or 1
  FencingToken lease_token = 0;
  TimestampUs lease_expires_us = 0;   // 0: no lease (released, or never taken)
  Quantity low_stock = no_low_stock;  // the low-stock threshold of the feed's alerts
  std::int64_t active_slots = 0;      // on a SKU's own row: StockLevel::active_slots
  Quantity safety_stock = 0;          // StockLevel's quantity states
  Quantity damaged = 0;
  Quantity quality_control = 0;
  Quantity incoming = 0;  // in transit to this row (transfers)

  static constexpr Quantity no_low_stock = INT64_MIN;
  bool lease_live(TimestampUs now) const { return lease_expires_us > now; }
  Quantity withheld() const { return safety_stock + damaged + quality_control; }
  // The schema's CHECK constraints on a stock row (types.hpp, StockLevel).
  bool keeps_invariant() const {
    return backorder_limit >= 0 && reserved >= 0 && safety_stock >= 0 && damaged >= 0 &&
           quality_control >= 0 && incoming >= 0 &&
           reserved + damaged + quality_control <= on_hand + backorder_limit;
  }
};

struct RowSnapshot {
  RowValues values;
  std::uint64_t seq = 0;
};

// Where a row's changes are journaled (memory/journal.hpp).
class RowJournal {
 public:
  virtual ~RowJournal() = default;
  // `before` is null when the change made the row.
  virtual void record(const SkuKey& key, const RowValues* before, const RowValues& after) = 0;
};

class alignas(cache_line_size) RowCell {
 public:
  explicit RowCell(const RowValues& initial, RowJournal* journal_ = nullptr) : journal(journal_) {
    store_fields(initial);
  }
  RowJournal* const journal;  // none: the store journals nothing

  RowSnapshot read() const {
    SpinWait wait;
    for (;;) {
      const std::uint64_t before = seq_.load(std::memory_order_acquire);
      if ((before & 1) == 0) {
        RowSnapshot snap{load_fields(), before};
        std::atomic_thread_fence(std::memory_order_acquire);
        if (seq_.load(std::memory_order_relaxed) == before) return snap;
      }
      wait.once();
    }
  }

  // Takes the latch only if no write happened since the read that returned `seen_seq`.
  bool try_latch(std::uint64_t seen_seq) {
    std::uint64_t expected = seen_seq;
    if (!seq_.compare_exchange_strong(expected, seen_seq + 1, std::memory_order_acquire,
                                      std::memory_order_relaxed)) {
      return false;
    }
    std::atomic_thread_fence(std::memory_order_release);
    return true;
  }

  // Takes the latch unconditionally, waiting for the current holder; returns the values
  // under the latch. Callers that take several latches take them in sorted key order.
  RowValues latch() {
    SpinWait wait;
    for (;;) {
      std::uint64_t current = seq_.load(std::memory_order_relaxed);
      if ((current & 1) == 0 && try_latch(current)) return load_fields();
      wait.once();
    }
  }

  // Requires the latch. Writes `next` and releases the latch.
  void publish(const RowValues& next) {
    const std::uint64_t odd = seq_.load(std::memory_order_relaxed);
    store_fields(next);
    seq_.store(odd + 1, std::memory_order_release);
  }

  // Requires the latch. Releases it without a write: the sequence goes back to its value
  // before the latch, so readers and compare-and-set callers holding it are not failed.
  void unlatch_unchanged() {
    const std::uint64_t odd = seq_.load(std::memory_order_relaxed);
    seq_.store(odd - 1, std::memory_order_release);
  }

 private:
  RowValues load_fields() const {
    return RowValues{on_hand_.load(std::memory_order_relaxed),
                     reserved_.load(std::memory_order_relaxed),
                     version_.load(std::memory_order_relaxed),
                     updated_at_us_.load(std::memory_order_relaxed),
                     backorder_limit_.load(std::memory_order_relaxed),
                     discontinued_.load(std::memory_order_relaxed),
                     lease_token_.load(std::memory_order_relaxed),
                     lease_expires_us_.load(std::memory_order_relaxed),
                     low_stock_.load(std::memory_order_relaxed),
                     active_slots_.load(std::memory_order_relaxed),
                     safety_stock_.load(std::memory_order_relaxed),
                     damaged_.load(std::memory_order_relaxed),
                     quality_control_.load(std::memory_order_relaxed),
                     incoming_.load(std::memory_order_relaxed)};
  }
  void store_fields(const RowValues& v) {
    on_hand_.store(v.on_hand, std::memory_order_relaxed);
    reserved_.store(v.reserved, std::memory_order_relaxed);
    version_.store(v.version, std::memory_order_relaxed);
    updated_at_us_.store(v.updated_at_us, std::memory_order_relaxed);
    backorder_limit_.store(v.backorder_limit, std::memory_order_relaxed);
    discontinued_.store(v.discontinued, std::memory_order_relaxed);
    lease_token_.store(v.lease_token, std::memory_order_relaxed);
    lease_expires_us_.store(v.lease_expires_us, std::memory_order_relaxed);
    low_stock_.store(v.low_stock, std::memory_order_relaxed);
    active_slots_.store(v.active_slots, std::memory_order_relaxed);
    safety_stock_.store(v.safety_stock, std::memory_order_relaxed);
    damaged_.store(v.damaged, std::memory_order_relaxed);
    quality_control_.store(v.quality_control, std::memory_order_relaxed);
    incoming_.store(v.incoming, std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> seq_{0};
  std::atomic<Quantity> on_hand_{0};
  std::atomic<Quantity> reserved_{0};
  std::atomic<Version> version_{0};
  std::atomic<TimestampUs> updated_at_us_{0};
  std::atomic<Quantity> backorder_limit_{0};
  std::atomic<std::int64_t> discontinued_{0};
  std::atomic<FencingToken> lease_token_{0};
  std::atomic<TimestampUs> lease_expires_us_{0};
  std::atomic<Quantity> low_stock_{RowValues::no_low_stock};
  std::atomic<std::int64_t> active_slots_{0};
  std::atomic<Quantity> safety_stock_{0};
  std::atomic<Quantity> damaged_{0};
  std::atomic<Quantity> quality_control_{0};
  std::atomic<Quantity> incoming_{0};
};

[[noreturn]] void throw_invariant_violation(const RowValues& next, const SkuKey& key);

// Holds a latch; releases it unchanged unless publish() was called. Movable, so a
// multi-row write can keep a vector of them.
class RowLatch {
 public:
  RowLatch() = default;
  RowLatch(RowCell& cell, const RowValues& under_latch) : cell_(&cell), values_(under_latch) {}
  RowLatch(RowLatch&& other) noexcept : cell_(other.cell_), values_(other.values_) {
    other.cell_ = nullptr;
  }
  RowLatch& operator=(RowLatch&& other) noexcept {
    if (this != &other) {
      release();
      cell_ = other.cell_;
      values_ = other.values_;
      other.cell_ = nullptr;
    }
    return *this;
  }
  RowLatch(const RowLatch&) = delete;
  RowLatch& operator=(const RowLatch&) = delete;
  ~RowLatch() { release(); }

  const RowValues& values() const { return values_; }
  bool held() const { return cell_ != nullptr; }

  // Checks the row invariant (the CHECK constraint of the schema), then writes `next`
  // and releases the latch. A broken invariant is a bug in a caller: it raises
  // invariant_violation and leaves the row as it was.
  void publish(const RowValues& next, const SkuKey& key) {
    if (!next.keeps_invariant()) throw_invariant_violation(next, key);
    STOCKADE_ASSERT(next.version >= values_.version);  // versions never go back
    // The journal's entry, appended under the latch: per row, entries follow versions.
    if (cell_->journal != nullptr) cell_->journal->record(key, &values_, next);
    cell_->publish(next);
    cell_ = nullptr;
  }

 private:
  void release() {
    if (cell_ != nullptr) cell_->unlatch_unchanged();
    cell_ = nullptr;
  }

  RowCell* cell_ = nullptr;
  RowValues values_;
};

}  // namespace stockade::detail
