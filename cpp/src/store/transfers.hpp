// Transfers between locations (Store::transfer, Store::transfer_step), decided once for
// both stores: each locks the transfer (for a step) and then the rows in key order, asks
// these what they become, and writes that in the same transaction.
#pragma once

#include "stockade/store.hpp"

namespace stockade::detail {

// The units a transfer may take from its source: on hand, neither held nor withheld from
// sale (safety stock, damaged, quality control). Never backorders: units that are not
// there cannot ship.
Quantity transferable(const StockLevel& source);

// Checks a transfer against its rows as locked: a discontinued source, or a live lease on
// either row, refuses it (LeaseHeld, Discontinued); fewer transferable units than `qty`
// raises OutOfStock.
void check_transfer(const StockLevel& source, const StockLevel& destination, Quantity qty);

// The transfer as inserted: every unit in transit.
Transfer new_transfer(const TransferRequest& request, TimestampUs now);

// A step decided on the transfer as locked: the transfer after it (version and time not
// moved), and how many units go where.
struct TransferStep {
  Transfer next;
  Quantity accepted = 0;   // destination: on_hand up, incoming down
  Quantity rejected = 0;   // destination: incoming down (written off)
  Quantity cancelled = 0;  // source: on_hand up; destination: incoming down
};
TransferStep plan_transfer_step(const Transfer& transfer, const TransferStepRequest& request);

// The state a transfer's units give it (TransferState), and whether it keeps the identity
// of types.hpp (the schema's transfer_units CHECK).
TransferState state_of(const Transfer& transfer);
bool transfer_consistent(const Transfer& transfer);

// A lease live on a row a receive or a cancel adds units to refuses them (LeaseHeld); a
// discontinued row does not: the units arrive, or come back, all the same.
void check_arrival(const StockLevel& row);

// The checks of a request's arguments before any store sees it (Engine).
void validate_transfer(const TransferRequest& request);
void validate_transfer_step(const TransferStepRequest& request);

}  // namespace stockade::detail
