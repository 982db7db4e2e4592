#include "stockade/errors.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

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

std::string one_line(const std::string& message) {
  const auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  if (message.find_first_of("\n\r") == std::string::npos &&
      (message.empty() || !blank(message.back()))) {
    return message;  // the common case: nothing to do
  }
  std::string out;
  out.reserve(message.size());
  for (std::size_t i = 0; i < message.size();) {
    if (message[i] != '\n' && message[i] != '\r') {
      out += message[i++];
      continue;
    }
    while (!out.empty() && blank(out.back())) out.pop_back();  // before the break
    while (i < message.size() && blank(message[i])) ++i;       // the break and after it
    if (out.empty() || i == message.size()) continue;
    // A line that ends without a mark, before one that starts a sentence (libpq's
    // "Connection refused\n\tIs the server running..."), ends its sentence here.
    const bool sentence = message[i] >= 'A' && message[i] <= 'Z';
    if (sentence && std::string_view(".:;,!?").find(out.back()) == std::string_view::npos) {
      out += '.';
    }
    out += ' ';
  }
  while (!out.empty() && blank(out.back())) out.pop_back();
  return out;
}

std::string in_doubt_hint(const ErrorContext& context) {
  if (context.keyed) {
    return "retry with the same idempotency key: it returns the first call's outcome if that "
           "landed, and makes the change if it did not";
  }
  if (context.reservation_id) {
    return "read the reservation back: its state and version show whether the change landed";
  }
  if (!context.sku.empty()) {
    return "a reserve or order with an idempotency key: retry with the same key, which returns "
           "its reservation if it landed; any other write: read the stock row back (its version, "
           "and movements()) before writing again";
  }
  return "read back what the call changes before calling it again";
}

Error rehint_in_doubt(const Error& error, const ErrorContext& context) {
  const std::string message = error.what();
  const std::size_t at = message.rfind(in_doubt_hint_lead);
  const std::string head = at == std::string::npos ? message + "." : message.substr(0, at);
  return Error(error.code(), head + in_doubt_hint_lead + in_doubt_hint(context) + ".", context);
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
