// The engine over the memory store: every operation, its errors, and that a refused call
// changes nothing. Time comes from a ManualClock, so expiry is tested without sleeping.
#include <gtest/gtest.h>

#include <memory>

#include "stockade/engine.hpp"
#include "stockade/hash.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

constexpr std::int64_t second_us = 1'000'000;
constexpr std::int64_t minute_us = 60 * second_us;

class MemoryEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    clock = std::make_shared<ManualClock>(1'800'000'000LL * second_us);
    engine = Engine::memory({}, clock);
  }
  // A row and its version must be exactly as before a refused call.
  void expect_unchanged(const StockLevel& before) {
    const StockLevel now = engine->stock(before.key);
    EXPECT_EQ(now.on_hand, before.on_hand);
    EXPECT_EQ(now.reserved, before.reserved);
    EXPECT_EQ(now.version, before.version);
  }

  std::shared_ptr<ManualClock> clock;
  std::unique_ptr<Engine> engine;
  const SkuKey sku{"sku-1", "default"};
};

TEST_F(MemoryEngine, restock_creates_a_row_and_grows_its_version) {
  const StockLevel first = engine->restock(sku, 10);
  EXPECT_EQ(first.on_hand, 10);
  EXPECT_EQ(first.reserved, 0);
  EXPECT_EQ(first.version, 1);
  const StockLevel second = engine->restock(sku, 5, first.version);
  EXPECT_EQ(second.on_hand, 15);
  EXPECT_EQ(second.version, 2);
  EXPECT_EQ(second.updated_at_us, clock->now_us());
}

TEST_F(MemoryEngine, restock_with_a_stale_version_raises_version_conflict) {
  engine->restock(sku, 10);
  const StockLevel before = engine->restock(sku, 1);
  EXPECT_STOCKADE_ERROR(engine->restock(sku, 1, /*expected_version=*/1),
                        ErrorCode::version_conflict);
  expect_unchanged(before);
}

// on_hand_max keeps a row's room (on_hand + backorder_limit) within 64 bits.
TEST_F(MemoryEngine, restock_past_on_hand_max_raises_invalid_argument_and_changes_nothing) {
  engine->restock(sku, 1);
  EXPECT_STOCKADE_ERROR(engine->set_on_hand(sku, on_hand_max + 1), ErrorCode::invalid_argument);
  const StockLevel before = engine->set_on_hand(sku, on_hand_max - 1);
  EXPECT_STOCKADE_ERROR(engine->restock(sku, 2), ErrorCode::invalid_argument);
  expect_unchanged(before);
  engine->set_backorder_limit(sku, quantity_max);
  EXPECT_EQ(engine->stock(sku).available(), on_hand_max - 1 + quantity_max);
}

TEST_F(MemoryEngine, stock_of_an_unknown_sku_raises_not_found) {
  EXPECT_STOCKADE_ERROR(engine->stock({"nope", "default"}), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->reserve({"nope", "default"}, 1), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->restock({"nope", "default"}, 1, 3), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->stock({"nope", "default"}), ErrorCode::not_found);
}

TEST_F(MemoryEngine, locations_are_separate_rows) {
  engine->restock({"sku-1", "berlin"}, 3);
  engine->restock({"sku-1", "lisbon"}, 7);
  EXPECT_EQ(engine->stock({"sku-1", "berlin"}).on_hand, 3);
  EXPECT_EQ(engine->stock({"sku-1", "lisbon"}).on_hand, 7);
  EXPECT_STOCKADE_ERROR(engine->stock(sku), ErrorCode::not_found);
}

TEST_F(MemoryEngine, set_on_hand_checks_version_and_never_drops_below_reserved) {
  const StockLevel created = engine->set_on_hand(sku, 10);
  EXPECT_EQ(created.on_hand, 10);
  engine->reserve(sku, 4);
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->set_on_hand(sku, 3), ErrorCode::invalid_state);
  EXPECT_STOCKADE_ERROR(engine->set_on_hand(sku, 20, created.version), ErrorCode::version_conflict);
  EXPECT_STOCKADE_ERROR(engine->set_on_hand(sku, -1), ErrorCode::invalid_argument);
  expect_unchanged(before);
  const StockLevel after = engine->set_on_hand(sku, 4, before.version);
  EXPECT_EQ(after.available(), 0);
  EXPECT_EQ(after.version, before.version + 1);
}

TEST_F(MemoryEngine, reserve_holds_stock_until_the_ttl_from_the_store_clock) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 3, 10 * minute_us);
  EXPECT_EQ(r.state, ReservationState::held);
  EXPECT_EQ(r.version, 1);
  EXPECT_EQ(r.qty, 3);
  EXPECT_EQ(r.created_at_us, clock->now_us());
  EXPECT_EQ(r.expires_at_us, clock->now_us() + 10 * minute_us);
  EXPECT_EQ(r.id.version(), 7);
  EXPECT_EQ(r.id.shard_key(), shard_key_of(sku.sku, sku.location));
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, 3);
  EXPECT_EQ(level.available(), 7);
}

TEST_F(MemoryEngine, reserve_uses_the_engine_default_ttl_when_none_is_given) {
  engine->restock(sku, 1);
  const Reservation r = engine->reserve(sku, 1);
  EXPECT_EQ(r.expires_at_us - r.created_at_us, engine->options().default_ttl_us);
}

TEST_F(MemoryEngine, reserve_past_available_raises_out_of_stock_and_changes_nothing) {
  engine->restock(sku, 5);
  engine->reserve(sku, 4);
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 2), ErrorCode::out_of_stock);
  expect_unchanged(before);
}

TEST_F(MemoryEngine, bad_input_raises_invalid_argument_and_changes_nothing) {
  const StockLevel before = engine->restock(sku, 5);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 0), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, -1), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, -5), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, 0), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve({"", "default"}, 1), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve({std::string(257, 'x'), "default"}, 1),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve({std::string("sku-1\0", 6), "default"}, 1),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, std::string("")), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->sell(sku, 0), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->restock(sku, -3), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->expire_due(0), ErrorCode::invalid_argument);
  CallOptions nowait_atomic;
  nowait_atomic.nowait = true;
  nowait_atomic.strategy = Strategy::atomic;
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, {}, nowait_atomic),
                        ErrorCode::invalid_argument);
  CallOptions bad_timeout;
  bad_timeout.lock_timeout_ms = 0;
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1, {}, {}, bad_timeout), ErrorCode::invalid_argument);
  expect_unchanged(before);
  EXPECT_EQ(engine->stats().reservation_count, 0u);
}

TEST_F(MemoryEngine, batched_and_auto_reserve_and_sell_like_atomic) {
  engine->restock(sku, 5);
  for (Strategy s : {Strategy::batched, Strategy::automatic}) {
    CallOptions call;
    call.strategy = s;
    const Reservation r = engine->reserve(sku, 1, {}, {}, call);
    EXPECT_EQ(r.state, ReservationState::held);
    EXPECT_EQ(engine->get_reservation(r.id).qty, 1);
    EXPECT_EQ(engine->sell(sku, 1, call).on_hand, 5 - (s == Strategy::batched ? 1 : 2));
  }
  CallOptions batched;
  batched.strategy = Strategy::batched;
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 2, {}, {}, batched), ErrorCode::out_of_stock);
  EXPECT_STOCKADE_ERROR(engine->reserve({"missing", "default"}, 1, {}, {}, batched),
                        ErrorCode::not_found);
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.on_hand, 3);
  EXPECT_EQ(level.reserved, 2);
  const StoreStats stats = engine->stats();
  const auto& b = stats.strategies[static_cast<std::size_t>(Strategy::batched)];
  EXPECT_EQ(b.requests, 4u);
  EXPECT_EQ(b.granted, 2u);
  EXPECT_EQ(b.refused, 1u);
  EXPECT_EQ(b.failed, 1u);
  EXPECT_TRUE(stats.batcher.started);
  EXPECT_EQ(stats.batcher.requests, 4u);
}

TEST_F(MemoryEngine, batched_with_expected_version_runs_per_request) {
  const StockLevel level = engine->restock(sku, 5);
  CallOptions call;
  call.strategy = Strategy::batched;
  call.expected_version = level.version + 1;
  EXPECT_STOCKADE_ERROR(engine->sell(sku, 1, call), ErrorCode::version_conflict);
  call.expected_version = level.version;
  EXPECT_EQ(engine->sell(sku, 1, call).on_hand, 4);
  EXPECT_FALSE(engine->stats().batcher.started);  // never went through the batcher
}

TEST_F(MemoryEngine, confirm_sells_the_held_units) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 4);
  const Reservation c = engine->confirm(r.id, r.version);
  EXPECT_EQ(c.state, ReservationState::confirmed);
  EXPECT_EQ(c.version, r.version + 1);
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.on_hand, 6);
  EXPECT_EQ(level.reserved, 0);
  EXPECT_EQ(engine->get_reservation(r.id).state, ReservationState::confirmed);
}

TEST_F(MemoryEngine, release_returns_the_units) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 4);
  EXPECT_EQ(engine->release(r.id).state, ReservationState::released);
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.on_hand, 10);
  EXPECT_EQ(level.available(), 10);
}

TEST_F(MemoryEngine, a_hold_is_confirmed_and_released_in_parts) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 5, minute_us);
  const Reservation part = engine->confirm(r.id, r.version, 2);
  EXPECT_EQ(part.state, ReservationState::held);
  EXPECT_EQ(part.held(), 3);
  EXPECT_EQ(part.confirmed, 2);
  EXPECT_EQ(part.expires_at_us, r.expires_at_us);
  EXPECT_EQ(engine->stock(sku).on_hand, 8);
  EXPECT_EQ(engine->stock(sku).reserved, 3);
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->release(r.id, {}, 4), ErrorCode::invalid_state);
  EXPECT_STOCKADE_ERROR(engine->confirm(r.id, {}, 0), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->transition({r.id, Transition::extend, minute_us, {}, 1, false, {}}),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->transition({r.id, Transition::release, 0, {}, 1, true, {}}),
                        ErrorCode::invalid_argument);
  expect_unchanged(before);
  EXPECT_EQ(engine->release(r.id, {}, 1).held(), 2);
  clock->advance_us(minute_us);  // the rest lapses: two sold first, so it ends confirmed
  const Reservation done = engine->get_reservation(r.id);
  EXPECT_EQ(done.state, ReservationState::confirmed);
  EXPECT_EQ(done.expired, 2);
  EXPECT_EQ(engine->stock(sku).reserved, 0);
  EXPECT_STOCKADE_ERROR(engine->confirm(r.id), ErrorCode::reservation_expired);
  EXPECT_TRUE(engine->audit({}).violations.empty());
}

TEST_F(MemoryEngine, a_confirm_releases_the_rest_in_the_same_step) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 3);
  const Reservation done = engine->confirm(r.id, {}, 2, true);
  EXPECT_EQ(done.state, ReservationState::confirmed);
  EXPECT_EQ(done.confirmed, 2);
  EXPECT_EQ(done.released, 1);
  EXPECT_EQ(done.version, r.version + 1);
  EXPECT_EQ(engine->stock(sku).on_hand, 8);
  EXPECT_EQ(engine->stock(sku).available(), 8);
}

TEST_F(MemoryEngine, transitions_from_a_final_state_raise_invalid_state) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 1);
  engine->confirm(r.id);
  EXPECT_STOCKADE_ERROR(engine->confirm(r.id), ErrorCode::invalid_state);
  EXPECT_STOCKADE_ERROR(engine->release(r.id), ErrorCode::invalid_state);
  EXPECT_STOCKADE_ERROR(engine->extend(r.id, minute_us), ErrorCode::invalid_state);
  EXPECT_EQ(engine->stock(sku).on_hand, 9) << "a second confirm must not sell twice";
}

TEST_F(MemoryEngine, stale_expected_version_raises_version_conflict_on_reservations) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 1);
  const Reservation extended = engine->extend(r.id, 20 * minute_us, r.version);
  EXPECT_STOCKADE_ERROR(engine->confirm(r.id, r.version), ErrorCode::version_conflict);
  EXPECT_EQ(engine->get_reservation(r.id).state, ReservationState::held);
  EXPECT_EQ(engine->confirm(r.id, extended.version).state, ReservationState::confirmed);
}

TEST_F(MemoryEngine, unknown_reservation_raises_not_found) {
  const Uuid missing = make_uuid_v7(1, 1);
  EXPECT_STOCKADE_ERROR(engine->confirm(missing), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->release(missing), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->extend(missing, minute_us), ErrorCode::not_found);
  EXPECT_STOCKADE_ERROR(engine->get_reservation(missing), ErrorCode::not_found);
}

TEST_F(MemoryEngine, confirm_after_expiry_raises_reservation_expired_and_frees_the_units) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 4, minute_us);
  clock->advance_us(minute_us);  // expires_at is exclusive: now == expires_at is expired
  EXPECT_STOCKADE_ERROR(engine->confirm(r.id), ErrorCode::reservation_expired);
  EXPECT_EQ(engine->get_reservation(r.id).state, ReservationState::expired);
  EXPECT_EQ(engine->stock(sku).reserved, 0);
  EXPECT_EQ(engine->stock(sku).on_hand, 10);
  EXPECT_STOCKADE_ERROR(engine->release(r.id), ErrorCode::reservation_expired);
}

TEST_F(MemoryEngine, extend_moves_expiry_from_now) {
  engine->restock(sku, 10);
  const Reservation r = engine->reserve(sku, 1, minute_us);
  clock->advance_us(30 * second_us);
  const Reservation e = engine->extend(r.id, 5 * minute_us);
  EXPECT_EQ(e.expires_at_us, clock->now_us() + 5 * minute_us);
  clock->advance_us(2 * minute_us);
  EXPECT_EQ(engine->confirm(r.id).state, ReservationState::confirmed);
  EXPECT_STOCKADE_ERROR(engine->extend(r.id, -1), ErrorCode::invalid_argument);
}

TEST_F(MemoryEngine, expire_due_expires_only_lapsed_holds_up_to_the_limit) {
  MemoryOptions asked_only;
  asked_only.expire_lapsed = false;  // holds lapse only when expire_due() runs
  engine = Engine::memory({}, clock, asked_only);
  engine->restock(sku, 100);
  for (int i = 0; i < 5; ++i) engine->reserve(sku, 1, minute_us);
  const Reservation long_hold = engine->reserve(sku, 10, 60 * minute_us);
  EXPECT_EQ(engine->expire_due(100), 0u);
  clock->advance_us(2 * minute_us);
  EXPECT_EQ(engine->expire_due(2), 2u);
  EXPECT_EQ(engine->stock(sku).reserved, 13);
  EXPECT_EQ(engine->expire_due(100), 3u);
  EXPECT_EQ(engine->expire_due(100), 0u);
  EXPECT_EQ(engine->stock(sku).reserved, 10);
  EXPECT_EQ(engine->get_reservation(long_hold.id).state, ReservationState::held);
  EXPECT_EQ(engine->stats().held_count, 1u);
}

// By default holds lapse as the store goes: no call to expire_due() is needed, and a
// pass expires at most expire_lapsed_batch of them per call.
TEST_F(MemoryEngine, lapsed_holds_expire_as_the_store_goes) {
  engine->restock(sku, 5000);
  const std::size_t many = expire_lapsed_batch + 10;
  for (std::size_t i = 0; i < many; ++i) engine->reserve(sku, 1, minute_us);
  const Reservation long_hold = engine->reserve(sku, 10, 60 * minute_us);
  clock->advance_us(2 * minute_us);
  EXPECT_EQ(engine->stock(sku).reserved, 20);  // a pass of 1,024, then the other 10
  EXPECT_EQ(engine->stock(sku).reserved, 10);
  EXPECT_EQ(engine->get_reservation(long_hold.id).state, ReservationState::held);
  EXPECT_EQ(engine->expire_due(100), 0u);
  clock->advance_us(60 * minute_us);
  EXPECT_EQ(engine->get_reservation(long_hold.id).state, ReservationState::expired);
  EXPECT_EQ(engine->stock(sku).reserved, 0);
}

TEST_F(MemoryEngine, sell_decrements_on_hand_without_a_hold) {
  engine->restock(sku, 5);
  engine->reserve(sku, 3);
  EXPECT_EQ(engine->sell(sku, 2).on_hand, 3);
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->sell(sku, 1), ErrorCode::out_of_stock);
  expect_unchanged(before);
}

TEST_F(MemoryEngine, idempotency_key_replays_the_same_reservation_even_after_confirm) {
  engine->restock(sku, 10);
  const Reservation first = engine->reserve(sku, 2, minute_us, std::string("order-77"));
  const Reservation again = engine->reserve(sku, 2, minute_us, std::string("order-77"));
  EXPECT_EQ(again.id, first.id);
  engine->confirm(first.id);
  const Reservation after = engine->reserve(sku, 2, minute_us, std::string("order-77"));
  EXPECT_EQ(after.id, first.id);
  EXPECT_EQ(after.state, ReservationState::confirmed);
  EXPECT_EQ(engine->stock(sku).on_hand, 8) << "replays must not reserve again";
}

TEST_F(MemoryEngine, idempotency_key_with_a_different_request_raises_conflict) {
  engine->restock(sku, 10);
  engine->reserve(sku, 2, minute_us, std::string("k"));
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 3, minute_us, std::string("k")),
                        ErrorCode::idempotency_conflict);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 2, 2 * minute_us, std::string("k")),
                        ErrorCode::idempotency_conflict);
  expect_unchanged(before);
}

TEST_F(MemoryEngine, idempotency_key_of_a_refused_request_can_be_retried) {
  engine->restock(sku, 1);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 2, minute_us, std::string("k")),
                        ErrorCode::out_of_stock);
  engine->restock(sku, 1);
  EXPECT_EQ(engine->reserve(sku, 2, minute_us, std::string("k")).qty, 2);
}

TEST_F(MemoryEngine, reserve_order_is_all_or_nothing) {
  engine->restock({"a", "default"}, 5);
  engine->restock({"b", "default"}, 1);
  const StockLevel a_before = engine->stock({"a", "default"});
  EXPECT_STOCKADE_ERROR(engine->reserve_order({{{"a", "default"}, 2}, {{"b", "default"}, 2}}),
                        ErrorCode::out_of_stock);
  expect_unchanged(a_before);
  const auto made = engine->reserve_order({{{"b", "default"}, 1}, {{"a", "default"}, 2}});
  ASSERT_EQ(made.size(), 2u);
  EXPECT_EQ(made[0].key.sku, "b") << "results follow the caller's line order";
  EXPECT_EQ(made[1].key.sku, "a");
  EXPECT_EQ(engine->stock({"a", "default"}).reserved, 2);
  EXPECT_EQ(engine->stock({"b", "default"}).reserved, 1);
}

TEST_F(MemoryEngine, reserve_order_rejects_duplicates_missing_rows_and_empty_orders) {
  engine->restock({"a", "default"}, 5);
  EXPECT_STOCKADE_ERROR(engine->reserve_order({}), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve_order({{{"a", "default"}, 1}, {{"a", "default"}, 1}}),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(engine->reserve_order({{{"a", "default"}, 1}, {{"zz", "default"}, 1}}),
                        ErrorCode::not_found);
  EXPECT_EQ(engine->stock({"a", "default"}).reserved, 0);
}

TEST_F(MemoryEngine, reserve_order_replays_by_idempotency_key) {
  engine->restock({"a", "default"}, 5);
  engine->restock({"b", "default"}, 5);
  const std::vector<OrderLine> order{{{"a", "default"}, 1}, {{"b", "default"}, 2}};
  const auto first = engine->reserve_order(order, {}, std::string("cart-9"));
  const auto again = engine->reserve_order(order, {}, std::string("cart-9"));
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].id, first[0].id);
  EXPECT_EQ(again[1].id, first[1].id);
  EXPECT_EQ(engine->stock({"b", "default"}).reserved, 2);
}

TEST_F(MemoryEngine, stats_count_outcomes_per_strategy_and_hottest_skus) {
  engine->restock(sku, 1);
  engine->reserve(sku, 1);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1), ErrorCode::out_of_stock);
  const StoreStats s = engine->stats(5);
  const auto& automatic = s.strategies[static_cast<std::size_t>(Strategy::automatic)];
  EXPECT_EQ(automatic.requests, 2u);  // the default strategy is auto
  EXPECT_EQ(automatic.granted, 1u);
  EXPECT_EQ(automatic.refused, 1u);
  EXPECT_EQ(s.hottest_skus[0].mode, Strategy::atomic);  // one request at a time: cold
  ASSERT_EQ(s.hottest_skus.size(), 1u);
  EXPECT_EQ(s.hottest_skus[0].requests, 2u);
  EXPECT_EQ(s.hottest_skus[0].refused, 1u);
  EXPECT_EQ(s.backend, "memory");
}

}  // namespace
}  // namespace stockade
