#include "stockade/errors.hpp"

namespace stockade {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::out_of_stock:
      return "out_of_stock";
    case ErrorCode::not_found:
      return "not_found";
    case ErrorCode::version_conflict:
      return "version_conflict";
    case ErrorCode::reservation_expired:
      return "reservation_expired";
    case ErrorCode::invalid_state:
      return "invalid_state";
    case ErrorCode::lock_not_available:
      return "lock_not_available";
    case ErrorCode::lock_timeout:
      return "lock_timeout";
    case ErrorCode::idempotency_conflict:
      return "idempotency_conflict";
    case ErrorCode::in_doubt:
      return "in_doubt";
    case ErrorCode::overloaded:
      return "overloaded";
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::not_supported:
      return "not_supported";
    case ErrorCode::invariant_violation:
      return "invariant_violation";
    case ErrorCode::unavailable:
      return "unavailable";
    case ErrorCode::database_error:
      return "database_error";
  }
  return "unknown";
}

void throw_invalid_argument(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

}  // namespace stockade
