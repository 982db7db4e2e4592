// The definitions of PostgresStore's runners (run, run_attempt, run_delegated, run_on and
// their helpers), included at the end of postgres_store_impl.hpp, which declares them: every
// file that runs a call instantiates them, and the class's header keeps to its declarations.
#pragma once

#include "postgres/postgres_store_impl.hpp"

namespace stockade::detail::pg {

// Bounds on transparent retries inside run().
inline constexpr int serialization_retries_max = 4;  // 40001 / 40P01
inline constexpr std::int64_t retry_backoff_base_us = 500;
inline constexpr std::int64_t retry_backoff_cap_us = 50'000;

template <RunMode Mode, class Fn>
auto PostgresStore::run(const WriteOptions* options, const ErrorContext& context, Fn&& fn,
                        Pool* via) -> std::invoke_result_t<Fn&, Tx&> {
  Pool& pool = via != nullptr ? *via : pool_;
  const Failure failure{options, context, options_.schema};
  const std::int64_t deadline_us = call_deadline_us();
  bool reconnected = false, remote_retried = false;  // the two retries of a broken call
  for (int attempt = 0;; ++attempt) {
    if (steady_now_us() >= deadline_us) throw past_deadline(context, false);  // none sent yet
    Pool::Lease lease = pool.acquire(deadline_us);
    bool committing = false;
    const bool in_transaction = runs_in_transaction(Mode, lease->pooled());
    // Disarmed before the lease goes back: a connection whose deadline fired is discarded.
    const Watchdog::Guard guard = watchdog_.arm(lease->raw(), lease->backend(), deadline_us);
    try {
      auto result = run_attempt<Mode>(lease, options, in_transaction, committing, fn);
      if (guard.fired()) {  // it committed, but a cancel may have cut a synchronous wait
        lease.discard();
        throw past_deadline(context, true);
      }
      return result;
    } catch (const pqxx::in_doubt_error& e) {
      lease.discard();
      if (guard.fired()) throw past_deadline(context, true);
      throw lost_commit(lease->backend(), context, e.what());
    } catch (const pqxx::broken_connection& e) {
      if (statements_->citus() && !guard.fired() && lease->is_open() && from_a_node(e.what())) {
        remote_node_failed(remote_retried, committing, Mode == RunMode::delegated, context,
                           e.what());
        continue;
      }
      lease.discard();
      if (guard.fired()) throw past_deadline(context, committing);
      if (committing) throw lost_commit(lease->backend(), context, e.what());
      // Nothing was committed: the server rolls back a transaction whose client is gone.
      run_again_or_give_up(pool, reconnected, context, e.what());
      continue;
    } catch (const pqxx::transaction_rollback& e) {
      // 40001 / 40P01: rolled back, so safe to run again (not sql_error in libpqxx 6.4).
      const bool unknown = dynamic_cast<const pqxx::statement_completion_unknown*>(&e) != nullptr;
      if (unknown || guard.fired()) lease.discard();
      if (guard.fired()) throw past_deadline(context, unknown);
      if (unknown) throw lost_commit(lease->backend(), context, e.what());
      back_off_or_give_up(options, context, rollback_sqlstate(e), attempt, e.what());
      continue;
    } catch (const pqxx::sql_error& e) {
      if (!guard.fired() && is_retryable(e.sqlstate())) {  // 40001 / 40P01 (libpqxx 7)
        back_off_or_give_up(options, context, e.sqlstate(), attempt, e.what());
        continue;
      }
      const bool delegated = Mode == RunMode::delegated;
      sql_failed(e, lease, guard.fired(), committing && in_transaction, delegated, failure);
    } catch (const pqxx::failure& e) {  // any other libpqxx failure: never a bare exception
      lease.discard();
      if (guard.fired()) throw past_deadline(context, committing);
      throw Error(ErrorCode::database_error, std::string("database error: ") + e.what(), context);
    } catch (...) {  // stockade's errors, and the callers' signals (OptimisticRace, FastMiss)
      if (guard.fired()) lease.discard();  // a late cancel must not reach another call
      throw;
    }
  }
}

template <RunMode Mode, class Fn>
auto PostgresStore::run_attempt(Pool::Lease& lease, const WriteOptions* options,
                                bool in_transaction, bool& committing, Fn& fn)
    -> std::invoke_result_t<Fn&, Tx&> {
  using Result = std::invoke_result_t<Fn&, Tx&>;
  lease->set_lock_timeout(options != nullptr ? options->lock_timeout_ms : options_.lock_timeout_ms);
  // Pooled, a transaction runs by hand: BEGIN and SET LOCAL lock_timeout in one round
  // trip (see TransactionByHand).
  const bool by_hand = in_transaction && lease->pooled();
  std::optional<pqxx::work> transaction;
  std::optional<pqxx::nontransaction> autocommit;
  pqxx::transaction_base& work =
      in_transaction && !by_hand
          ? static_cast<pqxx::transaction_base&>(transaction.emplace(lease->raw()))
          : autocommit.emplace(lease->raw());
  std::optional<TransactionByHand> manual;
  if (by_hand) manual.emplace(*autocommit, *lease);
  Tx tx{work, *lease};
  if (in_transaction && Mode != RunMode::read) set_note(tx);
  std::optional<Result> result;
  std::optional<Error> deferred;
  committing = commits_itself(Mode, in_transaction);
  try {
    result.emplace(fn(tx));
  } catch (CommitThenRaise& raise) {
    deferred.emplace(std::move(raise.error));
  }
  committing = true;
  if (manual) {
    manual->commit();
  } else {
    work.commit();
  }
  if (Mode != RunMode::read) note_commit();  // the feed's waiters hear of it (record.cpp)
  if (deferred) throw Error(*deferred);
  return std::move(*result);
}

template <class Result, class Fn>
Result PostgresStore::keyed(const std::optional<KeyedWrite>& k, const WriteOptions* options,
                            ErrorContext context, Fn&& body, std::optional<std::uint16_t> shard) {
  if (!k) return run_on(shard, options, context, body);
  context.keyed = true;
  for (int lost = 0;; ++lost) {
    try {
      return run_on(shard, options, context, [&](Tx& tx) -> Result {
        if (const std::optional<std::string> stored = claim_or_replay(tx, *k)) {
          return decode_outcome<Result>(*stored);
        }
        std::optional<Result> out;
        try {
          out.emplace(body(tx));
        } catch (CommitThenRaise&) {  // what commits is the body's, not a key without outcome
          tx.exec_on(k->shard, Stmt::idempotency_unclaim, k->key);
          throw;
        }
        tx.exec_on(k->shard, Stmt::idempotency_outcome_set, k->key, encode_outcome(*out));
        return std::move(*out);
      });
    } catch (const LostCommit& e) {
      if (lost > 0) throw;
      if (const std::optional<std::string> stored = landed_outcome(*k, e, context)) {
        return decode_outcome<Result>(*stored);
      }
    }
  }
}

template <class Call>
auto PostgresStore::via_route(std::uint16_t shard, Call&& call)
    -> std::invoke_result_t<Call&, const Routes::Route*> {
  const std::optional<Routes::Route> route = route_of(shard);
  if (!route) return call(nullptr);
  const CallDeadline deadline(options_.call_timeout_ms);  // the worker's try and the fallback
  try {
    return call(&*route);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unavailable) throw;
    routes_->fell_back(*route);
  }
  return call(nullptr);
}

template <class Fn>
auto PostgresStore::run_delegated(Delegated which, std::uint16_t shard, const WriteOptions* options,
                                  const ErrorContext& context, Fn&& fn)
    -> std::optional<std::invoke_result_t<Fn&, Tx&, std::int32_t*>> {
  if (!delegates(which)) return std::nullopt;
  try {
    return via_route(shard, [&](const Routes::Route* route) {
      std::int32_t ran_on = -1;
      auto out = run<RunMode::delegated>(
          options, context, [&](Tx& tx) { return fn(tx, route != nullptr ? &ran_on : nullptr); },
          route != nullptr ? route->pool.get() : nullptr);
      if (route != nullptr && ran_on >= 0) routes_->ran(*route, ran_on);
      return out;
    });
  } catch (const Error& e) {
    if (!lacks_delegation(e, which)) throw;
    return std::nullopt;
  }
}

template <RunMode Mode, class Fn>
auto PostgresStore::run_on(std::optional<std::uint16_t> shard, const WriteOptions* options,
                           const ErrorContext& context, Fn&& fn) -> std::invoke_result_t<Fn&, Tx&> {
  if (!shard) return run<Mode>(options, context, fn);
  return via_route(*shard, [&](const Routes::Route* route) {
    if (route == nullptr) return run<Mode>(options, context, fn);
    auto out = run<Mode>(options, context, fn, route->pool.get());
    routes_->sent();
    return out;
  });
}

}  // namespace stockade::detail::pg
