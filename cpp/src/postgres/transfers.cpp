// PostgresStore: transfers between locations. A transfer locks its rows in key order (the
// destination's made, if it has none, with the units in transit), decides on them
// (store/transfers.hpp), writes them and inserts the transfer; a step locks the transfer,
// then its rows. Each is one transaction; with a key, a lost COMMIT settles by the key.
#include <algorithm>

#include "postgres/postgres_store_impl.hpp"
#include "store/keyed.hpp"
#include "store/transfers.hpp"

namespace stockade::detail::pg {

namespace {

Transfer transfer_from(const pqxx::row& row) {
  Transfer t;
  t.id = Uuid::parse(row[0].c_str());
  t.sku = row[1].as<std::string>();
  t.source = row[2].as<std::string>();
  t.destination = row[3].as<std::string>();
  t.qty = row[4].as<std::int64_t>();
  t.received = row[5].as<std::int64_t>();
  t.rejected = row[6].as<std::int64_t>();
  t.cancelled = row[7].as<std::int64_t>();
  t.state = parse_transfer_state(row[8].as<std::string>());
  t.version = row[9].as<std::int64_t>();
  t.created_at_us = row[10].as<std::int64_t>();
  t.updated_at_us = row[11].as<std::int64_t>();
  if (!row[12].is_null()) t.reason = row[12].as<std::string>();
  if (!row[13].is_null()) t.actor = row[13].as<std::string>();
  return t;
}

[[noreturn]] void throw_transfer_not_found(const Uuid& id) {
  throw Error(ErrorCode::not_found, "no transfer " + id.to_string());
}

}  // namespace

StockLevel PostgresStore::write_transit(Tx& tx, const StockLevel& row, Quantity on_hand,
                                        Quantity incoming) {
  const SkuKey& key = row.key;
  return observed_write(level_from(key, tx.exec_on(shard_of(key), Stmt::stock_set_transit, key.sku,
                                                   key.location, on_hand, incoming, key.slot)[0]));
}

Transfer PostgresStore::transfer(const TransferRequest& request) {
  const SkuKey from{request.sku, request.source, 0}, to{request.sku, request.destination, 0};
  std::optional<KeyedWrite> k;
  if (request.idempotency_key) {
    k = KeyedWrite{*request.idempotency_key, fingerprint(request), shard_of(from)};
  }
  const auto body = [&](Tx& tx) {
    // A destination without a row gets one first, at zero units (as a restock makes one): a
    // row being made holds no lock that a transaction waits on while it holds others, so
    // the two rows are then locked in key order. A refusal rolls the new row back too.
    tx.exec_on(shard_of(to), Stmt::stock_insert, to.sku, to.location, Quantity{0}, to.slot);
    Level source, destination;
    for (const SkuKey& key : {std::min(from, to), std::max(from, to)}) {  // in key order
      (key == from ? source : destination) = read_row(tx, Stmt::stock_lock, key);
    }
    if (!source) throw_stock_not_found(from);
    if (!destination) throw_stock_not_found(to);  // rows are never deleted: not reached
    check_transfer(*source, *destination, request.qty);
    write_transit(tx, *source, source->on_hand - request.qty, source->incoming);
    write_transit(tx, *destination, destination->on_hand, destination->incoming + request.qty);
    return transfer_from(tx.exec_on(request.id.shard_key(), Stmt::transfer_insert,
                                    request.id.to_string(), request.sku, request.source,
                                    request.destination, request.qty, request.reason.value_or(""),
                                    request.actor.value_or(""))[0]);
  };
  if (k) return keyed<Transfer>(k, nullptr, context_of(from), body);
  // Without a key, a lost COMMIT settles by the transfer's id, which the engine made: one
  // transaction writes the transfer with its rows, so finding it means all of it landed.
  // On Citus a step over two shards commits on each in turn (two-phase), and may be seen
  // part-way: there it stays InDoubt.
  const CallDeadline deadline(options_.call_timeout_ms);
  for (int lost = 0;; ++lost) {
    try {
      return run(nullptr, context_of(from), body);
    } catch (const LostCommit& e) {
      if (lost > 0 || statements_->citus()) throw;
      std::optional<Transfer> found;
      try {
        found = get_transfer(request.id);
      } catch (const Error& unread) {
        landing_unreadable(e, unread);
      }
      settle_landing(e, found.has_value(), ", and its transfer is returned to the caller");
      if (found) return *found;
    }
  }
}

Transfer PostgresStore::transfer_step(const TransferStepRequest& request) {
  const std::uint16_t shard = request.id.shard_key();
  std::optional<KeyedWrite> k;
  if (request.idempotency_key) {
    k = KeyedWrite{*request.idempotency_key, fingerprint(request), shard};
  }
  return keyed<Transfer>(k, nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result locked = tx.exec_on(shard, Stmt::transfer_lock, request.id.to_string());
    if (locked.empty()) throw_transfer_not_found(request.id);
    const Transfer transfer = transfer_from(locked[0]);
    const TransferStep step = plan_transfer_step(transfer, request);
    const SkuKey from = transfer.source_key(), to = transfer.destination_key();
    if (step.cancelled > 0) {
      Level source, destination;
      for (const SkuKey& key : {std::min(from, to), std::max(from, to)}) {
        (key == from ? source : destination) = read_row(tx, Stmt::stock_lock, key);
      }
      if (!source) throw_stock_not_found(from);
      if (!destination) throw_stock_not_found(to);
      check_arrival(*source);
      check_arrival(*destination);
      write_transit(tx, *destination, destination->on_hand, destination->incoming - step.cancelled);
      write_transit(tx, *source,
                    checked_on_hand(source->on_hand, step.cancelled, "a transfer's units"),
                    source->incoming);
    } else {
      const Level destination = read_row(tx, Stmt::stock_lock, to);
      if (!destination) throw_stock_not_found(to);
      check_arrival(*destination);
      // The units accepted, then those rejected: a write (and a journal entry) each.
      StockLevel now = *destination;
      if (step.accepted > 0) {
        now = write_transit(tx, now,
                            checked_on_hand(now.on_hand, step.accepted, "a transfer's units"),
                            now.incoming - step.accepted);
      }
      if (step.rejected > 0) write_transit(tx, now, now.on_hand, now.incoming - step.rejected);
    }
    return transfer_from(tx.exec_on(shard, Stmt::transfer_set, request.id.to_string(),
                                    step.next.received, step.next.rejected, step.next.cancelled,
                                    std::string(transfer_state_name(step.next.state)))[0]);
  });
}

std::optional<Transfer> PostgresStore::get_transfer(const Uuid& id) {
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) -> std::optional<Transfer> {
    const pqxx::result rows = tx.exec_on(id.shard_key(), Stmt::transfer_get, id.to_string());
    if (rows.empty()) return std::nullopt;
    return transfer_from(rows[0]);
  });
}

std::vector<Transfer> PostgresStore::find_transfers(const TransferQuery& query) {
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result rows = tx.exec(
        Stmt::transfers_list, query.sku.value_or(""),
        std::string(query.state ? transfer_state_name(*query.state) : ""),
        (query.after ? *query.after : Uuid{}).to_string(), static_cast<std::int64_t>(query.limit));
    std::vector<Transfer> out;
    for (const auto& row : rows) out.push_back(transfer_from(row));
    return out;
  });
}

}  // namespace stockade::detail::pg
