// One error taxonomy for the whole engine. Every failure a caller can act on is an Error
// with a code; the Python bindings map each code to one exception class of
// stockade.errors, and the PostgreSQL store maps SQLSTATEs to these codes in one place.
//
// Invalid input from a caller is always an Error (code invalid_argument), never an assert:
// asserts are reserved for what the engine itself guarantees.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "stockade/uuid.hpp"

namespace stockade {

enum class ErrorCode : std::uint8_t {
  out_of_stock,
  not_found,
  version_conflict,
  reservation_expired,
  invalid_state,
  lock_not_available,
  lock_timeout,
  idempotency_conflict,
  in_doubt,
  overloaded,
  invalid_argument,
  not_supported,
  invariant_violation,
  unavailable,     // the database cannot be reached; nothing was changed
  database_error,  // any other database error; context().sqlstate says which
};

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
  std::string state;  // the current reservation state, for invalid_state and the like
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, ErrorContext context = {})
      : std::runtime_error(message), code_(code), context_(std::move(context)) {}

  ErrorCode code() const noexcept { return code_; }
  const ErrorContext& context() const noexcept { return context_; }

 private:
  ErrorCode code_;
  ErrorContext context_;
};

[[noreturn]] void throw_invalid_argument(const std::string& message);

}  // namespace stockade
