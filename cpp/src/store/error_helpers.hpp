// Builders for the errors every store raises, so that messages and context fields read
// the same whichever backend raised them.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::detail {

inline ErrorContext context_of(const SkuKey& key) {
  ErrorContext context;
  context.sku = key.sku;
  context.location = key.location;
  return context;
}

inline std::string describe(const SkuKey& key) {
  return "sku " + shown(key.sku) + " at location " + shown(key.location);
}

inline Error stock_not_found(const SkuKey& key) {
  return Error(ErrorCode::not_found, "no stock row for " + describe(key), context_of(key));
}

[[noreturn]] inline void throw_stock_not_found(const SkuKey& key) {
  throw stock_not_found(key);
}

// `version`: the row's version the refusal was decided at (or a later one), when known:
// the engine uses it to tell, without a read, that a SKU had no hot-row slots then.
inline Error out_of_stock(const SkuKey& key, Quantity available, Quantity qty,
                          std::optional<Version> version = std::nullopt) {
  ErrorContext context = context_of(key);
  context.actual_version = version;
  context.available = available;
  return Error(ErrorCode::out_of_stock,
               "out of stock: " + describe(key) + " has " + std::to_string(available) +
                   " available, " + std::to_string(qty) + " requested",
               std::move(context));
}

[[noreturn]] inline void throw_out_of_stock(const SkuKey& key, Quantity available, Quantity qty,
                                            std::optional<Version> version = std::nullopt) {
  throw out_of_stock(key, available, qty, version);
}

inline Error idempotency_conflict(const std::string& key) {
  return Error(ErrorCode::idempotency_conflict,
               "idempotency key " + shown(key) + " was used for a different request");
}

[[noreturn]] inline void throw_stock_version_conflict(const SkuKey& key, Version expected,
                                                      Version actual) {
  ErrorContext context = context_of(key);
  context.expected_version = expected;
  context.actual_version = actual;
  throw Error(ErrorCode::version_conflict,
              "version conflict on " + describe(key) + ": expected version " +
                  std::to_string(expected) + ", found " + std::to_string(actual),
              std::move(context));
}

inline void check_expected(const SkuKey& key, const std::optional<Version>& expected,
                           Version actual) {
  if (expected && *expected != actual) throw_stock_version_conflict(key, *expected, actual);
}

// What a write to a stock row must pass besides room, in this order: the row is not
// discontinued (410), no other holder's lease is live on it (a write without a token, or
// with an older token, is refused), and its version is the expected one. A fencing token
// is good while it is the row's latest lease's: a holder whose lease lapsed may still
// write with it until someone else acquires the row (that is what fencing means: the
// store refuses only a token older than one it has seen).
inline void check_writable(const StockLevel& row, const std::optional<Version>& expected,
                           const std::optional<FencingToken>& token) {
  const SkuKey& key = row.key;
  if (row.discontinued) {
    throw Error(ErrorCode::discontinued, describe(key) + " is discontinued", context_of(key));
  }
  if (token && *token != row.lease_token) {
    throw Error(ErrorCode::fencing_token_stale,
                "fencing token " + std::to_string(*token) + " is not the latest lease's on " +
                    describe(key) + " (" + std::to_string(row.lease_token) +
                    (*token < row.lease_token ? "): a newer lease superseded it"
                                              : "): it was not issued for this row"),
                context_of(key));
  }
  if (!token && row.leased) {
    throw Error(ErrorCode::lease_held,
                describe(key) + " is leased (token " + std::to_string(row.lease_token) +
                    "); writes need the lease's fencing_token until it is released or lapses",
                context_of(key));
  }
  check_expected(key, expected, row.version);
}

// How many of a SKU's rows (Store::sku_rows: the own row first, in slot order) take new
// reserves and sells: the own row says (StockLevel::active_slots; 0, as written before
// slots could be taken away, means every row). The rows past them are retired slots.
inline int active_rows(const std::vector<StockLevel>& rows) {
  if (rows.empty()) return 0;
  const int all = static_cast<int>(rows.size());
  const int said = rows.front().active_slots;
  return said <= 0 ? all : std::min(said, all);
}

// Whether a SKU counts as slotted for what slots do not build (leases, fencing tokens,
// backorder limits): it has active slot rows, or a retired one that still keeps units
// (held, or free ones not moved home yet). A SKU whose slots were taken away and whose
// retired rows are empty is a one-row SKU again.
inline bool has_slots(const std::vector<StockLevel>& rows) {
  if (active_rows(rows) > 1) return true;
  for (std::size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].on_hand != 0 || rows[i].reserved != 0) return true;
  }
  return false;
}

// What hot-row slots do not build (leases, backorder limits), refused on a SKU that has
// them: `rows` of them, or 0 when the caller only knows that it has some.
[[noreturn]] inline void throw_not_built_for_slots(const SkuKey& key, const char* feature,
                                                   std::size_t rows) {
  throw Error(ErrorCode::not_supported,
              std::string(feature) + " is not built for a SKU with hot-row slots; " +
                  describe(key) +
                  (rows > 1 ? " spreads its units over " + std::to_string(rows) + " rows"
                            : std::string(" has slot rows")),
              context_of(key));
}

// The same, when `rows` (Store::sku_rows) say the SKU has slots (has_slots).
inline void refuse_if_slots(const SkuKey& key, const char* feature,
                            const std::vector<StockLevel>& rows) {
  if (has_slots(rows)) throw_not_built_for_slots(key, feature, rows.size());
}

// set_on_hand and set_backorder_limit: what is promised, and what sits damaged or in
// quality control (`unsellable`), must stay covered.
inline void check_covers(const SkuKey& key, Quantity on_hand, Quantity reserved,
                         Quantity backorder_limit, Quantity unsellable = 0) {
  if (reserved + unsellable <= on_hand + backorder_limit) return;
  std::string claimed = std::to_string(reserved) + " units reserved";
  if (unsellable > 0)
    claimed += " and the " + std::to_string(unsellable) + " damaged or in quality control";
  throw Error(ErrorCode::invalid_state,
              "on_hand " + std::to_string(on_hand) + " with backorder_limit " +
                  std::to_string(backorder_limit) + " would not cover the " + claimed + " on " +
                  describe(key) + "; confirm or release holds, or write off units, first",
              context_of(key));
}

[[noreturn]] inline void throw_lease_lapsed(const SkuKey& key, FencingToken token) {
  throw Error(ErrorCode::fencing_token_stale,
              "the lease with token " + std::to_string(token) + " on " + describe(key) +
                  " has lapsed; acquire a new one",
              context_of(key));
}

// A reserve that would take `buyer` past the group's per_buyer.
inline Error limit_exceeded(const SkuKey& key, const std::string& group, const std::string& buyer,
                            Quantity held, Quantity per_buyer, Quantity qty) {
  return Error(ErrorCode::limit_exceeded,
               "purchase limit: buyer " + shown(buyer) + " holds " + std::to_string(held) +
                   " of the " + std::to_string(per_buyer) + " units group " + shown(group) +
                   " allows per buyer; " + std::to_string(qty) + " more asked for " + describe(key),
               context_of(key));
}

inline ErrorContext context_of(const Reservation& reservation) {
  ErrorContext context = context_of(reservation.key);
  context.reservation_id = reservation.id;
  context.state = reservation_state_name(reservation.state);
  return context;
}

[[noreturn]] inline void throw_reservation_not_found(const Uuid& id) {
  ErrorContext context;
  context.reservation_id = id;
  throw Error(ErrorCode::not_found, "no reservation " + id.to_string(), std::move(context));
}

// A transition found the reservation no longer held: expired holds raise
// ReservationExpired, every other state InvalidState.
inline Error not_holdable(const Reservation& r) {
  // A hold ends by expiry only once, taking all that is left: a reservation with expired
  // units has expired, even when its state says some were sold first.
  if (r.state == ReservationState::expired ||
      (r.state != ReservationState::held && r.expired > 0)) {
    std::string sold;
    if (r.confirmed > 0) {
      sold = " (" + std::to_string(r.confirmed) + " of its " + std::to_string(r.qty) +
             " units were confirmed before)";
    }
    return Error(ErrorCode::reservation_expired,
                 "reservation " + r.id.to_string() + " has expired" + sold, context_of(r));
  }
  return Error(
      ErrorCode::invalid_state,
      "reservation " + r.id.to_string() + " is " + reservation_state_name(r.state) + ", not held",
      context_of(r));
}

inline void check_expected(const Reservation& r, const std::optional<Version>& expected) {
  if (!expected || *expected == r.version) return;
  ErrorContext context = context_of(r);
  context.expected_version = *expected;
  context.actual_version = r.version;
  throw Error(ErrorCode::version_conflict,
              "version conflict on reservation " + r.id.to_string() + ": expected version " +
                  std::to_string(*expected) + ", found " + std::to_string(r.version),
              std::move(context));
}

}  // namespace stockade::detail
