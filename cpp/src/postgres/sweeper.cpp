// The background sweeper: one per database, elected with a session advisory lock.
#include <chrono>
#include <limits>

#include "postgres/postgres_store_impl.hpp"
#include "postgres/sqlstate.hpp"
#include "stockade/hash.hpp"
#include "stockade/log.hpp"

namespace stockade::detail::pg {

namespace {

// A round's failure, at most once a minute. A connection that broke (a restart, a killed
// session, a cut) is the sweeper's own business: expiry is idempotent and the next round
// runs on a fresh one, so it is INFO, in plain words; anything else is a WARNING.
void log_round_error(LogLimiter& limiter, const std::exception& e) {
  const bool lost = dynamic_cast<const pqxx::broken_connection*>(&e) != nullptr ||
                    dynamic_cast<const pqxx::in_doubt_error*>(&e) != nullptr;
  if (lost) {
    limiter.log(LogLevel::info, "stockade.sweeper",
                "the sweeper's connection broke (" + plain_cause(e.what()) +
                    "); the next round runs on a fresh one");
  } else {
    limiter.log(LogLevel::warning, "stockade.sweeper",
                std::string("a sweeper round failed; the next one runs on a fresh connection: ") +
                    e.what());
  }
}

}  // namespace

// One sweeper per database: the engine whose session holds the sweeper's advisory lock
// leads, and it sweeps in that very session. (Behind a transaction-mode pooler, where no
// session lasts, each sweeper transaction takes the same key as a transaction-scoped lock
// instead: engines may then take turns round by round, never two at once.) So leadership follows
// the lock: if the leader's session is terminated, its next sweep fails on the dead connection
// before it expires anything, and the engine stands for election again on a fresh one (and loses if
// another engine took the lock meanwhile). An engine never sweeps from a session that does not hold
// the lock. Errors never stop the loop: they are counted (stats().sweeper), and the next round runs
// on a fresh connection. A schema that migrate() has not made yet is no error: the rounds find
// nothing to do until it has.
void PostgresStore::sweep_loop() {
  const std::int64_t election_key =
      static_cast<std::int64_t>(stable_hash64({options_.schema, "stockade-sweeper"}));
  std::unique_ptr<Connection> leader;
  bool elected = false;
  bool was_leader = false;
  bool told_unmigrated = false;
  const auto note_unmigrated = [&](bool& told) {
    if (told) return;
    log(LogLevel::info, "stockade.sweeper",
        "the schema '" + options_.schema +
            "' is not migrated to this version yet; sweeping once migrate() has run");
    told = true;
  };
  LogLimiter round_errors(60'000'000);  // a sweeper that cannot reach the database: once a minute
  std::unique_lock<std::mutex> lock(sweeper_mutex_);
  while (!stopping_) {
    lock.unlock();
    std::uint64_t expired = 0;
    std::string error;
    const auto started = std::chrono::steady_clock::now();
    try {
      elected = stand_for_sweeper(leader, elected, election_key);
      if (elected) expired = expire_as_leader(*leader, election_key, elected);
      if (elected && options_.retention_ms > 0) purge_on_leader(*leader, election_key);
      if (elected && options_.journal_retention_ms > 0) {
        const std::uint64_t gone =
            purge_movements(options_.journal_retention_ms * 1000, options_.purge_batch * 16);
        if (gone > 0) {
          log(LogLevel::debug, "stockade.sweeper",
              "journal retention dropped " + std::to_string(gone) + " entries");
        }
      }
    } catch (const pqxx::undefined_table&) {
      // The schema is not migrated yet (an engine opened before migrate()): nothing to
      // sweep, and not a failure. The session, and the election, stay.
      note_unmigrated(told_unmigrated);
    } catch (const pqxx::undefined_column&) {
      // Migrations are running (or a newer stockade runs on an older schema): the same.
      note_unmigrated(told_unmigrated);
    } catch (const std::exception& e) {
      error = e.what();
      log_round_error(round_errors, e);
      leader.reset();  // closing the session also gives up the election
      elected = false;
    }
    if (elected != was_leader) {
      // Pooled engines may take turns round by round: that is no news worth an info line.
      log(leader && leader->pooled() ? LogLevel::debug : LogLevel::info, "stockade.sweeper",
          elected ? "this engine now sweeps the schema '" + options_.schema + "' (elected)"
                  : "this engine no longer sweeps the schema '" + options_.schema + "'");
      was_leader = elected;
    }
    if (expired > 0) {
      log(LogLevel::debug, "stockade.sweeper", "expired " + std::to_string(expired) + " holds");
    }
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - started;
    lock.lock();
    telemetry().sweeper_round(elected, expired, error, took.count());
    sweeper_wake_.wait_for(lock, std::chrono::milliseconds(options_.sweep_interval_ms),
                           [this] { return stopping_; });
  }
  lock.unlock();
  telemetry().sweeper_round(false, 0, "");
}

// Opens the sweeper's session if it has none (standing anew), and stands for election on
// it: whether this engine sweeps this round. Behind a transaction pooler every round
// stands, and a transaction that finds the lock taken says so (sweep_batch).
bool PostgresStore::stand_for_sweeper(std::unique_ptr<Connection>& leader, bool elected,
                                      std::int64_t election_key) {
  if (!leader || !leader->is_open()) {
    elected = false;
    leader = std::make_unique<Connection>(options_.dsn, statements_, options_.pooler, &watchdog_,
                                          call_deadline_us());
    const Watchdog::Guard guard = arm_leader(*leader);
    leader->set_lock_timeout(options_.lock_timeout_ms);
  }
  if (leader->pooled() || elected) return true;
  const Watchdog::Guard guard = arm_leader(*leader);
  pqxx::nontransaction session(leader->raw());
  const std::string sql = "SELECT pg_try_advisory_lock(" + std::to_string(election_key) + ")";
  return session.exec(sql)[0][0].as<bool>();
}

// A leader's round of expiry: batches of sweep_batch until one comes back short (or the
// store stops); returns how many holds expired. `elected` turns false when a batch finds
// that this session no longer holds the election.
std::uint64_t PostgresStore::expire_as_leader(Connection& leader, std::int64_t election_key,
                                              bool& elected) {
  std::uint64_t expired = 0;
  for (bool more = true; more;) {
    const std::optional<std::size_t> n = sweep_batch(leader, election_key);
    if (!n) {
      elected = false;
      break;
    }
    expired += *n;
    std::lock_guard<std::mutex> check(sweeper_mutex_);
    more = *n == options_.sweep_batch && !stopping_;
  }
  return expired;
}

// Retention: purges everything older than retention_ms, in statements of purge_batch rows
// on the leader's session, until nothing old is left or the store closes. It paces
// itself like a cost-delayed VACUUM: after each statement it rests half as long as the
// statement took (a two-thirds duty cycle), so a backlog drains at about two thirds of the
// speed of an explicit purge() and slows by itself when the database is busy, leaving the
// hot path more of the machine.
//
// On Citus, with the leader's own session (not pooled), it purges as purge() does there
// (purge_citus: each shard's delegated call, on the pool's connections), one call at a
// time, resting after each one the same way. Pooled, each step must take the election
// lock in its transaction, so it keeps the statement form on the leader's connection.
void PostgresStore::purge_on_leader(Connection& leader, std::int64_t election_key) {
  const std::int64_t older_than_us = options_.retention_ms * 1000;
  if (statements_->citus() && !leader.pooled()) {
    const auto rest = [&](std::chrono::steady_clock::duration took) {
      std::unique_lock<std::mutex> lock(sweeper_mutex_);
      return !sweeper_wake_.wait_for(lock, took / 2, [this] { return stopping_; });
    };
    return log_purged(purge_citus(older_than_us, std::numeric_limits<std::uint64_t>::max(), rest));
  }
  bool outvoted = false;  // pooled: another engine holds the election lock now
  const auto delete_some = [&](Stmt statement, std::uint64_t n, std::int64_t cursor) {
    const auto started = std::chrono::steady_clock::now();
    const Watchdog::Guard guard = arm_leader(leader);
    pqxx::work work(leader.raw());
    leader.begin(work);
    if (!elected_for(work, leader, election_key)) {
      outvoted = true;
      return PurgeStep{0, 0, cursor};
    }
    Tx tx{work, leader};
    const PurgeStep step = purge_step(tx, statement, older_than_us, n, cursor);
    work.commit();
    if (guard.fired()) throw past_deadline(ErrorContext{}, true);
    if (step.keys + step.reservations > 0) {
      std::unique_lock<std::mutex> rest(sweeper_mutex_);
      sweeper_wake_.wait_for(rest, (std::chrono::steady_clock::now() - started) / 2,
                             [this] { return stopping_; });
    }
    return step;
  };
  const auto stop = [&] {
    std::lock_guard<std::mutex> check(sweeper_mutex_);
    return stopping_ || outvoted;
  };
  log_purged(purge_with(std::numeric_limits<std::uint64_t>::max(), delete_some, stop));
}

void PostgresStore::log_purged(const PurgeCounts& purged) {
  if (purged.total() == 0) return;
  log(LogLevel::info, "stockade.sweeper",
      "retention purged " + std::to_string(purged.keys) + " idempotency keys and " +
          std::to_string(purged.reservations) + " reservations");
}

bool PostgresStore::elected_for(pqxx::transaction_base& work, const Connection& leader,
                                std::int64_t election_key) {
  if (!leader.pooled()) return true;  // the session holds the lock
  return work.exec("SELECT pg_try_advisory_xact_lock(" + std::to_string(election_key) + ")")[0][0]
      .as<bool>();
}

std::optional<std::size_t> PostgresStore::sweep_batch(Connection& leader,
                                                      std::int64_t election_key) {
  const Watchdog::Guard guard = arm_leader(leader);
  pqxx::work work(leader.raw());
  leader.begin(work);
  if (!elected_for(work, leader, election_key)) return std::nullopt;
  Tx tx{work, leader};
  const std::size_t n = expire_in(tx, options_.sweep_batch);
  work.commit();
  // Past the deadline a cancel may still be on its way: the round fails, and the next one
  // runs on a fresh session.
  if (guard.fired()) throw past_deadline(ErrorContext{}, true);
  return n;
}

// Each of the sweeper's transactions is bounded like a caller's (call_timeout).
Watchdog::Guard PostgresStore::arm_leader(Connection& leader) {
  return watchdog_.arm(leader.raw(), leader.backend(), call_deadline_us());
}

}  // namespace stockade::detail::pg
