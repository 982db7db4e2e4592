// PostgresStore: the Citus layout's delegated one-row writes (migrations citus/105 and
// citus/111): a reserve, a sell and a step of a held reservation as one call that Citus
// hands to the worker holding the row, which commits it. Each gives nothing where it does
// not apply, and the caller then takes the transaction (stock.cpp, reservations.cpp).
#include "postgres/postgres_store_impl.hpp"
#include "store/lifecycle.hpp"

namespace stockade::detail::pg {

// An atomic reserve on Citus as one delegated call (migration citus/105): the key (if
// any) claimed, the row moved and the hold made on the row's worker, which commits them.
// A refusal reads why, as reserve_in_one_statement's. A key that is there already gives
// nothing: the statement path then answers the replay (with_idempotency), reading the
// key's reservations in the transaction that holds the key, which a purge cannot take.
// With direct routing the call goes straight to the worker the map names (citus/106,
// routes.hpp); if that worker is out of reach (Unavailable: nothing changed), through the
// coordinator.
std::optional<Reservation> PostgresStore::reserve_delegated(const ReserveRequest& request,
                                                            const Uuid& id,
                                                            const std::string& print) {
  const SkuKey& key = request.key;
  const ErrorContext context = context_of(key);
  std::string outcome;
  const std::optional<std::optional<Reservation>> made = run_delegated(
      Delegated::reserve, shard_of(key), &request.options, context,
      [&](Tx& tx, std::int32_t* ran_on) -> std::optional<Reservation> {
        const pqxx::result rows = tx.exec_on(
            shard_of(key), ran_on ? Stmt::citus_reserve_routed : Stmt::citus_reserve_one, key.sku,
            key.location, key.slot, request.qty, request.options.expected_version.value_or(-1),
            id.to_string(), request.ttl_us, std::to_string(request.options.lock_timeout_ms),
            request.idempotency_key.value_or(std::string()), print);
        outcome = rows.at(0)[3].as<std::string>();
        if (ran_on) *ran_on = rows[0][4].as<std::int32_t>();
        if (outcome != "made") return std::nullopt;
        report_write(key, rows[0][2].as<Version>());
        return new_hold(id, key, request.qty, request.idempotency_key, rows[0]);
      });
  if (!made) return std::nullopt;  // no delegated functions: the statement path
  if (*made || outcome == "replay") return *made;
  return refused_by_read(key, request.qty, request.options, std::nullopt);
}

// An atomic sell on Citus as one delegated call (migration citus/111): the row moved by
// its worker, which commits it, and returned as it left it. A refusal reads why, as a
// delegated reserve's does. Nothing (the statement path) with a key or a journal note (a
// ref), which the function does not carry, or when the schema lacks the function. A cut
// call is InDoubt, as a keyless sell's lost commit is: a sale leaves no row to look for.
std::optional<StockLevel> PostgresStore::sell_delegated(const SellRequest& request) {
  const WriteOptions& options = request.options;
  const SkuKey& key = request.key;
  if (!statements_->citus() || options.strategy != Strategy::atomic || request.idempotency_key ||
      note_in_scope()) {
    return std::nullopt;
  }
  const ErrorContext context = context_of(key);
  const std::optional<std::optional<StockLevel>> sold = run_delegated(
      Delegated::write, shard_of(key), &options, context,
      [&](Tx& tx, std::int32_t* ran_on) -> std::optional<StockLevel> {
        const pqxx::result rows =
            tx.exec_on(shard_of(key), Stmt::citus_sell_one, key.sku, key.location, key.slot,
                       request.qty, options.expected_version.value_or(-1),
                       options.fencing_token.value_or(-1), std::to_string(options.lock_timeout_ms));
        if (rows.empty()) return std::nullopt;
        if (ran_on) *ran_on = rows[0][15].as<std::int32_t>();
        return level_from(key, rows[0]);
      });
  if (!sold) return std::nullopt;  // no delegated functions: the statement path
  if (*sold) return observed_write(**sold);
  return refused_by_read(key, request.qty, options, options.fencing_token);
}

// A step on Citus as a read and one delegated call (migration citus/111): the reservation
// read on its worker, the step decided from it as the transaction decides it (lifecycle.hpp:
// the same checks, the same errors), and step_one applying that decision on the worker if
// the reservation is still as read (its version, held, not lapsed), with the stock row
// settled in the same commit. A refusal decided on the read (VersionConflict, more than is
// held) is one the reservation gave at that moment, within the call. Nothing (the
// transaction, which decides afresh under the reservation's lock): with a key, whose claim
// is the transaction's; when the read finds it missing, not held or lapsed (the
// transaction says why, or expires it); for units given back to a buyer's count (a row on
// another shard); when the reservation moved on after the read; where the worker does not
// hold the shard; or when the schema lacks the function. A cut call is InDoubt (no key).
std::optional<Reservation> PostgresStore::transition_delegated(const TransitionRequest& request) {
  if (!statements_->citus() || request.idempotency_key || !delegates(Delegated::write) ||
      !shard_path_usable()) {
    return std::nullopt;
  }
  const Uuid& id = request.id;
  const std::uint16_t shard = id.shard_key();
  ErrorContext context;
  context.reservation_id = id;
  bool lapsed = false;
  const std::optional<Reservation> read =
      run_on<RunMode::read>(shard, nullptr, context, [&](Tx& tx) -> std::optional<Reservation> {
        const pqxx::result rows = tx.exec_on(shard, Stmt::reservation_get, id.to_string());
        if (rows.empty()) return std::nullopt;
        return read_reservation(rows[0], &lapsed);
      });
  if (!read || read->state != ReservationState::held || lapsed) return std::nullopt;
  Reservation r = *read;
  check_expected(r, request.expected_version);
  Settlement moved;
  if (request.kind != Transition::extend) {
    moved = settle_transition(r, request.kind == Transition::confirm, request.qty.value_or(0),
                              request.release_rest);
    if (frees_allowance(r, moved)) return std::nullopt;  // give_back
  }
  const std::string note = note_text();
  const std::optional<std::optional<Reservation>> done = run_delegated(
      Delegated::write, shard, nullptr, context,
      [&](Tx& tx, std::int32_t* ran_on) -> std::optional<Reservation> {
        const pqxx::result rows = tx.exec_on(
            shard, Stmt::citus_step_one, id.to_string(), read->version,
            std::string(reservation_state_name(r.state)), r.confirmed, r.released, r.expired,
            request.kind == Transition::extend ? request.ttl_us : std::int64_t{0}, r.key.sku,
            r.key.location, r.key.slot, moved.sold, moved.sold + moved.freed, note,
            std::to_string(options_.lock_timeout_ms));
        if (rows.empty()) return std::nullopt;
        if (ran_on) *ran_on = rows[0][4].as<std::int32_t>();
        Reservation out = r;
        out.version = rows[0][0].as<Version>();
        out.updated_at_us = rows[0][1].as<std::int64_t>();
        out.expires_at_us = rows[0][2].as<std::int64_t>();
        if (!rows[0][3].is_null()) report_write(r.key, rows[0][3].as<Version>());
        return out;
      });
  return done.value_or(std::nullopt);  // nothing: no delegated functions, the transaction
}

namespace {

// A yes or no the store reads once (`read`, a statement's one boolean) and keeps in `known`
// (0: not read yet, 1, -1). `said_no` runs once, for the first reader to store a no (two
// that read at once both store). A read that fails answers no, and the next call reads
// again.
template <class Read, class SaidNo>
bool read_once(std::atomic<int>& known, Read&& read, SaidNo&& said_no) {
  const int k = known.load(std::memory_order_relaxed);
  if (k != 0) return k > 0;
  try {
    const bool yes = read();
    if (known.exchange(yes ? 1 : -1, std::memory_order_relaxed) == 0 && !yes) said_no();
    return yes;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace

// step_one changes nothing where it cannot take the shard path (it would have to write
// through Citus, which a note set inside does not reach): for a role that does not own the
// tables, or sessions that are not READ COMMITTED, every step would pay for a call that
// does nothing. purge_shard asks the same (citus_old_shards). Read once; until it can be
// read, steps take the transaction and purges the statement form.
bool PostgresStore::shard_path_usable() {
  return read_once(
      shard_path_,
      [&] {
        return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
          return tx.exec(Stmt::citus_shard_path_usable)[0][0].as<bool>();
        });
      },
      [&] {
        log(LogLevel::info, "stockade.postgres",
            "this role does not own the tables of schema '" + options_.schema +
                "', or its sessions are not READ COMMITTED: confirms, releases and extends "
                "on the Citus layout run as transactions, and purges as statements, not as "
                "delegated calls");
      });
}

// The same for citus/113's calls (where shard_path_usable): a schema an older release
// migrated lacks them until migrate(), which forgets the answer; said once.
bool PostgresStore::batch_writes_delegable() {
  if (!shard_path_usable()) return false;
  return read_once(
      batch_writes_,
      [&] {
        return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
          return tx.exec(Stmt::citus_batch_delegable)[0][0].as<bool>();
        });
      },
      [&] { say_no_batch_writes(); });
}

void PostgresStore::say_no_batch_writes() {
  log(LogLevel::warning, "stockade.postgres",
      "schema '" + options_.schema +
          "' lacks the batch writes of migration citus/113 (Citus layout), so the batches' "
          "statement forms send their writes as SQL text, which is slower; migrate() makes "
          "them");
}

}  // namespace stockade::detail::pg
