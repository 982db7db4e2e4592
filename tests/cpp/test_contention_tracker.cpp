// The contention tracker behind `auto`: it switches a SKU to batched when hot and back when
// cool, learns heat from other writers through the row's version, keeps rows that share a
// cell apart, and names the measured collision rate in its advice.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "stockade/contention.hpp"
#include "stockade/hash.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

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
