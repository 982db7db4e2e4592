// BatchTx's steps (batch_tx.hpp): claim keys, lock reservations and rows, decide each
// request, write the rows, the reservations and the transitions, free refused keys.
#include <algorithm>
#include <limits>

#include "base/invariant.hpp"
#include "postgres/batch_tx.hpp"
#include "stockade/hash.hpp"
#include "store/fingerprint.hpp"
#include "store/lifecycle.hpp"

namespace stockade::detail::pg {

namespace {

// The reserve a batched request asks for, as the per-request path takes it.
ReserveRequest request_of(const BatchItem& item) {
  WriteOptions options;
  options.buyer = item.buyer;
  options.ref = item.ref;
  options.metadata = item.metadata;
  return ReserveRequest{item.key, item.qty,     item.ttl_us, item.idempotency_key,
                        options,  item.order_id};
}

Asked asked_of(const BatchItem& item) {
  return asked_by(request_of(item));
}

// The lifecycle rules a confirm or release meets, in their order: the full path
// (decide_transition) and the fast path's trial (read_steps) both ask them here. The
// expected version, a hold still held (InvalidState or ReservationExpired), then the units
// (settle_transition); a refusal throws and leaves `r` as it was. A `lapsed` hold that
// passed the first two expires whole, whatever was asked. Moves `r`'s units and state (not
// its version) and returns what the rows move by.
Settlement step_by_rules(Reservation& r, const BatchItem& item, bool lapsed) {
  check_live(r, item.expected_version);
  Settlement moved;
  if (lapsed) {
    moved.freed = r.held();
    settle_units(r, Settle::expire, moved.freed);
    return moved;
  }
  Reservation next = r;  // decided first: a refusal changes nothing
  moved = settle_transition(next, item.op == BatchOp::confirm, item.qty, item.release_rest);
  r = std::move(next);
  return moved;
}

}  // namespace

// A keyed request's fingerprint, as its per-request form prints it.
std::string print_of(const BatchItem& item) {
  switch (item.op) {
    case BatchOp::reserve:
      return fingerprint(request_of(item));
    case BatchOp::sell:
      return fingerprint(SellRequest{item.key, item.qty, WriteOptions{}, item.idempotency_key});
    case BatchOp::confirm:
    case BatchOp::release:
      break;
  }
  return fingerprint(TransitionRequest{
      item.id, item.op == BatchOp::confirm ? Transition::confirm : Transition::release, 0,
      item.expected_version, item.qty > 0 ? std::optional<Quantity>(item.qty) : std::nullopt,
      item.release_rest, item.idempotency_key});
}

// A keyed request's outcome as its key stores it (a sell's level, a step's reservation).
std::string outcome_of(const BatchItem& item) {
  return item.op == BatchOp::sell ? encode_outcome(item.level) : encode_outcome(item.reservation);
}

// The outcome a key stored, as the request's: a sell's level, a step's reservation.
void adopt_outcome(BatchItem& item, const std::string& stored) {
  if (item.op == BatchOp::sell) {
    item.level = decode_outcome<StockLevel>(stored);
  } else {
    item.reservation = decode_outcome<Reservation>(stored);
  }
  item.ok = true;
}

void BatchTx::claim_keys(PostgresStore& store, Tx& tx) {
  std::vector<std::string> names, fingerprints, ids;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (!keyed(i)) continue;
    const BatchItem& item = *items_[i];
    prints_[i] = print_of(item);
    const std::string& print = prints_[i];
    auto [it, first] = keys_.try_emplace(*item.idempotency_key);
    if (!first) {
      decided_[i] = true;  // a duplicate inside the batch: settled by settle_duplicates()
      continue;
    }
    it->second = KeyClaim{i, print, false, std::nullopt, {}, std::nullopt};
    names.push_back(it->first);
    fingerprints.push_back(print);
    ids.push_back(item.op == BatchOp::reserve ? ids_[i].to_string() : std::string());
  }
  if (names.empty()) return;
  const Statements& statements = tx.conn.statements();
  const pqxx::result claimed = statements.citus()
                                   ? write_keys_citus(tx, names, fingerprints, ids, true)
                                   : tx.exec_on(shard_, Stmt::batch_claim, text_array(names),
                                                text_array(fingerprints), text_array(ids));
  for (const auto& row : claimed) keys_.at(row[0].as<std::string>()).claimed = true;
  std::vector<std::string> taken;
  for (const auto& [name, claim] : keys_) {
    if (!claim.claimed) taken.push_back(name);
  }
  if (!taken.empty()) replay(store, tx, taken);
}

// Keys committed before this batch: the same request replays its reservation (a reserve) or
// its stored outcome (a sell's level, a confirm's or release's reservation), a different one
// is a conflict.
void BatchTx::replay(PostgresStore& store, Tx& tx, const std::vector<std::string>& names) {
  const pqxx::result found = tx.exec_on(shard_, Stmt::batch_keys_get, text_array(names));
  for (const auto& row : found) {
    KeyClaim& claim = keys_.at(row[0].as<std::string>());
    BatchItem& item = *items_[claim.first];
    decided_[claim.first] = true;
    claim.stored_fingerprint = row[1].as<std::string>();
    // Read even on a conflict: a later duplicate in the batch may be the same request.
    if (reserves(*claim.stored_fingerprint)) {
      claim.stored = store.fetch(tx, parse_ids(row[2].as<std::string>()));
    } else if (!row[3].is_null()) {
      claim.stored_outcome = row[3].as<std::string>();
    }
    settle_stored(item, claim.fingerprint, claim);
  }
  for (const std::string& name : names) {
    const KeyClaim& claim = keys_.at(name);
    if (!decided_[claim.first]) {
      // Neither claimed nor found: its holder rolled back between the two statements.
      // Rare; the request fails as a lock wait would, and its caller may retry at once.
      fail(*items_[claim.first],
           Error(ErrorCode::lock_timeout,
                 "idempotency key " + shown(name) + " was released by a concurrent request; retry",
                 context_of(items_[claim.first]->key)));
      decided_[claim.first] = true;
    }
  }
}

void BatchTx::lock_reservations(Tx& tx) {
  std::vector<Uuid> ids;
  for (const BatchItem* item : items_) {
    if (is_transition(item->op)) ids.push_back(item->id);
  }
  if (ids.empty()) return;
  for (const auto& row : tx.exec_on(shard_, Stmt::batch_lock_reservations, uuid_array(ids))) {
    Hold hold;
    hold.reservation = read_reservation(row, &hold.lapsed);
    holds_.emplace(hold.reservation.id, std::move(hold));
  }
}

void BatchTx::lock_rows(Tx& tx) {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (decided_[i]) continue;
    if (!is_transition(items_[i]->op)) {
      rows_.try_emplace(items_[i]->key);
    } else if (auto it = holds_.find(items_[i]->id); it != holds_.end()) {
      rows_.try_emplace(it->second.reservation.key);
    }
  }
  if (rows_.empty()) return;
  std::vector<std::string> skus, locations;
  std::vector<std::int64_t> slots;
  for (const auto& [key, state] : rows_) {
    skus.push_back(key.sku);
    locations.push_back(key.location);
    slots.push_back(key.slot);
  }
  std::map<SkuKey, RowState> found;
  const pqxx::result rows = tx.exec_on(shard_, Stmt::batch_lock, text_array(skus),
                                       text_array(locations), int_array(slots));
  for (const auto& row : rows) {
    RowState state;
    state.on_hand = row[2].as<std::int64_t>();
    state.reserved = row[3].as<std::int64_t>();
    state.version = row[4].as<std::int64_t>();
    now_us_ = row[5].as<std::int64_t>();
    read_limits(row, 6, state);
    state.discontinued = row[after_limits].as<bool>();
    state.leased = row[after_limits + 1].as<bool>();
    found.emplace(
        SkuKey{row[0].as<std::string>(), row[1].as<std::string>(), row[after_limits + 2].as<int>()},
        state);
  }
  rows_ = std::move(found);
}

void BatchTx::decide() {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (decided_[i]) continue;
    decided_[i] = true;
    BatchItem& item = *items_[i];
    if (is_transition(item.op)) {
      decide_transition(item);
      continue;
    }
    auto it = rows_.find(item.key);
    if (it == rows_.end()) {
      fail(item, stock_not_found(item.key));
      continue;
    }
    RowState& row = it->second;
    // as locked, or as decided so far
    STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
    STOCKADE_ASSERT(item.qty > 0);
    if (item.op == BatchOp::reserve && item.buyer && limit_refuses(item)) continue;
    if (row.discontinued || row.leased) {  // batched calls carry no fencing token
      try {
        check_writable(level_of(item.key, row), std::nullopt, std::nullopt);
      } catch (const Error& e) {
        fail(item, e);
        continue;
      }
    }
    const Quantity available = row.available();
    if (available < item.qty) {
      fail(item, out_of_stock(item.key, available, item.qty, row.version));
      continue;
    }
    ++row.changes;
    if (item.op == BatchOp::sell) {
      row.on_hand -= item.qty;
      row.sold += item.qty;
      STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
      item.level = level_of(item.key, row);
      item.level.updated_at_us = now_us_;
    } else {
      row.reserved += item.qty;
      row.held += item.qty;
      STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
      Reservation& r = item.reservation;
      r = Reservation{};
      r.id = ids_[i];
      r.key = item.key;
      r.qty = item.qty;
      r.version = 1;
      r.expires_at_us = now_us_ + item.ttl_us;
      r.created_at_us = r.updated_at_us = now_us_;
      r.idempotency_key = item.idempotency_key;
      r.buyer = item.buyer;
      r.ref = item.ref;
      r.metadata = item.metadata;
      r.order_id = item.order_id;
      if (item.buyer) {
        if (auto limit = limits_.find(item.key.sku); limit != limits_.end()) {
          r.limit_group = limit->second.first;
          allowances_[{limit->second.first, *item.buyer}].delta += item.qty;
        }
      }
    }
    item.ok = true;
  }
}

// Writes every row's summed deltas and inserts every reservation granted here (not those
// replayed from an earlier key), with `statement` (batch_write or batch_fast).
pqxx::result BatchTx::write(Tx& tx, Stmt statement) {
  std::vector<std::string> skus, locations;
  std::vector<std::int64_t> sold, held, changes, slots;
  for (const auto& [key, row] : rows_) {
    if (row.changes == 0 && statement == Stmt::batch_write) continue;
    skus.push_back(key.sku);
    locations.push_back(key.location);
    slots.push_back(key.slot);
    sold.push_back(row.sold);
    held.push_back(row.held);
    changes.push_back(row.changes);
  }
  std::vector<std::string> ids, r_skus, r_locations, r_keys, r_buyers, r_groups, r_refs, r_meta,
      r_orders;
  std::vector<std::int64_t> qtys, ttls, r_slots;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!item.ok || item.op != BatchOp::reserve || item.reservation.id != ids_[i]) continue;
    ids.push_back(ids_[i].to_string());
    r_skus.push_back(item.key.sku);
    r_locations.push_back(item.key.location);
    r_slots.push_back(item.key.slot);
    r_keys.push_back(item.idempotency_key.value_or(std::string()));
    r_buyers.push_back(item.reservation.buyer.value_or(std::string()));
    r_groups.push_back(item.reservation.limit_group.value_or(std::string()));
    r_refs.push_back(item.ref.value_or(std::string()));
    r_meta.push_back(item.metadata.value_or(std::string()));
    r_orders.push_back(item.order_id ? item.order_id->to_string() : std::string());
    qtys.push_back(item.qty);
    ttls.push_back(item.ttl_us);
  }
  reservations_written_ = ids.size();
  if (skus.empty()) return pqxx::result();
  if (tx.conn.statements().citus() && statement == Stmt::batch_write) {
    // Two statements there (see citus_move_one in statements.cpp); the rows are locked.
    const std::size_t moved = rows_changed(
        tx.exec_on(shard_, Stmt::citus_move, text_array(skus), text_array(locations),
                   int_array(sold), int_array(held), int_array(changes), int_array(slots)));
    if (moved != skus.size()) {
      throw Error(ErrorCode::invariant_violation, "a batch moved " + std::to_string(moved) +
                                                      " of its " + std::to_string(skus.size()) +
                                                      " locked rows; rolled back");
    }
    if (ids.empty()) return pqxx::result();
    return write_holds_citus(tx, now_us_,
                             CitusHolds{ids, r_skus, r_locations, r_slots, qtys, ttls, r_keys,
                                        r_buyers, r_groups, r_refs, r_meta, r_orders});
  }
  return tx.exec_on(shard_, statement, text_array(skus), text_array(locations), int_array(sold),
                    int_array(held), int_array(changes), text_array(ids), text_array(r_skus),
                    text_array(r_locations), int_array(qtys), int_array(ttls), text_array(r_keys),
                    static_cast<std::int64_t>(skus.size()), text_array(r_buyers),
                    text_array(r_groups), int_array(slots), int_array(r_slots), text_array(r_refs),
                    text_array(r_meta), text_array(r_orders));
}

std::size_t BatchTx::write_full(Tx& tx) {
  return rows_written(write(tx, Stmt::batch_write),
                      delegated_writes_ && tx.conn.statements().citus());
}

pqxx::result BatchTx::write_holds_citus(Tx& tx, std::int64_t now_us, const CitusHolds& h) {
  if (delegated_writes_) {
    return tx.exec_on(shard_, Stmt::citus_batch_holds, now_us, text_array(h.ids),
                      text_array(h.skus), text_array(h.locations), int_array(h.slots),
                      int_array(h.qtys), int_array(h.ttls), text_array(h.keys),
                      text_array(h.buyers), text_array(h.groups), text_array(h.orders),
                      text_array(h.refs), text_array(h.metadata));
  }
  return tx.conn.exec_sql(
      tx.work, citus_holds_sql(quoting(tx.work), tx.conn.statements().schema(), shard_, now_us, h));
}

pqxx::result BatchTx::write_keys_citus(Tx& tx, const std::vector<std::string>& names,
                                       const std::vector<std::string>& prints,
                                       const std::vector<std::string>& ids, bool skip_taken,
                                       const std::vector<std::string>& outcomes) {
  if (delegated_writes_) {
    return tx.exec_on(shard_, Stmt::citus_batch_keys, text_array(names), text_array(prints),
                      text_array(ids), text_array(outcomes), skip_taken);
  }
  return tx.conn.exec_sql(
      tx.work, citus_keys_sql(quoting(tx.work), tx.conn.statements().schema(), shard_, names,
                              prints, ids, skip_taken, outcomes));
}

// write() for a batch on several rows, through batch_fast: a row that lacked room when the
// UPDATE reached it, though the lock's verdict said it had some, aborts the statement
// (SK001), which undoes it whole; the full path then decides on the rows as locked.
pqxx::result BatchTx::write_fast(Tx& tx) {
  try {
    return write(tx, Stmt::batch_fast);
  } catch (const pqxx::sql_error& e) {
    if (e.sqlstate() == statement_aborted) throw FastMiss{};
    throw;
  }
}

// A confirm or release, by the per-request rules: NotFound, VersionConflict, a hold no
// longer held (InvalidState or ReservationExpired); a lapsed hold is expired here, which
// the batch commits, and then raises ReservationExpired.
void BatchTx::decide_transition(BatchItem& item) {
  auto it = holds_.find(item.id);
  if (it == holds_.end()) {
    ErrorContext context;
    context.reservation_id = item.id;
    fail(item, Error(ErrorCode::not_found, "no reservation " + item.id.to_string(), context));
    return;
  }
  Reservation& r = it->second.reservation;
  try {
    check_live(r, item.expected_version);  // the caller's refusals before the row's check
  } catch (const Error& e) {
    fail(item, e);
    return;
  }
  auto found = rows_.find(r.key);  // locked with the batch's rows
  if (found == rows_.end()) {
    fail(item,
         Error(ErrorCode::invariant_violation,
               "the stock row of a reservation is missing: " + describe(r.key), context_of(r.key)));
    return;
  }
  RowState& row = found->second;
  const bool lapsed = it->second.lapsed;
  Settlement moved;
  try {
    moved = step_by_rules(r, item, lapsed);
  } catch (const Error& e) {
    fail(item, e);
    return;
  }
  const Quantity units = moved.sold + moved.freed;
  STOCKADE_ASSERT(units > 0 && units <= row.reserved);  // a held hold's units are reserved
  if (frees_allowance(r, moved)) {
    if (auto a = allowances_.find({*r.limit_group, *r.buyer}); a != allowances_.end()) {
      a->second.delta -= moved.freed;
    }
  }
  row.reserved -= units;
  row.held -= units;
  row.on_hand -= moved.sold;
  row.sold += moved.sold;
  ++row.changes;
  STOCKADE_ASSERT_ROW(row.on_hand, row.reserved, row.backorder_limit);
  ++r.version;
  r.updated_at_us = now_us_;
  if (!it->second.changed) {
    it->second.changed = true;
    transitions_.push_back(r.id);
  }
  if (lapsed) {
    fail(item, not_holdable(r));
    return;
  }
  item.reservation = r;
  item.ok = true;
}

void BatchTx::write_transitions(Tx& tx) {
  if (transitions_.empty()) return;
  std::vector<Uuid> ids;
  std::vector<std::string> states;
  std::vector<std::int64_t> confirmed, released, expired, versions;
  for (const Uuid& id : transitions_) {
    const Reservation& r = holds_.at(id).reservation;
    ids.push_back(r.id);
    states.emplace_back(reservation_state_name(r.state));
    confirmed.push_back(r.confirmed);
    released.push_back(r.released);
    expired.push_back(r.expired);
    versions.push_back(r.version);
  }
  const std::size_t written = rows_changed(tx.exec_on(
      shard_, Stmt::batch_transition, uuid_array(ids), text_array(states), int_array(confirmed),
      int_array(released), int_array(expired), int_array(versions)));
  if (written != ids.size()) {
    throw Error(ErrorCode::invariant_violation, "a batch changed " + std::to_string(written) +
                                                    " of " + std::to_string(ids.size()) +
                                                    " reservations; rolled back");
  }
}

// The arrays of a one-row batch's reservations (write_one), one element per granted
// reserve, and of its new keys (one per keyed reserve).
struct OneRowHolds {
  std::vector<std::string> ids, keys, buyers, refs, metadata, orders;
  std::vector<std::int64_t> qtys, ttls;
  bool any_buyer = false;
};
struct NewKeys {
  std::vector<std::string> names, prints, ids, outcomes;
};

// The reservations a one-row fast statement inserts: the batch's granted reserves.
OneRowHolds BatchTx::one_row_holds() {
  OneRowHolds h;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    if (!item.ok || item.op != BatchOp::reserve) continue;
    h.ids.push_back(ids_[i].to_string());
    h.keys.push_back(item.idempotency_key.value_or(std::string()));
    h.buyers.push_back(item.buyer.value_or(std::string()));
    h.any_buyer = h.any_buyer || item.buyer.has_value();
    h.refs.push_back(item.ref.value_or(std::string()));
    h.metadata.push_back(item.metadata.value_or(std::string()));
    h.orders.push_back(item.order_id ? item.order_id->to_string() : std::string());
    h.qtys.push_back(item.qty);
    h.ttls.push_back(item.ttl_us);
  }
  reservations_written_ = h.ids.size();
  return h;
}

// write() for a batch on one row, through batch_fast_one: the key travels once.
pqxx::result BatchTx::write_one(Tx& tx) {
  const auto& [key, row] = *rows_.begin();
  const OneRowHolds h = one_row_holds();
  if (h.any_buyer) {  // needs_full_path() sent keyed batches with buyers the long way
    try {
      return tx.exec_on(shard_, Stmt::batch_fast_one_limited, key.sku, key.location, row.sold,
                        row.held, row.changes, text_array(h.ids), int_array(h.qtys),
                        int_array(h.ttls), text_array(h.keys), text_array(h.buyers), key.slot);
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() == statement_aborted) throw FastMiss{};  // rolled back in full
      throw;
    }
  }
  if (!any_keyed() && !tx.conn.statements().citus()) {
    return tx.exec_on(shard_, Stmt::batch_fast_one, key.sku, key.location, row.sold, row.held,
                      row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls),
                      text_array(h.keys), key.slot);
  }
  const NewKeys k = new_keys(row);
  for (std::size_t n = 0; n < k.names.size(); ++n) {
    if (!k.outcomes[n].empty()) fast_prefixes_.emplace(k.names[n], k.outcomes[n]);
  }
  if (tx.conn.statements().citus()) {
    return delegated_lock_timeout_ms_ ? write_one_delegated(tx, h, k) : write_one_citus(tx, h, k);
  }
  try {
    return tx.exec_on(shard_, Stmt::batch_fast_one_keyed, key.sku, key.location, row.sold, row.held,
                      row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls),
                      text_array(h.keys), text_array(k.names), text_array(k.prints),
                      text_array(k.ids), text_array(k.outcomes), key.slot);
  } catch (const pqxx::unique_violation&) {
    throw FastMiss{};  // a key claimed in flight elsewhere: the statement rolled back
  }
}

bool BatchTx::read_steps(Tx& tx) {
  read_.clear();
  std::set<Uuid> ids;
  for (const BatchItem* item : items_) {
    if (is_transition(item->op)) ids.insert(item->id);
  }
  const std::vector<Uuid> wanted(ids.begin(), ids.end());
  for (const auto& row : tx.exec_on(shard_, Stmt::reservation_get_many, uuid_array(wanted))) {
    Hold hold;
    hold.reservation = read_reservation(row, &hold.lapsed);
    read_.emplace(hold.reservation.id, std::move(hold));
  }
  const SkuKey* one = nullptr;  // the batch's one row: its reserves' and sells'
  for (const BatchItem* item : items_) {
    if (!is_transition(item->op)) one = &item->key;
  }
  bool fits = read_.size() == ids.size();
  for (const auto& [id, hold] : read_) {
    const Reservation& r = hold.reservation;
    if (one == nullptr) one = &r.key;
    fits = fits && !hold.lapsed && r.state == ReservationState::held && r.key == *one;
  }
  // A step the rules refuse (a stale expected version, more than is held, a hold its
  // earlier steps in the batch ended) is the full path's to answer, and so is one that
  // gives units back to a buyer's count: each is tried here on a copy of its hold.
  std::map<Uuid, Reservation> after;
  for (const BatchItem* item : items_) {
    if (!fits || !is_transition(item->op)) continue;
    Reservation& r = after.try_emplace(item->id, read_.at(item->id).reservation).first->second;
    try {
      const Settlement moved = step_by_rules(r, *item, /*lapsed=*/false);
      fits = fits && !frees_allowance(r, moved);
      ++r.version;
    } catch (const Error&) {
      fits = false;
    }
  }
  if (!fits) read_.clear();
  return fits;
}

// write() for a batch on one row with steps, through batch_fast_one_steps: the holds the
// steps changed (in id order), each as decided, with its version as read.
pqxx::result BatchTx::write_steps(Tx& tx) {
  const auto& [key, row] = *rows_.begin();
  const OneRowHolds h = one_row_holds();
  Quantity demand = 0;  // the units of the new sales and holds
  for (const BatchItem* item : items_) {
    if (!is_transition(item->op)) demand += item->qty;
  }
  std::vector<Uuid> ids(transitions_.begin(), transitions_.end());
  std::sort(ids.begin(), ids.end());
  std::vector<std::string> states;
  std::vector<std::int64_t> confirmed, released, expired, versions, was;
  for (const Uuid& id : ids) {
    const Reservation& r = holds_.at(id).reservation;
    states.emplace_back(reservation_state_name(r.state));
    confirmed.push_back(r.confirmed);
    released.push_back(r.released);
    expired.push_back(r.expired);
    versions.push_back(r.version);
    was.push_back(read_.at(id).reservation.version);
  }
  try {
    return tx.exec_on(shard_, Stmt::batch_fast_one_steps, key.sku, key.location, row.sold, row.held,
                      row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls),
                      text_array(h.keys), demand, uuid_array(ids), text_array(states),
                      int_array(confirmed), int_array(released), int_array(expired),
                      int_array(versions), int_array(was), static_cast<std::int64_t>(ids.size()),
                      key.slot);
  } catch (const pqxx::sql_error& e) {
    if (e.sqlstate() == statement_aborted) throw FastMiss{};  // rolled back in full
    throw;
  }
}

// The keys a one-row fast batch claims: a reserve's names its reservation; a sell's carries
// its level's prefix (store/keyed.hpp), what the batch changes on the row after that sale,
// the row as the statement leaves it being appended when it is known. `row` holds the
// batch's totals, as decided with every request granted.
NewKeys BatchTx::new_keys(const RowState& row) const {
  NewKeys k;
  Quantity sold = 0, held = 0;
  std::int64_t changes = 0;
  for (std::size_t i = 0; i < items_.size(); ++i) {
    const BatchItem& item = *items_[i];
    (item.op == BatchOp::sell ? sold : held) += item.qty;
    ++changes;
    if (!keyed(i)) continue;
    k.names.push_back(*item.idempotency_key);
    k.prints.push_back(print_of(item));
    const bool sell = item.op == BatchOp::sell;
    k.ids.push_back(sell ? std::string() : ids_[i].to_string());
    k.outcomes.push_back(sell ? batched_level_prefix(ids_[i].to_string(), item.key, row.sold - sold,
                                                     row.held - held, row.changes - changes)
                              : std::string());
  }
  return k;
}

// write_one on Citus: the same writes as separate statements of one transaction (see
// citus_move_one).
pqxx::result BatchTx::write_one_citus(Tx& tx, const OneRowHolds& h, const NewKeys& k) {
  const auto& [key, row] = *rows_.begin();
  if (!k.names.empty() &&
      tx.exec_on(shard_, Stmt::citus_keys_taken, text_array(k.names))[0][0].as<std::int64_t>() >
          0) {
    return pqxx::result();  // a replay or a conflict: the full path decides
  }
  pqxx::result moved = tx.exec_on(shard_, Stmt::citus_move_one, key.sku, key.location, row.sold,
                                  row.held, row.changes, key.slot);
  if (moved.empty()) return moved;
  if (!h.ids.empty()) {
    const std::vector<std::string> skus(h.ids.size(), key.sku),
        locations(h.ids.size(), key.location), none;
    const std::vector<std::int64_t> slots(h.ids.size(), key.slot);
    const std::int64_t now_us = moved[0][5].as<std::int64_t>();  // the move's now()
    write_holds_citus(tx, now_us,
                      CitusHolds{h.ids, skus, locations, slots, h.qtys, h.ttls, h.keys, none, none,
                                 h.refs, h.metadata, h.orders});
  }
  if (!k.names.empty()) {
    const pqxx::row m = moved[0];      // the row as it moved: each sell's level's tail
    std::vector<std::int64_t> values;  // on_hand, reserved, version, now, limit, states
    for (int i = 2; i < after_limits; ++i) values.push_back(m[i].as<std::int64_t>());
    const std::string tail = batched_level_tail(values);
    std::vector<std::string> outcomes = k.outcomes;
    for (std::string& outcome : outcomes) {
      if (!outcome.empty()) outcome += tail;
    }
    try {
      write_keys_citus(tx, k.names, k.prints, k.ids, false, outcomes);
    } catch (const pqxx::unique_violation&) {
      throw FastMiss{};  // claimed elsewhere meanwhile: the transaction rolls back
    }
  }
  return moved;
}

// write_one on Citus as one delegated call (migration citus/107): the same writes, run and
// committed by the row's worker. No row back: a key stored already, or no room.
pqxx::result BatchTx::write_one_delegated(Tx& tx, const OneRowHolds& h, const NewKeys& k) {
  const auto& [key, row] = *rows_.begin();
  try {
    pqxx::result moved = tx.exec_on(
        shard_, Stmt::citus_batch_one, key.sku, key.location, key.slot, row.sold, row.held,
        row.changes, text_array(h.ids), int_array(h.qtys), int_array(h.ttls), text_array(h.keys),
        text_array(h.refs), text_array(h.metadata), text_array(h.orders), text_array(k.names),
        text_array(k.prints), text_array(k.ids), std::to_string(*delegated_lock_timeout_ms_));
    if (!moved.empty()) ran_on_ = moved[0][after_limits].as<std::int32_t>();
    return moved;
  } catch (const pqxx::unique_violation&) {
    throw FastMiss{};  // a key claimed in flight elsewhere: the call rolled back
  }
}

// The outcomes of the sells, confirms and releases whose keys this batch claimed and which
// went through, stored with their keys (a refused one's key is freed instead:
// unclaim_refused). A reserve's key names its reservation instead.
void BatchTx::write_key_outcomes(Tx& tx) {
  std::vector<std::string> names, outcomes;
  for (const auto& [name, claim] : keys_) {
    const BatchItem& item = *items_[claim.first];
    if (!claim.claimed || !item.ok || item.op == BatchOp::reserve) continue;
    names.push_back(name);
    outcomes.push_back(outcome_of(item));
  }
  if (names.empty()) return;
  const Statements& statements = tx.conn.statements();
  const bool as_row = statements.citus() && delegated_writes_;
  const pqxx::result result =
      as_row
          ? tx.exec_on(shard_, Stmt::citus_batch_outcomes, text_array(names), text_array(outcomes))
      : statements.citus()
          ? tx.conn.exec_sql(tx.work, citus_key_outcomes_sql(quoting(tx.work), statements.schema(),
                                                             shard_, names, outcomes))
          : tx.exec_on(shard_, Stmt::batch_key_outcomes, text_array(names), text_array(outcomes));
  const std::size_t written = rows_written(result, as_row);
  if (written != names.size()) {
    throw Error(ErrorCode::invariant_violation, "a batch stored " + std::to_string(written) +
                                                    " of its " + std::to_string(names.size()) +
                                                    " keyed outcomes; rolled back");
  }
}

void BatchTx::unclaim_refused(Tx& tx) {
  std::vector<std::string> names;
  for (const auto& [name, claim] : keys_) {
    if (claim.claimed && !items_[claim.first]->ok) names.push_back(name);
  }
  if (!names.empty()) tx.exec_on(shard_, Stmt::batch_unclaim, text_array(names));
}

// A request whose key was stored before the batch (`claim`): the same request replays what
// the key holds (a reserve's reservation, another write's outcome), any other conflicts.
void BatchTx::settle_stored(BatchItem& item, const std::string& print,
                            const KeyClaim& claim) const {
  const std::string& stored = *claim.stored_fingerprint;
  if (reserves(stored) && item.op == BatchOp::reserve) {
    if (claim.stored.empty()) {  // retention purged them since the look
      fail(item, Error(ErrorCode::not_found,
                       "the reservations of idempotency key " + shown(*item.idempotency_key) +
                           " were purged by retention",
                       context_of(item.key)));
      return;
    }
    if (print != stored) {
      fail(item, idempotency_conflict(*item.idempotency_key, asked_by(claim.stored, stored),
                                      asked_of(item)));
      return;
    }
    item.reservation = claim.stored.front();
    item.ok = true;
  } else if (print == stored && claim.stored_outcome) {
    adopt_outcome(item, *claim.stored_outcome);
  } else {  // another kind of write's key, or other arguments
    fail(item, keyed_conflict(*item.idempotency_key, stored, print));
  }
}

// Requests that repeat a key already seen in this batch. The key's request is the one
// stored before the batch, if there was one (settle_stored), else the batch's first with
// that key; the same request gets that one's outcome, a different one IdempotencyConflict.
void BatchTx::settle_duplicates() {
  for (std::size_t i = 0; i < items_.size(); ++i) {
    if (!keyed(i)) continue;
    BatchItem& item = *items_[i];
    const KeyClaim& claim = keys_.at(*item.idempotency_key);
    if (claim.first == i) continue;
    if (claim.stored_fingerprint) {
      settle_stored(item, prints_[i], claim);
      continue;
    }
    const BatchItem& first = *items_[claim.first];
    if (prints_[i] != claim.fingerprint) {
      const bool reserves_both = item.op == BatchOp::reserve && first.op == BatchOp::reserve;
      fail(item, reserves_both
                     ? idempotency_conflict(*item.idempotency_key, asked_of(first), asked_of(item))
                     : keyed_conflict(*item.idempotency_key, claim.fingerprint, prints_[i]));
      continue;
    }
    item.ok = first.ok;  // the same request: the first's outcome
    item.level = first.level;
    item.reservation = first.reservation;
    item.error = first.error;
  }
}

}  // namespace stockade::detail::pg
