// Races: many threads on one row, for every strategy, and the canary that proves the
// harness can see an oversell.
//
// Goal: no strategy ever grants more than exists, and none grants less (every unit is
// sold when buyers outnumber it). Method: threads released together by a latch hammer
// one row until they see OutOfStock, then the grants are counted against the stock row
// and the reservation table. The same harness run with the naive read-modify-write must
// oversell, or the harness proves nothing.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "memory/row_cell.hpp"
#include "stockade/engine.hpp"
#include "stockade/testing.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

constexpr int threads_count = 16;
constexpr int attempts_max = 100000;  // per thread: bounds the loop if something is wrong

// Starts `n` threads running fn(i) at the same moment and waits for all of them.
template <class Fn>
void run_together(int n, Fn fn) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      fn(i);
    });
  }
  while (ready.load() < n) std::this_thread::yield();
  go.store(true);
  for (auto& t : threads) t.join();
}

struct Tally {
  std::atomic<std::int64_t> granted{0};
  std::atomic<std::int64_t> refused{0};
  std::atomic<std::int64_t> retried{0};
};

// Each buyer takes one unit at a time until the row says OutOfStock.
template <class Reserve>
void buy_until_sold_out(Tally& tally, Reserve reserve) {
  for (int attempt = 0; attempt < attempts_max; ++attempt) {
    try {
      reserve();
      tally.granted.fetch_add(1);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::out_of_stock) {
        tally.refused.fetch_add(1);
        return;
      }
      if (e.code() != ErrorCode::retries_exhausted) throw;
      tally.retried.fetch_add(1);  // optimistic gave up after retries_max: buyer tries again
    }
  }
  ADD_FAILURE() << "a buyer never saw the row sell out";
}

class EveryStrategy : public ::testing::TestWithParam<Strategy> {
 protected:
  std::unique_ptr<Engine> engine = Engine::memory();
  const SkuKey sku{"hot", "default"};
};

std::string strategy_param_name(const ::testing::TestParamInfo<Strategy>& info) {
  return strategy_name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Memory, EveryStrategy,
                         ::testing::Values(Strategy::atomic, Strategy::pessimistic,
                                           Strategy::advisory, Strategy::optimistic),
                         strategy_param_name);

TEST_P(EveryStrategy, backorders_sell_out_exactly_on_hand_plus_the_limit) {
  engine->restock(sku, 1500);
  engine->set_backorder_limit(sku, 500);
  CallOptions call;
  call.strategy = GetParam();
  Tally tally;
  run_together(threads_count, [&](int) {
    buy_until_sold_out(tally, [&] { engine->reserve(sku, 1, {}, {}, call); });
  });
  EXPECT_EQ(tally.granted.load(), 2000);
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.on_hand, 1500);
  EXPECT_EQ(level.reserved, 2000);
  EXPECT_EQ(level.backordered(), 500);
  EXPECT_EQ(level.available(), 0);
}

// Threads race to lease the row; a winner writes with its token and releases, the others
// write without one. At no moment do two threads hold the lease, no write is lost, and
// every write without the token lands only while no lease is live.
TEST_P(EveryStrategy, leases_have_one_holder_at_a_time_and_writes_add_up) {
  engine->restock(sku, 1000000);
  CallOptions call;
  call.strategy = GetParam();
  std::atomic<int> holders{0};
  std::atomic<int> most_holders{0};
  std::atomic<std::int64_t> sold{0};
  std::atomic<std::int64_t> refused_for_lease{0};
  run_together(threads_count, [&](int) {
    for (int round = 0; round < 200; ++round) {
      try {
        const Lease lease = engine->acquire_lease(sku, 60LL * 1000 * 1000, "racer");
        const int now_holding = holders.fetch_add(1) + 1;
        int seen = most_holders.load();
        while (now_holding > seen && !most_holders.compare_exchange_weak(seen, now_holding)) {
        }
        CallOptions fenced = call;
        fenced.fencing_token = lease.token;
        engine->sell(sku, 1, fenced);
        sold.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::microseconds(200));  // others meet the lease
        holders.fetch_sub(1);
        EXPECT_TRUE(engine->release_lease(sku, lease.token));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::lease_held) throw;
        try {
          engine->sell(sku, 1, call);
          sold.fetch_add(1);
        } catch (const Error& write) {
          if (write.code() == ErrorCode::lease_held) {
            refused_for_lease.fetch_add(1);
          } else if (write.code() != ErrorCode::retries_exhausted) {
            throw;
          }
        }
      }
    }
  });
  EXPECT_EQ(most_holders.load(), 1);
  EXPECT_GT(refused_for_lease.load(), 0);
  EXPECT_EQ(engine->stock(sku).on_hand, 1000000 - sold.load());
}

// One thread discontinues and reinstates the row while the others reserve: every grant
// is counted in the row, and the row ends as the last toggle left it.
TEST_P(EveryStrategy, discontinue_races_with_reserves_and_loses_no_update) {
  engine->restock(sku, 1000000);
  CallOptions call;
  call.strategy = GetParam();
  std::atomic<std::int64_t> granted{0};
  std::atomic<std::int64_t> refused{0};
  run_together(threads_count, [&](int i) {
    for (int round = 0; round < 300; ++round) {
      if (i == 0) {
        if (round % 2 == 0) {
          engine->discontinue(sku);
        } else {
          engine->reinstate(sku);
        }
        continue;
      }
      try {
        engine->reserve(sku, 1, {}, {}, call);
        granted.fetch_add(1);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::discontinued) {
          refused.fetch_add(1);
        } else if (e.code() != ErrorCode::retries_exhausted) {
          throw;
        }
      }
    }
  });
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, granted.load());
  EXPECT_TRUE(level.discontinued == false);  // round 299 reinstated it
  EXPECT_GT(granted.load(), 0);
}

// Four threads per buyer reserve one unit at a time on the group's three SKUs until the
// buyer's limit says no: each buyer ends with exactly its limit (no write skew), and
// releases give units back that others of the same buyer then take.
TEST_P(EveryStrategy, purchase_limits_hold_for_buyers_racing_on_many_skus) {
  const std::vector<SkuKey> skus{{"a", "default"}, {"b", "default"}, {"c", "default"}};
  for (const SkuKey& key : skus) engine->restock(key, 1000000);
  engine->set_purchase_limit(PurchaseLimit{"drop", 50, {"a", "b", "c"}});
  std::array<std::atomic<std::int64_t>, 4> granted{};
  run_together(threads_count, [&](int i) {
    CallOptions call;
    call.strategy = GetParam();
    call.buyer = "buyer-" + std::to_string(i % 4);
    for (int attempt = 0; attempt < attempts_max; ++attempt) {
      try {
        const Reservation r = engine->reserve(skus[attempt % 3], 1, {}, {}, call);
        if (attempt % 7 == 0) {
          engine->release(r.id);
        } else {
          granted[i % 4].fetch_add(1);
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::limit_exceeded) return;
        if (e.code() != ErrorCode::retries_exhausted) throw;
      }
    }
    ADD_FAILURE() << "a buyer never reached its limit";
  });
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(granted[b].load(), 50);
    EXPECT_EQ(engine->buyer_held("drop", "buyer-" + std::to_string(b)), 50);
  }
  Quantity reserved = 0;
  for (const SkuKey& key : skus) reserved += engine->stock(key).reserved;
  EXPECT_EQ(reserved, 200);
}

TEST_P(EveryStrategy, grants_exactly_the_units_there_are_to_racing_threads) {
  constexpr Quantity units = 2000;
  engine->restock(sku, units);
  CallOptions call;
  call.strategy = GetParam();
  Tally tally;
  run_together(threads_count, [&](int) {
    buy_until_sold_out(tally, [&] { engine->reserve(sku, 1, {}, {}, call); });
  });
  EXPECT_EQ(tally.granted.load(), units);
  EXPECT_EQ(tally.refused.load(), threads_count);
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, units);
  EXPECT_EQ(level.available(), 0);
  EXPECT_EQ(engine->stats().reservation_count, static_cast<std::uint64_t>(units));
}

TEST_P(EveryStrategy, sells_exactly_the_units_there_are_to_racing_threads) {
  constexpr Quantity units = 2000;
  engine->restock(sku, units);
  CallOptions call;
  call.strategy = GetParam();
  Tally tally;
  run_together(threads_count,
               [&](int) { buy_until_sold_out(tally, [&] { engine->sell(sku, 1, call); }); });
  EXPECT_EQ(tally.granted.load(), units);
  EXPECT_EQ(engine->stock(sku).on_hand, 0);
}

TEST_P(EveryStrategy, reservations_confirmed_and_released_concurrently_balance_the_ledger) {
  constexpr Quantity units = 1000;
  engine->restock(sku, units);
  CallOptions call;
  call.strategy = GetParam();
  std::atomic<std::int64_t> confirmed{0};
  run_together(threads_count, [&](int i) {
    for (int k = 0; k < 200; ++k) {
      try {
        const Reservation r = engine->reserve(sku, 2, {}, {}, call);
        if ((i + k) % 3 == 0) {
          engine->release(r.id);
        } else {
          engine->confirm(r.id);
          confirmed.fetch_add(2);
        }
      } catch (const Error& e) {
        if (e.code() != ErrorCode::out_of_stock && e.code() != ErrorCode::retries_exhausted) throw;
      }
    }
  });
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, 0);
  EXPECT_EQ(level.on_hand, units - confirmed.load());
  EXPECT_GE(level.on_hand, 0);
}

TEST_P(EveryStrategy, orders_in_opposite_line_order_do_not_deadlock) {
  // Goal: sorted lock order. Method: two groups of threads reserve the same two SKUs,
  // naming them in opposite orders, many times; the test finishing is the assertion,
  // with the stock ledger exact at the end.
  const SkuKey a{"a", "default"}, b{"b", "default"};
  engine->restock(a, 100000);
  engine->restock(b, 100000);
  CallOptions call;
  call.strategy = GetParam();
  std::atomic<std::int64_t> orders{0};
  run_together(8, [&](int i) {
    const std::vector<OrderLine> ab{{a, 1}, {b, 1}}, ba{{b, 1}, {a, 1}};
    for (int k = 0; k < 500; ++k) {
      try {
        engine->reserve_order(i % 2 == 0 ? ab : ba, {}, {}, call);
        orders.fetch_add(1);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::retries_exhausted) throw;
      }
    }
  });
  EXPECT_GT(orders.load(), 0);
  EXPECT_EQ(engine->stock(a).reserved, orders.load());
  EXPECT_EQ(engine->stock(b).reserved, orders.load());
}

TEST_P(EveryStrategy, racing_orders_are_all_or_nothing) {
  // Goal: an order never holds one line without the other. Method: orders of one unit of
  // `a` (plenty) and one of `b` (50) race until `b` runs out; `a` must end with exactly
  // as many held as `b`.
  const SkuKey a{"a", "default"}, b{"b", "default"};
  engine->restock(a, 10000);
  engine->restock(b, 50);
  CallOptions call;
  call.strategy = GetParam();
  Tally tally;
  run_together(threads_count, [&](int i) {
    const std::vector<OrderLine> order = i % 2 == 0 ? std::vector<OrderLine>{{a, 1}, {b, 1}}
                                                    : std::vector<OrderLine>{{b, 1}, {a, 1}};
    buy_until_sold_out(tally, [&] { engine->reserve_order(order, {}, {}, call); });
  });
  EXPECT_EQ(tally.granted.load(), 50);
  EXPECT_EQ(engine->stock(a).reserved, 50);
  EXPECT_EQ(engine->stock(b).reserved, 50);
}

TEST(Races, confirm_racing_the_sweeper_settles_each_hold_exactly_once) {
  // Goal: a hold is confirmed or expired, never both, and stock follows. Method: half the
  // holds lapse; confirmers and sweepers then race over all of them; every live hold ends
  // confirmed, every lapsed one expired, and on_hand falls by exactly the confirmed units.
  auto clock = std::make_shared<ManualClock>(1'000'000'000'000);
  auto engine = Engine::memory({}, clock);
  const SkuKey sku{"lapse", "default"};
  constexpr int holds = 2000;
  engine->restock(sku, holds);
  std::vector<Uuid> ids;
  for (int i = 0; i < holds; ++i) {
    ids.push_back(engine->reserve(sku, 1, i % 2 == 0 ? 1'000'000 : 10'000'000).id);
  }
  clock->advance_us(1'000'000);  // the even holds have lapsed, the odd ones are live
  std::atomic<int> confirmed{0}, expired_on_confirm{0};
  std::atomic<std::size_t> swept{0};
  run_together(8, [&](int t) {
    if (t % 2 == 0) {
      while (engine->expire_due(37) > 0) swept.fetch_add(1);
      return;
    }
    for (int i = t / 2; i < holds; i += 4) {  // confirmers t = 1, 3, 5, 7 split the holds
      try {
        engine->confirm(ids[static_cast<std::size_t>(i)]);
        confirmed.fetch_add(1);
      } catch (const Error& e) {
        ASSERT_EQ(e.code(), ErrorCode::reservation_expired) << e.what();
        expired_on_confirm.fetch_add(1);
      }
    }
  });
  engine->expire_due(expire_batch_max);
  EXPECT_EQ(confirmed.load(), holds / 2);
  EXPECT_EQ(expired_on_confirm.load(), holds / 2);
  for (int i = 0; i < holds; ++i) {
    const ReservationState state = engine->get_reservation(ids[static_cast<std::size_t>(i)]).state;
    EXPECT_EQ(state, i % 2 == 0 ? ReservationState::expired : ReservationState::confirmed) << i;
  }
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, 0);
  EXPECT_EQ(level.on_hand, holds / 2);
}

TEST(Races, mixed_strategies_on_one_row_never_oversell) {
  auto engine = Engine::memory();
  const SkuKey sku{"hot", "default"};
  constexpr Quantity units = 3000;
  engine->restock(sku, units);
  const Strategy strategies[] = {Strategy::atomic, Strategy::pessimistic, Strategy::advisory,
                                 Strategy::optimistic};
  Tally tally;
  run_together(threads_count, [&](int i) {
    CallOptions call;
    call.strategy = strategies[i % 4];
    buy_until_sold_out(tally, [&] { engine->reserve(sku, 1, {}, {}, call); });
  });
  EXPECT_EQ(tally.granted.load(), units);
  EXPECT_EQ(engine->stock(sku).reserved, units);
}

TEST(Races, naive_read_modify_write_canary_oversells_under_the_same_race) {
  auto engine = Engine::memory();
  const SkuKey sku{"hot", "default"};
  constexpr Quantity units = 100;
  engine->restock(sku, units);
  Tally tally;
  run_together(threads_count, [&](int) {
    buy_until_sold_out(tally, [&] {
      test_hooks(engine->store()).naive_reserve_unsafe(sku, 1, 60'000'000, /*window_us=*/200);
    });
  });
  // The lost update: more grants than units, while the row itself looks fine.
  EXPECT_GT(tally.granted.load(), units);
  EXPECT_LE(engine->stock(sku).reserved, units);
  EXPECT_GT(static_cast<std::int64_t>(engine->stats().reservation_count), units);
}

TEST(Locks, nowait_and_lock_timeout_fail_fast_while_another_session_holds_the_lock) {
  auto engine = Engine::memory();
  const SkuKey sku{"locked", "default"};
  engine->restock(sku, 10);
  for (Strategy kind : {Strategy::pessimistic, Strategy::advisory}) {
    const Quantity reserved_before = engine->stock(sku).reserved;
    auto hold = test_hooks(engine->store()).hold_lock(sku, kind, 1000);
    CallOptions nowait;
    nowait.strategy = kind;
    nowait.nowait = true;
    CallOptions timeout;
    timeout.strategy = kind;
    timeout.lock_timeout_ms = 30;
    // Another thread, as another session would: std::timed_mutex is not recursive.
    std::thread([&] {
      EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, {}, nowait), ErrorCode::lock_not_available);
      const auto start = std::chrono::steady_clock::now();
      EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, {}, timeout), ErrorCode::lock_timeout);
      EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));
    }).join();
    EXPECT_EQ(engine->stock(sku).reserved, reserved_before);
    hold.reset();
    EXPECT_EQ(engine->reserve(sku, 1, {}, {}, nowait).qty, 1);
    EXPECT_EQ(engine->stock(sku).reserved, reserved_before + 1);
  }
  const StoreStats all = engine->stats();
  const auto& stats = all.strategies[static_cast<std::size_t>(Strategy::pessimistic)];
  EXPECT_EQ(stats.lock_not_available, 1u);
  EXPECT_EQ(stats.lock_timeouts, 1u);
  EXPECT_EQ(stats.lock_waits, 1u);
}

TEST(Locks, atomic_writers_are_not_blocked_by_a_row_lock_holder_but_stay_correct) {
  // The memory store's atomic path is a compare-and-set, not a lock: a long-held row lock
  // does not stall it, and pessimistic writers queued behind the lock see its writes.
  auto engine = Engine::memory();
  const SkuKey sku{"row", "default"};
  engine->restock(sku, 2);
  auto hold = test_hooks(engine->store()).hold_lock(sku, Strategy::pessimistic, 1000);
  EXPECT_EQ(engine->reserve(sku, 2).qty, 2);
  hold.reset();
  CallOptions pessimistic;
  pessimistic.strategy = Strategy::pessimistic;
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, {}, pessimistic), ErrorCode::out_of_stock);
}

TEST(RowCell, readers_never_see_a_torn_row) {
  // Goal: the seqlock gives consistent snapshots. Method: a writer keeps publishing rows
  // whose on_hand always equals reserved and whose version equals both; readers check
  // every snapshot they take.
  detail::RowCell cell(detail::RowValues{0, 0, 0, 0});
  const SkuKey key{"torn", "default"};
  std::atomic<bool> stop{false};
  std::atomic<std::int64_t> torn{0}, reads{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        const detail::RowValues s = cell.read().values;
        if (s.on_hand != s.reserved || s.reserved != s.version) torn.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  std::thread writer([&] {
    while (reads.load() == 0) std::this_thread::yield();  // overlap with the readers
    // At least 200,000 writes, and on until the readers have taken enough snapshots to
    // mean something (a slow build, ASan, gives them fewer per write), within a bound.
    for (std::int64_t v = 1; v <= 200000 || (reads.load() <= 5000 && v <= 50'000'000); ++v) {
      detail::RowLatch latch(cell, cell.latch());
      latch.publish(detail::RowValues{v, v, v, v}, key);
    }
    stop.store(true);
  });
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(torn.load(), 0);
  EXPECT_GT(reads.load(), 1000);
}

TEST(RowCell, publish_refuses_to_break_the_row_invariant_and_leaves_the_row_unchanged) {
  detail::RowCell cell(detail::RowValues{5, 2, 7, 0});
  const SkuKey key{"check", "default"};
  {
    detail::RowLatch latch(cell, cell.latch());
    EXPECT_STOCKADE_ERROR(latch.publish(detail::RowValues{5, 6, 8, 0}, key),
                          ErrorCode::invariant_violation);
    EXPECT_STOCKADE_ERROR(latch.publish(detail::RowValues{5, -1, 8, 0}, key),
                          ErrorCode::invariant_violation);
  }
  const auto snap = cell.read();
  EXPECT_EQ(snap.values.reserved, 2);
  EXPECT_EQ(snap.values.version, 7);
  EXPECT_EQ(snap.seq % 2, 0u) << "the latch was released";
}

}  // namespace
}  // namespace stockade

namespace stockade {
namespace {

// Purging while reserves, replays and confirms race: no deadlock between a reservation
// shard and the key table (purge takes them in the store's lock order), nothing
// acknowledged is lost (every confirmed unit left on_hand), and a replay never finds its
// reservation purged under it.
TEST(MemoryRetentionRace, purge_races_keyed_reserves_and_confirms) {
  MemoryOptions memory;
  memory.retention_us = 1;  // everything terminal is old at once: purge as often as possible
  auto engine = Engine::memory({}, nullptr, memory);
  const SkuKey key{"hot", "default"};
  const Quantity units = 1'000'000;
  engine->restock(key, units);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sold{0};
  std::atomic<std::uint64_t> replay_failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; n < 3000; ++n) {
        // Keys repeat across threads, so replays race the purge of their own key.
        const std::string name = "k" + std::to_string((n * 4 + t) % 500);
        try {
          const Reservation r = engine->reserve(key, 1, 60'000'000, name);
          if (r.state == ReservationState::held) {
            engine->confirm(r.id);
            sold.fetch_add(1);
          }
        } catch (const Error& e) {
          // A concurrent replay may confirm first, or find the hold still in flight.
          if (e.code() != ErrorCode::invalid_state && e.code() != ErrorCode::lock_timeout) {
            replay_failures.fetch_add(1);
          }
        }
      }
    });
  }
  threads.emplace_back([&] {
    while (!stop.load()) engine->purge(0, 1000);
  });
  for (std::size_t i = 0; i + 1 < threads.size(); ++i) threads[i].join();
  stop.store(true);
  threads.back().join();
  EXPECT_EQ(replay_failures.load(), 0u);
  const StockLevel level = engine->stock(key);
  EXPECT_EQ(level.reserved, 0);
  EXPECT_EQ(units - level.on_hand, static_cast<Quantity>(sold.load()));
  engine->purge(0, 1'000'000);
  EXPECT_EQ(engine->row_counts().reservation_count, 0u);
}

}  // namespace
}  // namespace stockade
