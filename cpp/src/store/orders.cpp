#include "store/orders.hpp"

#include <algorithm>
#include <map>

namespace stockade::detail {

const char* step_name(Transition kind) {
  return kind == Transition::confirm   ? "confirm_order"
         : kind == Transition::release ? "release_order"
                                       : "extend_order";
}

namespace {

// The parts by line id; InvalidArgument for an id that is no line of the order, or named
// twice.
std::map<Uuid, Quantity> parts_of(const OrderStepRequest& request,
                                  const std::vector<Reservation>& lines) {
  std::map<Uuid, Quantity> parts;
  for (const auto& [id, qty] : request.parts) {
    const bool known =
        std::any_of(lines.begin(), lines.end(), [&](const Reservation& r) { return r.id == id; });
    if (!known) {
      throw_invalid_argument("reservation " + id.to_string() + " is not a line of order " +
                             request.order_id.to_string());
    }
    if (!parts.emplace(id, qty).second) {
      throw_invalid_argument("reservation " + id.to_string() + " is named twice");
    }
  }
  return parts;
}

// Whether a line's hold ended by expiry (now or before), as not_holdable reads it.
bool ended_by_expiry(const Reservation& r) {
  return r.state == ReservationState::expired ||
         (r.state != ReservationState::held && r.expired > 0);
}

}  // namespace

OrderPlan plan_order_step(const OrderStepRequest& request, const std::vector<Reservation>& lines,
                          const std::vector<bool>& lapsed) {
  const std::map<Uuid, Quantity> parts = parts_of(request, lines);
  const bool confirm = request.kind == Transition::confirm;
  // A confirm or an extend of the whole order (no parts) takes it as it stands, or not at
  // all: a line that expired fails it. A release frees what is left, whatever expired.
  const bool whole = parts.empty() && request.kind != Transition::release;
  OrderPlan plan;
  std::optional<Reservation> expired_line;  // the first line that fails the step
  bool any_live = false;
  bool any_expiry = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    PlannedLine p{lines[i], {}, false, false, false};
    Reservation& r = p.line;
    const auto part = parts.find(r.id);
    const bool named = part != parts.end();
    if (r.state != ReservationState::held) {
      if (named) throw not_holdable(r);  // a part of a line that ended
      if (whole && ended_by_expiry(r) && !expired_line) expired_line = r;
    } else if (lapsed[i]) {
      p.changed = p.expires = any_expiry = true;
      p.moved.freed = r.held();
      settle_units(r, Settle::expire, r.held());
      if ((whole || named) && !expired_line) expired_line = r;
    } else if (request.kind == Transition::extend) {
      p.changed = p.extended = any_live = true;
    } else if (named || parts.empty()) {
      p.moved =
          settle_transition(r, confirm, named ? part->second : 0, confirm && request.release_rest);
      p.changed = any_live = true;
    } else if (request.release_rest) {  // a line not named: released whole
      p.moved = settle_transition(r, /*confirm=*/false, 0, false);
      p.changed = any_live = true;
    } else {
      any_live = true;  // held, left as it is
    }
    plan.lines.push_back(std::move(p));
  }
  if (expired_line) {
    // Only the expiries are written; every live line stays as it was.
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (!plan.lines[i].expires) plan.lines[i] = PlannedLine{lines[i], {}, false, false, false};
    }
    plan.raise_after = Error(
        ErrorCode::reservation_expired,
        "line " + expired_line->id.to_string() + " of order " + request.order_id.to_string() +
            " has expired, so " + step_name(request.kind) +
            " changed no live line (name the lines to go on with in qty=, or step them one by "
            "one)",
        context_of(*expired_line));
    return plan;
  }
  if (!any_live && !any_expiry) {
    ErrorContext context;
    context.reservation_id = request.order_id;
    throw Error(ErrorCode::invalid_state,
                "no line of order " + request.order_id.to_string() + " holds units any more; " +
                    step_name(request.kind) + " changed nothing",
                std::move(context));
  }
  return plan;
}

bool matches(const Reservation& r, const ReservationQuery& q) {
  return (!q.ref || r.ref == q.ref) && (!q.order_id || r.order_id == q.order_id) &&
         (!q.buyer || r.buyer == q.buyer) && (!q.sku || r.key.sku == *q.sku) &&
         (!q.location || r.key.location == *q.location) && (!q.state || r.state == *q.state);
}

void throw_order_not_found(const Uuid& order_id) {
  ErrorContext context;
  context.reservation_id = order_id;
  throw Error(ErrorCode::not_found, "no order " + order_id.to_string(), std::move(context));
}

void throw_no_order_for_key(const std::string& key, bool purged) {
  throw Error(ErrorCode::not_found,
              purged ? "the order made with idempotency key " + shown(key) + " was purged"
                     : "no order was made with idempotency key " + shown(key));
}

void sort_lines(std::vector<Reservation>& lines) {
  std::sort(lines.begin(), lines.end(), [](const Reservation& a, const Reservation& b) {
    if (a.key != b.key) return a.key < b.key;
    return a.id < b.id;
  });
}

}  // namespace stockade::detail
