// PostgresStore: the idempotency keys of writes other than reserves (store/keyed.hpp). A
// reserve's key is in reservations.cpp (with_idempotency), a batch's in batch_tx.cpp.
#include "postgres/postgres_store_impl.hpp"

namespace stockade::detail::pg {

// The key is claimed by inserting its row, before any other row is locked. A concurrent
// duplicate's INSERT waits for the first transaction (at most lock_timeout): if that one
// commits, the duplicate replays its outcome; if it rolls back (OutOfStock, a lost
// connection), the duplicate claims the key and runs afresh. ON CONFLICT DO NOTHING, so a
// replay or a race never puts a unique-violation ERROR in the server's log.
std::optional<std::string> PostgresStore::claim_or_replay(Tx& tx, const KeyedWrite& k) {
  for (;;) {
    if (!tx.exec_on(k.shard, Stmt::idempotency_claim, k.key, k.fingerprint, uuid_array({}))
             .empty()) {
      return std::nullopt;
    }
    const pqxx::result found = tx.exec_on(k.shard, Stmt::idempotency_get, k.key);
    if (found.empty()) continue;  // the holder rolled back between our two statements
    const std::string stored = found[0][0].as<std::string>();
    if (stored != k.fingerprint || found[0][2].is_null()) {
      throw keyed_conflict(k.key, stored, k.fingerprint);
    }
    return found[0][2].as<std::string>();
  }
}

// After a lost commit, the session ended first (lost_commit): the key holds this request's
// outcome if and only if the write committed. Unsettled (a pooler hides the session), only
// an outcome already there is a certain answer; otherwise InDoubt, whose hint is to retry
// with the key.
std::optional<std::string> PostgresStore::landed_outcome(const KeyedWrite& k,
                                                         const LostCommit& lost,
                                                         const ErrorContext& context,
                                                         const OutcomeMatch* ours) {
  std::optional<std::string> stored;
  try {
    stored = run(nullptr, context, [&](Tx& tx) -> std::optional<std::string> {
      const pqxx::result found = tx.exec_on(k.shard, Stmt::idempotency_get, k.key);
      if (found.empty() || found[0][2].is_null()) return std::nullopt;
      if (found[0][0].as<std::string>() != k.fingerprint) return std::nullopt;
      std::string held = found[0][2].as<std::string>();
      if (ours != nullptr &&
          (ours->whole ? held != ours->expected
                       : held.compare(0, ours->expected.size(), ours->expected) != 0)) {
        return std::nullopt;  // another call's outcome: this attempt did not land
      }
      return held;
    });
  } catch (const LostCommit&) {
    throw lost;
  } catch (const Error& e) {
    landing_unreadable(lost, e);
  }
  settle_landing(lost, stored.has_value(),
                 " (its idempotency key holds its outcome), which is returned to the caller");
  return stored;
}

}  // namespace stockade::detail::pg
