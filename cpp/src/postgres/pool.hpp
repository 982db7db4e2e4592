// Connections to PostgreSQL: one connection with its prepared statements and session
// settings, and a bounded pool of them.
#pragma once

#include <array>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <vector>

#include "statements.hpp"
#include "stockade/errors.hpp"

namespace stockade::detail::pg {

// The server session behind a connection: its backend PID and when it started (the pair
// names one session even if the PID is reused later).
struct Backend {
  std::int32_t pid = 0;
  std::int64_t started_us = 0;
};

class Connection {
 public:
  Connection(const std::string& dsn, std::shared_ptr<const Statements> statements);

  pqxx::connection& raw() { return *conn_; }
  bool is_open() const;
  const Backend& backend() const { return backend_; }

  // Sets the session's lock_timeout, only when it differs from the last value set.
  void set_lock_timeout(std::int64_t ms);

  // Runs a prepared statement inside `work` (preparing it first on this connection).
  template <class... Args>
  pqxx::result exec(pqxx::transaction_base& work, Stmt s, Args&&... args) {
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

  std::unique_ptr<pqxx::connection> conn_;
  std::shared_ptr<const Statements> statements_;
  std::array<bool, stmt_count> prepared_{};
  std::int64_t lock_timeout_ms_ = -1;
  Backend backend_;
};

// Opens a connection, turning failure into Error(unavailable).
std::unique_ptr<pqxx::connection> connect(const std::string& dsn);

// Ends the server session `backend` (pg_terminate_backend) from a fresh connection and
// waits until it is gone from pg_stat_activity, at most `timeout_ms`. Once it is gone,
// whatever it was running has committed or rolled back for good, and a fresh read shows
// which. Returns whether that was established (false: the server cannot be reached, or
// the session would not end in time).
bool end_session(const std::string& dsn, const Backend& backend, std::int64_t timeout_ms);

// What the pool holds right now: `open` counts connections leased or being opened.
struct PoolGauges {
  std::size_t size = 0;
  std::size_t in_use = 0;
  std::size_t idle = 0;
  std::size_t waiting = 0;  // callers waiting for a connection
};

// A bounded pool. acquire() hands out an idle connection, opens a new one while fewer than
// `size` are open, or waits at most `timeout_ms` for one to come back (then Overloaded).
class Pool {
 public:
  Pool(std::string dsn, std::shared_ptr<const Statements> statements, std::size_t size,
       std::int64_t timeout_ms);
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

  Lease acquire();
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

  const std::string dsn_;
  const std::shared_ptr<const Statements> statements_;
  const std::size_t size_;
  const std::int64_t timeout_ms_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;
  std::size_t waiting_ = 0;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::size_t open_ = 0;  // idle, leased, and being opened
  bool closed_ = false;
};

}  // namespace stockade::detail::pg
