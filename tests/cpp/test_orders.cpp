// A step of a whole order, decided once for both stores (store/orders.hpp): which lines it
// moves and by how much, the all-or-nothing rule for a line that expired, and refusals
// that decide nothing.
#include <gtest/gtest.h>

#include "stockade/errors.hpp"
#include "store/orders.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

using detail::OrderPlan;
using detail::plan_order_step;

const Uuid order_id = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-000000000001");

Reservation line(const char* sku, int n, Quantity qty) {
  Reservation r;
  r.id = Uuid::parse(std::string("01890f4e-8a3c-7b2d-9e4f-00000000010") + std::to_string(n));
  r.key = {sku, "default", 0};
  r.qty = qty;
  r.order_id = order_id;
  return r;
}

OrderStepRequest step(Transition kind, std::vector<std::pair<Uuid, Quantity>> parts = {},
                      bool release_rest = false) {
  OrderStepRequest request;
  request.order_id = order_id;
  request.kind = kind;
  request.parts = std::move(parts);
  request.release_rest = release_rest;
  return request;
}

TEST(OrderStep, a_whole_confirm_sells_every_held_line_and_skips_ended_ones) {
  Reservation a = line("a", 1, 3), b = line("b", 2, 2), c = line("c", 3, 1);
  settle_units(c, Settle::release, 1);  // ended before
  const OrderPlan plan =
      plan_order_step(step(Transition::confirm), {a, b, c}, {false, false, false});
  EXPECT_FALSE(plan.raise_after.has_value());
  EXPECT_EQ(plan.lines[0].moved.sold, 3);
  EXPECT_EQ(plan.lines[0].line.state, ReservationState::confirmed);
  EXPECT_EQ(plan.lines[1].moved.sold, 2);
  EXPECT_FALSE(plan.lines[2].changed);
}

TEST(OrderStep, a_whole_confirm_with_a_lapsed_line_writes_only_its_expiry) {
  const Reservation a = line("a", 1, 3), b = line("b", 2, 2);
  const OrderPlan plan = plan_order_step(step(Transition::confirm), {a, b}, {false, true});
  ASSERT_TRUE(plan.raise_after.has_value());
  EXPECT_EQ(plan.raise_after->code(), ErrorCode::reservation_expired);
  EXPECT_FALSE(plan.lines[0].changed);
  EXPECT_EQ(plan.lines[0].line.held(), 3);
  EXPECT_TRUE(plan.lines[1].expires);
  EXPECT_EQ(plan.lines[1].moved.freed, 2);
  EXPECT_EQ(plan.lines[1].line.state, ReservationState::expired);
}

TEST(OrderStep, a_line_that_expired_before_fails_a_whole_confirm_or_extend_too) {
  Reservation a = line("a", 1, 3), b = line("b", 2, 2);
  settle_units(b, Settle::expire, 2);
  for (Transition kind : {Transition::confirm, Transition::extend}) {
    const OrderPlan plan = plan_order_step(step(kind), {a, b}, {false, false});
    ASSERT_TRUE(plan.raise_after.has_value());
    EXPECT_FALSE(plan.lines[0].changed);
  }
  // Naming the live line goes on with it; a release frees what is left.
  EXPECT_FALSE(plan_order_step(step(Transition::confirm, {{a.id, 1}}), {a, b}, {false, false})
                   .raise_after.has_value());
  EXPECT_EQ(plan_order_step(step(Transition::release), {a, b}, {false, false}).lines[0].moved.freed,
            3);
}

TEST(OrderStep, parts_with_release_rest_end_every_line) {
  const Reservation a = line("a", 1, 3), b = line("b", 2, 2);
  const OrderPlan plan =
      plan_order_step(step(Transition::confirm, {{a.id, 1}}, true), {a, b}, {false, false});
  EXPECT_EQ(plan.lines[0].moved.sold, 1);
  EXPECT_EQ(plan.lines[0].moved.freed, 2);
  EXPECT_EQ(plan.lines[0].line.state, ReservationState::confirmed);
  EXPECT_EQ(plan.lines[1].moved.freed, 2);
  EXPECT_EQ(plan.lines[1].line.state, ReservationState::released);
  // Without release_rest a line not named stays as it was.
  const OrderPlan kept =
      plan_order_step(step(Transition::confirm, {{a.id, 1}}), {a, b}, {false, false});
  EXPECT_FALSE(kept.lines[1].changed);
  EXPECT_EQ(kept.lines[0].line.held(), 2);
}

TEST(OrderStep, refusals_decide_nothing) {
  Reservation a = line("a", 1, 3), b = line("b", 2, 2);
  const Uuid stranger = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-000000000999");
  EXPECT_STOCKADE_ERROR(
      plan_order_step(step(Transition::confirm, {{stranger, 1}}), {a, b}, {false, false}),
      ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(
      plan_order_step(step(Transition::confirm, {{a.id, 1}, {a.id, 1}}), {a, b}, {false, false}),
      ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(
      plan_order_step(step(Transition::release, {{b.id, 3}}), {a, b}, {false, false}),
      ErrorCode::invalid_state);
  settle_units(a, Settle::confirm, 3);
  EXPECT_STOCKADE_ERROR(
      plan_order_step(step(Transition::confirm, {{a.id, 1}}), {a, b}, {false, false}),
      ErrorCode::invalid_state);
  settle_units(b, Settle::release, 2);
  EXPECT_STOCKADE_ERROR(plan_order_step(step(Transition::release), {a, b}, {false, false}),
                        ErrorCode::invalid_state);
}

TEST(Metadata, one_json_object_of_bounded_size_passes_and_nothing_else) {
  for (const char* good :
       {R"({})", R"( {"a": 1, "b": [true, false, null, -0.5e+3, "x\"y"]} )",
        R"({"n": {"m": {"o": "\u00e9\n"}}})", R"({"pair": "\ud83d\ude00", "e": 1E0009999})"}) {
    EXPECT_NO_THROW(validate_metadata(good)) << good;
  }
  for (const char* bad : {"",
                          "[]",
                          "1",
                          R"("s")",
                          "{",
                          R"({"a" 1})",
                          R"({"a": 01})",
                          R"({"a": 1,})",
                          R"({a: 1})",
                          R"({"a": tru})",
                          R"({} {})",
                          R"({"a": "\x"})",
                          R"({"a": "\u0000"})",
                          "{\"a\": \"\t\"}",
                          R"({"a": "\ud800"})",
                          R"({"a": "\udc00x"})",
                          R"({"a": "\ud800\u0041"})",
                          R"({"a": 1e10000})",
                          R"({"a": 1e})",
                          "{\"a\": \"\xff\"}"}) {
    EXPECT_STOCKADE_ERROR(validate_metadata(bad), ErrorCode::invalid_argument);
  }
  std::string deep;
  for (int i = 0; i < 40; ++i) deep += R"({"a":)";
  deep += "1" + std::string(40, '}');
  EXPECT_STOCKADE_ERROR(validate_metadata(deep), ErrorCode::invalid_argument);
  EXPECT_STOCKADE_ERROR(
      validate_metadata(R"({"a": ")" + std::string(metadata_bytes_max, 'x') + R"("})"),
      ErrorCode::invalid_argument);
}

}  // namespace
}  // namespace stockade
