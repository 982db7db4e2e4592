// Units on hand that are not for sale: plan_move's decisions (store/unit_states.hpp), the
// memory store's row invariant with the buckets, and that no strategy sells a withheld unit;
// and a transfer's steps as store/transfers.hpp decides them.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "stockade/engine.hpp"
#include "store/transfers.hpp"
#include "store/unit_states.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

using detail::plan_move;

StockLevel row(Quantity on_hand, Quantity reserved, Quantity damaged = 0, Quantity qc = 0) {
  StockLevel l;
  l.key = {"a", "default", 0};
  l.on_hand = on_hand;
  l.reserved = reserved;
  l.damaged = damaged;
  l.quality_control = qc;
  l.version = 1;
  return l;
}

MoveRequest move(Quantity qty, UnitState from, UnitState to) {
  MoveRequest m;
  m.key = {"a", "default", 0};
  m.qty = qty;
  m.from = from;
  m.to = to;
  return m;
}

TEST(UnitStates, available_counts_every_withheld_unit_and_never_goes_below_zero) {
  StockLevel l = row(20, 6, 4, 2);
  l.safety_stock = 3;
  EXPECT_EQ(l.withheld(), 9);
  EXPECT_EQ(l.available(), 5);
  l.safety_stock = 30;  // a floor above what is free
  EXPECT_EQ(l.available(), 0);
  l.safety_stock = 0;
  l.backorder_limit = 4;
  EXPECT_EQ(l.available(), 12);
}

TEST(UnitStates, a_move_takes_only_units_its_source_state_has) {
  StockLevel l = row(10, 4, 1, 0);
  l.safety_stock = 2;  // not a bucket: the 5 unclaimed units may move
  const auto to_damaged = plan_move(l, move(5, UnitState::available, UnitState::damaged));
  EXPECT_EQ(to_damaged.on_hand, 10);
  EXPECT_EQ(to_damaged.damaged, 6);
  EXPECT_STOCKADE_ERROR(plan_move(l, move(6, UnitState::available, UnitState::damaged)),
                        ErrorCode::out_of_stock);
  EXPECT_STOCKADE_ERROR(plan_move(l, move(2, UnitState::damaged, UnitState::quality_control)),
                        ErrorCode::invalid_state);
  const auto off = plan_move(l, move(1, UnitState::damaged, UnitState::written_off));
  EXPECT_EQ(off.on_hand, 9);
  EXPECT_EQ(off.damaged, 0);
  const auto back =
      plan_move(row(10, 0, 0, 3), move(3, UnitState::quality_control, UnitState::available));
  EXPECT_EQ(back.quality_control, 0);
  EXPECT_EQ(back.on_hand, 10);
  EXPECT_STOCKADE_ERROR(plan_move(l, move(1, UnitState::written_off, UnitState::available)),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(plan_move(l, move(1, UnitState::damaged, UnitState::damaged)),
                        ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(parse_unit_state("sold"), ErrorCode::invalid_argument);
  EXPECT_EQ(parse_unit_state("quality_control"), UnitState::quality_control);
}

// 16 threads reserve and sell one unit at a time on a row that withholds 15 of its 40
// units: on every strategy exactly the 25 free units go.
TEST(UnitStates, no_strategy_sells_a_withheld_unit) {
  for (const Strategy strategy : {Strategy::atomic, Strategy::pessimistic, Strategy::optimistic,
                                  Strategy::advisory, Strategy::batched, Strategy::automatic}) {
    auto engine = Engine::memory();
    const SkuKey key{"hot", "default"};
    engine->restock(key, 40);
    engine->set_safety_stock(key, 6);
    MoveRequest damaged = move(5, UnitState::available, UnitState::damaged);
    damaged.key = key;
    engine->move_units(damaged);
    MoveRequest qc = move(4, UnitState::available, UnitState::quality_control);
    qc.key = key;
    engine->move_units(qc);
    std::atomic<int> granted{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) {
      threads.emplace_back([&, t] {
        CallOptions call;
        call.strategy = strategy;
        for (int i = 0; i < 4; ++i) {
          try {
            if ((t + i) % 2) {
              engine->reserve(key, 1, 600000000, {}, call);
            } else {
              engine->sell(key, 1, call);
            }
            ++granted;
          } catch (const Error& e) {
            EXPECT_TRUE(e.code() == ErrorCode::out_of_stock ||
                        e.code() == ErrorCode::retries_exhausted)
                << e.what();
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    const StockLevel s = engine->stock(key);
    EXPECT_LE(granted.load(), 25) << strategy_name(strategy);
    EXPECT_EQ(s.on_hand - s.reserved, 40 - granted.load());
    EXPECT_EQ(s.damaged + s.quality_control + s.safety_stock, 15);
    if (strategy != Strategy::optimistic) {
      EXPECT_EQ(granted.load(), 25) << strategy_name(strategy);
    }
  }
}

TEST(Transfers, a_transfer_takes_free_units_and_its_steps_keep_the_identity) {
  StockLevel source = row(10, 3, 1, 0);
  source.safety_stock = 2;
  source.backorder_limit = 50;  // never shipped
  StockLevel destination = row(0, 0);
  destination.key.location = "south";
  EXPECT_EQ(detail::transferable(source), 4);
  EXPECT_NO_THROW(detail::check_transfer(source, destination, 4));
  EXPECT_STOCKADE_ERROR(detail::check_transfer(source, destination, 5), ErrorCode::out_of_stock);
  source.discontinued = true;
  EXPECT_STOCKADE_ERROR(detail::check_transfer(source, destination, 1), ErrorCode::discontinued);

  TransferRequest made;
  made.id = make_uuid_v7(1, 7);
  made.sku = "a";
  made.source = "default";
  made.destination = "south";
  made.qty = 5;
  const Transfer t = detail::new_transfer(made, 42);
  EXPECT_TRUE(detail::transfer_consistent(t));
  TransferStepRequest receive;
  receive.id = t.id;
  receive.accepted = 3;
  receive.rejected = 1;
  const auto part = detail::plan_transfer_step(t, receive);
  EXPECT_EQ(part.next.in_transit(), 1);
  EXPECT_EQ(part.next.state, TransferState::in_transit);
  receive.accepted = 2;
  receive.rejected = 0;
  EXPECT_STOCKADE_ERROR(detail::plan_transfer_step(part.next, receive), ErrorCode::invalid_state);
  TransferStepRequest cancel;
  cancel.id = t.id;
  cancel.cancel = true;
  const auto back = detail::plan_transfer_step(part.next, cancel);
  EXPECT_EQ(back.cancelled, 1);
  EXPECT_EQ(back.next.state, TransferState::received);  // some units arrived
  EXPECT_TRUE(detail::transfer_consistent(back.next));
  EXPECT_STOCKADE_ERROR(detail::plan_transfer_step(back.next, cancel), ErrorCode::invalid_state);
  const auto all_back = detail::plan_transfer_step(t, cancel);
  EXPECT_EQ(all_back.next.state, TransferState::cancelled);
  EXPECT_EQ(parse_transfer_state("received"), TransferState::received);
  EXPECT_STOCKADE_ERROR(parse_transfer_state("lost"), ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace stockade
