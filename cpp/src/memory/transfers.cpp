// MemoryStore: transfers between locations. The rows a transfer or a step writes are
// latched in key order and decided on as latched (store/transfers.hpp); the transfers
// themselves live in one map under transfers_mutex_, which a step holds while it latches
// its rows (lock order: transfers_mutex_, then row latches).
#include <algorithm>

#include "memory/memory_store_impl.hpp"
#include "store/error_helpers.hpp"
#include "store/transfers.hpp"

namespace stockade::detail {

namespace {

[[noreturn]] void throw_transfer_not_found(const Uuid& id) {
  throw Error(ErrorCode::not_found, "no transfer " + id.to_string());
}

}  // namespace

Transfer MemoryStore::transfer(const TransferRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<Transfer>(request.idempotency_key, print, [&] {
    expire_lapsed();  // a lapsed hold keeps no units a transfer may take
    const SkuKey from{request.sku, request.source, 0}, to{request.sku, request.destination, 0};
    StockRow& source = require_row(from);
    StockRow* destination = find_row(to);
    if (destination == nullptr) {
      // A destination without a row gets one at zero units first (as a restock makes one),
      // with no latch held: a reader may hold the row's stock shard while it waits for a
      // latch. Not if the source, as read now, refuses the transfer: a refusal makes no
      // row. (If the source changes before its latch below and refuses then, the row
      // stays, empty: the memory store has no transaction to roll it back.)
      StockLevel none;
      none.key = to;
      check_transfer(level_at(from, source.cell.read().values, clock_->now_us()), none,
                     request.qty);
      destination = insert_row(to, RowValues{0, 0, 1, clock_->now_us()}).first;
    }
    const TimestampUs now = clock_->now_us();
    {
      std::vector<StockRow*> rows{&source, destination};
      std::sort(rows.begin(), rows.end(),
                [](const StockRow* a, const StockRow* b) { return a->key < b->key; });
      std::vector<RowLatch> latches;
      for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
      RowLatch& src = rows[0] == &source ? latches[0] : latches[1];
      RowLatch& dst = rows[0] == &source ? latches[1] : latches[0];
      check_transfer(level_at(from, src.values(), now), level_at(to, dst.values(), now),
                     request.qty);
      RowValues out = changed(src.values(), now), in = changed(dst.values(), now);
      out.on_hand -= request.qty;
      in.incoming = checked_add(in.incoming, request.qty, "a transfer's incoming");
      src.publish(out, from);
      dst.publish(in, to);
    }
    {
      const Transfer made = new_transfer(request, now);
      std::lock_guard<std::mutex> guard(transfers_mutex_);
      transfers_.emplace(made.id, made);
      return made;
    }
  });
}

Transfer MemoryStore::transfer_step(const TransferStepRequest& request) {
  const std::string print = request.idempotency_key ? fingerprint(request) : std::string();
  return keyed<Transfer>(request.idempotency_key, print, [&] {
    std::lock_guard<std::mutex> guard(transfers_mutex_);
    auto found = transfers_.find(request.id);
    if (found == transfers_.end()) throw_transfer_not_found(request.id);
    Transfer& transfer = found->second;
    const TransferStep step = plan_transfer_step(transfer, request);
    const SkuKey from = transfer.source_key(), to = transfer.destination_key();
    StockRow& destination = require_row(to);
    const TimestampUs now = clock_->now_us();
    // Each change of a row is a write of its own (and a journal entry): the units accepted,
    // then those rejected, or those cancelled, which go back to the source too. Every row
    // is checked before any is written.
    const auto moved = [&](const RowValues& v, Quantity on_hand, Quantity incoming) {
      RowValues next = changed(v, now);
      if (on_hand > 0) next.on_hand = checked_on_hand(next.on_hand, on_hand, "a transfer's units");
      next.incoming += incoming;  // never up here: a step only takes units out of transit
      return next;
    };
    if (step.cancelled > 0) {
      StockRow& source = require_row(from);
      std::vector<StockRow*> rows{&source, &destination};
      std::sort(rows.begin(), rows.end(),
                [](const StockRow* a, const StockRow* b) { return a->key < b->key; });
      std::vector<RowLatch> latches;
      for (StockRow* row : rows) latches.emplace_back(row->cell, row->cell.latch());
      for (std::size_t i = 0; i < rows.size(); ++i) {
        check_arrival(level_at(rows[i]->key, latches[i].values(), now));
      }
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const bool back = rows[i] == &source;
        latches[i].publish(
            moved(latches[i].values(), back ? step.cancelled : 0, back ? 0 : -step.cancelled),
            rows[i]->key);
      }
    } else {
      RowLatch first(destination.cell, destination.cell.latch());
      check_arrival(level_at(to, first.values(), now));
      const Quantity accepted = step.accepted, rejected = step.rejected;
      first.publish(accepted > 0 ? moved(first.values(), accepted, -accepted)
                                 : moved(first.values(), 0, -rejected),
                    to);
      if (accepted > 0 && rejected > 0) {  // the rest of the same step: no check again
        RowLatch second(destination.cell, destination.cell.latch());
        second.publish(moved(second.values(), 0, -rejected), to);
      }
    }
    transfer = step.next;
    transfer.version += 1;
    transfer.updated_at_us = now;
    STOCKADE_ASSERT(transfer_consistent(transfer));
    if (transfer.state != TransferState::in_transit) {
      finished_transfers_.emplace(transfer.updated_at_us, transfer.id);
    }
    return transfer;
  });
}

std::optional<Transfer> MemoryStore::get_transfer(const Uuid& id) {
  std::lock_guard<std::mutex> guard(transfers_mutex_);
  auto found = transfers_.find(id);
  if (found == transfers_.end()) return std::nullopt;
  return found->second;
}

std::vector<Transfer> MemoryStore::find_transfers(const TransferQuery& query) {
  std::vector<Transfer> out;
  std::lock_guard<std::mutex> guard(transfers_mutex_);
  auto it = query.after ? transfers_.upper_bound(*query.after) : transfers_.begin();
  for (; it != transfers_.end() && out.size() < query.limit; ++it) {
    const Transfer& t = it->second;
    if (query.sku && t.sku != *query.sku) continue;
    if (query.state && t.state != *query.state) continue;
    out.push_back(t);
  }
  return out;
}

}  // namespace stockade::detail
