// Allocation from a pool of locations: the split each policy decides on the locked rows
// (store/allocation.hpp), its refusals, and a race of many buyers on the memory store
// while the locations run out one by one.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>
#include <vector>

#include "stockade/engine.hpp"
#include "store/allocation.hpp"
#include "store/fingerprint.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

using detail::plan_allocation;
using detail::PoolLevels;

AllocateRequest pool_request(std::vector<AllocationWant> wants,
                             AllocationPolicy policy = AllocationPolicy::priority,
                             bool split = true) {
  AllocateRequest request;
  request.wants = std::move(wants);
  request.locations = {"north", "south", "east"};
  request.policy = policy;
  request.split = split;
  return request;
}

StockLevel level(const std::string& sku, const std::string& location, Quantity on_hand,
                 Quantity reserved = 0) {
  StockLevel l;
  l.key = {sku, location, 0};
  l.on_hand = on_hand;
  l.reserved = reserved;
  l.version = 1;
  return l;
}

// One SKU's levels at north, south, east (a negative: no row there).
PoolLevels one_sku(const std::string& sku, std::vector<Quantity> free) {
  const char* names[] = {"north", "south", "east"};
  PoolLevels levels(1, std::vector<std::optional<StockLevel>>(3));
  for (std::size_t l = 0; l < 3; ++l) {
    if (free[l] >= 0) levels[0][l] = level(sku, names[l], free[l]);
  }
  return levels;
}

std::map<std::string, Quantity> by_location(const std::vector<OrderLine>& lines) {
  std::map<std::string, Quantity> out;
  for (const OrderLine& line : lines) out[line.key.location] += line.qty;
  return out;
}

TEST(Allocation, priority_takes_from_the_locations_in_the_pools_order) {
  const auto lines = plan_allocation(pool_request({{"a", 5}}), one_sku("a", {2, 10, 10}));
  EXPECT_EQ(by_location(lines), (std::map<std::string, Quantity>{{"north", 2}, {"south", 3}}));
  EXPECT_EQ(lines.front().key.location, "north");  // the pool's order
}

TEST(Allocation, most_available_takes_from_the_fullest_location_first) {
  const auto lines = plan_allocation(pool_request({{"a", 12}}, AllocationPolicy::most_available),
                                     one_sku("a", {2, 4, 10}));
  EXPECT_EQ(by_location(lines), (std::map<std::string, Quantity>{{"east", 10}, {"south", 2}}));
  EXPECT_EQ(lines.front().key.location, "south");  // answered in the pool's order
}

TEST(Allocation, without_split_one_location_fills_the_whole_quantity_or_it_refuses) {
  auto request = pool_request({{"a", 5}}, AllocationPolicy::priority, /*split=*/false);
  EXPECT_EQ(by_location(plan_allocation(request, one_sku("a", {4, 6, 9}))),
            (std::map<std::string, Quantity>{{"south", 5}}));
  request.policy = AllocationPolicy::most_available;
  EXPECT_EQ(by_location(plan_allocation(request, one_sku("a", {4, 6, 9}))),
            (std::map<std::string, Quantity>{{"east", 5}}));
  EXPECT_STOCKADE_ERROR(plan_allocation(request, one_sku("a", {4, 4, 4})), ErrorCode::out_of_stock);
}

TEST(Allocation, a_refusal_names_each_locations_free_units) {
  try {
    plan_allocation(pool_request({{"a", 9}}), one_sku("a", {2, -1, 3}));
    FAIL() << "expected OutOfStock";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::out_of_stock);
    EXPECT_EQ(e.context().sku, "a");
    const std::vector<std::pair<std::string, std::int64_t>> pool{
        {"north", 2}, {"south", 0}, {"east", 3}};
    EXPECT_EQ(e.context().pool, pool);
    EXPECT_NE(std::string(e.what()).find("5 free units over the pool, 9 requested"),
              std::string::npos)
        << e.what();
  }
}

TEST(Allocation, a_sku_with_no_row_in_the_pool_is_not_found) {
  EXPECT_STOCKADE_ERROR(plan_allocation(pool_request({{"a", 1}}), one_sku("a", {-1, -1, -1})),
                        ErrorCode::not_found);
}

TEST(Allocation, withheld_rows_give_nothing) {
  PoolLevels levels = one_sku("a", {5, 5, 5});
  levels[0][0]->discontinued = true;
  levels[0][1]->leased = true;
  levels[0][2]->reserved = 4;
  EXPECT_STOCKADE_ERROR(plan_allocation(pool_request({{"a", 2}}), levels), ErrorCode::out_of_stock);
  levels[0][2]->backorder_limit = 1;  // backorders count, as a reserve's
  EXPECT_EQ(by_location(plan_allocation(pool_request({{"a", 2}}), levels)),
            (std::map<std::string, Quantity>{{"east", 2}}));
}

TEST(Allocation, an_order_prefers_one_location_that_fills_every_line) {
  auto request = pool_request({{"a", 2}, {"b", 3}});
  PoolLevels levels(2, std::vector<std::optional<StockLevel>>(3));
  const char* names[] = {"north", "south", "east"};
  const Quantity a[] = {5, 2, 1}, b[] = {1, 3, 9};
  for (std::size_t l = 0; l < 3; ++l) {
    levels[0][l] = level("a", names[l], a[l]);
    levels[1][l] = level("b", names[l], b[l]);
  }
  // north has a but not b; south has both: one shipment.
  EXPECT_EQ(by_location(plan_allocation(request, levels)),
            (std::map<std::string, Quantity>{{"south", 5}}));
  levels[0][1] = level("a", "south", 1);  // now no one location has both
  const auto lines = plan_allocation(request, levels);
  ASSERT_EQ(lines.size(), 3u);  // a: north 2; b: north 1, south 2 (priority, split)
  EXPECT_EQ(lines[0].key, (SkuKey{"a", "north", 0}));
  EXPECT_EQ(lines[0].qty, 2);
  EXPECT_EQ(lines[1].key, (SkuKey{"b", "north", 0}));
  EXPECT_EQ(lines[1].qty, 1);
  EXPECT_EQ(lines[2].key, (SkuKey{"b", "south", 0}));
  EXPECT_EQ(lines[2].qty, 2);
  request.split = false;
  EXPECT_STOCKADE_ERROR(plan_allocation(request, levels), ErrorCode::out_of_stock);
}

TEST(Allocation, the_pool_is_locked_in_key_order) {
  const auto rows = detail::pool_rows(pool_request({{"b", 1}, {"a", 1}}));
  ASSERT_EQ(rows.size(), 6u);
  for (std::size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1].key, rows[i].key);
  EXPECT_EQ(rows.front().key, (SkuKey{"a", "east", 0}));
  EXPECT_EQ(rows.front().want, 1u);
  EXPECT_EQ(rows.front().location, 2u);
}

TEST(Allocation, the_same_request_prints_alike_and_a_new_pool_does_not) {
  auto a = pool_request({{"x", 1}, {"y", 2}});
  auto b = pool_request({{"y", 2}, {"x", 1}});
  EXPECT_EQ(detail::fingerprint(a), detail::fingerprint(b));
  b.locations = {"south", "north", "east"};
  EXPECT_NE(detail::fingerprint(a), detail::fingerprint(b));
  b = a;
  b.split = false;
  EXPECT_NE(detail::fingerprint(a), detail::fingerprint(b));
}

// The medusa shape as a race: buyers allocate from a pool of three locations while the
// locations run out one by one. The units granted are the pool's exactly; no location
// oversells; every refusal changes nothing.
TEST(AllocationRace, many_buyers_drain_the_pool_exactly) {
  for (const AllocationPolicy policy :
       {AllocationPolicy::priority, AllocationPolicy::most_available}) {
    for (const Strategy strategy :
         {Strategy::atomic, Strategy::pessimistic, Strategy::optimistic, Strategy::batched}) {
      auto engine = Engine::memory();
      const std::vector<std::string> pool{"p1", "p2", "p3"};
      const Quantity stocked[] = {37, 23, 11};
      for (std::size_t l = 0; l < pool.size(); ++l) {
        engine->restock({"hot", pool[l]}, stocked[l]);
      }
      std::atomic<std::int64_t> granted{0};
      std::atomic<int> refused{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 8; ++t) {
        threads.emplace_back([&, t] {
          CallOptions call;
          call.strategy = strategy;
          for (int i = 0; i < 200; ++i) {
            const Quantity qty = 1 + (t + i) % 4;
            try {
              const auto made =
                  engine->allocate({{"hot", qty}}, pool, policy, /*split=*/true, {}, {}, call);
              Quantity sum = 0;
              for (const Reservation& r : made) sum += r.qty;
              EXPECT_EQ(sum, qty);
              granted += sum;
            } catch (const Error& e) {
              EXPECT_EQ(e.code(), ErrorCode::out_of_stock) << e.what();
              ++refused;
            }
          }
        });
      }
      for (auto& t : threads) t.join();
      Quantity reserved = 0, on_hand = 0;
      for (std::size_t l = 0; l < pool.size(); ++l) {
        const StockLevel s = engine->stock({"hot", pool[l]});
        EXPECT_LE(s.reserved, s.on_hand) << pool[l];
        reserved += s.reserved;
        on_hand += s.on_hand;
      }
      EXPECT_EQ(on_hand, 71);
      EXPECT_EQ(reserved, granted.load());
      EXPECT_GE(granted.load(), 71 - 3);  // what is left is less than the largest ask
      EXPECT_GT(refused.load(), 0);
    }
  }
}

}  // namespace
}  // namespace stockade
