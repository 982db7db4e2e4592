// PostgresStore: reservations, their lifecycle, expiry, idempotency keys and the sweeper.
#include <algorithm>
#include <chrono>
#include <map>

#include "postgres/postgres_store_impl.hpp"
#include "stockade/hash.hpp"
#include "stockade/log.hpp"

namespace stockade::detail::pg {

ReservationState parse_state(const std::string& name) {
  if (name == "held") return ReservationState::held;
  if (name == "confirmed") return ReservationState::confirmed;
  if (name == "released") return ReservationState::released;
  if (name == "expired") return ReservationState::expired;
  throw Error(ErrorCode::invariant_violation,
              "unknown reservation state '" + name + "' in the database");
}

Reservation read_reservation(const pqxx::row& row, bool* lapsed_out) {
  Reservation r;
  r.id = Uuid::parse(row[0].c_str());
  r.key = SkuKey{row[1].as<std::string>(), row[2].as<std::string>(), row[13].as<int>()};
  r.qty = row[3].as<std::int64_t>();
  r.state = parse_state(row[4].as<std::string>());
  r.version = row[5].as<std::int64_t>();
  r.expires_at_us = row[6].as<std::int64_t>();
  r.created_at_us = row[7].as<std::int64_t>();
  r.updated_at_us = row[8].as<std::int64_t>();
  if (!row[9].is_null()) r.idempotency_key = row[9].as<std::string>();
  if (lapsed_out != nullptr) *lapsed_out = row[10].as<bool>();
  if (!row[11].is_null()) r.buyer = row[11].as<std::string>();
  if (!row[12].is_null()) r.limit_group = row[12].as<std::string>();
  r.confirmed = row[14].as<std::int64_t>();
  r.released = row[15].as<std::int64_t>();
  r.expired = row[16].as<std::int64_t>();
  r.returned = row[17].as<std::int64_t>();
  if (!row[18].is_null()) r.order_id = Uuid::parse(row[18].c_str());
  if (!row[19].is_null()) r.ref = row[19].as<std::string>();
  if (!row[20].is_null()) r.metadata = row[20].as<std::string>();
  return r;
}

Reservation new_hold(const Uuid& id, const SkuKey& key, Quantity qty,
                     const std::optional<std::string>& idempotency_key, const pqxx::row& times) {
  Reservation r;
  r.id = id;
  r.key = key;
  r.qty = qty;
  r.state = ReservationState::held;
  r.version = 1;
  r.expires_at_us = times[0].as<std::int64_t>();
  r.created_at_us = r.updated_at_us = times[1].as<std::int64_t>();
  r.idempotency_key = idempotency_key;
  return r;
}

// The session is ended first, so that the write cannot commit behind the engine's back.
// A settled loss logs nothing yet: the engine looks for the write, and find_landed logs
// one INFO line that says what it found and did. An unsettled one is a WARNING: the write
// may still land, so the caller is told InDoubt unless it is there already.
LostCommit PostgresStore::lost_commit(const Backend& backend, const ErrorContext& context,
                                      const char* cause) const {
  const bool pooled = backend.pid == 0;  // Connection::pooled(): no session to end
  const bool settled =
      !pooled && end_session(options_.dsn, backend, options_.resolve_timeout_ms, watchdog_);
  std::string prelude = "connection lost during COMMIT (" + plain_cause(cause) + "); ";
  prelude += settled                ? "the server session was ended, so the outcome is final"
             : statements_->citus() ? "the Citus layout keeps no server session to end"
             : pooled               ? "a pooler hides the server session, which cannot be ended"
                      : "the server session could not be shown to have ended (in time, "
                        "or on the server it ran on)";
  LostCommit lost(in_doubt(context, cause, settled, pooled), settled, std::move(prelude));
  if (!settled) {
    log(LogLevel::warning, "stockade.postgres",
        lost.prelude +
            ", so the write may still land: unless the engine finds it, the caller is "
            "told InDoubt with what that call can do to learn the outcome");
  }
  return lost;
}

LostCommit PostgresStore::remote_commit_failed(const ErrorContext& context,
                                               const char* cause) const {
  const std::string what = first_line(scrub_secrets(cause, options_.dsn), 300);
  std::string prelude = "a Citus node answered a write that commits with an error (" + what +
                        "); a worker failed on the way and may have committed it";
  ErrorContext c = context;
  Error error(ErrorCode::in_doubt,
              prelude + ", so the outcome is unknown: look a little later." + in_doubt_hint_lead +
                  in_doubt_hint(c) + ".",
              std::move(c));
  log(LogLevel::warning, "stockade.postgres",
      prelude +
          ": unless the engine finds it, the caller is told InDoubt with what that call "
          "can do to learn the outcome");
  return LostCommit(std::move(error), false, std::move(prelude));
}

// The reservations of `ids` that exist, in no order: one statement per shard key among
// them (one in all on the plain layout, whose statement takes none).
std::vector<Reservation> PostgresStore::read_many(Tx& tx, const std::vector<Uuid>& ids) {
  std::map<std::uint16_t, std::vector<Uuid>> by_shard;
  for (const Uuid& id : ids) by_shard[statements_->citus() ? id.shard_key() : 0].push_back(id);
  std::vector<Reservation> found;
  for (const auto& [shard, some] : by_shard) {
    for (const auto& row : tx.exec_on(shard, Stmt::reservation_get_many, uuid_array(some))) {
      found.push_back(read_reservation(row));
    }
  }
  return found;
}

// What a lost commit's look for the write found, logged once as one INFO line (unless
// nothing was found in an unsettled loss, which lost_commit has logged); raises `lost`
// (InDoubt) unless the answer is certain: found, or absent after the session ended.
void PostgresStore::settle_landing(const LostCommit& lost, bool found, const char* returned) const {
  if (found || lost.settled) {
    log(LogLevel::info, "stockade.postgres",
        lost.prelude + (found ? std::string("; the write is in the database") + returned
                              : std::string("; the write is not in the database, so it runs "
                                            "again")));
  }
  if (!found && !lost.settled) throw lost;
}

void PostgresStore::landing_unreadable(const LostCommit& lost, const Error& e) const {
  log(LogLevel::warning, "stockade.postgres",
      lost.prelude + "; the engine could not read whether the write landed (" +
          plain_cause(e.what()) + "), so the caller is told InDoubt");
  throw lost;
}

namespace {

// Those of `ids` that `found` has, in the order of `ids`.
std::vector<Uuid> landed_ids(const std::vector<Reservation>& found, const std::vector<Uuid>& ids) {
  std::vector<Uuid> out;
  for (const Uuid& id : ids) {
    if (std::any_of(found.begin(), found.end(), [&](const Reservation& r) { return r.id == id; })) {
      out.push_back(id);
    }
  }
  return out;
}

}  // namespace

std::vector<Reservation> PostgresStore::find_landed(const std::vector<Uuid>& ids,
                                                    const LostCommit& lost,
                                                    const ErrorContext& context, bool some) {
  const std::vector<Reservation> rows = read_after_loss(ids, lost, context);
  settle_landing(lost, !rows.empty(), ", and its reservations are returned to the caller");
  if (rows.empty()) return {};
  if (some && !statements_->citus()) return in_order(rows, landed_ids(rows, ids));
  if ((some || rows.size() != ids.size()) && statements_->citus()) {
    // A transaction across shards commits on each worker in turn (two-phase commit): a
    // lost one may be seen part-way, and Citus finishes it later. Not a certain answer.
    throw lost;
  }
  if (rows.size() != ids.size()) {  // one transaction makes all of them or none
    throw Error(ErrorCode::invariant_violation,
                std::to_string(rows.size()) + " of the " + std::to_string(ids.size()) +
                    " reservations of one lost write are in the database",
                context);
  }
  return in_order(rows, ids);
}

std::vector<Reservation> PostgresStore::read_after_loss(const std::vector<Uuid>& ids,
                                                        const LostCommit& lost,
                                                        const ErrorContext& context) {
  try {
    return run<RunMode::read>(nullptr, context, [&](Tx& tx) { return read_many(tx, ids); });
  } catch (const Error& e) {
    landing_unreadable(lost, e);
  }
}

Reservation PostgresStore::insert_reservation(
    Tx& tx, const Uuid& id, const SkuKey& key, Quantity qty, std::int64_t ttl_us,
    const std::optional<std::string>& key_name, const std::optional<std::string>& buyer,
    const std::optional<std::string>& group, const std::optional<Uuid>& order_id,
    const std::optional<std::string>& ref, const std::optional<std::string>& metadata) {
  const pqxx::result rows =
      tx.exec_on(id.shard_key(), Stmt::reservation_insert, id.to_string(), key.sku, key.location,
                 qty, ttl_us, key_name.value_or(std::string()), buyer.value_or(std::string()),
                 group.value_or(std::string()), order_id ? order_id->to_string() : std::string(),
                 ref.value_or(std::string()), metadata.value_or(std::string()), key.slot);
  Reservation r = new_hold(id, key, qty, key_name, rows[0]);
  r.buyer = buyer;
  r.limit_group = group;
  r.order_id = order_id;
  r.ref = ref;
  r.metadata = metadata;
  return r;
}

LineGroups PostgresStore::take_allowances(Tx& tx, const std::vector<OrderLine>& lines,
                                          const std::string& buyer) {
  std::vector<std::string> skus;
  for (const OrderLine& line : lines) skus.push_back(line.key.sku);
  std::map<std::string, std::pair<std::string, Quantity>> limits;  // sku: (group, per_buyer)
  for (const auto& row : tx.exec(Stmt::limit_lookup, text_array(skus))) {
    limits.emplace(row[0].as<std::string>(),
                   std::make_pair(row[1].as<std::string>(), row[2].as<std::int64_t>()));
  }
  LineGroups groups;
  const auto asks = group_asks(
      lines,
      [&](const std::string& sku) -> std::optional<std::pair<std::string, Quantity>> {
        auto it = limits.find(sku);
        if (it == limits.end()) return std::nullopt;
        return it->second;
      },
      groups);
  // Sorted by group: every transaction locks the parent rows in the same order, and
  // before any stock row.
  for (const auto& [group, ask] : asks) {
    const std::uint16_t shard = shard_key_of(group, buyer);
    if (ask.units <= ask.per_buyer &&
        !tx.exec_on(shard, Stmt::allowance_take, group, buyer, ask.units, ask.per_buyer).empty()) {
      continue;
    }
    const pqxx::result held = tx.exec_on(shard, Stmt::allowance_get, group, buyer);
    telemetry().count(*ask.first, SkuEvent::refused);
    throw limit_exceeded(*ask.first, group, buyer, held.empty() ? 0 : held[0][0].as<std::int64_t>(),
                         ask.per_buyer, ask.units);
  }
  return groups;
}

void PostgresStore::give_back(Tx& tx, const Reservation& r, Quantity units) {
  if (r.buyer && r.limit_group) {
    tx.exec_on(shard_key_of(*r.limit_group, *r.buyer), Stmt::allowance_give, *r.limit_group,
               *r.buyer, units);
  }
}

void PostgresStore::set_purchase_limit(const PurchaseLimit& limit) {
  run(nullptr, ErrorContext{}, [&](Tx& tx) {
    tx.exec(Stmt::limit_upsert, limit.group, limit.per_buyer);
    const pqxx::result joined = tx.exec(Stmt::limit_skus_set, limit.group, text_array(limit.skus));
    if (static_cast<std::size_t>(joined.size()) == limit.skus.size()) return 0;
    const pqxx::result owner = tx.exec(Stmt::limit_sku_owner, limit.group, text_array(limit.skus));
    throw Error(ErrorCode::invalid_state,
                "sku " + shown(owner.empty() ? std::string("?") : owner[0][0].as<std::string>()) +
                    " is already in purchase-limit group " +
                    shown(owner.empty() ? std::string("?") : owner[0][1].as<std::string>()) +
                    "; a sku is in one group at most");
  });
}

bool PostgresStore::remove_purchase_limit(const std::string& group) {
  return run(nullptr, ErrorContext{}, [&](Tx& tx) {
    // On Citus the counts' DELETE reaches every shard; run in parallel, it would
    // bar the change to the (reference) group table in the same transaction.
    if (statements_->citus()) {
      tx.conn.exec_sql(tx.work, "SET LOCAL citus.multi_shard_modify_mode = 'sequential'");
    }
    return !tx.exec(Stmt::limit_delete, group).empty();
  });
}

Quantity PostgresStore::buyer_held(const std::string& group, const std::string& buyer) {
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result held =
        tx.exec_on(shard_key_of(group, buyer), Stmt::allowance_get, group, buyer);
    return held.empty() ? Quantity{0} : Quantity{held[0][0].as<std::int64_t>()};
  });
}

std::vector<Reservation> PostgresStore::fetch(Tx& tx, const std::vector<Uuid>& ids) {
  if (ids.empty()) return {};
  return in_order(read_many(tx, ids), ids);
}

std::vector<Reservation> in_order(const std::vector<Reservation>& found,
                                  const std::vector<Uuid>& ids) {
  std::unordered_map<Uuid, Reservation, UuidHash> by_id;
  for (const Reservation& r : found) by_id.emplace(r.id, r);
  std::vector<Reservation> out;
  out.reserve(ids.size());
  for (const Uuid& id : ids) {
    auto it = by_id.find(id);
    if (it == by_id.end()) throw_reservation_not_found(id);
    out.push_back(it->second);
  }
  return out;
}

// The key is claimed by inserting its row, before any stock row is locked. A concurrent
// duplicate's INSERT waits for the first transaction (at most lock_timeout): if that one
// commits, the duplicate replays its reservations; if it rolls back (OutOfStock, a lost
// connection), the duplicate claims the key and runs afresh.
std::vector<Reservation> PostgresStore::with_idempotency(
    Tx& tx, const std::string& key, const std::string& fingerprint, const Asked& asked,
    const std::vector<Uuid>& ids, const std::function<std::vector<Reservation>()>& body,
    std::optional<std::uint16_t> key_shard) {
  // The key lives with the request's rows: the shard key of its SKU (of an order, of its
  // first line in key order, as a replay sorts them too), which the first id carries.
  const std::uint16_t shard = key_shard.value_or(ids.at(0).shard_key());
  for (;;) {
    if (!tx.exec_on(shard, Stmt::idempotency_claim, key, fingerprint, uuid_array(ids)).empty()) {
      return body();
    }
    const pqxx::result found = tx.exec_on(shard, Stmt::idempotency_get, key);
    if (found.empty()) continue;  // the holder rolled back between our two statements
    const std::string stored = found[0][0].as<std::string>();
    if (!reserves(stored)) throw keyed_conflict(key, stored, fingerprint);  // another kind's
    std::vector<Reservation> made = fetch(tx, parse_ids(found[0][1].as<std::string>()));
    if (stored != fingerprint) {
      throw idempotency_conflict(key, asked_by(made, stored), asked);
    }
    return made;
  }
}

void PostgresStore::move_stock(Tx& tx, const SkuKey& key, Quantity sold, Quantity released) {
  // on_hand -= sold, reserved -= released: units the hold already has, on any row.
  const pqxx::result rows = tx.exec_on(shard_of(key), Stmt::stock_settle, key.sku, key.location,
                                       sold, released, key.slot);
  if (rows.empty()) {
    throw Error(ErrorCode::invariant_violation,
                "the stock row of a reservation is missing: " + describe(key), context_of(key));
  }
  // A confirm or release is this process's write too: reported, so that `auto` does not
  // take it for another writer's (Store::report_write, RowWriteObserver).
  report_write(key, rows[0][0].as<Version>());
}

// What a step decided moves: the freed units back to the buyer's count (parent rows
// first), then the stock row.
void PostgresStore::settle_in(Tx& tx, const Reservation& r, const Settlement& moved) {
  if (moved.freed > 0) give_back(tx, r, moved.freed);
  move_stock(tx, r.key, moved.sold, moved.sold + moved.freed);
}

// Writes a reservation's state and units as a step decided them (and, for an extend, its
// new expiry: `ttl_us` > 0); returns it as written.
Reservation PostgresStore::write_units(Tx& tx, const Reservation& r, std::int64_t ttl_us) {
  return read_reservation(tx.exec_on(r.id.shard_key(), Stmt::reservation_set, r.id.to_string(),
                                     std::string(reservation_state_name(r.state)), ttl_us,
                                     r.confirmed, r.released, r.expired)[0]);
}

// A hold found lapsed by a step: expired here, as the sweeper would have, which commits;
// then the step hears ReservationExpired.
void PostgresStore::throw_lapsed(Tx& tx, Reservation& r) {
  // The journal's cause for the row this moves is an expiry, whichever step found it.
  const NoteScope expiry({"expire", "", "", r.id.to_string()});
  set_note(tx);
  Settlement moved;
  moved.freed = r.held();
  settle_units(r, Settle::expire, moved.freed);
  settle_in(tx, r, moved);
  throw CommitThenRaise{not_holdable(write_units(tx, r, 0))};
}

// The reservation `id`, locked, at `expected` (if given), held and not lapsed: a step of
// a live hold starts here. NotFound, VersionConflict, InvalidState; a lapsed hold is
// expired (throw_lapsed).
Reservation PostgresStore::lock_live_hold(Tx& tx, const Uuid& id,
                                          const std::optional<Version>& expected) {
  const pqxx::result rows = tx.exec_on(id.shard_key(), Stmt::reservation_lock, id.to_string());
  if (rows.empty()) throw_reservation_not_found(id);
  bool lapsed = false;
  Reservation r = read_reservation(rows[0], &lapsed);
  check_live(r, expected);
  if (lapsed) throw_lapsed(tx, r);
  return r;
}

Reservation PostgresStore::transition(const TransitionRequest& request) {
  const CallDeadline deadline(options_.call_timeout_ms);  // one bound over both ways
  if (std::optional<Reservation> done = transition_delegated(request)) return *done;
  const Uuid& id = request.id;
  const Transition kind = request.kind;
  ErrorContext context;
  context.reservation_id = id;
  return keyed<Reservation>(
      keyed_write(request), nullptr, context,
      [&](Tx& tx) {
        Reservation r = lock_live_hold(tx, id, request.expected_version);
        if (kind == Transition::extend) return write_units(tx, r, request.ttl_us);
        settle_in(tx, r,
                  settle_transition(r, kind == Transition::confirm, request.qty.value_or(0),
                                    request.release_rest));
        return write_units(tx, r, 0);
      },
      id.shard_key());
}

// One transaction: the reservation locked first, then the buyer's count, then the stock
// row (the order of every transition); a refusal rolls it all back.
Reservation PostgresStore::return_units(const ReturnRequest& request) {
  const Uuid& id = request.id;
  ErrorContext context;
  context.reservation_id = id;
  return keyed<Reservation>(
      keyed_write(request), nullptr, context,
      [&](Tx& tx) {
        const pqxx::result rows =
            tx.exec_on(id.shard_key(), Stmt::reservation_lock, id.to_string());
        if (rows.empty()) throw_reservation_not_found(id);
        Reservation r = read_reservation(rows[0]);
        check_expected(r, request.expected_version);
        take_return(r, request.qty);
        give_back(tx, r, request.qty);
        if (request.restock) {
          upsert_in(tx, return_row(r, request.location), request.qty, /*add=*/true, {}, {});
        }
        return read_reservation(
            tx.exec_on(id.shard_key(), Stmt::reservation_return, id.to_string(), r.returned)[0]);
      },
      id.shard_key());
}

// One transaction, in the order of every transition: the reservation locked, then the
// buyer's count (a growth), then the stock row. A growth writes the row through the
// guarded delta a new hold uses (room, an open row); a refusal rolls it all back.
Reservation PostgresStore::resize(const ResizeRequest& request) {
  const Uuid& id = request.id;
  ErrorContext context;
  context.reservation_id = id;
  return keyed<Reservation>(
      keyed_write(request), nullptr, context,
      [&](Tx& tx) {
        Reservation r = lock_live_hold(tx, id, request.expected_version);
        const Quantity delta = resize_delta(r, request.qty);
        if (delta == 0) return r;
        if (delta < 0) {  // a release of the units it no longer holds
          settle_in(tx, r, settle_transition(r, /*confirm=*/false, -delta, /*release_rest=*/false));
        } else {
          if (r.buyer) {
            const LineGroups groups = take_allowances(tx, {OrderLine{r.key, delta}}, *r.buyer);
            if (groups.at(0) != r.limit_group) throw group_changed(r);
          }
          const pqxx::result moved =
              tx.exec_on(shard_of(r.key), Stmt::stock_delta, r.key.sku, r.key.location, Quantity{0},
                         delta, delta, std::int64_t{-1}, std::int64_t{-1}, r.key.slot);
          if (moved.empty()) refuse(tx, r.key, delta, std::nullopt, std::nullopt, true);
          observed_write(level_from(r.key, moved[0]));
          grow_hold(r, delta);
        }
        return read_reservation(tx.exec_on(id.shard_key(), Stmt::reservation_resize, id.to_string(),
                                           r.qty, r.released)[0]);
      },
      id.shard_key());
}

Reservation PostgresStore::get_reservation(const Uuid& id) {
  ErrorContext context;
  context.reservation_id = id;
  return run<RunMode::read>(nullptr, context, [&](Tx& tx) {
    const pqxx::result rows = tx.exec_on(id.shard_key(), Stmt::reservation_get, id.to_string());
    if (rows.empty()) throw_reservation_not_found(id);
    return read_reservation(rows[0]);
  });
}

std::size_t PostgresStore::expire_due(std::size_t limit) {
  return run(nullptr, ErrorContext{}, [&](Tx& tx) { return expire_in(tx, limit); });
}

// On a refused request's own time: its stock-row locks wait briefly, so a refusal is not
// held up behind another SKU's writers (a LockTimeout here leaves the refusal as it was).
std::size_t PostgresStore::free_lapsed(std::size_t limit) {
  if (!options_.sweeper) return 0;
  WriteOptions brief;
  brief.lock_timeout_ms = free_lapsed_lock_timeout_ms;
  const std::size_t freed =
      run(&brief, ErrorContext{}, [&](Tx& tx) { return expire_in(tx, limit); });
  if (freed > 0) telemetry().freed_on_refusal(freed);
  return freed;
}

std::size_t PostgresStore::expire_in(Tx& tx, std::size_t limit) {
  tx.exec(Stmt::note_set, "expire");  // the journal's cause for the rows it moves
  std::size_t expired = 0;
  // Units back to the buyers' counts first, then to the stock rows: each in sorted order,
  // parent rows before stock rows, as a reserve locks them.
  std::map<std::pair<std::string, std::string>, Quantity> allowances;
  std::map<SkuKey, Quantity> rows;
  // Units a reservation (or a group of them) of this row, limit group and buyer held.
  const auto give = [&](const pqxx::row& r, int qty_at, int group_at, int slot_at) {
    const Quantity qty = r[qty_at].as<std::int64_t>();
    rows[SkuKey{r[0].as<std::string>(), r[1].as<std::string>(), r[slot_at].as<int>()}] += qty;
    const std::string limit_group = r[group_at].as<std::string>();
    if (!limit_group.empty()) allowances[{limit_group, r[group_at + 1].as<std::string>()}] += qty;
  };
  if (statements_->citus()) {
    // Citus refuses FOR UPDATE across shards: the shard keys with due holds first (a read
    // without locks), then each shard's due holds, locked and expired.
    std::size_t left = limit;
    for (const auto& shard_row : tx.exec(Stmt::due_shards)) {
      if (left == 0) break;
      const auto shard = static_cast<std::uint16_t>(shard_row[0].as<int>());
      std::vector<Uuid> ids;
      for (const auto& r : tx.exec_on(shard, Stmt::expire_lock, static_cast<std::int64_t>(left))) {
        ids.push_back(Uuid::parse(r[0].c_str()));
      }
      if (ids.empty()) continue;
      for (const auto& r : tx.exec_on(shard, Stmt::expire_set, uuid_array(ids))) {
        give(r, 2, 3, 5);  // sku, location, qty, limit group, buyer, slot
        ++expired;
      }
      left -= std::min(left, ids.size());
    }
  } else {
    for (const auto& group : tx.exec(Stmt::expire_pick, static_cast<std::int64_t>(limit))) {
      give(group, 2, 4, 6);  // sku, location, sum(qty), count, limit group, buyer, slot
      expired += group[3].as<std::size_t>();
    }
  }
  for (const auto& [pair, qty] : allowances) {
    tx.exec_on(shard_key_of(pair.first, pair.second), Stmt::allowance_give, pair.first, pair.second,
               qty);
  }
  for (const auto& [key, qty] : rows) move_stock(tx, key, 0, qty);
  return expired;
}

}  // namespace stockade::detail::pg
