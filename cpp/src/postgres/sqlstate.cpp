#include "postgres/sqlstate.hpp"

#include <algorithm>
#include <array>

namespace stockade::detail::pg {
namespace {

using A = SqlAction;
using C = ErrorCode;

// Every SQLSTATE the store treats specially. Anything else is a DatabaseError that
// carries its SQLSTATE.
constexpr std::array<SqlStateRule, 20> rules{{
    {"40001", A::retry, C::overloaded, "serialization failures"},
    {"40P01", A::retry, C::overloaded, "deadlocks"},
    {"55P03", A::lock, C::lock_timeout, "lock not available"},
    {query_canceled, A::raise, C::overloaded,
     "the server canceled the statement (statement_timeout or a cancel request); nothing "
     "was changed"},
    {"23505", A::raise, C::idempotency_conflict, "a unique key is already taken"},
    {"23514", A::raise, C::invariant_violation,
     "the database refused a write that breaks a CHECK constraint (a bug in the engine; "
     "please report it)"},
    {"SK002", A::raise, C::invariant_violation, "the stock row of a reservation is missing"},
    {"22003", A::raise, C::invalid_argument, "a quantity would overflow a 64-bit value"},
    {undefined_table, A::raise, C::schema_not_migrated, "the schema is missing or not migrated"},
    {"3F000", A::raise, C::schema_not_migrated, "the schema is missing or not migrated"},
    {"42703", A::raise, C::schema_not_migrated,
     "the schema is older than this version of stockade (a column is missing)"},
    {undefined_function, A::raise, C::schema_not_migrated,
     "the schema is older than this version of stockade (a function is missing)"},
    {"28", A::raise, C::misconfigured,
     "the server refused the role or its password (fix the DSN or the server's pg_hba.conf)"},
    {"3D000", A::raise, C::misconfigured, "the DSN names a database that does not exist"},
    {"42501", A::raise, C::misconfigured,
     "the role lacks a privilege stockade needs (see the GRANTs in the docs)"},
    {"53300", A::raise, C::unavailable, "the database is unavailable"},
    {"57P01", A::raise, C::unavailable, "the database is unavailable"},
    {"57P02", A::raise, C::unavailable, "the database is unavailable"},
    {"57P03", A::raise, C::unavailable, "the database is unavailable"},
    {"08", A::raise, C::unavailable, "the database is unavailable"},  // connection exceptions
}};

constexpr SqlStateRule other{"", A::raise, C::database_error, "database error"};

// The server's own wording (and libpq's) of a refused connection. libpq reports no
// SQLSTATE for a failed connection attempt, so here alone the message text decides; on a
// server whose lc_messages is not English none matches and the failure stays Unavailable.
constexpr std::array<std::string_view, 10> refusals{{
    "authentication failed",           // password, peer, ident, SASL; PgBouncer's too
    "no pg_hba.conf entry for",        // 28000
    "pg_hba.conf rejects connection",  // 28000
    "is not permitted to log in",      // 28000
    "\" does not exist",               // role or database (28000, 3D000)
    "permission denied for database",  // 42501 (CONNECT privilege)
    "no password supplied",            // libpq: the server asks for one, the DSN has none
    "no such database",                // PgBouncer
    "no such user",                    // PgBouncer
    "invalid connection option",       // libpq: the DSN itself is malformed
}};

}  // namespace

const SqlStateRule& rule_for(std::string_view sqlstate) {
  for (const SqlStateRule& rule : rules) {
    if (rule.sqlstate.size() == 5 && rule.sqlstate == sqlstate) return rule;
  }
  for (const SqlStateRule& rule : rules) {
    if (rule.sqlstate.size() == 2 && sqlstate.substr(0, 2) == rule.sqlstate) return rule;
  }
  return other;
}

std::string plain_cause(std::string_view message) {
  struct Plain {
    std::string_view marker, said;
  };
  static constexpr std::array<Plain, 8> plain{{
      {"terminating connection due to administrator command",
       "the server ended the session: a restart, a shutdown or pg_terminate_backend"},
      {"server closed the connection", "the server closed the connection"},
      {"not connected",
       "the server had already closed the connection: a restart or an ended session"},
      {"Connection lost while committing", "the connection broke while COMMIT was on its way"},
      // libpqxx 6.4 tries to reopen a broken connection once, and says this when it cannot.
      {"Connection to database failed",
       "the connection broke and could not be opened again: the server was down or restarting"},
      {"timed out", "the connection timed out"},
      {"Connection reset", "the connection was reset"},
      {"Broken pipe", "the connection was reset"},
  }};
  for (const Plain& p : plain) {
    if (message.find(p.marker) != std::string_view::npos) return std::string(p.said);
  }
  return first_line(message, 160);
}

bool from_a_node(std::string_view message) {
  return message.find("remote node") != std::string_view::npos ||
         message.find("connections to the node") != std::string_view::npos;
}

bool never_reached(std::string_view message) {
  // libpq's and the server's words for a connection that was never made.
  // (Not "connection not open": Citus says it of a connection that broke, which may
  // have been after the call was sent, and the worker's commit with it.)
  static constexpr std::array<std::string_view, 6> unmade{{
      "Connection refused",
      "the database system is starting up",
      "the database system is shutting down",
      "the database system is not yet accepting connections",
      "the database system is in recovery mode",
      "timeout expired",
  }};
  // Citus's own words when no connection to the node came up in time.
  if (message.find("could not establish") != std::string_view::npos) return true;
  if (message.find("connection to the remote node") == std::string_view::npos) return false;
  for (std::string_view m : unmade) {
    if (message.find(m) != std::string_view::npos) return true;
  }
  return false;
}

std::string first_line(std::string_view message, std::size_t n) {
  std::size_t end = std::min(message.find('\n'), n);
  if (end < message.size()) {
    while (end > 0 && (static_cast<unsigned char>(message[end]) & 0xC0) == 0x80) --end;
  }
  return std::string(message.substr(0, end));
}

bool is_refusal(std::string_view message) {
  for (std::string_view refusal : refusals) {
    if (message.find(refusal) != std::string_view::npos) return true;
  }
  return false;
}

std::string sqlstate_of(const pqxx::sql_error& e) {
  std::string state = e.sqlstate();
  if (!state.empty()) return state;
  // libpqxx 6.4 throws some of its specific classes without the code: the class says it.
  if (dynamic_cast<const pqxx::insufficient_privilege*>(&e) != nullptr) return "42501";
  if (dynamic_cast<const pqxx::unique_violation*>(&e) != nullptr) return "23505";
  if (dynamic_cast<const pqxx::check_violation*>(&e) != nullptr) return "23514";
  if (dynamic_cast<const pqxx::undefined_table*>(&e) != nullptr)
    return std::string(undefined_table);
  if (dynamic_cast<const pqxx::undefined_column*>(&e) != nullptr) return "42703";
  if (dynamic_cast<const pqxx::undefined_function*>(&e) != nullptr)
    return std::string(undefined_function);
  if (dynamic_cast<const pqxx::too_many_connections*>(&e) != nullptr) return "53300";
  return state;
}

Error translate(const pqxx::sql_error& e, const Failure& failure) {
  const std::string state = sqlstate_of(e);
  const SqlStateRule& rule = rule_for(state);
  ErrorContext context = failure.context;
  context.sqlstate = state;
  const std::string what = e.what();
  if (rule.action == SqlAction::lock) {
    if (failure.options != nullptr && failure.options->nowait) {
      return Error(ErrorCode::lock_not_available, "lock not available (NOWAIT): " + what,
                   std::move(context));
    }
    const std::string ms = failure.options != nullptr
                               ? std::to_string(failure.options->lock_timeout_ms) + " ms"
                               : std::string("the lock_timeout");
    return Error(ErrorCode::lock_timeout, "lock_timeout of " + ms + " passed: " + what,
                 std::move(context));
  }
  std::string message(rule.meaning);
  if (rule.code == ErrorCode::schema_not_migrated)
    message += " (schema '" + failure.schema + "'); call migrate() first";
  if (rule.code == ErrorCode::database_error) message += " " + state;
  return Error(rule.code, message + ": " + what, std::move(context));
}

}  // namespace stockade::detail::pg
