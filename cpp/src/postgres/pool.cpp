#include "postgres/pool.hpp"

#include "postgres/dsn.hpp"
#include "postgres/sqlstate.hpp"
#include "postgres/watchdog.hpp"
#include "stockade/log.hpp"
#include "stockade/telemetry.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace stockade::detail::pg {
namespace {

// Faults that a busy service would otherwise log once per request.
LogLimiter connect_failures;
LogLimiter pool_timeouts;

}  // namespace

std::unique_ptr<pqxx::connection> connect(const std::string& dsn) {
  std::unique_ptr<pqxx::connection> conn;
  try {
    conn = std::make_unique<pqxx::connection>(dsn);
    // Text travels as UTF-8 whatever PGCLIENTENCODING or the server's default says:
    // stockade validates and compares its strings as UTF-8.
    conn->set_client_encoding("UTF8");
  } catch (const pqxx::failure& e) {  // broken_connection, or an sql_error such as 53300
    ErrorContext context;
    ErrorCode code = ErrorCode::unavailable;
    std::string why = "cannot connect to PostgreSQL: ";
    if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) {
      context.sqlstate = sqlstate_of(*sql);
      if (rule_for(context.sqlstate).code == ErrorCode::misconfigured)
        code = ErrorCode::misconfigured;
    }
    if (is_refusal(e.what())) code = ErrorCode::misconfigured;
    if (code == ErrorCode::misconfigured)
      why =
          "PostgreSQL refused the connection (a configuration error: check the DSN's role, "
          "password and database, and the server's pg_hba.conf; retrying will not help): ";
    Error error(code, why + scrub_secrets(e.what(), dsn), std::move(context));
    connect_failures.log(code == ErrorCode::misconfigured ? LogLevel::error : LogLevel::warning,
                         "stockade.postgres", error.what());
    throw error;
  } catch (const std::exception& e) {  // libpqxx's argument errors: the same care
    throw Error(ErrorCode::unavailable,
                "cannot connect to PostgreSQL: " + scrub_secrets(e.what(), dsn));
  }
  return conn;
}

namespace {

// Which server a connection is on: its cluster (system identifier) and WAL timeline.
const char* const server_identity =
    "(SELECT system_identifier::text FROM pg_control_system()) || '/' || CASE WHEN "
    "pg_is_in_recovery() THEN 'in recovery' ELSE substr(pg_walfile_name(pg_current_wal_lsn()), "
    "1, 8) END";

// Identifies a session in pg_stat_activity: its PID and its start, in epoch microseconds.
const char* const session_match =
    " FROM pg_stat_activity WHERE pid = $1"
    " AND (extract(epoch FROM backend_start) * 1000000)::bigint = $2";

pqxx::result exec_for(pqxx::nontransaction& session, const std::string& sql, const Backend& b) {
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
  return session.exec(sql, pqxx::params{b.pid, b.started_us});
#else
  return session.exec_params(sql, b.pid, b.started_us);  // libpqxx 6.4
#endif
}

// stockade validates, compares and limits its strings as UTF-8; a database in another
// encoding (LATIN1, or SQL_ASCII, which stores bytes unchecked) would refuse or mangle
// some of them on every request. So the first connection refuses it, before migrate()
// creates anything.
void refuse_encoding(const std::string& encoding) {
  if (encoding == "UTF8") return;
  throw Error(ErrorCode::misconfigured,
              "the database's encoding is " + encoding.substr(0, 64) +
                  ", and stockade needs UTF8 (a configuration error): create the database "
                  "with CREATE DATABASE name ENCODING 'UTF8' TEMPLATE template0 (and an "
                  "LC_COLLATE/LC_CTYPE that suits UTF8, such as C.UTF-8 or C)");
}

Error setup_past_deadline() {
  return Error(ErrorCode::deadline_exceeded,
               "the call's deadline (call_timeout) passed while a new database connection was "
               "being set up, and the server had not answered; nothing was changed");
}

}  // namespace

Connection::Connection(const std::string& dsn, std::shared_ptr<const Statements> statements,
                       Pooler pooler, Watchdog* watchdog, std::int64_t deadline_us)
    : conn_(connect(dsn)), statements_(std::move(statements)) {
  Watchdog::Guard guard;
  if (watchdog != nullptr && deadline_us != 0) guard = watchdog->arm(*conn_, {}, deadline_us);
  try {
    pqxx::nontransaction session(*conn_);
    // With it, how many of the statement routines exist (all or none are used).
    const std::vector<Stmt>& routines = statements_->routines();
    std::string names;
    for (Stmt r : routines) {
      names += (names.empty() ? "" : ", ") + session.quote(statements_->routine_name(r));
    }
    const pqxx::result row = session.exec(
        "SELECT pg_backend_pid(), (extract(epoch FROM backend_start) * 1000000)::bigint, "
        "current_setting('server_encoding'), " +
        std::string(server_identity) + ", " +
        (routines.empty()
             ? std::string("0")
             : "(SELECT count(*) FROM pg_catalog.pg_proc WHERE pronamespace ="
               " to_regnamespace(" +
                   session.quote(statements_->schema()) + ") AND proname IN (" + names + "))") +
        " FROM pg_stat_activity WHERE pid = pg_backend_pid()");
    if (!row.empty()) {
      backend_ = Backend{row[0][0].as<std::int32_t>(), row[0][1].as<std::int64_t>(),
                         row[0][3].as<std::string>()};
      refuse_encoding(row[0][2].as<std::string>());
      routines_ = !routines.empty() &&
                  row[0][4].as<std::int64_t>() == static_cast<std::int64_t>(routines.size());
    }
  } catch (const pqxx::failure& e) {
    if (guard.fired()) throw setup_past_deadline();
    throw Error(ErrorCode::unavailable,
                std::string("cannot set up a PostgreSQL connection: ") + e.what());
  }
  if (guard.fired()) throw setup_past_deadline();  // cut, or about to be: never reused
  // libpq's backendpid() is the PID of the cancel key the server side of the connection
  // sent. A pooler answers the client itself with a key of its own (PgBouncer: random),
  // so it differs from the PID of the server session that ran the query above.
  pooled_ = pooler == Pooler::transaction ||
            (pooler == Pooler::detect && conn_->backendpid() != backend_.pid);
  if (pooled_) backend_ = Backend{};  // the next transaction may run on another session
  routines_ = routines_ && pooled_;   // directly, prepared statements do better
}

bool end_session(const std::string& dsn, const Backend& backend, std::int64_t timeout_ms,
                 Watchdog& watchdog) {
  if (backend.pid == 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::int64_t deadline_us = steady_now_us() + timeout_ms * 1000;
  const std::string terminate = std::string("SELECT pg_terminate_backend(pid)") + session_match;
  const std::string alive = std::string("SELECT 1") + session_match;
  auto pause = std::chrono::milliseconds(1);
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      pqxx::connection conn(dsn);
      const Watchdog::Guard guard = watchdog.arm(conn, {}, deadline_us);
      pqxx::nontransaction session(conn);
      // Only the server the session ran on can show that it ended. After a failover the
      // DSN leads to the promoted standby (same cluster, a new timeline), where that
      // session never existed: its absence there proves nothing, for the old primary may
      // still be alive and commit it. So on another server the session stays unsettled.
      const std::string here =
          session.exec(std::string("SELECT ") + server_identity)[0][0].as<std::string>();
      if (!backend.server.empty() && here != backend.server) {
        log(LogLevel::warning, "stockade.postgres",
            "the server is not the one a lost write ran on (" + backend.server + " then, " + here +
                " now: a failover, or another cluster behind the DSN); its session cannot be "
                "shown to have ended, so the write is in doubt unless it is found here");
        return false;
      }
      exec_for(session, terminate, backend);
      for (;;) {
        if (exec_for(session, alive, backend).empty()) return true;
        if (std::chrono::steady_clock::now() + pause >= deadline) return false;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
      }
    } catch (const pqxx::failure&) {
      // The server is restarting, or refuses connections for now: try again until the
      // deadline (a restart ends every session, so the next connection settles it).
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  return false;
}

bool Connection::is_open() const {
  return conn_ && conn_->is_open();
}

void Connection::set_lock_timeout(std::int64_t ms) {
  if (pooled_) {
    lock_timeout_ms_ = ms;  // begin() sets it in each transaction
    return;
  }
  if (session_set_ && ms == lock_timeout_ms_) return;
  std::string sql = "SET lock_timeout = " + std::to_string(ms);
  // Once per connection, with its first setting: generic plans for the prepared
  // statements. Each is a primary-key lookup or a join with unnested arrays, whose best
  // plan does not depend on the values, and a custom plan is planned afresh on every
  // execution (about 13% of a hot batch's time, measured with benchmarks/hot_sku.py).
  if (!session_set_) sql += "; SET plan_cache_mode = force_generic_plan";
  pqxx::nontransaction session(*conn_);
  session.exec(sql);
  lock_timeout_ms_ = ms;
  session_set_ = true;
}

std::string Connection::begin_sql() const {
  std::string sql = "BEGIN";
  // Citus carries a SET LOCAL to the workers, where the row locks are taken, only when
  // told to (a session SET on the coordinator does not reach them at all). It sends the
  // text of the query that held the SET, so there lock_timeout goes in a query of its own
  // (lock_timeout_sql): sent with this BEGIN, it would send a BEGIN inside the worker's
  // transaction, which the worker logs as a warning each time.
  if (statements_->citus()) return sql + "; SET LOCAL citus.propagate_set_commands = 'local'";
  if (lock_timeout_ms_ > 0) sql += "; " + lock_timeout_sql();
  return sql;
}

std::string Connection::lock_timeout_sql() const {
  return "SET LOCAL lock_timeout = " + std::to_string(lock_timeout_ms_);
}

TransactionByHand::TransactionByHand(pqxx::nontransaction& session, Connection& conn)
    : session_(session), conn_(conn) {
  conn_.statement_failed_ = false;
  open_ = true;
  if (conn.routines()) {  // (never on Citus) BEGIN travels with the first statement
    conn_.begin_pending_ = true;
    return;
  }
  session_.exec(conn.begin_sql());
  if (conn.statements().citus() && conn.lock_timeout_ms_ > 0) {
    session_.exec(conn.lock_timeout_sql());
  }
}

TransactionByHand::~TransactionByHand() {
  if (!open_) return;
  if (conn_.begin_pending_) {  // no statement ran: no transaction began
    conn_.begin_pending_ = false;
    return;
  }
  try {
    session_.exec("ROLLBACK");
  } catch (...) {  // NOLINT(bugprone-empty-catch): a broken connection; run() discards it
  }
}

void TransactionByHand::commit() {
  if (conn_.statement_failed_) {  // the destructor rolls back
    throw Error(ErrorCode::database_error,
                "a statement of the transaction had failed, so it was rolled back; nothing "
                "was changed");
  }
  open_ = false;               // whatever COMMIT answers, the transaction is over
  if (conn_.begin_pending_) {  // no statement ran: nothing to commit
    conn_.begin_pending_ = false;
    return;
  }
  session_.exec("COMMIT");
}

void Connection::begin(pqxx::transaction_base& work) {
  // Behind a transaction-mode pooler a session-level SET would stay on whichever server
  // session ran it, for other clients to inherit, and be missing from the next one.
  if (pooled_ && statements_->citus())
    work.exec("SET LOCAL citus.propagate_set_commands = 'local'");
  if (pooled_ && lock_timeout_ms_ > 0) work.exec(lock_timeout_sql());
}

void Connection::prepare(Stmt s) {
  bool& done = prepared_[static_cast<std::size_t>(s)];
  if (done) return;
  conn_->prepare(Statements::name(s), statements_->sql(s));
  done = true;
}

Pool::Pool(std::string dsn, std::shared_ptr<const Statements> statements, std::size_t size,
           std::int64_t timeout_ms, Pooler pooler, Watchdog& watchdog)
    : dsn_(std::move(dsn)),
      statements_(std::move(statements)),
      size_(size),
      timeout_ms_(timeout_ms),
      pooler_(pooler),
      watchdog_(watchdog) {}

Pool::~Pool() {
  close();
}

Pool::Lease::~Lease() {
  if (conn_) pool_->give_back(std::move(conn_), discard_);
}

Pool::Lease Pool::acquire(std::int64_t deadline_us) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::int64_t pool_deadline_us = steady_now_us() + timeout_ms_ * 1000;
  const bool call_bound = deadline_us != 0 && deadline_us < pool_deadline_us;
  const auto deadline = std::chrono::steady_clock::time_point(
      std::chrono::microseconds(call_bound ? deadline_us : pool_deadline_us));
  for (;;) {
    if (closed_) throw Error(ErrorCode::unavailable, "the engine is closed");
    if (!idle_.empty()) {
      std::unique_ptr<Connection> conn = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(conn));
    }
    if (open_ < size_) break;
    ++waiting_;
    const bool timed_out = returned_.wait_until(lock, deadline) == std::cv_status::timeout;
    --waiting_;
    if (timed_out && idle_.empty() && open_ >= size_ && call_bound) {
      throw Error(ErrorCode::deadline_exceeded,
                  "the call's deadline (call_timeout) passed while it waited for a database "
                  "connection (pool_size " +
                      std::to_string(size_) + "); nothing was changed");
    }
    if (timed_out && idle_.empty() && open_ >= size_) {
      Error error(ErrorCode::overloaded, "no database connection came free within " +
                                             std::to_string(timeout_ms_) + " ms (pool_size " +
                                             std::to_string(size_) + ")");
      pool_timeouts.log(LogLevel::warning, "stockade.postgres", error.what());
      throw error;
    }
  }
  ++open_;
  lock.unlock();
  try {
    auto conn = std::make_unique<Connection>(dsn_, statements_, pooler_, &watchdog_, deadline_us);
    note_server(*conn);
    return Lease(this, std::move(conn));
  } catch (...) {
    lock.lock();
    --open_;
    returned_.notify_one();
    throw;
  }
}

void Pool::note_server(const Connection& conn) {
  std::string changed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (conn.pooled()) {
      pooled_seen_ = true;
      routines_newest_ = conn.routines();
      return;  // behind a pooler the server session, and so the server, is not known
    }
    const std::string& here = conn.backend().server;
    if (here.empty() || here == server_) return;
    if (!server_.empty()) {
      ++server_changes_;
      changed = server_;
    }
    server_ = here;
  }
  if (!changed.empty()) {
    log(LogLevel::warning, "stockade.postgres",
        "a new connection reached another server than the one before (" + changed + " then, " +
            conn.backend().server +
            " now: a failover, or a DSN that leads to another cluster); writes acknowledged "
            "on the old server that had not reached this one are not here (docs/failover.md)");
  }
}

void Pool::give_back(std::unique_ptr<Connection> conn, bool discard) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (discard || closed_ || !conn->is_open()) {
    --open_;
    lock.unlock();
    conn.reset();  // closes the connection outside the lock
    lock.lock();
  } else {
    idle_.push_back(std::move(conn));
  }
  returned_.notify_one();
}

std::size_t Pool::drop_idle() {
  std::vector<std::unique_ptr<Connection>> idle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    idle.swap(idle_);
    open_ -= idle.size();
  }
  returned_.notify_all();
  return idle.size();
}  // the connections close here, outside the lock

PoolGauges Pool::gauges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return PoolGauges{size_,        open_ - idle_.size(), idle_.size(), waiting_,
                    pooled_seen_, routines_newest_,     server_,      server_changes_};
}

void Pool::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;  // leased connections close when they come back
  }
  drop_idle();
}

}  // namespace stockade::detail::pg
