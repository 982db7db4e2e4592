// Test facilities, kept off the Store seam: a store that supports them also implements
// TestHooks. The Python bindings expose them in register_testing.cpp, and the test suites
// use them to prove that their race harness can see a lost update and to observe NOWAIT
// and lock_timeout. No production path calls them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "stockade/store.hpp"
#include "stockade/types.hpp"

namespace stockade {

// A lock held on behalf of a test, released when destroyed.
class LockHold {
 public:
  virtual ~LockHold() = default;
};

class TestHooks {
 public:
  virtual ~TestHooks() = default;

  // A deliberately broken read-modify-write: read the row, wait window_us (a stand-in for
  // the round trip every real application has between its read and its write), then
  // write back absolute values computed from the stale read. It loses updates and
  // oversells under concurrency; tests run it as a canary to prove that their race
  // harness can see the bug the real strategies prevent.
  virtual Reservation naive_reserve_unsafe(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                           std::int64_t window_us) = 0;

  // A purchase limit checked the naive way: sum the buyer's held and confirmed
  // reservations on the SKUs of the group of `key`, refuse past per_buyer
  // (LimitExceeded), wait window_us, then reserve (atomic), with no parent row. At READ
  // COMMITTED (serializable = false) two requests by one buyer on two SKUs both pass the
  // check: write skew, the canary that shows what the parent row prevents. With
  // serializable = true it runs at SERIALIZABLE and retries serialization failures as
  // every transaction does: the other way to prevent it, measured against the parent row
  // (PostgreSQL only; the memory store raises NotSupported).
  virtual Reservation limited_reserve_by_check(const SkuKey& key, Quantity qty,
                                               const std::string& buyer, bool serializable,
                                               std::int64_t window_us) = 0;
  // Takes the lock that `kind` (pessimistic: the row lock; advisory: the key's advisory
  // lock) would take, as another session would, and holds it until the result is
  // destroyed. Lets tests observe NOWAIT and lock_timeout.
  virtual std::unique_ptr<LockHold> hold_lock(const SkuKey& key, Strategy kind,
                                              std::int64_t timeout_ms) = 0;
};

// The test hooks of `store`; NotSupported if the store has none.
TestHooks& test_hooks(Store& store);

// Points inside the batcher where a test may widen a race window (no-ops unless set).
struct BatcherTestPoints {
  // A flusher found its queue empty and has read whether the batcher is closing; it
  // reads the queue's count next, and stops if the count is zero and it was closing.
  std::atomic<void (*)()> before_drain_check{+[] {}};
};
BatcherTestPoints& batcher_test_points();

}  // namespace stockade
