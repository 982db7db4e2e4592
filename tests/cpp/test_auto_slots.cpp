// Automatic hot-row slots: two engines over one store whose batches report row versions,
// as two processes over one PostgreSQL database. `auto` splits a row that both engines batch
// into slots (and the other engine learns the split), keeps a SKU that slots cannot carry on
// one row, merges a slotted SKU back once it cools, and never splits a row one engine writes
// alone.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "stockade/engine.hpp"
#include "store_doubles.hpp"

namespace stockade {
namespace {

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
  // Cool after 400 ms without a batched request: under TSan, beside other tests on two
  // cores, the hot phase's callers paused for 150 ms (the window this test had) once.
  auto a = engine(0, 4, 400);
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

// One engine alone on its row never splits it: nobody else writes it. Under `auto` its
// callers start per request and turn batched as the row heats; a per-request write of its
// own still in flight at that turn lands between two batches, where the flusher sees it as
// another writer's (design.md: writes outside the batcher count). Each of the 16 callers
// has at most one such write, so at most 16 batches see the row shared (a clean-clone
// `make test` saw 1 under TSan), and a split needs that to go on for 200 ms.
TEST_F(AutoSlotsTest, one_engine_alone_on_a_row_never_splits_it) {
  auto a = engine(0);
  a->restock(hot, 1000000);
  race_two_engines(*a, *a, hot, 16, 1.0, [] { return false; });
  const StoreStats s = a->stats();
  EXPECT_GE(s.batcher.batches, 1u);
  EXPECT_LE(s.batcher.shared_row_batches, 16u);
  EXPECT_EQ(s.slots.auto_splits, 0u);
  EXPECT_EQ(a->slot_count(hot), 1);
  a->close();
}

}  // namespace
}  // namespace stockade
