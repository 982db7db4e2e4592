// Connections to PostgreSQL: one connection with its prepared statements and session
// settings, and a bounded pool of them.
//
// What the pool guarantees: at most `size` connections are open at once, counting those
// being opened, so the server never sees more sessions from one engine than pool_size
// allows, whatever the traffic. A caller waits for one no longer than the pool's timeout
// (Overloaded) or its call's deadline, whichever comes first (DeadlineExceeded, and
// nothing was changed); no wait is unbounded. A connection comes back either whole
// (idle, reused newest first, so that the idle ones past a burst are the ones that age)
// or discarded: a lease marks it discarded when its state is unknown (a broken link, a
// deadline that fired, a commit whose outcome is not known), and it is then closed, never
// handed to another call. Opening and closing happen outside the pool's lock, so a slow
// connect or close holds up no other caller.
//
// What it does not do: it does not test a connection before lending it. A connection the
// server dropped while it sat idle fails on its first statement, which run() treats as a
// break before anything was sent (and retries) or as a lost commit (and resolves); after
// one such break the store drops the idle siblings too (drop_idle()), since a restart or a
// failover breaks them all. It also does not balance across servers: one DSN, one server
// (or one pooler) at a time, and a connection that reaches another server than the one
// before is logged and counted (a failover), not refused.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <type_traits>
#include <vector>

#include "postgres/statements.hpp"
#include "stockade/errors.hpp"
#include "stockade/postgres_store.hpp"

namespace stockade::detail::pg {

// The server session behind a connection: its backend PID and when it started (the pair
// names one session even if the PID is reused later).
struct Backend {
  std::int32_t pid = 0;
  std::int64_t started_us = 0;
  // The server it ran on: "<system identifier>/<timeline>". A promoted standby shares the
  // primary's system identifier but not its timeline; another cluster shares neither.
  std::string server;
};

// A connection, direct or through a pooler (see Pooler). Directly, it prepares each
// statement once and keeps its settings in the session. `pooled()`: a transaction-mode
// pooler may be in between, so it keeps no session state at all. Its statements go
// unnamed (parsed with their parameters in one round trip), its lock_timeout is set with
// SET LOCAL by begin() in each transaction, and it has no server session to end
// (backend() is empty).
class Watchdog;  // watchdog.hpp

class Connection {
 public:
  // Its setup statements are armed with `watchdog` (if given) until `deadline_us`.
  Connection(const std::string& dsn, std::shared_ptr<const Statements> statements, Pooler pooler,
             Watchdog* watchdog = nullptr, std::int64_t deadline_us = 0);

  pqxx::connection& raw() { return *conn_; }
  bool is_open() const;
  bool pooled() const { return pooled_; }
  const Statements& statements() const { return *statements_; }
  const Backend& backend() const { return backend_; }

  // The lock_timeout of the next transactions. Directly, it is set on the session, only
  // when it differs from the last value set; pooled, begin() sets it in each transaction.
  void set_lock_timeout(std::int64_t ms);
  // Call first in every transaction that may wait for a lock. Pooled: SET LOCAL
  // lock_timeout (one round trip); directly: nothing (the session has it).
  void begin(pqxx::transaction_base& work);
  // What a pooled transaction begins with: BEGIN and SET LOCAL lock_timeout, one round trip.
  std::string begin_sql() const;
  std::string lock_timeout_sql() const;

  // Whether this connection calls the statement routines (Statements::routines()): it is
  // pooled, and they all existed when it opened.
  bool routines() const { return routines_; }

  // Runs SQL built for this call (its values quoted into it) inside `work`, unnamed.
  pqxx::result exec_sql(pqxx::transaction_base& work, const std::string& sql) {
    try {
      send_begin(work);
      return work.exec(sql);
    } catch (...) {
      statement_failed_ = true;  // TransactionByHand::commit() must not send COMMIT
      throw;
    }
  }

  // Runs a statement inside `work`: prepared on this connection, or unnamed when pooled
  // (as a call of its routine when this connection has them; the first statement of a
  // transaction by hand then travels with its BEGIN, its values quoted into the call).
  template <class... Args>
  pqxx::result exec(pqxx::transaction_base& work, Stmt s, Args&&... args) {
    if (pooled_) {
      try {
        const bool routine = routines_ && statements_->has_routine(s);
        if (routine && begin_pending_) {
          std::string sql = begin_sql() + "; " + statements_->routine_call_head(s);
          [[maybe_unused]] const char* separator = "";
          ((sql += separator, sql += literal(work, args), separator = ", "), ...);
          sql += ")";
          begin_pending_ = false;  // sent: from here on, the transaction is open
          return work.exec(sql);
        }
        send_begin(work);
        const std::string& sql = routine ? statements_->routine_call(s) : statements_->sql(s);
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
        // libpqxx 7.10 (Debian 13) deprecates exec_params for exec(sql, params).
        return work.exec(sql, pqxx::params{std::forward<Args>(args)...});
#else
        return work.exec_params(sql, std::forward<Args>(args)...);  // 6.4
#endif
      } catch (...) {
        statement_failed_ = true;  // TransactionByHand::commit() must not send COMMIT
        throw;
      }
    }
    prepare(s);
#if PQXX_VERSION_MAJOR > 7 || (PQXX_VERSION_MAJOR == 7 && PQXX_VERSION_MINOR >= 10)
    // libpqxx 7.10 (Debian 13) deprecates exec_prepared for exec(prepped, params).
    return work.exec(pqxx::prepped{Statements::name(s)}, pqxx::params{std::forward<Args>(args)...});
#else
    return work.exec_prepared(Statements::name(s), std::forward<Args>(args)...);  // libpqxx 6.4
#endif
  }

 private:
  void prepare(Stmt s);
  // A transaction by hand whose BEGIN waits for its first statement: sends it alone.
  void send_begin(pqxx::transaction_base& work) {
    if (!begin_pending_) return;
    begin_pending_ = false;  // whatever it answers: a failed BEGIN left nothing to end
    work.exec(begin_sql());
  }
  // A value as an SQL literal, for a routine's call sent with its BEGIN (the routine's
  // parameter types give the quoted text its type, as they do a parameter's).
  static std::string literal(pqxx::transaction_base& work, const std::string& value) {
    return work.quote(value);
  }
  template <class T, class = std::enable_if_t<std::is_integral_v<T>>>
  static std::string literal(pqxx::transaction_base& work, T value) {
    return work.quote(std::to_string(value));
  }

  std::unique_ptr<pqxx::connection> conn_;
  std::shared_ptr<const Statements> statements_;
  std::array<bool, stmt_count> prepared_{};
  std::int64_t lock_timeout_ms_ = -1;
  bool session_set_ = false;  // direct: the session has lock_timeout_ms_ and generic plans
  bool pooled_ = false;
  bool routines_ = false;
  bool statement_failed_ = false;  // pooled: since the last TransactionByHand began
  bool begin_pending_ = false;     // pooled: a TransactionByHand has not sent its BEGIN yet
  Backend backend_;
  friend class TransactionByHand;
};

// Opens a connection, turning failure into Error(unavailable).
std::unique_ptr<pqxx::connection> connect(const std::string& dsn);

// Ends the server session `backend` (pg_terminate_backend) from a fresh connection and
// waits until it is gone from pg_stat_activity, at most `timeout_ms` (its statements armed
// with `watchdog`, so a server that stops answering cannot hold it longer). Once it is
// gone, whatever it was running has committed or rolled back for good, and a fresh read
// shows which. Returns whether that was established (false: the server cannot be
// reached, or the session would not end in time).
bool end_session(const std::string& dsn, const Backend& backend, std::int64_t timeout_ms,
                 Watchdog& watchdog);

// A transaction run by hand on a nontransaction, for pooled connections on the hot path:
// BEGIN and SET LOCAL lock_timeout travel as one simple query (pqxx::work sends BEGIN
// alone, and SET LOCAL would cost a second round trip). With statement routines they wait
// for the transaction's first statement and travel with it when it has a routine (one
// round trip fewer again), or just before it otherwise. commit() refuses to send COMMIT
// after a statement of the transaction failed (the server would answer ROLLBACK to it,
// which libpqxx 6.4 does not let us read, and a caller that swallowed the error would be
// told of a commit that did not happen). Destroyed without commit(), it sends ROLLBACK;
// if that fails, the connection is broken, and the caller discards it.
class TransactionByHand {
 public:
  TransactionByHand(pqxx::nontransaction& session, Connection& conn);
  TransactionByHand(const TransactionByHand&) = delete;
  TransactionByHand& operator=(const TransactionByHand&) = delete;
  ~TransactionByHand();
  void commit();

 private:
  pqxx::nontransaction& session_;
  Connection& conn_;
  bool open_ = false;
};

// What the pool holds right now: `open` counts connections leased or being opened.
struct PoolGauges {
  std::size_t size = 0;
  std::size_t in_use = 0;
  std::size_t idle = 0;
  std::size_t waiting = 0;           // callers waiting for a connection
  bool pooled = false;               // a connection opened so far runs as Connection::pooled()
  bool routines = false;             // the newest pooled connection calls statement routines
  std::string server;                // the server the newest direct connection reached
  std::uint64_t server_changes = 0;  // new connections that found another server
};

// A bounded pool. acquire() hands out an idle connection, opens a new one while fewer than
// `size` are open, or waits at most `timeout_ms` for one to come back (then Overloaded),
// and never past the call's deadline (then DeadlineExceeded).
class Pool {
 public:
  Pool(std::string dsn, std::shared_ptr<const Statements> statements, std::size_t size,
       std::int64_t timeout_ms, Pooler pooler, Watchdog& watchdog);
  ~Pool();

  class Lease {
   public:
    Lease(Pool* pool, std::unique_ptr<Connection> conn) : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    Connection& operator*() { return *conn_; }
    Connection* operator->() { return conn_.get(); }
    // The connection is broken or in an unknown state: close it instead of reusing it.
    void discard() { discard_ = true; }

   private:
    Pool* pool_;
    std::unique_ptr<Connection> conn_;
    bool discard_ = false;
  };

  // `deadline_us`: the call's deadline (steady clock, microseconds), 0 for none.
  Lease acquire(std::int64_t deadline_us = 0);
  // Closes every idle connection: after one broke, its idle siblings are suspect too (a
  // server restart or failover breaks them all), so the next acquire() opens a fresh one.
  // Returns how many it closed.
  std::size_t drop_idle();
  void close();
  const std::string& dsn() const { return dsn_; }
  PoolGauges gauges() const;
  std::size_t size() const { return size_; }

 private:
  void give_back(std::unique_ptr<Connection> conn, bool discard);
  // Notes the server a new connection reached; logs and counts a change.
  void note_server(const Connection& conn);

  const std::string dsn_;
  const std::shared_ptr<const Statements> statements_;
  const std::size_t size_;
  const std::int64_t timeout_ms_;
  const Pooler pooler_;
  Watchdog& watchdog_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::size_t waiting_ = 0;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::size_t open_ = 0;  // idle, leased, and being opened
  bool pooled_seen_ = false;
  bool routines_newest_ = false;  // the newest pooled connection calls statement routines
  std::string server_;            // see PoolGauges
  std::uint64_t server_changes_ = 0;
  bool closed_ = false;
};

}  // namespace stockade::detail::pg
