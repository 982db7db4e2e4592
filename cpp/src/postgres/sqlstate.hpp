// The one place where a SQLSTATE decides what happens: retry the transaction, or raise
// which stockade error. Keyed on the code only, never on the server's message text,
// which is translated on servers with another lc_messages (is_refusal() is the one
// exception, for failed connection attempts, which carry no SQLSTATE).
#pragma once

#include <pqxx/pqxx>
#include <string>
#include <string_view>

#include "stockade/errors.hpp"
#include "stockade/store.hpp"

namespace stockade::detail::pg {

// The SQLSTATEs the store tests for by name outside rule_for(); the first two have their
// rules in the table (sqlstate.cpp) too.
inline constexpr std::string_view query_canceled = "57014";   // a cancel request: ours, if
                                                              // the call's watchdog fired
inline constexpr std::string_view undefined_table = "42P01";  // the schema is not migrated
// A function the call names is missing: the schema predates this release's (a Citus
// layout's delegated functions before migrate()).
inline constexpr std::string_view undefined_function = "42883";
// abort_statement() (migration 004): a one-statement write undid itself, as its caller
// asked, and the caller decides the long way.
inline constexpr std::string_view statement_aborted = "SK001";

// What the transaction runner does with a failed statement's SQLSTATE.
enum class SqlAction {
  retry,  // the server rolled the transaction back (40001, 40P01): run it again, bounded
  lock,   // 55P03: LockNotAvailable under the request's NOWAIT, else LockTimeout
  raise,  // raise `code`
};

struct SqlStateRule {
  std::string_view sqlstate;  // a full code, or a two-character class ("08")
  SqlAction action;
  ErrorCode code;            // for raise
  std::string_view meaning;  // the start of the error message
};

// Whether a failed connection attempt's message says the server refused the DSN's role,
// password or database (a configuration error) rather than being unreachable: the one
// decision made on message text, since libpq gives a failed connection no SQLSTATE.
bool is_refusal(std::string_view message);

// What a lost connection's libpq/libpqxx message means, in plain words for a log line
// ("the server closed the connection"), or the message's first line if none fits.
std::string plain_cause(std::string_view message);

// Whether a connection error (class 08) is the Citus coordinator's about a node behind
// it (its words name the node), not about the client's own connection.
bool from_a_node(std::string_view message);

// Whether a Citus coordinator's connection error (class 08) says that it could not
// connect to the worker at all (refused, starting up, shutting down, in recovery, a
// connect timeout): the call never reached the worker, so it changed nothing there.
bool never_reached(std::string_view message);

// The first line of a server's message, at most `n` bytes, never cut inside a UTF-8
// character: the remote node's error as the server words it (with the node it names).
std::string first_line(std::string_view message, std::size_t n);

// The rule for `sqlstate`: an exact code first, then its class, then DatabaseError.
const SqlStateRule& rule_for(std::string_view sqlstate);

inline bool is_retryable(std::string_view sqlstate) {
  return rule_for(sqlstate).action == SqlAction::retry;
}

// The SQLSTATE of a failed statement: its own, or where libpqxx 6.4 left it out, the one
// its exception class stands for.
std::string sqlstate_of(const pqxx::sql_error& e);

// What a failed statement was doing, for the error it becomes.
struct Failure {
  const WriteOptions* options = nullptr;  // the caller's lock options, if any
  ErrorContext context;                   // sku / reservation the call is about
  std::string schema;
};

// The stockade error for a failed statement, by rule_for(e.sqlstate()). A 55P03 is
// LockNotAvailable when the request asked for NOWAIT and LockTimeout otherwise: the
// request's own option decides, not the server's wording. Retryable codes never get here
// (the runner retries them, then raises Overloaded).
Error translate(const pqxx::sql_error& e, const Failure& failure);

// The SQLSTATE of a rolled-back transaction, whichever libpqxx reported it (libpqxx 6.4
// does not derive serialization failures and deadlocks from sql_error; 7.x does).
inline std::string rollback_sqlstate(const pqxx::transaction_rollback& e) {
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e)) return sql->sqlstate();
  return dynamic_cast<const pqxx::deadlock_detected*>(&e) != nullptr ? "40P01" : "40001";
}

// `settled`: the server session that ran the write has ended, so a read shows whether it
// committed; otherwise even a read may not show the final outcome yet. `pooled`: the
// session was never known, since a transaction-mode pooler stands in between.
inline Error in_doubt(const ErrorContext& context, const std::string& cause, bool settled,
                      bool pooled = false) {
  const char* why =
      settled  ? "The server session has ended, so the outcome is final."
      : pooled ? "A connection pooler stands between the engine and the server session, which "
                 "therefore cannot be ended, so the write may still complete: look a little "
                 "later."
               : "The server session could not be ended in time, so the write may still "
                 "complete: look a little later.";
  return Error(ErrorCode::in_doubt,
               "the connection was lost during COMMIT (" + plain_cause(cause) +
                   "); the outcome is unknown. " + why + " (" + one_line(cause) + ")" +
                   in_doubt_hint_lead + in_doubt_hint(context) + ".",
               context);
}

}  // namespace stockade::detail::pg
