// Option parsing: strategy names, and connection strings as libpq parses them. Any text
// gives a strategy or InvalidArgument; any connection string parses or raises
// InvalidArgument that does not quote it; and scrub_secrets never lets a parsed password
// through, whatever libpq's message quotes.
#include <algorithm>

#include "fuzz.hpp"
#include "postgres/dsn.hpp"
#include "stockade/errors.hpp"
#include "stockade/types.hpp"

const std::vector<std::string>& fuzz_seeds() {
  static const std::vector<std::string> seeds = {
      "atomic",
      "auto",
      "host=127.0.0.1 port=5432 user=u password=hunter2 dbname=d",
      "postgresql://u:hunter2@127.0.0.1:5432/d?sslmode=disable",
      "postgresql://u:hunt%zzer2@127.0.0.1/d",
      "postgresql://u:hunter2@[::1/d",
      "password='hun\\'ter2' host=h",
      ""};
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const stockade::Strategy s = stockade::parse_strategy(text);
    FUZZ_CHECK(text == stockade::strategy_name(s));
  } catch (const stockade::Error& e) {
    FUZZ_CHECK(e.code() == stockade::ErrorCode::invalid_argument);
  }
  if (text.find('\0') != std::string::npos) return 0;  // refused before libpq sees it
  try {
    for (const auto& [keyword, value] : stockade::detail::pg::parse_conninfo(text)) {
      if (keyword != "password" || value.empty()) continue;
      if (value.find_first_not_of('*') == std::string::npos) continue;  // the mask itself
      // A message that quotes the whole connection string, as libpq's sometimes do.
      const std::string message = "error near \"" + text + "\": " + value;
      FUZZ_CHECK(stockade::detail::pg::scrub_secrets(message, text).find(value) ==
                 std::string::npos);
    }
  } catch (const stockade::Error& e) {
    FUZZ_CHECK(e.code() == stockade::ErrorCode::invalid_argument);
    // Always the same words: nothing of the input is quoted.
    static const std::string refusal = [] {
      try {
        stockade::detail::pg::parse_conninfo("=");
      } catch (const stockade::Error& bad) {
        return std::string(bad.what());
      }
      return std::string();
    }();
    FUZZ_CHECK(!refusal.empty() && e.what() == refusal);
  }
  return 0;
}
