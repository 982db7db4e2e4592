// PostgresStore's lifecycle and plumbing: opening and closing, options, stats, and the
// transaction runner's backoff.
#include <algorithm>
#include <set>
#include <sstream>

#include "postgres/dsn.hpp"
#include "postgres/postgres_store_impl.hpp"

namespace stockade::detail::pg {

// [a-z_][a-z0-9_]{0,62}
bool valid_schema_name(const std::string& schema) {
  if (schema.empty() || schema.size() > 63) return false;
  for (std::size_t i = 0; i < schema.size(); ++i) {
    const char c = schema[i];
    const bool letter = (c >= 'a' && c <= 'z') || c == '_';
    if (!letter && (i == 0 || c < '0' || c > '9')) return false;
  }
  return true;
}

// PostgreSQL's reserved key words (both kinds: "reserved" and "reserved, can be function
// or type"), which cannot name a schema without quotes. stockade writes the schema name
// unquoted into its SQL, so it refuses them, as it refuses names that start with pg_
// (reserved for system schemas).
// (Alphabetical, separated by spaces.)
constexpr const char* reserved_words =
    "all analyse analyze and any array as asc asymmetric authorization binary both case "
    "cast check collate collation column concurrently constraint create cross "
    "current_catalog current_date current_role current_schema current_time "
    "current_timestamp current_user default deferrable desc distinct do else end except "
    "false fetch for foreign freeze from full grant group having ilike in initially inner "
    "intersect into is isnull join lateral leading left like limit localtime "
    "localtimestamp natural not notnull null offset on only or order outer overlaps "
    "placing primary references returning right select session_user similar some "
    "symmetric system_user table tablesample then to trailing true union unique user "
    "using variadic verbose when where window with";

bool reserved_schema_name(const std::string& schema) {
  static const std::set<std::string> words = [] {
    std::set<std::string> out;
    std::istringstream in(reserved_words);
    for (std::string word; in >> word;) out.insert(word);
    return out;
  }();
  return words.count(schema) > 0 || schema.rfind("pg_", 0) == 0;
}

namespace {

// The migrations this build knows, by name (released files never change): what the
// statement routines' names carry of the tables they were made on.
std::string migration_names() {
  std::string out;
  for (const Migration& m : migrations()) out += std::string(m.name) + "\n";
  return out;
}

// The options as the store runs them. Citus carries no session SET to its workers, and
// could not plan our statements as generic plans of prepared statements: the Citus layout
// runs without session state, SET LOCAL in each transaction, as behind a transaction-mode
// pooler, on every connection (the pool's and the sweeper's).
PostgresOptions effective(PostgresOptions options) {
  // Connecting is bounded by libpq's connect_timeout, whole seconds and at least 2: the
  // call_timeout rounded up, at most 10 (so that a call opening a connection to a server
  // that does not answer waits about its call_timeout, not longer).
  const auto connect_s = static_cast<int>(std::clamp<std::int64_t>(
      (options.call_timeout_ms + 999) / 1000, connect_timeout_min_s, connect_timeout_max_s));
  options.dsn = with_connection_defaults(options.dsn, options.application_name, connect_s);
  if (options.layout == Layout::citus) options.pooler = Pooler::transaction;
  return options;
}

}  // namespace

PostgresStore::PostgresStore(PostgresOptions options, std::shared_ptr<Telemetry> shared)
    : Store(std::move(shared)),
      options_(effective(std::move(options))),
      statements_(std::make_shared<Statements>(options_.schema, options_.layout == Layout::citus,
                                               migration_names())),
      watchdog_(options_.dsn, options_.cancel_grace_ms),
      pool_(options_.dsn, statements_, options_.pool_size, options_.pool_timeout_ms,
            options_.pooler, watchdog_) {
  {
    Pool::Lease first =
        pool_.acquire(call_deadline_us());  // fail fast on a bad DSN or a server that is down
    if (first->pooled() && options_.pooler == Pooler::detect) {
      log(LogLevel::info, "stockade.postgres",
          "a connection pooler stands between this engine and PostgreSQL (the cancel key's "
          "PID is not the server's): running without session state, as for "
          "pooler='pgbouncer-transaction'");
    }
    if (first->pooled() && !first->routines() && !statements_->routines().empty()) {
      log(LogLevel::info, "stockade.postgres",
          "schema '" + options_.schema +
              "' lacks this release's statement routines, so pooled connections run each "
              "statement unnamed, planned on every execution; migrate() makes them");
    }
  }
  if (options_.citus_routing == CitusRouting::direct) {
    routes_ = std::make_unique<Routes>(options_.dsn, statements_, options_.pool_size,
                                       options_.pool_timeout_ms, watchdog_);
  }
  telemetry().sweeper_enabled(options_.sweeper);
  if (options_.sweeper) sweeper_ = std::thread([this] { sweep_loop(); });
  channel_ = feed_channel(options_.schema);
  if (options_.feed_notify) notifier_ = std::thread([this] { notify_loop(); });
}

PostgresStore::~PostgresStore() {
  close();
}

void PostgresStore::close() {
  {
    std::lock_guard<std::mutex> lock(sweeper_mutex_);
    stopping_ = true;
  }
  sweeper_wake_.notify_all();
  notify_wake_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  if (notifier_.joinable()) notifier_.join();
  notifier_conn_.reset();
  {
    std::unique_lock<std::mutex> lock(listen_mutex_);  // a waiter holds it a slice at most
    listen_cv_.wait(lock, [this] { return !listening_; });
    listener_.reset();
  }
  if (routes_) routes_->close();
  pool_.close();
  watchdog_.stop();
}

void PostgresStore::run_again_or_give_up(Pool& pool, bool& reconnected, const ErrorContext& context,
                                         const char* cause) {
  if (!reconnected) {
    reconnected = true;
    const std::size_t closed = pool.drop_idle();
    // INFO: nothing was committed and the engine recovers by itself.
    reconnect_log().log(LogLevel::info, "stockade.postgres",
                        "a database connection broke before its commit (" +
                            plain_cause(scrub_secrets(cause, options_.dsn)) +
                            "); nothing was committed, so the call runs again on a fresh "
                            "connection (and " +
                            std::to_string(closed) + " idle ones were closed with it)");
    return;
  }
  ErrorContext c = context;
  throw Error(ErrorCode::unavailable,
              std::string("the database connection broke twice; nothing was changed: ") + cause,
              std::move(c));
}

void PostgresStore::remote_node_failed(bool& retried, bool committing, bool delegated,
                                       const ErrorContext& context, const char* cause) {
  if (committing && !(delegated && never_reached(cause)))
    throw remote_commit_failed(context, cause);
  if (!retried) {
    retried = true;
    return;
  }
  ErrorContext c = context;
  throw Error(ErrorCode::unavailable,
              "a database node that holds this call's rows is out of reach (a Citus worker "
              "that is down or restarting); nothing was changed, and calls on other nodes' "
              "rows go on: " +
                  first_line(scrub_secrets(cause, options_.dsn), 240),
              std::move(c));
}

void PostgresStore::sql_failed(const pqxx::sql_error& e, Pool::Lease& lease, bool fired,
                               bool at_commit, bool delegated, const Failure& failure) {
  const std::string state = sqlstate_of(e);
  // A delegated call commits by itself on the worker: cancelled, or its session ended
  // (57P01, 57P02) while it ran, it may have committed first.
  const bool maybe_done =
      delegated && (state == query_canceled || state == "57P01" || state == "57P02");
  if (fired) {
    lease.discard();
    if (state == query_canceled) throw past_deadline(failure.context, maybe_done);  // ours
    throw translate(e, failure);
  }
  if (maybe_done) throw remote_commit_failed(failure.context, e.what());
  if (at_commit) {
    if (statements_->citus()) throw remote_commit_failed(failure.context, e.what());
    lease.discard();
  }
  throw translate(e, failure);
}

namespace {

// What a kind of delegated call is called in the warning that turns it off.
const char* delegated_calls(Delegated which) {
  switch (which) {
    case Delegated::reserve:
      return "reserves";
    case Delegated::batch:
      return "one-row batches";
    case Delegated::purge:
      return "purges";
    case Delegated::write:
      return "sells and steps";
  }
  return "delegated calls";
}

}  // namespace

bool PostgresStore::lacks_delegation(const Error& e, Delegated which) {
  if (e.code() != ErrorCode::schema_not_migrated || e.context().sqlstate != undefined_function) {
    return false;
  }
  if (delegation_[static_cast<std::size_t>(which)].on.exchange(false)) {
    log(LogLevel::warning, "stockade.postgres",
        "schema '" + options_.schema +
            "' lacks this release's delegated functions (Citus layout), so " +
            delegated_calls(which) +
            " take the statement path, which is slower; migrate() makes them");
  }
  return true;
}

std::optional<Routes::Route> PostgresStore::route_of(std::uint16_t shard) {
  if (!routes_) return std::nullopt;
  if (routes_->claim_reload()) load_routes();
  return routes_->route(shard);
}

// Reads the shard map on the coordinator. Until it can (no schema yet, the coordinator out
// of reach), calls go through the coordinator, and the read is tried again a second later.
void PostgresStore::load_routes() {
  static LogLimiter failures;
  try {
    const pqxx::result rows = run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
      return tx.conn.exec_sql(tx.work, Routes::map_sql(options_.schema));
    });
    routes_->install(rows);
  } catch (const std::exception& e) {
    routes_->reload_failed();
    failures.log(LogLevel::info, "stockade.postgres",
                 "citus_routing='direct': the shard map could not be read (" +
                     first_line(scrub_secrets(e.what(), options_.dsn), 240) +
                     "); calls go through the coordinator until it can");
  }
}

std::int64_t PostgresStore::call_deadline_us() const {
  const std::int64_t scoped = CallDeadline::current();
  return scoped != 0 ? scoped : steady_now_us() + options_.call_timeout_ms * 1000;
}

Error PostgresStore::past_deadline(const ErrorContext& context, bool commit_sent) const {
  static LogLimiter deadlines;
  const std::string bound = "the call's deadline (call_timeout " +
                            std::to_string(options_.call_timeout_ms) + " ms) passed ";
  ErrorContext c = context;
  if (!commit_sent) {
    Error error(ErrorCode::deadline_exceeded,
                bound +
                    "before its COMMIT was sent: the server was asked to cancel the call's "
                    "work (and the connection was cut if it did not answer within "
                    "cancel_grace); nothing was changed",
                std::move(c));
    deadlines.log(LogLevel::warning, "stockade.postgres", error.what());
    return error;
  }
  const std::string hint = in_doubt_hint(c);
  Error error(ErrorCode::in_doubt,
              bound +
                  "after its COMMIT was sent (a commit waiting for a synchronous standby, or a "
                  "server that stopped answering), so it may have committed: a cancelled wait "
                  "for a synchronous standby leaves the commit done locally but maybe not "
                  "replicated." +
                  in_doubt_hint_lead + hint + ".",
              std::move(c));
  deadlines.log(LogLevel::warning, "stockade.postgres", error.what());
  return error;
}

void PostgresStore::back_off_or_give_up(const WriteOptions* options, const ErrorContext& context,
                                        const std::string& sqlstate, int attempt,
                                        const char* cause) {
  if (attempt < serialization_retries_max) {
    if (options != nullptr) bump(telemetry().of(options->strategy).retries);
    sleep_full_jitter(attempt, retry_backoff_base_us, retry_backoff_cap_us);
    return;
  }
  ErrorContext c = context;
  c.sqlstate = sqlstate;
  throw Error(ErrorCode::overloaded,
              "gave up after " + std::to_string(attempt + 1) + " " +
                  std::string(rule_for(sqlstate).meaning) + ": " + cause,
              std::move(c));
}

LogLimiter& reconnect_log() {
  static LogLimiter limiter;
  return limiter;
}

StoreCounts PostgresStore::counts() const {
  StoreCounts out;
  out.exact = false;
  auto* self = const_cast<PostgresStore*>(this);  // run() leases from the (mutable) pool
  pqxx::result rows;
  try {
    rows = self->run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
      return tx.exec(Stmt::counts_estimate, static_cast<std::int64_t>(held_count_cap));
    });
  } catch (const Error& e) {
    // A schema that migrate() has not made yet holds no rows: stats() still answers
    // (a metrics scrape may come first), with zeros.
    if (e.context().sqlstate == undefined_table) return out;
    throw;
  }
  out.sku_count = rows[0][0].as<std::uint64_t>();
  out.reservation_count = rows[0][1].as<std::uint64_t>();
  out.held_count = rows[0][2].as<std::uint64_t>();
  return out;
}

StoreCounts PostgresStore::exact_counts() const {
  StoreCounts out;
  const std::string& s = options_.schema;
  auto* self = const_cast<PostgresStore*>(this);  // run() leases from the (mutable) pool
  const pqxx::result rows = self->run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    return tx.work.exec("SELECT (SELECT count(*) FROM " + s + ".stock), (SELECT count(*) FROM " +
                        s + ".reservation), (SELECT count(*) FROM " + s +
                        ".reservation WHERE state = 'held')");
  });
  out.sku_count = rows[0][0].as<std::uint64_t>();
  out.reservation_count = rows[0][1].as<std::uint64_t>();
  out.held_count = rows[0][2].as<std::uint64_t>();
  return out;
}

}  // namespace stockade::detail::pg

namespace stockade {

Layout layout_from_name(const std::string& name) {
  if (name == "plain") return Layout::plain;
  if (name == "citus") return Layout::citus;
  throw_invalid_argument("layout must be 'plain' or 'citus', got " + shown(name));
}

const char* layout_name(Layout layout) noexcept {
  return layout == Layout::citus ? "citus" : "plain";
}

CitusRouting citus_routing_from_name(const std::string& name) {
  if (name == "coordinator") return CitusRouting::coordinator;
  if (name == "direct") return CitusRouting::direct;
  throw_invalid_argument("citus_routing must be 'coordinator' or 'direct', got " + shown(name));
}

const char* citus_routing_name(CitusRouting routing) noexcept {
  return routing == CitusRouting::direct ? "direct" : "coordinator";
}

Pooler pooler_from_name(const std::string& name) {
  if (name == "auto") return Pooler::detect;
  if (name == "none") return Pooler::none;
  if (name == "pgbouncer-transaction") return Pooler::transaction;
  throw_invalid_argument("pooler must be 'auto', 'none' or 'pgbouncer-transaction', got " +
                         shown(name));
}

const char* pooler_name(Pooler pooler) noexcept {
  switch (pooler) {
    case Pooler::detect:
      return "auto";
    case Pooler::none:
      return "none";
    case Pooler::transaction:
      return "pgbouncer-transaction";
  }
  return "auto";
}

void validate_postgres_options(const PostgresOptions& options) {
  if (options.dsn.find('\0') != std::string::npos) {
    throw_invalid_argument("dsn must not contain NUL bytes");
  }
  detail::pg::parse_conninfo(options.dsn);  // InvalidArgument, without quoting it
  const std::string& app = options.application_name;
  const bool printable = std::all_of(app.begin(), app.end(), [](char c) {
    return c >= 0x20 && c < 0x7F && c != '\'' && c != '\\';
  });
  if (app.size() > 63 || !printable) {
    throw_invalid_argument(
        "application_name must be printable ASCII without quotes or backslashes, at most 63 "
        "bytes");
  }
  if (!detail::pg::valid_schema_name(options.schema)) {
    throw_invalid_argument("schema must match [a-z_][a-z0-9_]* and be at most 63 bytes, got " +
                           shown(options.schema));
  }
  if (detail::pg::reserved_schema_name(options.schema)) {
    throw_invalid_argument("schema " + shown(options.schema) +
                           " is a PostgreSQL reserved word or a pg_ name; pick another name");
  }
  if (options.citus_routing == CitusRouting::direct && options.layout != Layout::citus) {
    throw_invalid_argument("citus_routing='direct' needs layout='citus'");
  }
  if (options.pool_size == 0 || options.pool_size > pool_size_max) {
    throw_invalid_argument("pool_size must be between 1 and " + std::to_string(pool_size_max));
  }
  if (options.pool_timeout_ms <= 0 || options.pool_timeout_ms > lock_timeout_ms_max) {
    throw_invalid_argument("pool_timeout must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms");
  }
  if (options.sweep_interval_ms <= 0 || options.sweep_interval_ms > lock_timeout_ms_max) {
    throw_invalid_argument("sweep_interval must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms");
  }
  if (options.lock_timeout_ms <= 0 || options.lock_timeout_ms > lock_timeout_ms_max) {
    throw_invalid_argument("lock_timeout must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms");
  }
  if (options.resolve_timeout_ms <= 0 || options.resolve_timeout_ms > lock_timeout_ms_max) {
    throw_invalid_argument("resolve_timeout must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms");
  }
  if (options.call_timeout_ms <= 0 || options.call_timeout_ms > lock_timeout_ms_max) {
    throw_invalid_argument("call_timeout must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms");
  }
  if (options.cancel_grace_ms <= 0 || options.cancel_grace_ms > cancel_grace_ms_max) {
    throw_invalid_argument("cancel_grace must be between 1 ms and " +
                           std::to_string(cancel_grace_ms_max) + " ms");
  }
  if (options.sweep_batch == 0 || options.sweep_batch > expire_batch_max) {
    throw_invalid_argument("sweep_batch must be between 1 and " + std::to_string(expire_batch_max));
  }
  if (options.purge_batch == 0 || options.purge_batch > expire_batch_max) {
    throw_invalid_argument("purge_batch must be between 1 and " + std::to_string(expire_batch_max));
  }
  if (options.retention_ms < 0) throw_invalid_argument("retention must not be negative");
  if (options.retention_ms > 0 && !options.sweeper) {
    throw_invalid_argument(
        "retention needs sweeper=True: the sweeper is what purges (or call purge() yourself)");
  }
}

std::shared_ptr<Store> make_postgres_store(PostgresOptions options,
                                           std::shared_ptr<Telemetry> telemetry) {
  validate_postgres_options(options);
  return std::make_shared<detail::pg::PostgresStore>(std::move(options), std::move(telemetry));
}

}  // namespace stockade
