// Connections to PostgreSQL: the statements a store prepares, one connection with its
// prepared statements and session settings, a bounded pool of them, and the one place
// where SQLSTATEs become stockade errors.
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

#include "stockade/errors.hpp"
#include "stockade/store.hpp"

namespace stockade::detail::pg {

// Every statement the store runs on its hot paths; each is prepared once per connection,
// on first use (so that a connection to an unmigrated database still opens).
enum class Stmt : std::size_t {
  stock_get,
  stock_lock,
  stock_lock_nowait,
  stock_lock_skip,
  stock_insert,
  stock_set_on_hand,
  stock_delta,
  stock_cas,
  stock_overwrite_reserved,
  hold_atomic,
  reservation_insert,
  reservation_get,
  reservation_lock,
  reservation_set,
  reservation_get_many,
  expire_pick,
  idempotency_claim,
  idempotency_get,
  advisory_lock,
  advisory_try_lock,
  batch_claim,
  batch_keys_get,
  batch_lock,
  batch_write,
  batch_unclaim,
  batch_fast,
  batch_fast_one,
  batch_lock_reservations,
  batch_transition,
  count_
};

inline constexpr std::size_t stmt_count = static_cast<std::size_t>(Stmt::count_);

// The SQL of every statement, with the schema name filled in.
class Statements {
 public:
  explicit Statements(const std::string& schema);
  const std::string& sql(Stmt s) const { return sql_[static_cast<std::size_t>(s)]; }
  static const char* name(Stmt s);

 private:
  template <class Set>
  void add_batch_statements(const std::string& schema, Set& set);

  std::array<std::string, stmt_count> sql_;
};

class Connection {
 public:
  Connection(const std::string& dsn, std::shared_ptr<const Statements> statements);

  pqxx::connection& raw() { return *conn_; }
  bool is_open() const;

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
};

// Opens a connection, turning failure into Error(unavailable).
std::unique_ptr<pqxx::connection> connect(const std::string& dsn);

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
  void drop_idle();
  void close();
  const std::string& dsn() const { return dsn_; }
  std::size_t size() const { return size_; }

 private:
  void give_back(std::unique_ptr<Connection> conn, bool discard);

  const std::string dsn_;
  const std::shared_ptr<const Statements> statements_;
  const std::size_t size_;
  const std::int64_t timeout_ms_;
  std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<std::unique_ptr<Connection>> idle_;
  std::size_t open_ = 0;  // idle, leased, and being opened
  bool closed_ = false;
};

// What a failed statement was doing, for the error it becomes.
struct Failure {
  const WriteOptions* options = nullptr;  // the caller's lock options, if any
  ErrorContext context;                   // sku / reservation the call is about
  std::string schema;
};

// The SQLSTATE mapping, in one place:
//   55P03 lock_not_available: LockNotAvailable (NOWAIT) or LockTimeout (lock_timeout)
//   57014 query_canceled: Overloaded (statement_timeout or a cancel request)
//   23505 unique_violation: IdempotencyConflict
//   23514 check_violation: InvariantViolation (always a bug)
//   22003 numeric_value_out_of_range: InvalidArgument (a quantity would overflow)
//   42P01 / 3F000 missing table or schema: InvalidState (run migrate())
//   08xxx, 53300, 57P01-57P03 connection trouble: Unavailable
//   anything else: DatabaseError, with the SQLSTATE
// 40001 and 40P01 never get here: the transaction runner retries them within bounds.
Error translate(const pqxx::sql_error& e, const Failure& failure);

}  // namespace stockade::detail::pg
