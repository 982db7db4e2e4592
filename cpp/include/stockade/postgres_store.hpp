// PostgresStore: the durable store, over libpqxx (6.4 and 7.x).
//
// A bounded pool of connections with prepared statements; every strategy of docs/design.md
// section 1 in SQL; reservations with TTLs from the database clock; idempotency keys in
// their own table; a commit whose outcome is unknown raises InDoubt. The schema lives in
// sql/ (compiled into the library) and is applied by Store::migrate().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "stockade/store.hpp"

namespace stockade {

// Whether a connection pooler in transaction mode (PgBouncer's pool_mode = transaction)
// may stand between the engine and the server. Behind one, consecutive transactions of one
// client connection run on different server sessions, so nothing may rest on session
// state: the store then sends unnamed statements instead of prepared ones, sets
// lock_timeout with SET LOCAL in each transaction, elects the sweeper with a
// transaction-scoped advisory lock each round, and cannot end the server session of a
// commit whose connection was lost (that outcome stays InDoubt).
enum class Pooler {
  detect,       // per connection: a pooler is there when the cancel key's PID that libpq
                // got differs from the server's pg_backend_pid() (PgBouncer issues its own)
  none,         // direct, or a pooler in session mode: session state is safe
  transaction,  // always run as behind a transaction-mode pooler
};

// "auto", "none" or "pgbouncer-transaction"; InvalidArgument otherwise.
Pooler pooler_from_name(const std::string& name);
const char* pooler_name(Pooler pooler) noexcept;

// The physical layout of the tables. `citus`: stock, reservation and idempotency carry a
// shard_key column (a 16-bit stable hash of the SKU and location, which reservation ids
// carry too), are distributed on it by Citus and co-located, and every statement on them
// names the shard key it touches, so that the work for one SKU runs on one shard.
enum class Layout {
  plain,  // one PostgreSQL server
  citus,  // a Citus coordinator and its workers
};

// "plain" or "citus"; InvalidArgument otherwise.
Layout layout_from_name(const std::string& name);
const char* layout_name(Layout layout) noexcept;

// Where the Citus layout sends a call on one shard's rows (docs/scaling-out.md, "Routing
// straight to the worker"). Multi-shard work, migrate() and DDL always go through the
// coordinator.
enum class CitusRouting {
  coordinator,  // through the coordinator, which forwards it to the worker
  direct,       // straight to the worker that holds the shard (a map and a pool per worker)
};

// "coordinator" or "direct"; InvalidArgument otherwise.
CitusRouting citus_routing_from_name(const std::string& name);
const char* citus_routing_name(CitusRouting routing) noexcept;

struct PostgresOptions {
  std::string dsn;                      // a libpq connection string or URI
  std::string schema = "stockade";      // [a-z_][a-z0-9_]*, at most 63 bytes
  std::size_t pool_size = 8;            // connections, opened on demand
  std::int64_t pool_timeout_ms = 5000;  // waiting longer for a connection raises Overloaded
  // A background sweeper (one per database is elected) expires lapsed holds every
  // sweep_interval_ms, and a refused request frees lapsed holds before its refusal stands.
  // false: holds lapse only when expire_due() runs or a transition finds one lapsed.
  bool sweeper = true;
  std::int64_t sweep_interval_ms = 1000;
  std::size_t sweep_batch = 1000;  // holds expired per transaction
  // Retention: when > 0 (needs sweeper), the sweeper also purges what is older than this
  // (Store::purge), after expiring, in transactions of purge_batch rows.
  std::int64_t retention_ms = 0;
  std::size_t purge_batch = 5000;  // rows deleted per purge transaction
  // The movement journal's retention: when > 0 (needs sweeper), the sweeper also drops
  // journal entries older than this that every feed consumer has read (purge_movements);
  // entries older than feed_lag_max_ms go even so, and a consumer that had not read them
  // is told FeedOverrun.
  std::int64_t journal_retention_ms = 0;
  std::int64_t feed_lag_max_ms = 7LL * 24 * 3600 * 1000;
  // Wake the change feed's waiters (in any process) with one NOTIFY per few milliseconds
  // of this engine's commits, from a thread of its own (docs/journal.md).
  bool feed_notify = true;
  // lock_timeout of the calls that take no lock options (restock, set_on_hand, the
  // transitions, expiry); Engine::postgres sets it to the engine's lock_timeout.
  std::int64_t lock_timeout_ms = 10000;
  // After a connection was lost during a commit, how long the store may spend ending the
  // server session that ran it (so that it cannot commit later) before it answers InDoubt.
  std::int64_t resolve_timeout_ms = 5000;
  // The bound on a call's whole time: waiting for a connection, its statements and lock
  // waits, its retries and its COMMIT (postgres/watchdog.hpp). Past it the store sends
  // the server a cancel request and, cancel_grace_ms later, cuts the connection; the
  // caller gets DeadlineExceeded if no COMMIT was sent (nothing changed), else InDoubt.
  // After a connection lost during COMMIT, settling it may take resolve_timeout_ms more.
  std::int64_t call_timeout_ms = 30000;
  std::int64_t cancel_grace_ms = 1000;
  // The application_name of every connection, so that operators find stockade's sessions
  // in pg_stat_activity. Printable ASCII, at most 63 bytes; an application_name in the
  // DSN or in PGAPPNAME wins over it.
  std::string application_name = "stockade";
  Pooler pooler = Pooler::detect;
  Layout layout = Layout::plain;
  // Layout::citus only. `direct` keeps a pool of pool_size connections to each worker as
  // well as the coordinator's.
  CitusRouting citus_routing = CitusRouting::coordinator;
};

inline constexpr std::size_t pool_size_max = 1024;
inline constexpr std::int64_t cancel_grace_ms_max = 60000;

// The keyword/value pairs a libpq connection string (key=value or URI) sets, as libpq
// parses it; InvalidArgument, without quoting the string, if it cannot be parsed. Lets
// tools hand a child process the password through its environment instead of its argv.
std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& dsn);

// Checks the options; throws InvalidArgument.
void validate_postgres_options(const PostgresOptions& options);

// One statement the PostgreSQL store prepares, as a plan audit sees it.
struct PreparedStatementText {
  std::string name;      // the prepared statement's name ("stockade_...")
  std::string sql;       // as prepared, with the schema filled in
  int parameters = 0;    // it takes $1..$n
  bool routine = false;  // behind a transaction pooler it runs inside a statement routine
};

// Every statement the store prepares, on the plain layout (the Citus layout prepares
// none: it sends each statement unnamed, planned for its values). For the plan audit of
// the tests (tests/python/test_plans.py).
std::vector<PreparedStatementText> prepared_statements(const std::string& schema);

// Opens one connection at once, so that a bad DSN or an unreachable server fails here
// (Unavailable), not on the first request.
std::shared_ptr<Store> make_postgres_store(PostgresOptions options,
                                           std::shared_ptr<Telemetry> telemetry = nullptr);

}  // namespace stockade
