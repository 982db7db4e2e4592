// A step of a whole order (Store::order_step), decided once for both stores: which lines it
// moves, by how much, and what it raises. The stores lock the lines, call plan_order_step on
// them as locked, write what it decided, and raise what it says to raise after that.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "stockade/store.hpp"
#include "store/lifecycle.hpp"

namespace stockade::detail {

// One line as a step found it and leaves it.
struct PlannedLine {
  Reservation line;       // as decided: units, state (not the version, not the times)
  Settlement moved;       // what its stock row and its buyer's count move by
  bool changed = false;   // whether it is written at all
  bool expires = false;   // it had lapsed: expired here, as the sweeper would have
  bool extended = false;  // an extend's: its expiry moves to now + ttl
};

struct OrderPlan {
  std::vector<PlannedLine> lines;  // every line, in the order given
  // Raised after the plan is written and committed (a confirm or an extend of an order
  // with an expired line: the expiries stand, nothing else moved). None: it went through.
  std::optional<Error> raise_after;
};

// The call a step of an order is: "confirm_order", "release_order" or "extend_order".
const char* step_name(Transition kind);

// Decides `request` on `lines` (the order's lines, locked; `lapsed[i]` whether line i is
// held past its expiry on the store's clock), by the rules of OrderStepRequest. Throws,
// deciding nothing, for a part that names no line of the order or one line twice, a part of
// a line that holds nothing or less than asked, and an order with no line holding units.
OrderPlan plan_order_step(const OrderStepRequest& request, const std::vector<Reservation>& lines,
                          const std::vector<bool>& lapsed);

// Whether `r` is one `query` asks for (every field given matches; `after` and `limit` are
// the caller's to apply). The memory store's filter; PostgreSQL's statements say the same.
bool matches(const Reservation& r, const ReservationQuery& query);

// NotFound for an order id that names no order (or one whose lines retention purged).
[[noreturn]] void throw_order_not_found(const Uuid& order_id);

// NotFound for a key that made no order, or whose order's lines retention purged.
[[noreturn]] void throw_no_order_for_key(const std::string& key, bool purged);

// Lines in the order Store::get_order returns them: by (sku, location, slot), then id.
void sort_lines(std::vector<Reservation>& lines);

}  // namespace stockade::detail
