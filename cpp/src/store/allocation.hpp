// An allocation from a pool of locations (Store::allocate), decided once for both stores:
// which rows it locks, in what order, and how it splits each SKU's units over them. The
// stores lock the rows, call plan_allocation on them as locked, and write what it
// decided in the same transaction; nothing read before the lock is trusted after it.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "stockade/store.hpp"

namespace stockade::detail {

// One row of the pool: wants[want]'s SKU at locations[location] (its own row, slot 0).
struct PoolRow {
  SkuKey key;
  std::size_t want = 0;
  std::size_t location = 0;
};
// Every row of the pool, sorted by key: the order every store locks them in (that of
// reserve_order's lines, so the two never deadlock each other).
std::vector<PoolRow> pool_rows(const AllocateRequest& request);

// The pool as locked: levels[want][location] (none: the SKU has no row there, which gives
// nothing).
using PoolLevels = std::vector<std::vector<std::optional<StockLevel>>>;

// What a row can give an allocation: its available units, none below zero, and none on a
// discontinued row or one under a live lease (allocate takes no fencing token).
Quantity free_units(const StockLevel& level);

// Decides the allocation on the locked pool: the lines (a SKU at a location, qty > 0), in
// the request's SKU order, then the pool's (allocation_order).
// - One SKU: `priority` takes from the locations in the pool's order, as much as each has,
//   until the quantity is met; `most_available` the same from the location with the most
//   free units down. With split = false, the first location (in the policy's order) that
//   has the whole quantity.
// - Several SKUs: first one location that can fill every line (fewest shipments; the
//   locations in the pool's order, or by their free units over the order's SKUs for
//   `most_available`); else, with split, each SKU as above.
// Throws OutOfStock (context: the short SKU and each location's free units of it; for a
// whole order that no one location can fill, none) or NotFound (a SKU with no row at any
// location of the pool); deciding nothing.
std::vector<OrderLine> plan_allocation(const AllocateRequest& request, const PoolLevels& levels);

// Sorts an allocation's lines (or its reservations, slots folded) in the request's SKU
// order, then the pool's: the order every answer gives them in, a replay's too.
void allocation_order(const AllocateRequest& request, std::vector<OrderLine>& lines);
void allocation_order(const AllocateRequest& request, std::vector<Reservation>& made);

}  // namespace stockade::detail
