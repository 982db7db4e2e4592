#include "store/transfers.hpp"

#include <string>

#include "store/error_helpers.hpp"

namespace stockade::detail {

Quantity transferable(const StockLevel& source) {
  const Quantity free = source.on_hand - source.reserved - source.withheld();
  return free > 0 ? free : 0;
}

void check_arrival(const StockLevel& row) {
  StockLevel open = row;
  open.discontinued = false;
  check_writable(open, std::nullopt, std::nullopt);
}

void check_transfer(const StockLevel& source, const StockLevel& destination, Quantity qty) {
  check_writable(source, std::nullopt, std::nullopt);
  check_arrival(destination);
  const Quantity free = transferable(source);
  if (free < qty) {
    ErrorContext context = context_of(source.key);
    context.available = free;
    throw Error(ErrorCode::out_of_stock,
                describe(source.key) + " has " + std::to_string(free) +
                    " units free to transfer (on hand, neither held nor withheld from sale), " +
                    std::to_string(qty) + " requested; nothing was moved",
                std::move(context));
  }
}

Transfer new_transfer(const TransferRequest& request, TimestampUs now) {
  Transfer t;
  t.id = request.id;
  t.sku = request.sku;
  t.source = request.source;
  t.destination = request.destination;
  t.qty = request.qty;
  t.state = TransferState::in_transit;
  t.version = 1;
  t.created_at_us = t.updated_at_us = now;
  t.reason = request.reason;
  t.actor = request.actor;
  return t;
}

TransferState state_of(const Transfer& t) {
  if (t.in_transit() > 0) return TransferState::in_transit;
  return t.received + t.rejected > 0 ? TransferState::received : TransferState::cancelled;
}

bool transfer_consistent(const Transfer& t) {
  return t.qty > 0 && t.received >= 0 && t.rejected >= 0 && t.cancelled >= 0 &&
         t.in_transit() >= 0 && t.state == state_of(t);
}

TransferStep plan_transfer_step(const Transfer& transfer, const TransferStepRequest& request) {
  const Quantity left = transfer.in_transit();
  const std::string named = "transfer " + transfer.id.to_string();
  TransferStep step;
  step.next = transfer;
  if (request.cancel) {
    if (left == 0) {
      throw Error(ErrorCode::invalid_state, named + " has no units in transit to cancel (it is " +
                                                transfer_state_name(transfer.state) + ")");
    }
    step.cancelled = left;
    step.next.cancelled += left;
  } else {
    const Quantity asked = request.accepted + request.rejected;
    if (asked > left) {
      throw Error(ErrorCode::invalid_state,
                  named + " has " + std::to_string(left) + " units in transit, fewer than the " +
                      std::to_string(asked) + " to receive (accepted and rejected); nothing " +
                      "was received");
    }
    step.accepted = request.accepted;
    step.rejected = request.rejected;
    step.next.received += request.accepted;
    step.next.rejected += request.rejected;
  }
  step.next.state = state_of(step.next);
  return step;
}

void validate_transfer(const TransferRequest& request) {
  validate_sku_key(SkuKey{request.sku, request.source});
  validate_sku_key(SkuKey{request.sku, request.destination});
  if (request.source == request.destination) {
    throw_invalid_argument("a transfer's source and destination are the same location");
  }
}

void validate_transfer_step(const TransferStepRequest& request) {
  if (request.cancel) return;
  if (request.accepted < 0 || request.rejected < 0 || request.accepted > quantity_max ||
      request.rejected > quantity_max) {
    throw_invalid_argument("accepted and rejected must be between 0 and " +
                           std::to_string(quantity_max));
  }
  if (request.accepted + request.rejected == 0) {
    throw_invalid_argument("a receive takes at least one unit (accepted or rejected)");
  }
}

}  // namespace stockade::detail
