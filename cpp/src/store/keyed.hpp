// Idempotency keys on the writes that are not reserves: sell, restock, set_on_hand, the
// transitions (confirm, release, extend), resize and return_units. A key lives in the same
// table (or map) as a reserve's and follows the same rules: the same key with the same
// request returns the first call's outcome without a second effect; with another request
// (another kind of write, or other arguments) it raises IdempotencyConflict; a key whose
// first call failed is free again.
//
// What a reserve's key stores is the ids of its reservations, read back on a replay. A
// write of these kinds stores its outcome itself (a stock level or a reservation, encoded
// below), so that a replay returns exactly what the first call returned, even after later
// writes changed the row or the reservation.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "stockade/store.hpp"

namespace stockade::detail {

// The first letter of a fingerprint names the kind of write that made the key ("r1:..." a
// reserve, "o1:..." an order, as fingerprint.cpp makes them; the letters below for the
// rest).
enum class KeyedKind : char {
  sell = 's',
  restock = 'k',
  set_on_hand = 'h',
  confirm = 'c',
  release = 'l',
  extend = 'x',
  resize = 'z',
  return_units = 't',
  move_units = 'm',
  transfer = 'n',
  receive = 'e',
  cancel_transfer = 'q',
  confirm_order = 'C',
  release_order = 'L',
  extend_order = 'X',
};

// The kind's name as a caller knows it ("sell", "reserve_order", ...), from a fingerprint.
const char* keyed_kind_name(const std::string& fingerprint);

std::string fingerprint(const SellRequest& request);
// restock (add) or set_on_hand (not add): `value` is the units added, or the new on_hand.
std::string stock_fingerprint(const SkuKey& key, Quantity value, bool add,
                              const std::optional<Version>& expected,
                              const std::optional<FencingToken>& token);
std::string fingerprint(const TransitionRequest& request);
std::string fingerprint(const ResizeRequest& request);
std::string fingerprint(const OrderStepRequest& request);
std::string fingerprint(const ReturnRequest& request);
std::string fingerprint(const MoveRequest& request);
std::string fingerprint(const TransferRequest& request);
std::string fingerprint(const TransferStepRequest& request);

// The conflict of a key made by the request printed `stored` and used again for `now`:
// names the kinds when they differ, never the first request's arguments (they may be
// another caller's).
Error keyed_conflict(const std::string& key, const std::string& stored, const std::string& now);
// Whether a fingerprint is a reserve's, an order's or an allocation's (its key stores reservation
// ids).
bool reserves(const std::string& fingerprint);

// A write's outcome as stored with its key, and read back by a replay. Every field is
// length-prefixed, so any text (a SKU, a buyer) travels unchanged; decoding text that is
// not an encoded outcome of that type raises InvariantViolation.
std::string encode_outcome(const StockLevel& level);
std::string encode_outcome(const Reservation& reservation);
std::string encode_outcome(const std::vector<Reservation>& lines);  // an order step's
std::string encode_outcome(const Transfer& transfer);
// A keyed sell that a one-row fast batch decided (postgres/batch_tx.hpp) stores its level
// in two parts: this prefix, made before the statement runs (the attempt's own id, so that
// a lost commit's probe can tell this statement's key from an older one; its row; and what
// the batch changed on the row after this sale: units sold and held, and changes), and the
// row as the
// statement left it, appended by the statement itself (batched_level_tail_sql), or by C++
// (batched_level_tail) where the keys go in after the row moved. decode_outcome<StockLevel>
// reads both forms; the level is the row right after this sale, as the first call got it.
std::string batched_level_prefix(const std::string& attempt, const SkuKey& key, Quantity sold_after,
                                 Quantity held_after, std::int64_t changes_after);
// Its values, in this order: on_hand, reserved, version, now_us, backorder_limit,
// safety_stock, damaged, quality_control, incoming (a tail stored before the quantity states ends
// after backorder_limit: none withheld).
std::string batched_level_tail(const std::vector<std::int64_t>& values);
// The tail as SQL text over the given expressions (each a bigint), in that order.
std::string batched_level_tail_sql(const std::vector<std::string>& values);

template <class T>
T decode_outcome(const std::string& text);
template <>
StockLevel decode_outcome<StockLevel>(const std::string& text);
template <>
Reservation decode_outcome<Reservation>(const std::string& text);
template <>
std::vector<Reservation> decode_outcome<std::vector<Reservation>>(const std::string& text);
template <>
Transfer decode_outcome<Transfer>(const std::string& text);

}  // namespace stockade::detail
