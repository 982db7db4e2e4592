// Hot-row slots on the memory store: the slot rows' keys and shard keys, the store's
// reshape (all or nothing), and replicas (engines with other home slots over one store)
// that sell a slotted SKU out exactly.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "hotrow/slot_directory.hpp"
#include "stockade/engine.hpp"
#include "stockade/hash.hpp"
#include "test_support.hpp"

namespace stockade {
namespace {

TEST(SlotKeys, name_rows_that_callers_cannot_name_and_map_back) {
  const SkuKey base{"sku-1", "eu"};
  EXPECT_EQ(slot_key(base, 0), base);
  const SkuKey seven = slot_key(base, 7);
  EXPECT_EQ(seven.sku, base.sku);
  EXPECT_EQ(seven.location, base.location);  // the slot is a field of its own
  EXPECT_NE(seven, base);
  EXPECT_EQ(slot_of(seven), 7);
  EXPECT_EQ(slot_of(base), 0);
  EXPECT_EQ(base_key(seven), base);
  EXPECT_EQ(slot_of(slot_key(base, slots_max - 1)), slots_max - 1);
  // Slot order is key order, so locking in key order locks the SKU's own row first.
  for (int i = 0; i + 1 < slots_max; ++i) EXPECT_LT(slot_key(base, i), slot_key(base, i + 1));
  // A SKU's slots share its shard key (one shard on Citus, one cell; the batcher gives
  // them consecutive shards by slot, so that their batches are in flight at once).
  EXPECT_EQ(row_shard_key(seven.sku, seven.location), shard_key_of(base.sku, base.location));
  EXPECT_EQ(row_shard_key(base.sku, base.location), shard_key_of(base.sku, base.location));
  EXPECT_STOCKADE_ERROR(validate_sku_key(seven), ErrorCode::invalid_argument);
}

class Slots : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.home_slot = 1;
    store = make_memory_store(nullptr, std::make_shared<Telemetry>(telemetry_options(options)));
    engine = std::make_unique<Engine>(store, options);
  }
  std::shared_ptr<Store> store;
  std::unique_ptr<Engine> engine;
  const SkuKey sku{"hot", "default"};
};

TEST_F(Slots, reshape_refused_by_its_plan_changes_and_makes_nothing) {
  engine->restock(sku, 10);
  const std::vector<SkuKey> rows{sku, slot_key(sku, 1), slot_key(sku, 2)};
  EXPECT_STOCKADE_ERROR(store->reshape(rows, true, false, 1000,
                                       [&](const std::vector<StockLevel>& levels) {
                                         EXPECT_EQ(levels.size(), 3u);
                                         EXPECT_EQ(levels[0].on_hand, 10);
                                         EXPECT_EQ(levels[1].on_hand, 0);
                                         throw Error(ErrorCode::invalid_state, "no");
                                         return std::vector<Quantity>{};
                                       }),
                        ErrorCode::invalid_state);
  EXPECT_EQ(store->sku_rows(sku).size(), 1u);  // no slot row was made
  EXPECT_EQ(engine->stock(sku).version, 1);
}

TEST_F(Slots, reshape_that_would_break_a_row_writes_no_row) {
  engine->set_slots(sku, 2);
  engine->restock(sku, 10);
  const Reservation held = engine->reserve(sku, 4);  // on slot 1, this engine's home
  const std::vector<StockLevel> before = store->sku_rows(sku);
  const std::vector<SkuKey> rows{sku, slot_key(sku, 1)};
  EXPECT_STOCKADE_ERROR(store->reshape(rows, false, false, 1000,
                                       [&](const std::vector<StockLevel>& levels) {
                                         // all units to the own row: slot 1 keeps 4 held
                                         return std::vector<Quantity>{
                                             levels[0].on_hand + levels[1].on_hand, 0};
                                       }),
                        ErrorCode::invariant_violation);
  const std::vector<StockLevel> after = store->sku_rows(sku);
  for (std::size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].on_hand, before[i].on_hand);
    EXPECT_EQ(after[i].version, before[i].version);
  }
  EXPECT_EQ(held.key, sku);
}

TEST_F(Slots, making_slot_rows_moves_the_own_rows_version) {
  // The engine proves "no slots" from a refusal's version alone: slot rows must never
  // appear while the own row keeps its version, even when no unit moves.
  engine->restock(sku, 1);
  engine->reserve(sku, 1);
  const StockLevel sold_out = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(engine->reserve(sku, 1), ErrorCode::out_of_stock);
  try {
    engine->reserve(sku, 1);
  } catch (const Error& e) {
    EXPECT_EQ(e.context().actual_version, sold_out.version);  // refusals carry it
  }
  const std::vector<SkuKey> rows{sku, slot_key(sku, 1)};
  const std::vector<StockLevel> after =
      store->reshape(rows, true, false, 1000, [](const std::vector<StockLevel>& levels) {
        return std::vector<Quantity>{levels[0].on_hand, levels[1].on_hand};  // nothing moves
      });
  EXPECT_GT(after[0].version, sold_out.version);
  EXPECT_EQ(after[0].on_hand, 1);
  // The engine, which found the own row alone at the old version, finds the slot: units
  // put there are granted, not refused.
  store->reshape(rows, false, false, 1000, [](const std::vector<StockLevel>& levels) {
    return std::vector<Quantity>{levels[0].on_hand + 3, levels[1].on_hand};
  });
  store->reshape(rows, false, false, 1000, [](const std::vector<StockLevel>& levels) {
    return std::vector<Quantity>{levels[0].on_hand - 3, levels[1].on_hand + 3};
  });
  EXPECT_EQ(engine->reserve(sku, 3).qty, 3);
  EXPECT_EQ(engine->slot_count(sku), 2);
}

// The engine refuses a lease or a backorder limit on a slotted SKU after reading its rows;
// the store refuses it again inside the write, so that a SKU slotted between that read
// and the write is refused too (here the store is called as that late write would be).
TEST_F(Slots, the_store_refuses_a_lease_or_a_backorder_limit_on_a_slotted_sku) {
  engine->restock(sku, 10);
  engine->set_slots(sku, 2);
  const StockLevel before = engine->stock(sku);
  EXPECT_STOCKADE_ERROR(store->acquire_lease(sku, 60'000'000, "ops"), ErrorCode::not_supported);
  EXPECT_STOCKADE_ERROR(store->set_backorder_limit(sku, 5, std::nullopt, std::nullopt),
                        ErrorCode::not_supported);
  const StockLevel after = engine->stock(sku);
  EXPECT_EQ(after.version, before.version);
  EXPECT_FALSE(after.leased);
  EXPECT_EQ(after.backorder_limit, 0);
  const SkuKey plain{"plain", "default"};
  engine->restock(plain, 1);
  EXPECT_EQ(store->set_backorder_limit(plain, 5, std::nullopt, std::nullopt).backorder_limit, 5);
  EXPECT_GT(store->acquire_lease(plain, 60'000'000, "ops").token, 0);
}

TEST_F(Slots, replicas_on_every_slot_sell_out_exactly) {
  engine->restock(sku, 5000);
  engine->set_slots(sku, 4);
  std::vector<std::unique_ptr<Engine>> replicas;
  for (int i = 0; i < 4; ++i) {
    EngineOptions options;
    options.home_slot = i;
    options.default_strategy = i % 2 == 0 ? Strategy::batched : Strategy::atomic;
    replicas.push_back(std::make_unique<Engine>(store, options));
  }
  std::atomic<Quantity> granted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      Engine& e = *replicas[static_cast<std::size_t>(t % 4)];
      const Quantity qty = 1 + t % 3;
      for (;;) {
        try {
          e.reserve(sku, qty);
          granted += qty;
        } catch (const Error& err) {
          if (err.code() == ErrorCode::out_of_stock) return;
          if (err.code() != ErrorCode::overloaded) throw;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  const StockLevel level = engine->stock(sku);
  EXPECT_EQ(level.reserved, granted.load());
  EXPECT_LE(level.reserved, 5000);
  EXPECT_EQ(level.available(), 0);  // the one-unit buyers stopped only at a true refusal
  for (const StockLevel& row : store->sku_rows(sku)) {
    EXPECT_LE(row.reserved, row.on_hand);
  }
  for (auto& r : replicas) r->close();
}

// Taking slots away retires the rows past the count: their free units go home at once,
// their holds stay and end there (confirm, release, expiry), units a release frees on a
// retired row reach a buyer of the own row, a replica that still routes to a retired slot
// learns the merge on its first refusal, and once the retired rows are empty the SKU
// takes a lease again; slots can then come back.
TEST(SlotMerge, retired_rows_keep_their_holds_and_their_units_go_home) {
  auto clock = std::make_shared<ManualClock>(1'800'000'000'000'000LL);
  auto store = make_memory_store(clock, std::make_shared<Telemetry>(TelemetryOptions{}));
  const SkuKey sku{"merge", "default"};
  std::vector<std::unique_ptr<Engine>> replicas;
  for (int i = 0; i < 4; ++i) {
    EngineOptions options;
    options.home_slot = i;
    options.default_strategy = Strategy::atomic;
    replicas.push_back(std::make_unique<Engine>(store, options));
  }
  Engine& any = *replicas[0];
  any.restock(sku, 100);
  any.set_slots(sku, 4);
  for (auto& r : replicas) EXPECT_EQ(r->slot_count(sku), 4);  // each learns the split
  std::vector<Reservation> holds;                             // one on each slot row
  for (int i = 0; i < 4; ++i) {
    holds.push_back(replicas[static_cast<std::size_t>(i)]->reserve(sku, 5, 60'000'000));
  }
  const Reservation expiring = replicas[3]->reserve(sku, 2, 1'000'000);
  const StockLevel before = any.stock(sku);
  EXPECT_EQ(before.reserved, 22);

  const StockLevel merged = replicas[0]->set_slots(sku, 1);
  EXPECT_EQ(merged.on_hand, before.on_hand);
  EXPECT_EQ(merged.reserved, before.reserved);
  EXPECT_GT(merged.version, before.version);
  EXPECT_EQ(merged.active_slots, 1);
  EXPECT_EQ(any.slot_count(sku), 1);
  std::vector<StockLevel> rows = store->sku_rows(sku);
  ASSERT_EQ(rows.size(), 4u);                   // retired, not removed
  EXPECT_EQ(rows[0].on_hand, 100 - 5 - 5 - 7);  // all but what the retired rows hold
  EXPECT_EQ(rows[1].on_hand, 5);                // only what its hold keeps
  EXPECT_EQ(rows[3].on_hand, 7);
  EXPECT_STOCKADE_ERROR(any.acquire_lease(sku, 60'000'000, "ops"), ErrorCode::not_supported);

  // The holds end on their rows.
  replicas[1]->confirm(holds[1].id);
  replicas[2]->release(holds[2].id);  // 5 units free on a retired row
  clock->advance_us(2'000'000);
  EXPECT_EQ(store->expire_due(100), 1u);
  EXPECT_EQ(any.get_reservation(expiring.id).state, ReservationState::expired);
  const StockLevel mid = any.stock(sku);
  EXPECT_EQ(mid.on_hand, 95);
  EXPECT_EQ(mid.reserved, 10);

  // A replica whose home is a retired slot still routes there once: the empty row refuses,
  // it reads the rows, learns the merge, and the units (those freed on retired rows too)
  // reach it through the own row.
  const Reservation all = replicas[3]->reserve(sku, mid.available(), 60'000'000);
  EXPECT_EQ(all.qty, 85);
  EXPECT_EQ(replicas[3]->slot_count(sku), 1);
  EXPECT_STOCKADE_ERROR(replicas[2]->reserve(sku, 1), ErrorCode::out_of_stock);
  rows = store->sku_rows(sku);
  EXPECT_EQ(rows[0].reserved, 85 + 5);  // and the hold made there before the merge
  EXPECT_EQ(rows[2].on_hand, 0);        // the released units went home

  // Every hold ends; the retired rows are empty, and the SKU is a one-row SKU again.
  replicas[0]->release(holds[0].id);
  replicas[3]->release(holds[3].id);
  replicas[3]->release(all.id);
  rows = store->sku_rows(sku);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].reserved, 0);
  }
  // A restock goes to the own row; reserving all there is takes the retired rows' free
  // units home first (the own row alone is short).
  any.restock(sku, 1);
  any.reserve(sku, any.stock(sku).available());
  for (const StockLevel& row : store->sku_rows(sku)) {
    if (row.key.slot > 0) {
      EXPECT_EQ(row.on_hand, 0) << row.key.slot;
    }
  }
  const Lease lease = any.acquire_lease(sku, 60'000'000, "ops");
  EXPECT_STOCKADE_ERROR(any.set_slots(sku, 2), ErrorCode::invalid_state);  // leased
  EXPECT_TRUE(any.release_lease(sku, lease.token));
  EXPECT_EQ(any.set_slots(sku, 3).active_slots, 3);  // retired rows come back
  EXPECT_EQ(store->sku_rows(sku).size(), 4u);
  EXPECT_EQ(replicas[2]->slot_count(sku), 3);
  for (auto& r : replicas) r->close();
}

// A directory entry is ordered by the own row's version: an older read (more slots)
// never undoes a newer one (fewer), and a SKU merged back stays known until then.
TEST(SlotMerge, the_directory_keeps_the_newest_count_it_saw) {
  detail::SlotDirectory directory(8);
  const SkuKey sku{"dir", "default"};
  directory.put(sku, 1, 1, 5);  // never slotted: not remembered
  EXPECT_EQ(directory.get(sku), 1);
  directory.put(sku, 4, 4, 10);
  EXPECT_EQ(directory.get(sku), 4);
  directory.put(sku, 1, 4, 20);  // merged back
  EXPECT_EQ(directory.get(sku), 1);
  EXPECT_EQ(directory.rows(sku), 4);
  directory.put(sku, 4, 4, 12);  // a read from before the merge, recorded late
  EXPECT_EQ(directory.get(sku), 1);
  directory.put(sku, 3, 4, 21);
  EXPECT_EQ(directory.get(sku), 3);
}

}  // namespace
}  // namespace stockade
