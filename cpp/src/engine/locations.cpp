// Engine: what a location's row holds besides its free units, and what moves between
// locations. The quantity states (set_safety_stock, move_units: one write under the row's
// lock, decided by the store, store/unit_states.hpp; neither built for a SKU with hot-row
// slots), and transfers (transfer, receive, cancel_transfer, get_transfer, transfers: one
// transaction each, store/transfers.hpp; they take and give units at a SKU's own rows).
#include <string>

#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "stockade/engine.hpp"
#include "stockade/journal.hpp"
#include "store/error_helpers.hpp"
#include "store/transfers.hpp"
#include "store/unit_states.hpp"

namespace stockade {

StockLevel Engine::set_safety_stock(const SkuKey& key, Quantity units,
                                    std::optional<Version> expected,
                                    std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  if (units < 0 || units > quantity_max) {
    throw_invalid_argument("safety_stock must be between 0 and " + std::to_string(quantity_max) +
                           ", got " + std::to_string(units));
  }
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::set_safety_stock, [&] {
    slots_->refuse_on_slots(key, "safety stock");
    return store_->set_safety_stock(key, units, expected, token);
  });
}

StockLevel Engine::move_units(MoveRequest request, const std::string& reason,
                              const std::string& actor) {
  check_process();
  validate_sku_key(request.key);
  validate_qty(request.qty);
  detail::validate_move(request.from, request.to);
  validate_expected_version(request.expected_version);
  validate_fencing_token(request.fencing_token);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  validate_idempotency_key(request.idempotency_key);
  const bool off = request.to == UnitState::written_off;
  const NoteScope note({off ? "write_off" : "move", reason, actor, ""});
  return observed(Op::move_units, [&] {
    slots_->refuse_on_slots(request.key, "moving units between states");
    return store_->move_units(request);
  });
}

Transfer Engine::transfer(TransferRequest request) {
  check_process();
  validate_qty(request.qty);
  detail::validate_transfer(request);
  validate_note_text(request.reason.value_or(""), "reason");
  validate_note_text(request.actor.value_or(""), "actor");
  validate_idempotency_key(request.idempotency_key);
  const std::uint16_t shard = row_shard_key(request.sku, request.source);
  request.id = make_uuid_v7(SystemClock().now_us() / 1000, shard);
  const NoteScope note({"transfer", request.reason.value_or(""), request.actor.value_or(""),
                        request.id.to_string()});
  return observed(Op::transfer, [&] { return store_->transfer(request); });
}

Transfer Engine::transfer_step(const TransferStepRequest& request) {
  check_process();
  detail::validate_transfer_step(request);
  validate_idempotency_key(request.idempotency_key);
  const NoteScope note(
      {request.cancel ? "cancel_transfer" : "receive", "", "", request.id.to_string()});
  return observed(request.cancel ? Op::cancel_transfer : Op::receive,
                  [&] { return store_->transfer_step(request); });
}

Transfer Engine::get_transfer(const Uuid& id) {
  check_process();
  return observed(Op::transfers, [&] {
    std::optional<Transfer> found = store_->get_transfer(id);
    if (!found) throw Error(ErrorCode::not_found, "no transfer " + id.to_string());
    return *found;
  });
}

std::vector<Transfer> Engine::transfers(const TransferQuery& query) {
  check_process();
  if (query.sku) validate_sku_key(SkuKey{*query.sku, "default"});
  if (query.limit == 0 || query.limit > transfers_limit_max) {
    throw_invalid_argument("limit must be between 1 and " + std::to_string(transfers_limit_max) +
                           ", got " + std::to_string(query.limit));
  }
  return observed(Op::transfers, [&] { return store_->find_transfers(query); });
}

}  // namespace stockade
