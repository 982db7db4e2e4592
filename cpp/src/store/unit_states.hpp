// The quantity states of a stock row (move_units, set_safety_stock), decided once for both
// stores: each locks the row, asks plan_move what the row becomes, and writes it in the
// same transaction.
#pragma once

#include "stockade/store.hpp"

namespace stockade::detail {

// What a move leaves on the row: its on_hand and its two unsellable buckets.
struct UnitCounts {
  Quantity on_hand = 0;
  Quantity damaged = 0;
  Quantity quality_control = 0;
};

// The units of `row` that no state claims: on hand, neither held nor damaged nor in quality
// control (never below zero). What a move from `available` may take: the safety stock is a
// floor on sales, not a bucket, so these units move even when it withholds them from sale.
Quantity unclaimed_units(const StockLevel& row);

// The row after `request` (MoveRequest), decided on the row as locked. Too few units in the
// source state raises OutOfStock (from available) or InvalidState; a move onto itself, or
// from written_off, InvalidArgument.
UnitCounts plan_move(const StockLevel& row, const MoveRequest& request);

// The checks a move's arguments get before any store sees them (Engine::move_units).
void validate_move(UnitState from, UnitState to);

}  // namespace stockade::detail
