// Domain types: input validation, UUIDv7 ids, stable hashes, strategy names.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "stockade/hash.hpp"
#include "stockade/log.hpp"
#include "stockade/types.hpp"
#include "stockade/uuid.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

constexpr ErrorCode invalid = ErrorCode::invalid_argument;

TEST(Errors, messages_are_one_line_with_no_trailing_newline) {
  EXPECT_STREQ(Error(ErrorCode::unavailable, "plain").what(), "plain");
  EXPECT_STREQ(
      Error(ErrorCode::unavailable, "cannot connect: refused\n\tIs the server running?\n").what(),
      "cannot connect: refused. Is the server running?");
  EXPECT_STREQ(Error(ErrorCode::database_error, "ERROR:  dup  \nDETAIL:  Key (k)\r\n").what(),
               "ERROR:  dup. DETAIL:  Key (k)");
  EXPECT_STREQ(Error(ErrorCode::database_error, "failed:\n\tNo route; see\nthe log.").what(),
               "failed: No route; see the log.");
  EXPECT_STREQ(Error(ErrorCode::database_error, "\n\n").what(), "");
}

TEST(Validation, rejects_empty_long_nul_and_non_utf8_skus) {
  EXPECT_STOCKADE_ERROR(validate_sku_key({"", "default"}), invalid);
  EXPECT_STOCKADE_ERROR(validate_sku_key({std::string(sku_bytes_max + 1, 'a'), "default"}),
                        invalid);
  EXPECT_STOCKADE_ERROR(validate_sku_key({std::string("a\0b", 3), "default"}), invalid);
  EXPECT_STOCKADE_ERROR(validate_sku_key({"\xff\xfe", "default"}), invalid);
  EXPECT_STOCKADE_ERROR(validate_sku_key({"\xed\xa0\x80", "default"}), invalid);  // surrogate
  EXPECT_STOCKADE_ERROR(validate_sku_key({"\xc0\xaf", "default"}), invalid);      // overlong
  EXPECT_STOCKADE_ERROR(validate_sku_key({"sku", ""}), invalid);
}

TEST(Validation, accepts_skus_up_to_the_byte_limit_in_any_script) {
  EXPECT_NO_THROW(validate_sku_key({std::string(sku_bytes_max, 'a'), "default"}));
  EXPECT_NO_THROW(validate_sku_key({"\xe9\x9e\x8b-42 \xf0\x9f\x91\x9f", "lager-\xc3\xb6st"}));
}

TEST(Validation, rejects_non_positive_quantities_and_ttls) {
  EXPECT_STOCKADE_ERROR(validate_qty(0), invalid);
  EXPECT_STOCKADE_ERROR(validate_qty(-5), invalid);
  EXPECT_NO_THROW(validate_qty(quantity_max));
  EXPECT_STOCKADE_ERROR(validate_qty(quantity_max + 1), invalid);
  EXPECT_STOCKADE_ERROR(validate_qty(std::numeric_limits<Quantity>::max()), invalid);
  EXPECT_STOCKADE_ERROR(validate_ttl_us(0), invalid);
  EXPECT_STOCKADE_ERROR(validate_ttl_us(-1), invalid);
  EXPECT_STOCKADE_ERROR(validate_ttl_us(ttl_us_max + 1), invalid);
  EXPECT_NO_THROW(validate_ttl_us(ttl_us_max));
}

TEST(Validation, checked_add_refuses_overflow) {
  const Quantity max = std::numeric_limits<Quantity>::max();
  EXPECT_EQ(checked_add(max - 1, 1, "x"), max);
  EXPECT_STOCKADE_ERROR(checked_add(max, 1, "x"), invalid);
}

// settle_units: the one rule for where a reservation's units go and what its state says.
TEST(Lifecycle, units_leave_a_hold_in_parts_and_the_state_says_how_it_ended) {
  Reservation r;
  r.qty = 5;
  EXPECT_TRUE(units_consistent(r));
  settle_units(r, Settle::confirm, 2);
  EXPECT_EQ(r.state, ReservationState::held);
  EXPECT_EQ(r.held(), 3);
  settle_units(r, Settle::release, 1);
  EXPECT_EQ(r.state, ReservationState::held);
  EXPECT_EQ(r.counted(), 4);
  settle_units(r, Settle::expire, 2);  // the rest lapses: some were sold, so confirmed
  EXPECT_EQ(r.state, ReservationState::confirmed);
  EXPECT_EQ(r.held(), 0);
  EXPECT_TRUE(units_consistent(r));
  EXPECT_EQ(units_of(r),
            "qty 5: held 0, confirmed 2, released 1, expired 2, returned 0; state confirmed");

  Reservation none_sold;
  none_sold.qty = 3;
  settle_units(none_sold, Settle::release, 1);
  settle_units(none_sold, Settle::expire, 2);
  EXPECT_EQ(none_sold.state, ReservationState::expired);
  Reservation released;
  released.qty = 3;
  settle_units(released, Settle::release, 3);
  EXPECT_EQ(released.state, ReservationState::released);
}

TEST(Lifecycle, units_that_do_not_add_up_are_inconsistent) {
  Reservation r;
  r.qty = 4;
  r.confirmed = 4;  // nothing held, yet the state says held
  EXPECT_FALSE(units_consistent(r));
  r.state = ReservationState::confirmed;
  EXPECT_TRUE(units_consistent(r));
  r.returned = 5;  // more came back than was sold
  EXPECT_FALSE(units_consistent(r));
  r.returned = 0;
  r.confirmed = 5;  // more moved than was asked
  EXPECT_FALSE(units_consistent(r));
  Reservation partly_expired;
  partly_expired.qty = 4;
  partly_expired.expired = 1;  // expiry takes the whole remainder, never a part
  EXPECT_FALSE(units_consistent(partly_expired));
}

TEST(Strategies, parse_round_trips_every_name_and_rejects_others) {
  for (std::size_t i = 0; i < strategy_count; ++i) {
    const auto s = static_cast<Strategy>(i);
    EXPECT_EQ(parse_strategy(strategy_name(s)), s);
  }
  EXPECT_EQ(parse_strategy("auto"), Strategy::automatic);
  EXPECT_STOCKADE_ERROR(parse_strategy("Atomic"), invalid);
  EXPECT_STOCKADE_ERROR(parse_strategy(""), invalid);
}

TEST(Uuid, v7_carries_version_variant_time_and_shard_key) {
  const std::int64_t ms = 1'790'000'000'123;
  for (std::uint16_t key :
       {std::uint16_t{0}, std::uint16_t{1}, std::uint16_t{0xBEEF}, std::uint16_t{0xFFFF}}) {
    const Uuid id = make_uuid_v7(ms, key);
    EXPECT_EQ(id.version(), 7);
    EXPECT_EQ(id.bytes[8] & 0xC0, 0x80) << "RFC 9562 variant bits";
    EXPECT_EQ(id.unix_ms(), ms);
    EXPECT_EQ(id.shard_key(), key);
  }
}

TEST(Uuid, ids_are_unique_and_sort_by_time) {
  std::set<Uuid> seen;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(seen.insert(make_uuid_v7(1000 + i / 10, 7)).second);
  EXPECT_LT(make_uuid_v7(1000, 7), make_uuid_v7(1001, 7));
  // Random bits differ between two ids of the same millisecond and shard.
  EXPECT_NE(make_uuid_v7(5, 5), make_uuid_v7(5, 5));
}

TEST(Uuid, hash_spreads_ids_of_one_row_across_shards) {
  // All ids of a hot SKU carry the same shard key; their hash must still spread them.
  std::set<std::size_t> shards;
  for (int i = 0; i < 1000; ++i) shards.insert(UuidHash{}(make_uuid_v7(1000, 0xABCD)) % 64);
  EXPECT_EQ(shards.size(), 64u);
}

TEST(Uuid, text_form_round_trips_and_bad_text_is_rejected) {
  const Uuid id = make_uuid_v7(1'700'000'000'000, 42);
  const std::string text = id.to_string();
  EXPECT_EQ(text.size(), 36u);
  EXPECT_EQ(Uuid::parse(text), id);
  EXPECT_STOCKADE_ERROR(Uuid::parse("not-a-uuid"), invalid);
  EXPECT_STOCKADE_ERROR(Uuid::parse("0189a0b2-7c1e-7abc-8def-0123456789zz"), invalid);
  // A fifth dash among the last twelve digits: once read past the end of the text.
  EXPECT_STOCKADE_ERROR(Uuid::parse("00000000-0000-0000-0000-0000000000-0"), invalid);
  EXPECT_STOCKADE_ERROR(Uuid::parse("00000000-0000-0000-0000-00000000000-"), invalid);
  EXPECT_STOCKADE_ERROR(Uuid::parse(std::string_view("00000000-0000-0000-0000-00000000000\0", 36)),
                        invalid);
  EXPECT_EQ(Uuid::parse("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF").to_string(),
            "ffffffff-ffff-ffff-ffff-ffffffffffff");
  EXPECT_STOCKADE_ERROR(Uuid::from_bytes("short"), invalid);
}

TEST(StableHash, is_stable_across_builds_and_separates_parts) {
  // Pinned values: these keys are stored and shared between engines, so they must never
  // change. If this fails, the hash changed: that is a data migration, not a refactor.
  EXPECT_EQ(stable_hash64({}), 0xc3817c016ba4ff30ULL);
  EXPECT_EQ(stable_hash64({"sku-1", "default"}), 0xbc2c8937efd70be4ULL);
  EXPECT_NE(stable_hash64({"ab", "c"}), stable_hash64({"a", "bc"}));
  EXPECT_EQ(shard_key_of("sku-1", "default"),
            static_cast<std::uint16_t>(stable_hash64({"sku-1", "default"}) >> 48));
}

// The log ring is bounded: records past log_capacity are dropped and counted, records
// below the level are never kept, long messages are cut, and a limiter lets one record
// through per interval and counts the rest.
TEST(Log, ring_is_bounded_and_counts_what_it_drops) {
  set_log_level(LogLevel::info);
  std::uint64_t dropped = 0;
  take_logs(log_capacity, 0, &dropped);  // start empty
  log(LogLevel::debug, "stockade", "below the level");
  for (std::size_t i = 0; i < log_capacity + 10; ++i) log(LogLevel::info, "stockade", "x");
  log(LogLevel::warning, "stockade", std::string(10 * log_message_max, 'y'));
  std::vector<LogRecord> got = take_logs(2 * log_capacity, 0, &dropped);
  EXPECT_EQ(got.size(), log_capacity);
  EXPECT_EQ(dropped, 11u);
  EXPECT_EQ(got.front().message, "x");
  got = take_logs(10, 0, &dropped);
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(dropped, 0u);

  log(LogLevel::warning, "stockade", std::string(10 * log_message_max, 'y'));
  got = take_logs(10, 0, &dropped);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_LT(got[0].message.size(), log_message_max + 16);

  LogLimiter limiter(60'000'000);
  for (int i = 0; i < 5; ++i) limiter.log(LogLevel::warning, "stockade", "again");
  got = take_logs(10, 0, &dropped);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].message, "again");
  set_log_level(LogLevel::warning);
}

}  // namespace
}  // namespace stockade
