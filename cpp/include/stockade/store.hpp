// The Store interface: the seam between the engine and a backend.
//
// Strategies, the hot-row batcher and the simulation tests all talk to a Store. A store
// implements every strategy of DESIGN.md section 1 in its own terms (SQL for PostgreSQL,
// compare-and-set and locks for memory) and keeps the same semantics and errors: inputs
// reach it already validated by the Engine, and it must never let a committed state break
// 0 <= reserved <= on_hand.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stockade/errors.hpp"
#include "stockade/hash.hpp"
#include "stockade/metrics.hpp"
#include "stockade/types.hpp"

namespace stockade {

// How a write may wait and retry. Resolved by the Engine: strategy is never automatic
// or batched by the time a store sees it.
struct WriteOptions {
  Strategy strategy = Strategy::atomic;
  bool nowait = false;  // pessimistic/advisory: fail at once if the lock is held
  std::int64_t lock_timeout_ms = 10000;
  int retries_max = 5;                      // optimistic: attempts after the first
  std::optional<Version> expected_version;  // of the stock row
};

struct ReserveRequest {
  SkuKey key;
  Quantity qty = 0;
  std::int64_t ttl_us = 0;
  std::optional<std::string> idempotency_key;
  WriteOptions options;
};

struct OrderLine {
  SkuKey key;
  Quantity qty = 0;
};

struct OrderRequest {
  std::vector<OrderLine> lines;  // distinct keys; the store sorts them for locking
  std::int64_t ttl_us = 0;
  std::optional<std::string> idempotency_key;
  WriteOptions options;
};

struct SellRequest {
  SkuKey key;
  Quantity qty = 0;
  WriteOptions options;
};

// One request inside a batch (Store::apply_batch). The hot-row batcher fills the input
// fields from a preallocated record; the store fills the outcome: a reservation (reserve,
// confirm, release), a stock level (sell), or a per-request error such as OutOfStock.
enum class BatchOp : std::uint8_t { reserve, sell, confirm, release };

inline bool is_transition(BatchOp op) {
  return op == BatchOp::confirm || op == BatchOp::release;
}

struct BatchItem {
  // Input.
  BatchOp op = BatchOp::reserve;
  SkuKey key;                                  // reserve and sell
  Quantity qty = 0;                            // reserve and sell
  std::int64_t ttl_us = 0;                     // reserve only
  std::optional<std::string> idempotency_key;  // reserve only
  Uuid id;                                     // confirm and release
  std::optional<Version> expected_version;     // confirm and release: the reservation's
  // Outcome, written by the store.
  bool ok = false;
  Reservation reservation;
  StockLevel level;
  std::optional<Error> error;

  void clear_outcome() {
    ok = false;
    error.reset();
  }

  // The 16-bit shard key of the row this request is about: from its SKU, or from the
  // reservation id, which carries it.
  std::uint16_t shard_key() const {
    return is_transition(op) ? id.shard_key() : shard_key_of(key.sku, key.location);
  }
};

// How a batch may wait for its locks.
struct BatchOptions {
  std::int64_t lock_timeout_ms = 10000;
};

// A lock held on behalf of a test, released when destroyed.
class LockHold {
 public:
  virtual ~LockHold() = default;
};

class Store {
 public:
  virtual ~Store() = default;

  virtual const char* backend_name() const noexcept = 0;

  // Stock rows.
  virtual StockLevel restock(const SkuKey& key, Quantity qty,
                             std::optional<Version> expected_version) = 0;
  virtual StockLevel set_on_hand(const SkuKey& key, Quantity on_hand,
                                 std::optional<Version> expected_version) = 0;
  virtual StockLevel stock(const SkuKey& key) = 0;
  virtual StockLevel sell(const SellRequest& request) = 0;

  // Reservations.
  virtual Reservation reserve(const ReserveRequest& request) = 0;
  virtual std::vector<Reservation> reserve_order(const OrderRequest& request) = 0;
  virtual Reservation confirm(const Uuid& id, std::optional<Version> expected_version) = 0;
  virtual Reservation release(const Uuid& id, std::optional<Version> expected_version) = 0;
  virtual Reservation extend(const Uuid& id, std::int64_t ttl_us,
                             std::optional<Version> expected_version) = 0;
  virtual Reservation get_reservation(const Uuid& id) = 0;
  virtual std::size_t expire_due(std::size_t limit) = 0;

  // Applies a batch of reserve, sell, confirm and release requests as one transaction,
  // deciding each in the order given (arrival order): grant while units are available,
  // refuse the rest with OutOfStock; a transition follows the per-request rules (a lapsed
  // hold is expired, and that commits, before ReservationExpired). Reservation rows are
  // locked before stock rows, and each kind in sorted order. Idempotency keys hold
  // inside a batch: a duplicate later in the same batch gets the first one's outcome,
  // and a key committed earlier replays its reservation. On return every item carries
  // its outcome (ok, or a per-item error) and the batch has committed. If the batch as a
  // whole fails it throws, and no item took effect, except that InDoubt means the commit
  // may or may not have landed.
  virtual void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) = 0;

  virtual StoreStats stats(std::size_t sku_limit) const = 0;

  // Creates or upgrades the backend's schema; returns the names of the migrations it
  // applied. A store without a schema applies nothing.
  virtual std::vector<std::string> migrate() { return {}; }

  // Releases connections and stops background work. Calls after close() raise
  // InvalidState on stores that hold such resources; closing twice is harmless.
  virtual void close() {}
  Metrics& metrics() { return metrics_; }
  const Metrics& metrics() const { return metrics_; }

  // --- Test facilities. Not for production paths. ---

  // A deliberately broken read-modify-write: read the row, wait window_us (a stand-in for
  // the round trip every real application has between its read and its write), then
  // write back absolute values computed from the stale read. It loses updates and
  // oversells under concurrency; tests run it as a canary to prove that their race
  // harness can see the bug the real strategies prevent.
  virtual Reservation naive_reserve_unsafe(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                           std::int64_t window_us) = 0;

  // Takes the lock that `kind` (pessimistic: the row lock; advisory: the key's advisory
  // lock) would take, as another session would, and holds it until the result is
  // destroyed. Lets tests observe NOWAIT and lock_timeout.
  virtual std::unique_ptr<LockHold> hold_lock(const SkuKey& key, Strategy kind,
                                              std::int64_t timeout_ms) = 0;

 private:
  Metrics metrics_;
};

}  // namespace stockade
