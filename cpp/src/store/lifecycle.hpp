// A confirm or release of a held reservation, decided once for both stores and the batch:
// which units it takes, and what the stock row and the buyer's count move by.
#pragma once

#include "stockade/types.hpp"
#include "store/error_helpers.hpp"

namespace stockade::detail {

// A confirm or release of more units than the hold still has.
inline Error exceeds_held(const Reservation& r, const char* verb, Quantity qty) {
  return Error(ErrorCode::invalid_state,
               "reservation " + r.id.to_string() + " holds " + std::to_string(r.held()) +
                   " units; cannot " + verb + " " + std::to_string(qty) + " (nothing changed)",
               context_of(r));
}

// The units a confirm or release of `r` settles: `asked` (0: all that is held; a batch
// item's qty). Throws exceeds_held for more than is held. `r` must be held.
inline Quantity units_to_settle(const Reservation& r, const char* verb, Quantity asked) {
  if (asked == 0) return r.held();
  if (asked > r.held()) throw exceeds_held(r, verb, asked);
  return asked;
}

// The memory store's check before it writes a reservation (the schema's reservation_units
// CHECK on PostgreSQL): units that do not add up are the engine's bug, refused before
// they are written.
inline void check_units(const Reservation& r) {
  if (units_consistent(r)) return;
  throw Error(ErrorCode::invariant_violation,
              "reservation " + r.id.to_string() + " would be written with units that do not add " +
                  "up (" + units_of(r) + "); nothing changed",
              context_of(r));
}

// What every step of a live hold checks first, in this order, on both stores and in the
// batch: the caller's expected version (VersionConflict), then that the hold is still held
// (InvalidState, or ReservationExpired for one that lapsed). A hold found lapsed but not
// yet expired is each store's to expire.
inline void check_live(const Reservation& r, const std::optional<Version>& expected) {
  check_expected(r, expected);
  if (r.state != ReservationState::held) throw not_holdable(r);
}

// What a confirm or release moves: units sold (they leave on_hand and reserved) and units
// given back (they leave reserved, and the buyer's purchase-limit count).
struct Settlement {
  Quantity sold = 0;
  Quantity freed = 0;
};

// Whether a step of `r` that moved `moved` gives units back to a buyer's purchase-limit
// count: units released or expired from a hold made under a limit.
inline bool frees_allowance(const Reservation& r, const Settlement& moved) {
  return moved.freed > 0 && r.buyer && r.limit_group;
}

// Decides a confirm (`confirm`) or release of held reservation `r`: `asked` units (0: all
// that is held), and with `release_rest` the units still held after them are released in
// the same step (a partial shipment that ends the hold). Moves them in `r` (settle_units:
// units and state; not the version) and returns what the rows move by. More than is held
// throws exceeds_held and leaves `r` as it was.
inline Settlement settle_transition(Reservation& r, bool confirm, Quantity asked,
                                    bool release_rest) {
  const char* verb = confirm ? "confirm" : "release";
  const Quantity units = units_to_settle(r, verb, asked);
  Settlement out;
  settle_units(r, confirm ? Settle::confirm : Settle::release, units);
  (confirm ? out.sold : out.freed) += units;
  if (release_rest && r.held() > 0) {
    out.freed += r.held();
    settle_units(r, Settle::release, r.held());
  }
  return out;
}

// A resize of held reservation `r` to `qty` held units: how many more it holds (> 0), or
// gives back (< 0). A shrink is counted in `r` as released units; a growth only after
// the rows took it (grow_hold). A growth that would take `qty` (every unit the hold was
// ever asked for: shrinks count as released, so cycles of shrinking and growing add up)
// past quantity_max is refused (InvalidState): the bound every sum relies on stays one.
inline Quantity resize_delta(const Reservation& r, Quantity qty) {
  const Quantity delta = qty - r.held();
  if (delta > 0 && r.qty > quantity_max - delta) {
    throw Error(ErrorCode::invalid_state,
                "reservation " + r.id.to_string() + " was asked for " + std::to_string(r.qty) +
                    " units over its life; growing it by " + std::to_string(delta) +
                    " would pass QUANTITY_MAX (" + std::to_string(quantity_max) +
                    "): hold the extra units with a new reservation (nothing changed)",
                context_of(r));
  }
  return delta;
}

// Counts a growth of `units` in `r`: asked for (qty) and held.
inline void grow_hold(Reservation& r, Quantity units) {
  r.qty += units;
}

// A growth of a hold whose buyer's purchase-limit group is not the one it was made in
// (the limit was set, removed or changed since): its units would be counted in one group
// and given back to another, so it is refused.
inline Error group_changed(const Reservation& r) {
  return Error(ErrorCode::invalid_state,
               "the purchase-limit group of reservation " + r.id.to_string() +
                   "'s SKU changed since it was made; hold the extra units with a new "
                   "reservation (nothing changed)",
               context_of(r));
}

// Counts a return of `qty` of `r`'s sold units in `r` (returned; not the version), or
// throws OverReturn, changing nothing, past the confirmed units not yet returned.
inline void take_return(Reservation& r, Quantity qty) {
  const Quantity returnable = r.confirmed - r.returned;
  if (qty > returnable) {
    throw Error(ErrorCode::over_return,
                "reservation " + r.id.to_string() + " has " + std::to_string(returnable) +
                    " confirmed units not returned yet; cannot return " + std::to_string(qty) +
                    " (nothing changed)",
                context_of(r));
  }
  r.returned += qty;
}

// Where returned units go back on hand: the SKU's own row (slot 0) at `location`, or at
// the reservation's location (a return never lands on a hot-row slot, which may be
// retired by then).
inline SkuKey return_row(const Reservation& r, const std::optional<std::string>& location) {
  return SkuKey{r.key.sku, location.value_or(r.key.location), 0};
}

}  // namespace stockade::detail
