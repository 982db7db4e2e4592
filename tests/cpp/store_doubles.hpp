// The store doubles of the GoogleTest suite: test Stores that forward every call to a real
// memory store (DelegatingStore) and change only apply_batch, to fail batches on a seeded
// schedule (FaultyStore), hold them until released (GatedStore), report row versions as
// the PostgreSQL store does (VersionReportingStore) or count the batches in flight
// (CountingStore).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stockade/errors.hpp"
#include "stockade/memory_store.hpp"
#include "stockade/store.hpp"

namespace stockade {

enum class Fate { commit, fail_before_commit, fail_after_commit, slow_commit };

struct FaultPlan {
  std::uint32_t seed = 1;
  int fail_before_percent = 0;
  int fail_after_percent = 0;
  int slow_percent = 0;
  std::chrono::microseconds slow{2000};
};

// Forwards every call to a real memory store; subclasses change apply_batch.
class DelegatingStore : public Store {
 public:
  // The inner store writes to this store's telemetry, as one store would.
  DelegatingStore() : inner_(make_memory_store(nullptr, shared_telemetry())) {}
  const char* backend_name() const noexcept override { return "delegating"; }
  StockLevel restock(const SkuKey& k, Quantity q, std::optional<Version> v,
                     std::optional<FencingToken> t,
                     const std::optional<std::string>& key = {}) override {
    return inner_->restock(k, q, v, t, key);
  }
  std::vector<StockLevel> sku_rows(const SkuKey& k) override { return inner_->sku_rows(k); }
  std::vector<StockLevel> reshape(const std::vector<SkuKey>& rows, bool create, bool write_all,
                                  std::int64_t ms, const ReshapePlan& plan,
                                  int active_slots) override {
    return inner_->reshape(rows, create, write_all, ms, plan, active_slots);
  }
  StockLevel set_on_hand(const SkuKey& k, Quantity q, std::optional<Version> v,
                         std::optional<FencingToken> t,
                         const std::optional<std::string>& key = {}) override {
    return inner_->set_on_hand(k, q, v, t, key);
  }
  StockLevel set_backorder_limit(const SkuKey& k, Quantity l, std::optional<Version> v,
                                 std::optional<FencingToken> t) override {
    return inner_->set_backorder_limit(k, l, v, t);
  }
  StockLevel set_safety_stock(const SkuKey& k, Quantity u, std::optional<Version> v,
                              std::optional<FencingToken> t) override {
    return inner_->set_safety_stock(k, u, v, t);
  }
  StockLevel move_units(const MoveRequest& request) override { return inner_->move_units(request); }
  Transfer transfer(const TransferRequest& request) override { return inner_->transfer(request); }
  Transfer transfer_step(const TransferStepRequest& request) override {
    return inner_->transfer_step(request);
  }
  std::optional<Transfer> get_transfer(const Uuid& id) override { return inner_->get_transfer(id); }
  std::vector<Transfer> find_transfers(const TransferQuery& query) override {
    return inner_->find_transfers(query);
  }
  std::vector<StockLevel> set_discontinued(const SkuKey& k, bool d, std::int64_t ms,
                                           const RowsCheck& check) override {
    return inner_->set_discontinued(k, d, ms, check);
  }
  Lease acquire_lease(const SkuKey& k, std::int64_t ttl, const std::string& owner) override {
    return inner_->acquire_lease(k, ttl, owner);
  }
  Lease renew_lease(const SkuKey& k, FencingToken t, std::int64_t ttl) override {
    return inner_->renew_lease(k, t, ttl);
  }
  bool release_lease(const SkuKey& k, FencingToken t) override {
    return inner_->release_lease(k, t);
  }
  void set_purchase_limit(const PurchaseLimit& l) override { inner_->set_purchase_limit(l); }
  bool remove_purchase_limit(const std::string& g) override {
    return inner_->remove_purchase_limit(g);
  }
  Quantity buyer_held(const std::string& g, const std::string& b) override {
    return inner_->buyer_held(g, b);
  }
  StockLevel stock(const SkuKey& k) override { return inner_->stock(k); }
  StockLevel sell(const SellRequest& r) override { return inner_->sell(r); }
  Reservation reserve(const ReserveRequest& r) override { return inner_->reserve(r); }
  std::vector<Reservation> reserve_order(const OrderRequest& r) override {
    return inner_->reserve_order(r);
  }
  std::vector<Reservation> allocate(const AllocateRequest& r) override {
    return inner_->allocate(r);
  }
  std::vector<std::string> sku_locations(const std::string& sku,
                                         const std::optional<std::string>& after,
                                         std::size_t limit) override {
    return inner_->sku_locations(sku, after, limit);
  }
  Reservation transition(const TransitionRequest& r) override { return inner_->transition(r); }
  Reservation return_units(const ReturnRequest& r) override { return inner_->return_units(r); }
  Reservation resize(const ResizeRequest& r) override { return inner_->resize(r); }
  Reservation get_reservation(const Uuid& id) override { return inner_->get_reservation(id); }
  std::vector<Reservation> order_step(const OrderStepRequest& request) override {
    return inner_->order_step(request);
  }
  std::vector<Reservation> get_order(const Uuid& order_id) override {
    return inner_->get_order(order_id);
  }
  std::vector<Reservation> order_by_key(const std::string& key) override {
    return inner_->order_by_key(key);
  }
  std::vector<Reservation> find_reservations(const ReservationQuery& query) override {
    return inner_->find_reservations(query);
  }
  std::size_t expire_due(std::size_t limit) override { return inner_->expire_due(limit); }
  std::size_t free_lapsed(std::size_t limit) override { return inner_->free_lapsed(limit); }
  PurgeCounts purge(std::int64_t older_than_us, std::uint64_t limit) override {
    return inner_->purge(older_than_us, limit);
  }
  StoreCounts counts() const override { return inner_->counts(); }
  std::vector<Movement> movements(const MovementQuery& q) override { return inner_->movements(q); }
  FeedPosition feed_open(const std::string& consumer, bool from_start) override {
    return inner_->feed_open(consumer, from_start);
  }
  FeedBatch feed_poll(const std::string& consumer, const FeedPosition& from,
                      std::size_t limit) override {
    return inner_->feed_poll(consumer, from, limit);
  }
  void feed_commit(const std::string& consumer, const FeedPosition& at) override {
    inner_->feed_commit(consumer, at);
  }
  bool feed_drop(const std::string& consumer) override { return inner_->feed_drop(consumer); }
  StockLevel set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) override {
    return inner_->set_low_stock(key, threshold);
  }
  AuditReport audit(const AuditOptions& options) override { return inner_->audit(options); }
  std::uint64_t purge_movements(std::int64_t older_than_us, std::uint64_t limit) override {
    return inner_->purge_movements(older_than_us, limit);
  }
  FeedWake feed_wait(std::int64_t timeout_us) override { return inner_->feed_wait(timeout_us); }

 protected:
  std::shared_ptr<Store> inner_;
};

// A store whose apply_batch fails on a seeded schedule. Everything else is the memory
// store's. "After commit" applies the batch and then reports InDoubt, as a connection
// lost during COMMIT would.
class FaultyStore final : public DelegatingStore {
 public:
  explicit FaultyStore(FaultPlan plan) : plan_(plan), rng_(plan.seed) {}

  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override {
    std::lock_guard<std::mutex> lock(mutex_);  // flushers of several shards may call at once
    const Fate fate = next_fate();
    batch_sizes_.push_back(items.size());
    if (fate == Fate::fail_before_commit) {
      ++failed_before_;
      throw Error(ErrorCode::unavailable, "injected: the connection broke before COMMIT");
    }
    if (fate == Fate::slow_commit) std::this_thread::sleep_for(plan_.slow);
    std::map<SkuKey, Quantity> available;
    for (const BatchItem* item : items) {
      if (available.count(item->key) == 0) {
        try {
          available[item->key] = inner_->stock(item->key).available();
        } catch (const Error&) {
          available[item->key] = -1;  // no row
        }
      }
    }
    inner_->apply_batch(items, options);
    check_arrival_order(items, available);
    if (fate == Fate::fail_after_commit) {
      for (const BatchItem* item : items) {
        if (item->ok && item->op == BatchOp::reserve)
          committed_in_doubt_.push_back(item->reservation.id);
      }
      throw Error(ErrorCode::in_doubt, "injected: the connection broke during COMMIT");
    }
  }

  std::size_t out_of_order = 0;  // batch decisions that differ from the replay
  std::vector<Uuid> committed_in_doubt_;
  std::vector<std::size_t> batch_sizes_;
  std::size_t failed_before_ = 0;

 private:
  Fate next_fate() {
    std::uniform_int_distribution<int> percent(0, 99);
    const int roll = percent(rng_);
    if (roll < plan_.fail_before_percent) return Fate::fail_before_commit;
    if (roll < plan_.fail_before_percent + plan_.fail_after_percent) return Fate::fail_after_commit;
    if (roll < plan_.fail_before_percent + plan_.fail_after_percent + plan_.slow_percent) {
      return Fate::slow_commit;
    }
    return Fate::commit;
  }

  // Replays the batch: in arrival order, grant while available, refuse the rest.
  void check_arrival_order(const std::vector<BatchItem*>& items,
                           std::map<SkuKey, Quantity> available) {
    for (const BatchItem* item : items) {
      if (is_transition(item->op)) continue;  // decided by the reservation, not the row
      Quantity& left = available[item->key];
      const bool grant = left >= item->qty;
      if (grant) left -= item->qty;
      if (grant != item->ok) ++out_of_order;
    }
  }

  FaultPlan plan_;
  std::mt19937 rng_;
  std::mutex mutex_;
};

// A store whose batches wait until the test lets them go.
class GatedStore final : public DelegatingStore {
 public:
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    gate_.notify_all();
  }
  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override {
    std::unique_lock<std::mutex> lock(mutex_);
    gate_.wait(lock, [&] { return open_; });
    lock.unlock();
    inner_->apply_batch(items, options);
  }

 private:
  std::mutex mutex_;
  std::condition_variable gate_;
  bool open_ = false;
};

// A store that reports each batch's row versions, as the PostgreSQL store does: the row as
// the batch found it and as it left it.
// Each batch takes 200 us (or `commit`), as a commit would, so that concurrent callers gather.
class VersionReportingStore final : public DelegatingStore {
 public:
  explicit VersionReportingStore(std::chrono::microseconds commit = std::chrono::microseconds(200))
      : commit_(commit) {}
  // As a real store reports: the version the batch found, and that one moved by one per
  // change the batch made (a restock racing the batch then shows as a gap, as it would:
  // reading the version again after the batch would take it in).
  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override {
    std::this_thread::sleep_for(commit_);
    const SkuKey key = items.front()->key;
    const Version found = inner_->stock(key).version;
    inner_->apply_batch(items, options);
    Version left = found;
    for (const BatchItem* item : items) left += item->ok ? 1 : 0;
    for (BatchItem* item : items) {
      item->row_found = found;
      item->row_left = left;
    }
    std::lock_guard<std::mutex> lock(sizes_mutex_);
    sizes_.push_back(items.size());
  }
  // The sizes of the batches applied so far (each recorded before the batcher hears back).
  std::vector<std::size_t> sizes() const {
    std::lock_guard<std::mutex> lock(sizes_mutex_);
    return sizes_;
  }

 private:
  const std::chrono::microseconds commit_;
  mutable std::mutex sizes_mutex_;
  std::vector<std::size_t> sizes_;
};

// A store that counts the batches in flight at once, each taking `commit`, and the rows
// batches went to.
class CountingStore final : public DelegatingStore {
 public:
  explicit CountingStore(std::chrono::microseconds commit) : commit_(commit) {}
  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override {
    const int now = ++in_flight_;
    int seen = most_in_flight.load();
    while (now > seen && !most_in_flight.compare_exchange_weak(seen, now)) {
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const BatchItem* item : items) ++slots_used[item->key.slot];
    }
    std::this_thread::sleep_for(commit_);
    inner_->apply_batch(items, options);
    --in_flight_;
  }
  std::atomic<int> most_in_flight{0};
  std::map<int, int> slots_used;  // read after the callers joined

 private:
  const std::chrono::microseconds commit_;
  std::atomic<int> in_flight_{0};
  std::mutex mutex_;
};

}  // namespace stockade
