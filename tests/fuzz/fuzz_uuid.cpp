// Uuid::parse on any text: it returns an id whose text form is the input in lower case, or
// raises InvalidArgument; it never reads outside the input (ASan watches).
#include <algorithm>
#include <cctype>
#include <memory>

#include "fuzz.hpp"
#include "stockade/errors.hpp"
#include "stockade/uuid.hpp"

const std::vector<std::string>& fuzz_seeds() {
  static const std::vector<std::string> seeds = {"0189a0b2-7c1e-7abc-8def-0123456789ab",
                                                 "00000000-0000-0000-0000-0000000000-0",
                                                 "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
                                                 "not-a-uuid",
                                                 "",
                                                 "--------------------"};
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::unique_ptr<char[]> copy = exact_copy(data, size);
  const std::string_view text(copy.get(), size);
  try {
    const stockade::Uuid id = stockade::Uuid::parse(text);
    std::string lower(text);
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    FUZZ_CHECK(id.to_string() == lower);
  } catch (const stockade::Error& e) {
    FUZZ_CHECK(e.code() == stockade::ErrorCode::invalid_argument);
  }
  return 0;
}
