#include "store/unit_states.hpp"

#include <string>

#include "store/error_helpers.hpp"

namespace stockade::detail {

Quantity unclaimed_units(const StockLevel& row) {
  const Quantity free = row.on_hand - row.reserved - row.damaged - row.quality_control;
  return free > 0 ? free : 0;
}

void validate_move(UnitState from, UnitState to) {
  if (from == UnitState::written_off) {
    throw_invalid_argument("'written_off' is a destination only: written-off units are gone");
  }
  if (from == to) {
    throw_invalid_argument(std::string("from_state and to_state are both '") +
                           unit_state_name(from) + "': a move goes from one state to another");
  }
}

namespace {

Quantity* bucket(UnitCounts& counts, UnitState state) {
  switch (state) {
    case UnitState::damaged:
      return &counts.damaged;
    case UnitState::quality_control:
      return &counts.quality_control;
    default:
      return nullptr;
  }
}

}  // namespace

UnitCounts plan_move(const StockLevel& row, const MoveRequest& request) {
  validate_move(request.from, request.to);
  const SkuKey& key = row.key;
  UnitCounts next{row.on_hand, row.damaged, row.quality_control};
  if (Quantity* from = bucket(next, request.from)) {
    if (*from < request.qty) {
      throw Error(ErrorCode::invalid_state,
                  describe(key) + " has " + std::to_string(*from) + " units " +
                      unit_state_name(request.from) + ", fewer than the " +
                      std::to_string(request.qty) + " to move; nothing was moved",
                  context_of(key));
    }
    *from -= request.qty;
  } else {
    const Quantity free = unclaimed_units(row);
    if (free < request.qty) {
      ErrorContext context = context_of(key);
      context.available = free;
      throw Error(ErrorCode::out_of_stock,
                  describe(key) + " has " + std::to_string(free) +
                      " units neither held nor in another state, fewer than the " +
                      std::to_string(request.qty) + " to move; nothing was moved",
                  std::move(context));
    }
  }
  if (Quantity* to = bucket(next, request.to)) {
    *to += request.qty;
  } else if (request.to == UnitState::written_off) {
    next.on_hand -= request.qty;
  }
  return next;
}

}  // namespace stockade::detail
