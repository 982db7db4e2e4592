// One error taxonomy for the whole engine. Every failure a caller can act on is an Error
// with a code; the Python bindings map each code to one exception class of
// stockade.errors, and the PostgreSQL store maps SQLSTATEs to these codes in one place.
//
// Invalid input from a caller is always an Error (code invalid_argument), never an assert:
// asserts are reserved for what the engine itself guarantees.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "stockade/uuid.hpp"

namespace stockade {

// Every error code, written once. Each X(name, comment) entry gives the enum value, its
// stable name (error_code_name, shared with Python as _core.ERROR_CODES) and, through the
// Python test of the error classes, exactly one exception class of stockade.errors.
#define STOCKADE_ERROR_CODES(X)                                                \
  X(out_of_stock, "fewer units are available than asked for")                  \
  X(not_found, "no such stock row or reservation")                             \
  X(version_conflict, "expected_version (If-Match) does not match")            \
  X(retries_exhausted, "optimistic retries ran out; nothing changed")          \
  X(reservation_expired, "the hold lapsed before the transition")              \
  X(invalid_state, "the reservation or engine is in the wrong state")          \
  X(lock_not_available, "NOWAIT found the lock taken")                         \
  X(lock_timeout, "lock_timeout passed while waiting for a lock")              \
  X(idempotency_conflict, "the key belongs to a different request")            \
  X(discontinued, "the stock row was discontinued (soft-deleted)")             \
  X(lease_held, "another holder's lease on the row is live")                   \
  X(fencing_token_stale, "a newer lease superseded this fencing token")        \
  X(limit_exceeded, "the buyer's purchase limit for the group is reached")     \
  X(in_doubt, "the commit's outcome is unknown")                               \
  X(overloaded, "a bounded wait or retry budget ran out; nothing changed")     \
  X(invalid_argument, "bad input from the caller; nothing changed")            \
  X(not_supported, "the store or build lacks the feature")                     \
  X(invariant_violation, "the engine caught a broken invariant (a bug)")       \
  X(unavailable, "the database cannot be reached; nothing was changed")        \
  X(schema_not_migrated, "the schema is missing or older: run migrate()")      \
  X(misconfigured, "the service's set-up: DSN, role, GRANT, or a fork")        \
  X(deadline_exceeded, "call_timeout passed before COMMIT; nothing changed")   \
  X(feed_overrun, "retention passed a feed consumer's position")               \
  X(database_error, "any other database error; context().sqlstate says which") \
  X(over_return, "more units returned than were sold and not returned yet")

enum class ErrorCode : std::uint8_t {
#define STOCKADE_ERROR_ENUM(name, comment) name,
  STOCKADE_ERROR_CODES(STOCKADE_ERROR_ENUM)
#undef STOCKADE_ERROR_ENUM
};

inline constexpr std::size_t error_code_count = 0
#define STOCKADE_ERROR_COUNT(name, comment) +1
    STOCKADE_ERROR_CODES(STOCKADE_ERROR_COUNT)
#undef STOCKADE_ERROR_COUNT
    ;

// The stable name of a code ("out_of_stock", ...), shared with the Python layer.
const char* error_code_name(ErrorCode code) noexcept;

// What an error is about. Every field is optional; fields that do not apply stay empty.
struct ErrorContext {
  std::string sku;
  std::string location;
  std::optional<Uuid> reservation_id;
  std::string sqlstate;
  std::optional<std::int64_t> expected_version;
  std::optional<std::int64_t> actual_version;
  std::string state;   // the current reservation state, for invalid_state and the like
  bool keyed = false;  // the call carried an idempotency key (in_doubt_hint)
  // out_of_stock: the free units the refusal was decided on (of the row, or the SKU's rows).
  std::optional<std::int64_t> available;
  // An allocation's refusal (out_of_stock): the free units of `sku` at each location of
  // the pool, in the pool's order.
  std::vector<std::pair<std::string, std::int64_t>> pool;
};

// What the caller of a write whose outcome is unknown (InDoubt) can do to learn it, by
// what the write was about: a write with an idempotency key retries with that key, which
// returns the first outcome if it landed and runs the write if not; a transition of a
// reservation reads the reservation back; a
// write to a stock row reads the row back, and a reserve with an idempotency key retries
// with that key, which returns the reservation if it landed.
std::string in_doubt_hint(const ErrorContext& context);
// Every InDoubt message ends with this and then its hint, so that an outcome shared by
// several calls (a batch's) can give each call its own hint (rehint_in_doubt).
inline constexpr const char* in_doubt_hint_lead = " To learn it: ";

// A message on one line: libpq's and the server's texts end in a newline and break lines
// with "\n\t" (connection failures) or "\nDETAIL:"; each line break and the whitespace
// around it become one space, and trailing whitespace goes.
std::string one_line(const std::string& message);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, ErrorContext context = {})
      : std::runtime_error(one_line(message)), code_(code), context_(std::move(context)) {}

  ErrorCode code() const noexcept { return code_; }
  const ErrorContext& context() const noexcept { return context_; }

 private:
  ErrorCode code_;
  ErrorContext context_;
};

// `error` (an InDoubt shared by several calls) for the call about `context`: its context,
// and its message with the hint after in_doubt_hint_lead replaced by that call's.
Error rehint_in_doubt(const Error& error, const ErrorContext& context);

[[noreturn]] void throw_invalid_argument(const std::string& message);

}  // namespace stockade
