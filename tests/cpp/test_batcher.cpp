// The hot-row batcher, driven through a fault-injecting store.
//
// Goal: whatever the store does to a batch (fail before COMMIT, fail after it, commit
// slowly), no acknowledged request is lost, none completes twice, and each committed
// batch decided its requests in arrival order. Method: FaultyStore wraps a real memory
// store; a seeded generator picks each batch's fate, and the store checks every batch it
// commits against a replay of arrival-order allocation. The fault sequence is
// reproducible from the seed; the thread interleaving is not, which is the point of
// running several seeds under ThreadSanitizer.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "stockade/batcher.hpp"
#include "stockade/engine.hpp"
#include "stockade/memory_store.hpp"
#include "stockade/testing.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

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
                     std::optional<FencingToken> t) override {
    return inner_->restock(k, q, v, t);
  }
  std::vector<StockLevel> sku_rows(const SkuKey& k) override { return inner_->sku_rows(k); }
  std::vector<StockLevel> reshape(const std::vector<SkuKey>& rows, bool create, bool write_all,
                                  std::int64_t ms, const ReshapePlan& plan,
                                  int active_slots) override {
    return inner_->reshape(rows, create, write_all, ms, plan, active_slots);
  }
  StockLevel set_on_hand(const SkuKey& k, Quantity q, std::optional<Version> v,
                         std::optional<FencingToken> t) override {
    return inner_->set_on_hand(k, q, v, t);
  }
  StockLevel set_backorder_limit(const SkuKey& k, Quantity l, std::optional<Version> v,
                                 std::optional<FencingToken> t) override {
    return inner_->set_backorder_limit(k, l, v, t);
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
  Reservation transition(const TransitionRequest& r) override { return inner_->transition(r); }
  Reservation get_reservation(const Uuid& id) override { return inner_->get_reservation(id); }
  std::size_t expire_due(std::size_t limit) override { return inner_->expire_due(limit); }
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

// Collects async completions, counting each token.
class CollectingSink final : public CompletionSink {
 public:
  void post(std::vector<Completion>& completions) override {
    std::lock_guard<std::mutex> lock(mutex_);
    ++posts_;
    for (Completion& c : completions) {
      ++seen_[c.token];
      done_.push_back(std::move(c));
    }
    completions.clear();
  }
  std::size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_.size();
  }
  std::vector<Completion> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::move(done_);
  }
  std::map<std::uint64_t, int> seen() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return seen_;
  }
  std::size_t posts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return posts_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<Completion> done_;
  std::map<std::uint64_t, int> seen_;
  std::size_t posts_ = 0;
};

BatchItem reserve_item(const SkuKey& key, Quantity qty) {
  BatchItem item;
  item.op = BatchOp::reserve;
  item.key = key;
  item.qty = qty;
  item.ttl_us = 60'000'000;
  return item;
}

struct Tally {
  std::vector<Uuid> granted;
  std::size_t refused = 0;
  std::size_t in_doubt = 0;
  std::size_t failed = 0;
};

// Many threads reserve one unit each through a batcher over a FaultyStore, then the test
// checks the store against what the callers were told.
void run_faulty_race(const FaultPlan& plan, std::size_t threads, std::size_t per_thread,
                     Quantity units) {
  auto store = std::make_shared<FaultyStore>(plan);
  const SkuKey hot{"hot", "default"};
  store->restock(hot, units, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 2;
  options.batch_max = 64;
  options.queue_capacity = 256;
  HotRowBatcher batcher(store, options);
  std::vector<Tally> tallies(threads);
  std::vector<std::thread> workers;
  for (std::size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (std::size_t i = 0; i < per_thread; ++i) {
        BatchItem item = reserve_item(hot, 1);
        try {
          batcher.run(item, 1000);
          tallies[t].granted.push_back(item.reservation.id);
        } catch (const Error& e) {
          if (e.code() == ErrorCode::out_of_stock) {
            ++tallies[t].refused;
          } else if (e.code() == ErrorCode::in_doubt) {
            ++tallies[t].in_doubt;
          } else {
            ++tallies[t].failed;
          }
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  batcher.close();

  std::set<Uuid> acknowledged;
  std::size_t answered = 0, in_doubt = 0;
  for (const Tally& t : tallies) {
    for (const Uuid& id : t.granted) {
      EXPECT_TRUE(acknowledged.insert(id).second) << "one reservation acknowledged twice";
    }
    answered += t.granted.size() + t.refused + t.in_doubt + t.failed;
    in_doubt += t.in_doubt;
  }
  EXPECT_EQ(answered, threads * per_thread) << "every request completes exactly once";
  for (const Uuid& id : acknowledged) {
    EXPECT_EQ(store->get_reservation(id).state, ReservationState::held) << "acknowledged, lost";
  }
  const StockLevel level = store->stock(hot);
  const auto committed =
      static_cast<Quantity>(acknowledged.size() + store->committed_in_doubt_.size());
  EXPECT_EQ(level.reserved, committed) << "the row holds exactly what committed";
  EXPECT_LE(level.reserved, level.on_hand);
  EXPECT_LE(store->committed_in_doubt_.size(), in_doubt);
  EXPECT_EQ(store->out_of_order, 0u) << "a batch decided out of arrival order";
  EXPECT_EQ(store->counts().reservation_count, static_cast<std::uint64_t>(committed));
}

TEST(HotRowBatcher, loses_nothing_and_completes_once_under_seeded_faults) {
  for (std::uint32_t seed : {1u, 7u, 42u, 2024u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FaultPlan plan;
    plan.seed = seed;
    plan.fail_before_percent = 15;
    plan.fail_after_percent = 10;
    plan.slow_percent = 20;
    run_faulty_race(plan, 16, 40, 300);
  }
}

TEST(HotRowBatcher, refuses_requests_past_available_in_arrival_order) {
  FaultPlan plan;
  plan.slow_percent = 50;  // slow commits let large batches gather
  run_faulty_race(plan, 24, 30, 100);
}

TEST(HotRowBatcher, gathers_requests_into_batches_while_a_commit_is_slow) {
  FaultPlan plan;
  plan.slow_percent = 100;
  plan.slow = std::chrono::microseconds(5000);
  auto store = std::make_shared<FaultyStore>(plan);
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 1000, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 1;
  HotRowBatcher batcher(store, options);
  std::vector<std::thread> workers;
  for (int t = 0; t < 16; ++t) {
    workers.emplace_back([&] {
      for (int i = 0; i < 10; ++i) {
        BatchItem item = reserve_item(hot, 1);
        batcher.run(item, 1000);
      }
    });
  }
  for (auto& w : workers) w.join();
  const BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.requests, 160u);
  EXPECT_GT(s.batch_size_max, 1u) << "16 waiting callers never shared a transaction";
  EXPECT_LT(s.batches, 160u);
  EXPECT_EQ(store->stock(hot).reserved, 160);
}

TEST(HotRowBatcher, flushes_a_lone_request_without_waiting_for_company) {
  auto store = std::make_shared<FaultyStore>(FaultPlan{});
  const SkuKey key{"cold", "default"};
  store->restock(key, 5, std::nullopt, std::nullopt);
  HotRowBatcher batcher(store, BatcherOptions{});
  for (int i = 0; i < 3; ++i) {
    BatchItem item = reserve_item(key, 1);
    batcher.run(item, 1000);  // would hang if a batch waited to fill up
  }
  EXPECT_EQ(store->telemetry().snapshot(0).batcher.batches, 3u);
  EXPECT_EQ(store->telemetry().snapshot(0).batcher.batch_size_max, 1u);
}

TEST(HotRowBatcher, completes_async_requests_once_each_in_bulk) {
  FaultPlan plan;
  plan.seed = 9;
  plan.fail_before_percent = 20;
  plan.fail_after_percent = 10;
  plan.slow_percent = 30;
  auto store = std::make_shared<FaultyStore>(plan);
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 500, std::nullopt, std::nullopt);
  HotRowBatcher batcher(store, BatcherOptions{});
  auto sink = std::make_shared<CollectingSink>();
  constexpr std::uint64_t requests = 2000;
  for (std::uint64_t token = 0; token < requests; ++token) {
    batcher.submit(reserve_item(hot, 1), 1000, sink, token);
  }
  batcher.close();  // drains: every request completes before close returns
  ASSERT_EQ(sink->size(), requests);
  const auto seen = sink->seen();
  ASSERT_EQ(seen.size(), requests);
  for (const auto& [token, times] : seen) EXPECT_EQ(times, 1) << "token " << token;
  EXPECT_LT(sink->posts(), requests) << "completions were posted one by one, not in bulk";
  Quantity granted = 0;
  for (const Completion& c : sink->take()) {
    if (c.error) continue;
    const auto& r = std::get<Reservation>(c.value);
    EXPECT_EQ(store->get_reservation(r.id).qty, 1);
    ++granted;
  }
  const auto committed = granted + static_cast<Quantity>(store->committed_in_doubt_.size());
  EXPECT_EQ(store->stock(hot).reserved, committed);
  EXPECT_EQ(store->out_of_order, 0u);
}

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

TEST(HotRowBatcher, a_full_queue_raises_overloaded_after_a_bounded_wait) {
  auto store = std::make_shared<GatedStore>();
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 100, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 1;
  options.batch_max = 4;
  options.queue_capacity = 8;
  options.enqueue_timeout_ms = 20;
  HotRowBatcher batcher(store, options);
  auto sink = std::make_shared<CollectingSink>();
  for (std::uint64_t token = 0; token < 8; ++token) {
    batcher.submit(reserve_item(hot, 1), 1000, sink, token);
  }
  EXPECT_STOCKADE_ERROR(batcher.submit(reserve_item(hot, 1), 1000, sink, 99),
                        ErrorCode::overloaded);
  store->open();
  batcher.close();
  EXPECT_EQ(sink->size(), 8u);
  EXPECT_EQ(store->stock(hot).reserved, 8);
}

TEST(HotRowBatcher, close_drains_queued_requests_and_refuses_new_ones) {
  auto store = std::make_shared<GatedStore>();
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 100, std::nullopt, std::nullopt);
  auto batcher = std::make_unique<HotRowBatcher>(store, BatcherOptions{});
  auto sink = std::make_shared<CollectingSink>();
  for (std::uint64_t token = 0; token < 50; ++token) {
    batcher->submit(reserve_item(hot, 1), 1000, sink, token);
  }
  std::thread closer([&] { batcher->close(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let close() begin
  store->open();
  closer.join();
  EXPECT_EQ(sink->size(), 50u);
  EXPECT_STOCKADE_ERROR(batcher->submit(reserve_item(hot, 1), 1000, sink, 50),
                        ErrorCode::invalid_state);
  BatchItem late = reserve_item(hot, 1);
  EXPECT_STOCKADE_ERROR(batcher->run(late, 1000), ErrorCode::invalid_state);
  EXPECT_EQ(store->stock(hot).reserved, 50);
}

// A producer that enqueues between the flusher's two reads of "closing" and "queued" must
// not be left behind: its caller would wait forever. The test point widens that window.
TEST(HotRowBatcher, a_request_queued_while_close_begins_is_applied_not_stranded) {
  static std::atomic<int> window{0};  // 1: armed, 2: the flusher is inside, 3: let it go
  auto store = std::make_shared<GatedStore>();
  store->open();
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 10, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 1;
  auto batcher = std::make_unique<HotRowBatcher>(store, options);
  batcher_test_points().before_drain_check.store(+[] {
    int armed = 1;
    if (!window.compare_exchange_strong(armed, 2)) return;
    while (window.load() != 3) std::this_thread::yield();
  });
  window.store(1);
  while (window.load() != 2) std::this_thread::yield();  // the flusher is in the window
  std::atomic<bool> answered{false};
  std::thread producer([&] {
    BatchItem item = reserve_item(hot, 1);
    try {
      batcher->run(item, 1000);
    } catch (const Error&) {  // InvalidState if close() came first: an answer too
    }
    answered.store(true);
  });
  while (batcher->queued() == 0 && !answered.load()) std::this_thread::yield();
  std::thread closer([&] { batcher->close(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // close() sets closing
  window.store(3);
  closer.join();
  producer.join();
  batcher_test_points().before_drain_check.store(+[] {});
  EXPECT_TRUE(answered.load());
  EXPECT_EQ(store->stock(hot).reserved, 1);
}

// The same race without a widened window, many times: every caller gets an answer, and
// exactly the acknowledged units are held.
TEST(HotRowBatcher, close_racing_producers_answers_every_caller) {
  for (int round = 0; round < 200; ++round) {
    auto store = std::make_shared<GatedStore>();
    store->open();
    const SkuKey hot{"hot", "default"};
    store->restock(hot, 1000, std::nullopt, std::nullopt);
    BatcherOptions options;
    options.shards = 1;
    auto batcher = std::make_unique<HotRowBatcher>(store, options);
    std::atomic<int> granted{0};
    std::vector<std::thread> producers;
    for (int p = 0; p < 4; ++p) {
      producers.emplace_back([&] {
        for (int i = 0; i < 5; ++i) {
          BatchItem item = reserve_item(hot, 1);
          try {
            batcher->run(item, 1000);
            granted.fetch_add(1);
          } catch (const Error& e) {
            ASSERT_EQ(e.code(), ErrorCode::invalid_state);
          }
        }
      });
    }
    batcher->close();
    for (auto& t : producers) t.join();
    EXPECT_EQ(store->stock(hot).reserved, granted.load());
  }
}

// A blocked caller's wait is bounded: past lock_timeout + result_timeout it gets InDoubt,
// and its record comes back to the pool when the batch finally completes.
TEST(HotRowBatcher, a_caller_whose_batch_hangs_gets_in_doubt_after_a_bound) {
  auto store = std::make_shared<GatedStore>();
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 10, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 1;
  options.batch_max = 1;
  options.queue_capacity = 1;
  options.enqueue_timeout_ms = 2000;
  options.result_timeout_ms = 30;
  HotRowBatcher batcher(store, options);
  BatchItem item = reserve_item(hot, 1);
  EXPECT_STOCKADE_ERROR(batcher.run(item, 10), ErrorCode::in_doubt);
  store->open();
  BatchItem next = reserve_item(hot, 1);  // needs the one record: it was given back
  batcher.run(next, 1000);
  EXPECT_TRUE(next.ok);
  EXPECT_EQ(store->stock(hot).reserved, 2);
}

TEST(HotRowBatcher, idempotency_keys_hold_inside_and_across_batches) {
  auto engine = Engine::memory();
  const SkuKey hot{"hot", "default"};
  engine->restock(hot, 10);
  CallOptions batched;
  batched.strategy = Strategy::batched;
  std::vector<Reservation> got(8);
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] { got[t] = engine->reserve(hot, 2, {}, "order-1", batched); });
  }
  for (auto& w : workers) w.join();
  for (const Reservation& r : got) EXPECT_EQ(r.id, got[0].id);
  EXPECT_EQ(engine->stock(hot).reserved, 2);
  EXPECT_STOCKADE_ERROR(engine->reserve(hot, 3, {}, "order-1", batched),
                        ErrorCode::idempotency_conflict);
}

TEST(HotRowBatcher, settles_confirms_and_releases_in_batches_once_each) {
  EngineOptions options;
  options.default_strategy = Strategy::batched;  // confirm and release batch too
  auto engine = Engine::memory(options);
  const SkuKey hot{"hot", "default"};
  engine->restock(hot, 100);
  std::vector<Reservation> holds;
  for (int i = 0; i < 64; ++i) holds.push_back(engine->reserve(hot, 1));
  std::atomic<int> settled{0}, refused{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 16; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 64; ++i) {  // every thread tries every hold: one settles it
        try {
          if (i % 2 == 0) {
            engine->confirm(holds[static_cast<std::size_t>(i)].id);
          } else {
            engine->release(holds[static_cast<std::size_t>(i)].id);
          }
          ++settled;
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ErrorCode::invalid_state) << e.what();
          ++refused;
        }
        (void)t;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(settled.load(), 64);
  EXPECT_EQ(refused.load(), 15 * 64);
  const StockLevel level = engine->stock(hot);
  EXPECT_EQ(level.on_hand, 100 - 32);
  EXPECT_EQ(level.reserved, 0);
  EXPECT_EQ(engine->stats().batcher.requests, 64u + 16u * 64u);
}

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
  }

 private:
  const std::chrono::microseconds commit_;
};

TEST(HotRowBatcher, lingers_only_on_a_row_another_writer_changed_between_its_batches) {
  auto store = std::make_shared<VersionReportingStore>();
  const SkuKey hot{"hot", "default"};
  store->restock(hot, 1000, std::nullopt, std::nullopt);
  BatcherOptions options;
  options.shards = 1;
  HotRowBatcher batcher(store, options);
  auto reserve = [&] {
    BatchItem item = reserve_item(hot, 1);
    batcher.run(item, 1000);
  };
  for (int i = 0; i < 20; ++i) reserve();  // alone on the row: never a wait
  BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.shared_row_batches, 0u);
  EXPECT_EQ(s.lingered_batches, 0u);

  // Another writer between two batches: the second sees the gap. Batches of one request
  // each still never wait: no company would come.
  for (int round = 0; round < 5; ++round) {
    store->restock(hot, 1, std::nullopt, std::nullopt);
    reserve();
    reserve();
  }
  s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.shared_row_batches, 5u);
  EXPECT_EQ(s.lingered_batches, 0u);

  // Eight callers at once while another writer writes the row: batches carry several
  // requests, so the flusher lingers (the row counts as shared for contention_memory_ms
  // after each gap; the rounds allow for a slow machine).
  for (int round = 0; round < 50 && s.lingered_batches == 0; ++round) {
    // One write before the callers start: the round's first batch sees it, whatever the
    // timing of the writes that race the callers.
    store->restock(hot, 1, std::nullopt, std::nullopt);
    std::vector<std::thread> callers;
    for (int t = 0; t < 8; ++t) {
      callers.emplace_back([&] {
        for (int i = 0; i < 5; ++i) reserve();
      });
    }
    for (int i = 0; i < 5; ++i) store->restock(hot, 1, std::nullopt, std::nullopt);
    for (auto& c : callers) c.join();
    s = store->telemetry().snapshot(0).batcher;
  }
  EXPECT_GE(s.shared_row_batches, 6u);
  EXPECT_GE(s.lingered_batches, 1u);
  EXPECT_EQ(store->stock(hot).reserved, static_cast<Quantity>(s.requests));
}

// Five reserves on `key`, each after another writer's restock of its row.
void reserve_after_writes_of_another(Store& store, HotRowBatcher& batcher, const SkuKey& key) {
  for (int i = 0; i < 5; ++i) {
    store.restock(key, 1, std::nullopt, std::nullopt);
    BatchItem item = reserve_item(key, 1);
    batcher.run(item, 1000);
  }
}

TEST(HotRowBatcher, a_zero_linger_counts_a_shared_row_and_never_waits) {
  auto store = std::make_shared<VersionReportingStore>();
  const SkuKey hot{"hot", "default"};
  BatcherOptions options;
  options.contended_linger_us = 0;
  HotRowBatcher batcher(store, options);
  reserve_after_writes_of_another(*store, batcher, hot);
  const BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.shared_row_batches, 4u);  // the first batch has nothing to compare with
  EXPECT_EQ(s.lingered_batches, 0u);
}

TEST(HotRowBatcher, the_memory_store_reports_no_row_versions_so_never_lingers) {
  auto store = std::make_shared<FaultyStore>(FaultPlan{});
  const SkuKey hot{"hot", "default"};
  HotRowBatcher batcher(store, BatcherOptions{});
  reserve_after_writes_of_another(*store, batcher, hot);
  const BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.shared_row_batches, 0u);
  EXPECT_EQ(s.lingered_batches, 0u);
}

// One shard over a store whose batches take `commit` and report row versions, after a
// first wave of four requests, submitted at once while the flusher sleeps (one batch,
// or two should the flusher wake between them).
struct AfterAWave {
  explicit AfterAWave(std::chrono::microseconds commit)
      : store(std::make_shared<VersionReportingStore>(commit)) {
    store->restock(hot, 100, std::nullopt, std::nullopt);
    BatcherOptions options;
    options.shards = 1;
    batcher = std::make_unique<HotRowBatcher>(store, options);
    for (std::uint64_t token = 0; token < 4; ++token) {
      batcher->submit(reserve_item(hot, 1), 1000, sink, token);
    }
    while (sink->size() < 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    first_wave = store->telemetry().snapshot(0).batcher.batches;
  }
  const SkuKey hot{"hot", "default"};
  std::shared_ptr<VersionReportingStore> store;
  std::unique_ptr<HotRowBatcher> batcher;
  std::shared_ptr<CollectingSink> sink = std::make_shared<CollectingSink>();
  std::uint64_t first_wave = 0;  // batches it took
};

// The callers of a batch come back as a wave, a little apart: the flusher waits for the
// wave (an eighth of its last batch's time at most), so that it is not split in two.
// Each round: one caller comes back, the other three 300 us later; the flusher, woken by
// the first, waits up to 1 ms (20 ms / 8, capped) for the rest. The wait is bounded, so
// a loaded machine (TSan, a parallel ctest) may let a round's 300 us run past it: the
// test asks for one round of five in which the flusher waited and the wave was one batch.
// Without the wait no round ever counts a wait.
TEST(HotRowBatcher, a_wave_of_returning_callers_is_one_batch_not_two) {
  AfterAWave w(std::chrono::milliseconds(20));
  auto& [hot, store, batcher, sink, first_wave] = w;
  bool whole = false;
  std::uint64_t token = 4;
  for (int round = 0; round < 5 && !whole; ++round) {
    const BatcherStats before = store->telemetry().snapshot(0).batcher;
    batcher->submit(reserve_item(hot, 1), 1000, sink, token++);
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    for (int i = 0; i < 3; ++i) batcher->submit(reserve_item(hot, 1), 1000, sink, token++);
    while (sink->size() < token) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const BatcherStats after = store->telemetry().snapshot(0).batcher;
    whole = after.batches - before.batches == 1 &&
            after.gathered_batches - before.gathered_batches == 1;
  }
  batcher->close();
  EXPECT_TRUE(whole) << "in five rounds, no returning wave was waited for and kept whole";
  const BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.requests, token);
  EXPECT_EQ(store->stock(hot).reserved, static_cast<Quantity>(token));
  (void)first_wave;
}

// A wave that does not come back is waited for a bounded time only: a lone request after a
// batch of four is applied alone.
TEST(HotRowBatcher, a_wave_that_does_not_come_back_is_waited_for_a_bound_only) {
  AfterAWave w(std::chrono::milliseconds(4));
  auto& [hot, store, batcher, sink, first_wave] = w;
  BatchItem lone = reserve_item(hot, 1);
  batcher->run(lone, 1000);  // blocks: completes only if the wait for company ends
  const BatcherStats s = store->telemetry().snapshot(0).batcher;
  EXPECT_EQ(s.batches - first_wave, 1u);
  EXPECT_GE(s.gathered_batches, 1u);
  EXPECT_EQ(store->stock(hot).reserved, 5);
  // The memory store reports no row versions: its flusher never waits for a wave.
  auto plain = std::make_shared<FaultyStore>(FaultPlan{});
  plain->restock(hot, 100, std::nullopt, std::nullopt);
  HotRowBatcher unwatched(plain, batcher->options());
  for (int i = 0; i < 3; ++i) {
    BatchItem item = reserve_item(hot, 1);
    unwatched.run(item, 1000);
  }
  EXPECT_EQ(plain->telemetry().snapshot(0).batcher.gathered_batches, 0u);
}

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

// One process, one slotted SKU: its batches are pipelined over the slot rows (each row's
// flusher commits while another's batch waits for its flush), where before one flusher
// took every row's batch in turn.
TEST(HotRowBatcher, batches_on_a_slotted_skus_rows_are_in_flight_at_once) {
  EngineOptions options;
  options.home_slot = 0;
  options.default_strategy = Strategy::batched;
  auto store = std::make_shared<CountingStore>(std::chrono::milliseconds(2));
  Engine engine(store, options);
  const SkuKey hot{"hot", "default"};
  engine.restock(hot, 10000);
  engine.set_slots(hot, 4);
  std::atomic<int> granted{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 32; ++t) {
    callers.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        engine.reserve(hot, 1);
        ++granted;
      }
    });
  }
  for (auto& c : callers) c.join();
  engine.close();
  EXPECT_GE(store->most_in_flight.load(), 2) << "the slot rows' batches ran one at a time";
  EXPECT_GE(store->slots_used.size(), 2u) << "every batch went to one row";
  const StockLevel level = engine.stock(hot);
  EXPECT_EQ(level.reserved, granted.load());
  EXPECT_EQ(level.reserved, 640);
  for (const StockLevel& row : store->sku_rows(hot)) EXPECT_LE(row.reserved, row.on_hand);
}

// Two engines over one store whose batches report row versions, as two processes over
// one PostgreSQL database: `threads` callers each reserve one unit at a time with `auto`
// until `done()` or `seconds` pass. Returns the units granted.
Quantity race_two_engines(Engine& a, Engine& b, const SkuKey& key, int threads, double seconds,
                          const std::function<bool()>& done) {
  std::atomic<bool> stop{false};
  std::atomic<Quantity> granted{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t) {
    callers.emplace_back([&, t] {
      Engine& e = t % 2 == 0 ? a : b;
      while (!stop.load()) {
        e.reserve(key, 1);
        ++granted;
      }
    });
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop.store(true);
  for (auto& c : callers) c.join();
  return granted.load();
}

class AutoSlotsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> engine(int home, int auto_slots_max = 4, std::int64_t cool_ms = 60000) {
    EngineOptions options;
    options.home_slot = home;
    options.auto_slots_max = auto_slots_max;
    options.auto_slots_cool_ms = cool_ms;
    return std::make_unique<Engine>(store, options);
  }
  std::shared_ptr<VersionReportingStore> store =
      std::make_shared<VersionReportingStore>(std::chrono::milliseconds(1));
  const SkuKey hot{"hot", "default"};
};

// Two processes batching one row take turns at its lock: `auto` splits the SKU by itself,
// the other engine learns the split from the store, and nothing is oversold or lost.
TEST_F(AutoSlotsTest, a_row_two_engines_batch_is_split_and_the_split_is_learned) {
  auto a = engine(0);
  auto b = engine(1);
  a->restock(hot, 1000000);
  const auto both_know = [&] {
    return a->stats().slots.auto_splits + b->stats().slots.auto_splits >= 1 &&
           a->stats().hottest_skus.front().slots == 4 && b->stats().hottest_skus.front().slots == 4;
  };
  const Quantity granted = race_two_engines(*a, *b, hot, 16, 20.0, both_know);
  ASSERT_TRUE(both_know()) << "no split within 20 s, or one engine never learned it";
  EXPECT_EQ(a->slot_count(hot), 4);
  const StoreStats sa = a->stats();
  const StoreStats sb = b->stats();
  EXPECT_EQ(sa.slots.auto_splits + sb.slots.auto_splits + sa.slots.learned + sb.slots.learned,
            2u);  // one split it, the other learned it (or both split at once)
  const StoreStats& splitter = sa.slots.auto_splits > 0 ? sa : sb;
  ASSERT_FALSE(splitter.slots.recent.empty());
  EXPECT_TRUE(splitter.slots.recent.back().split);
  EXPECT_NE(splitter.slots.recent.back().why.find("shared with another writer"), std::string::npos);
  const Advice advice = (sa.slots.auto_splits > 0 ? *a : *b).recommend(hot);
  bool said = false;
  for (const std::string& r : advice.reasons)
    said = said || r.rfind("slots: auto split it", 0) == 0;
  EXPECT_TRUE(said) << "recommend() does not say that auto split the SKU";
  const StockLevel level = a->stock(hot);
  EXPECT_EQ(level.reserved, granted);
  EXPECT_EQ(level.on_hand, 1000000);
  for (const StockLevel& row : store->sku_rows(hot)) EXPECT_LE(row.reserved, row.on_hand);
  a->close();
  b->close();
}

// A SKU with a backorder limit is not built for slots: `auto` keeps it on one row, says
// so, and does not ask again at once. auto_slots_max=1 never splits.
TEST_F(AutoSlotsTest, a_sku_slots_cannot_carry_or_auto_slots_max_1_stays_on_one_row) {
  for (int max : {4, 1}) {
    auto a = engine(0, max);
    auto b = engine(1, max);
    const SkuKey key{"kept-" + std::to_string(max), "default"};
    a->restock(key, 1000000);
    if (max == 4) a->set_backorder_limit(key, 5);
    const auto kept = [&] { return a->stats().slots.kept + b->stats().slots.kept >= 1; };
    race_two_engines(*a, *b, key, 16, max == 4 ? 20.0 : 1.0, kept);
    EXPECT_EQ(a->slot_count(key), 1);
    const StoreStats sa = a->stats();
    const StoreStats sb = b->stats();
    EXPECT_EQ(sa.slots.auto_splits + sb.slots.auto_splits, 0u);
    if (max == 4) {
      ASSERT_TRUE(kept());
      const StoreStats& keeper = sa.slots.kept > 0 ? sa : sb;
      EXPECT_NE(keeper.slots.recent.back().why.find("backorder"), std::string::npos)
          << keeper.slots.recent.back().why;
      EXPECT_LE(sa.slots.kept + sb.slots.kept, 2u);  // not asked again for refused_ms
    } else {
      EXPECT_GE(sa.batcher.shared_row_batches + sb.batcher.shared_row_batches, 1u);
      EXPECT_EQ(sa.slots.kept + sb.slots.kept, 0u);
    }
    a->close();
    b->close();
  }
}

// A slotted SKU whose requests run unbatched for auto_slots_cool_ms is merged back into one
// row by `auto` (which says so); while they run batched it is not; with the measure off
// (0) never. The holds made on the slots stay whole.
TEST_F(AutoSlotsTest, a_slotted_sku_that_cools_is_merged_back_and_a_hot_one_is_not) {
  auto a = engine(0, 4, 150);
  auto never = engine(1, 4, 0);
  a->restock(hot, 1000000);
  a->set_slots(hot, 4);
  EXPECT_EQ(never->slot_count(hot), 4);
  // Hot: 16 callers at once run batched; no merge while they do.
  race_two_engines(*a, *a, hot, 16, 0.6, [] { return false; });
  EXPECT_EQ(a->stats().slots.auto_merges, 0u);
  EXPECT_EQ(a->slot_count(hot), 4);
  // Cool: one caller at a time, on both engines; only `a` measures.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (a->stats().slots.auto_merges == 0 && std::chrono::steady_clock::now() < until) {
    a->reserve(hot, 1);
    never->reserve(hot, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const StoreStats s = a->stats();
  ASSERT_EQ(s.slots.auto_merges, 1u) << "no merge within 10 s of cool requests";
  EXPECT_TRUE(s.slots.recent.back().merged);
  EXPECT_NE(s.slots.recent.back().why.find("ran batched"), std::string::npos);
  EXPECT_EQ(a->slot_count(hot), 1);
  EXPECT_EQ(never->stats().slots.auto_merges, 0u);
  bool said = false;
  for (const std::string& r : a->recommend(hot).reasons) {
    said = said || r.rfind("slots: auto merged the slots of it back", 0) == 0;
  }
  EXPECT_TRUE(said) << "recommend() does not say that auto merged the SKU";
  const StockLevel level = a->stock(hot);
  EXPECT_EQ(level.on_hand, 1000000);
  Quantity held = 0;
  for (const StockLevel& row : store->sku_rows(hot)) held += row.reserved;
  EXPECT_EQ(level.reserved, held);
  a->close();
  never->close();
}

// One engine alone on its row never splits it: nobody else writes it.
TEST_F(AutoSlotsTest, one_engine_alone_on_a_row_never_splits_it) {
  auto a = engine(0);
  a->restock(hot, 1000000);
  race_two_engines(*a, *a, hot, 16, 1.0, [] { return false; });
  const StoreStats s = a->stats();
  EXPECT_GE(s.batcher.batches, 1u);
  EXPECT_EQ(s.batcher.shared_row_batches, 0u);
  EXPECT_EQ(s.slots.auto_splits, 0u);
  EXPECT_EQ(a->slot_count(hot), 1);
  a->close();
}

TEST(HotRowBatcher, rejects_options_out_of_range) {
  auto store = std::make_shared<FaultyStore>(FaultPlan{});
  for (auto bad : {BatcherOptions{0, 4096, 8192, 1000}, BatcherOptions{4, 0, 8192, 1000},
                   BatcherOptions{4, 4096, 100, 1000}, BatcherOptions{4, 4096, 8192, -1}}) {
    EXPECT_STOCKADE_ERROR(HotRowBatcher(store, bad), ErrorCode::invalid_argument);
  }
  for (std::int64_t linger : {std::int64_t{-1}, batch_linger_us_max + 1}) {
    BatcherOptions bad;
    bad.contended_linger_us = linger;
    EXPECT_STOCKADE_ERROR(HotRowBatcher(store, bad), ErrorCode::invalid_argument);
  }
}

TEST(ContentionTracker, switches_a_sku_to_batched_when_hot_and_back_when_cool) {
  AutoOptions options;
  options.window_ms = 1;
  options.hot_in_flight = 4;
  options.cool_in_flight = 1;
  options.cool_windows = 3;
  ContentionTracker tracker(options);
  const SkuKey key{"hot", "default"};
  EXPECT_EQ(tracker.enter(key), Strategy::atomic);
  tracker.leave(key);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(tracker.enter(key), Strategy::atomic);
  EXPECT_EQ(tracker.enter(key), Strategy::batched) << "the fourth request in flight switches";
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  EXPECT_EQ(tracker.enter(key), Strategy::batched) << "a window that peaked at 4 stays hot";
  for (int i = 0; i < 5; ++i) tracker.leave(key);
  EXPECT_EQ(tracker.heat(key).collisions, 4u);
  // One request at a time: every window peaks at 1, and after three cool windows the SKU
  // runs atomic again. (A long pause counts as cool windows too, so this cannot stall.)
  Strategy mode = Strategy::batched;
  for (int i = 0; i < 20 && mode == Strategy::batched; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    mode = tracker.enter(key);
    tracker.leave(key);
  }
  EXPECT_EQ(mode, Strategy::atomic);
  EXPECT_EQ(tracker.heat(key).switches, 2u);
}

TEST(ContentionTracker, advice_names_the_measured_collision_rate) {
  ContentionTracker tracker;
  const SkuKey key{"sku", "default"};
  EXPECT_EQ(advise(key, tracker.heat(key), tracker.options()).strategy, Strategy::atomic);
  for (int i = 0; i < 10; ++i) tracker.enter(key);
  const Advice hot = advise(key, tracker.heat(key), tracker.options());
  EXPECT_EQ(hot.strategy, Strategy::batched);
  ASSERT_GE(hot.reasons.size(), 2u);
  EXPECT_NE(hot.reasons[1].find("9 of 10 requests (90.0%)"), std::string::npos) << hot.reasons[1];
  for (int i = 0; i < 10; ++i) tracker.leave(key);
}

// Another process's writes show only in the row's version: between two of this process's
// writes, the row moved by 8, so 2 in flight here stand for about 16 on the row.
TEST(ContentionTracker, learns_heat_from_other_writers_through_the_rows_version) {
  AutoOptions options;
  options.window_ms = 10'000;  // one window and one span for the whole test
  ContentionTracker tracker(options);
  const SkuKey key{"shared", "default"};
  EXPECT_EQ(tracker.enter(key), Strategy::atomic);
  EXPECT_EQ(tracker.enter(key), Strategy::atomic) << "2 in flight here: not hot on its own";
  for (Version v = 10; v < 34; v += 8) {
    tracker.observe_version(key, v);
    EXPECT_EQ(tracker.mode(row_shard_key(key.sku, key.location)), Strategy::atomic)
        << "fewer than 4 writes give no estimate yet";
  }
  tracker.observe_version(key, 34);
  const SkuHeat heat = tracker.heat(key);
  EXPECT_EQ(heat.mode, Strategy::batched);
  EXPECT_EQ(heat.row_queue, 16u);
  EXPECT_EQ(heat.shared_switches, 1u);
  EXPECT_EQ(heat.switches, 1u);
  tracker.leave(key);
  tracker.leave(key);
  AutoOptions advised = options;
  SkuHeat measured = heat;
  measured.peak_in_flight = 2;  // what the window closes with
  const Advice advice = advise(key, measured, advised);
  EXPECT_EQ(advice.strategy, Strategy::batched);
  bool named = false;
  for (const std::string& reason : advice.reasons) {
    named = named || reason.find("about 16 requests are in flight on it across every process") !=
                         std::string::npos;
  }
  EXPECT_TRUE(named) << "the advice names the estimate";
}

TEST(ContentionTracker, a_row_written_only_here_or_one_request_at_a_time_stays_atomic) {
  AutoOptions options;
  options.window_ms = 10'000;
  ContentionTracker tracker(options);
  // Alone on its row: every version is this process's own; 2 in flight stay 2.
  const SkuKey alone{"alone", "default"};
  tracker.enter(alone);
  tracker.enter(alone);
  for (Version v = 1; v <= 20; ++v) tracker.observe_version(alone, v);
  EXPECT_EQ(tracker.heat(alone).mode, Strategy::atomic);
  EXPECT_EQ(tracker.heat(alone).row_queue, 2u);
  tracker.leave(alone);
  tracker.leave(alone);
  // A busy row, but one request at a time here: batching would have nothing to fold.
  const SkuKey single{"single", "default"};
  tracker.enter(single);
  for (Version v = 1; v <= 200; v += 10) tracker.observe_version(single, v);
  EXPECT_EQ(tracker.heat(single).mode, Strategy::atomic);
  EXPECT_EQ(tracker.heat(single).row_queue, 10u);
  tracker.leave(single);
}

TEST(ContentionTracker, rows_that_share_a_cell_never_mix_their_versions) {
  AutoOptions options;
  options.window_ms = 10'000;
  options.cells = 1;  // every row in one cell
  ContentionTracker tracker(options);
  const SkuKey a{"a", "default"};
  const SkuKey b{"b", "default"};
  tracker.enter(a);
  tracker.enter(b);
  // Each row's own versions step by one; mixed, they would look like a row moving by
  // thousands per write.
  for (Version v = 1; v <= 20; ++v) {
    tracker.observe_version(a, v);
    tracker.observe_version(b, 5000 + v);
  }
  EXPECT_EQ(tracker.heat(a).mode, Strategy::atomic);
  EXPECT_EQ(tracker.heat(a).shared_switches, 0u);
  tracker.leave(a);
  tracker.leave(b);
}

TEST(ContentionTracker, rejects_options_out_of_range) {
  AutoOptions bad;
  bad.cool_in_flight = bad.hot_in_flight;
  EXPECT_STOCKADE_ERROR(ContentionTracker{bad}, ErrorCode::invalid_argument);
  AutoOptions cells;
  cells.cells = 1000;  // not a power of two
  EXPECT_STOCKADE_ERROR(ContentionTracker{cells}, ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace stockade
