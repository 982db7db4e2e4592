// The outcome a keyed write stores with its key (store/keyed.hpp): read back field for
// field, whatever text its strings hold; anything else is refused, never misread.
#include <gtest/gtest.h>

#include "stockade/errors.hpp"
#include "store/keyed.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

using detail::decode_outcome;
using detail::encode_outcome;

TEST(KeyedOutcome, a_stock_level_reads_back_field_for_field) {
  StockLevel level;
  level.key = {"sku:12:with:colons", "loc 7", 3};
  level.on_hand = -4;
  level.reserved = 9;
  level.version = 1234567890123;
  level.updated_at_us = 1733000000000000;
  level.backorder_limit = 20;
  level.discontinued = true;
  level.lease_token = 77;
  level.leased = true;
  level.lease_expires_at_us = 1733000000500000;
  level.low_stock = 5;
  level.active_slots = 2;
  const StockLevel back = decode_outcome<StockLevel>(encode_outcome(level));
  EXPECT_EQ(back.key, level.key);
  EXPECT_EQ(back.on_hand, level.on_hand);
  EXPECT_EQ(back.reserved, level.reserved);
  EXPECT_EQ(back.version, level.version);
  EXPECT_EQ(back.updated_at_us, level.updated_at_us);
  EXPECT_EQ(back.backorder_limit, level.backorder_limit);
  EXPECT_EQ(back.discontinued, level.discontinued);
  EXPECT_EQ(back.lease_token, level.lease_token);
  EXPECT_EQ(back.leased, level.leased);
  EXPECT_EQ(back.lease_expires_at_us, level.lease_expires_at_us);
  EXPECT_EQ(back.low_stock, level.low_stock);
  EXPECT_EQ(back.active_slots, level.active_slots);
  level.low_stock.reset();
  EXPECT_FALSE(decode_outcome<StockLevel>(encode_outcome(level)).low_stock.has_value());
}

TEST(KeyedOutcome, a_reservation_reads_back_field_for_field) {
  Reservation r;
  r.id = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-0123456789ab");
  r.key = {"tee", "3:2:1", 0};
  r.qty = 5;
  r.confirmed = 2;
  r.released = 1;
  r.returned = 1;
  r.state = ReservationState::held;
  r.version = 4;
  r.expires_at_us = 30;
  r.created_at_us = 10;
  r.updated_at_us = 20;
  r.idempotency_key = std::string("4:abcd");
  r.buyer = std::string("");
  const Reservation back = decode_outcome<Reservation>(encode_outcome(r));
  EXPECT_EQ(back.id, r.id);
  EXPECT_EQ(back.key, r.key);
  EXPECT_EQ(back.qty, r.qty);
  EXPECT_EQ(back.confirmed, r.confirmed);
  EXPECT_EQ(back.released, r.released);
  EXPECT_EQ(back.expired, r.expired);
  EXPECT_EQ(back.returned, r.returned);
  EXPECT_EQ(back.state, r.state);
  EXPECT_EQ(back.version, r.version);
  EXPECT_EQ(back.expires_at_us, r.expires_at_us);
  EXPECT_EQ(back.created_at_us, r.created_at_us);
  EXPECT_EQ(back.updated_at_us, r.updated_at_us);
  EXPECT_EQ(back.idempotency_key, r.idempotency_key);
  EXPECT_EQ(back.buyer, r.buyer);  // present and empty is not absent
  EXPECT_FALSE(back.limit_group.has_value());
}

TEST(KeyedOutcome, an_order_steps_lines_read_back_with_their_order) {
  Reservation a;
  a.id = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-0123456789ab");
  a.key = {"tee", "default", 0};
  a.qty = 3;
  a.order_id = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-000000000001");
  Reservation b = a;
  b.id = Uuid::parse("01890f4e-8a3c-7b2d-9e4f-0123456789ac");
  b.key.sku = "mug";
  b.order_id.reset();
  b.ref = std::string("line:7");
  b.metadata = std::string(R"({"gift": true})");
  const auto back =
      decode_outcome<std::vector<Reservation>>(encode_outcome(std::vector<Reservation>{a, b}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].id, a.id);
  EXPECT_EQ(back[1].key, b.key);
  EXPECT_EQ(back[0].order_id, a.order_id);
  EXPECT_FALSE(back[1].order_id.has_value());
  EXPECT_EQ(back[1].ref, b.ref);
  EXPECT_EQ(back[1].metadata, b.metadata);
  EXPECT_FALSE(back[0].ref.has_value());
  EXPECT_TRUE(
      decode_outcome<std::vector<Reservation>>(encode_outcome(std::vector<Reservation>{})).empty());
  // A reservation stored before orders had ids (no trailing field) reads as it was.
  Reservation plain = a;
  plain.order_id.reset();
  EXPECT_FALSE(decode_outcome<Reservation>(encode_outcome(plain)).order_id.has_value());
  EXPECT_STOCKADE_ERROR(decode_outcome<std::vector<Reservation>>(encode_outcome(a)),
                        ErrorCode::invariant_violation);
  EXPECT_STOCKADE_ERROR(decode_outcome<std::vector<Reservation>>("O1:3"),
                        ErrorCode::invariant_violation);
}

// A sell a one-row fast batch decided: the prefix (what the batch did after it) and the row
// as the statement left it give the level right after the sale.
TEST(KeyedOutcome, a_batched_sells_level_reads_back_from_its_prefix_and_the_row) {
  const SkuKey key{"sku:with:colons", "loc 7", 2};
  // the row left at on_hand 40, reserved 13, version 108; after this sale the batch sold 5
  // more units, held 3 and made 4 more changes
  const std::string text =
      detail::batched_level_prefix("attempt-1", key, 5, 3, 4) +
      detail::batched_level_tail({40, 13, 108, 1733000000000000, 20, 6, 2, 1, 9});
  const StockLevel back = decode_outcome<StockLevel>(text);
  EXPECT_EQ(back.key, key);
  EXPECT_EQ(back.on_hand, 45);
  EXPECT_EQ(back.reserved, 10);
  EXPECT_EQ(back.version, 104);
  EXPECT_EQ(back.updated_at_us, 1733000000000000);
  EXPECT_EQ(back.backorder_limit, 20);
  EXPECT_EQ(back.safety_stock, 6);
  EXPECT_EQ(back.damaged, 2);
  EXPECT_EQ(back.quality_control, 1);
  EXPECT_EQ(back.incoming, 9);
  EXPECT_FALSE(back.discontinued || back.leased);
  EXPECT_EQ(detail::batched_level_tail({-4, 0, 1, 2, 3}), "2:-41:01:11:21:3");
  // A tail stored before the quantity states ends at the backorder limit: none withheld.
  const StockLevel older =
      decode_outcome<StockLevel>(detail::batched_level_prefix("attempt-1", key, 5, 3, 4) +
                                 detail::batched_level_tail({40, 13, 108, 1733000000000000, 20}));
  EXPECT_EQ(older.backorder_limit, 20);
  EXPECT_EQ(older.withheld(), 0);
  // (The SQL form is checked on a server: test_keyed_writes.py replays a batched sell.)
  for (const std::string& bad : {detail::batched_level_prefix("attempt-1", key, 5, 3, 4),
                                 text + "1:0", text.substr(0, text.size() - 1)}) {
    EXPECT_STOCKADE_ERROR(decode_outcome<StockLevel>(bad), ErrorCode::invariant_violation);
  }
}

TEST(KeyedOutcome, text_that_is_not_an_outcome_is_refused) {
  StockLevel level;
  level.key = {"a", "b", 0};
  const std::string good = encode_outcome(level);
  for (const std::string& bad :
       {std::string(), std::string("R") + good.substr(1), good.substr(0, good.size() - 1),
        good + "1:0", std::string("L99999999999999:x"), std::string("L1:a1:b1:z")}) {
    EXPECT_STOCKADE_ERROR(decode_outcome<StockLevel>(bad), ErrorCode::invariant_violation);
  }
}

TEST(KeyedOutcome, a_conflict_names_the_kinds_and_never_the_first_arguments) {
  SellRequest sell;
  sell.key = {"secret-sku", "default", 0};
  sell.qty = 2;
  const std::string first = detail::fingerprint(sell);
  const std::string other = detail::stock_fingerprint({"x", "default", 0}, 1, true, {}, {});
  const Error e = detail::keyed_conflict("k1", first, other);
  EXPECT_EQ(e.code(), ErrorCode::idempotency_conflict);
  EXPECT_NE(std::string(e.what()).find("used for a sell, this is a restock"), std::string::npos);
  EXPECT_EQ(std::string(e.what()).find("secret-sku"), std::string::npos);
  // A slot's row prints as its SKU: a retry may reach another slot.
  SellRequest slot = sell;
  slot.key.slot = 2;
  EXPECT_EQ(detail::fingerprint(slot), first);
  slot.qty = 3;
  EXPECT_NE(detail::fingerprint(slot), first);
}

}  // namespace
}  // namespace stockade
