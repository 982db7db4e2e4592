#include "stockade/errors.hpp"

#include <cstdio>
#include <cstdlib>

#include "base/invariant.hpp"

namespace stockade {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
#define STOCKADE_ERROR_NAME(name, comment) \
  case ErrorCode::name:                    \
    return #name;
    STOCKADE_ERROR_CODES(STOCKADE_ERROR_NAME)
#undef STOCKADE_ERROR_NAME
  }
  return "unknown";
}

void throw_invalid_argument(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

}  // namespace stockade

namespace stockade::detail {

void assertion_failed(const char* condition, const char* file, int line) noexcept {
  std::fprintf(stderr, "stockade: assertion failed: %s (%s:%d)\n", condition, file, line);
  std::abort();
}

}  // namespace stockade::detail
