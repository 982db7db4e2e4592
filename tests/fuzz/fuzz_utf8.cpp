// The UTF-8 validator against an independent decoder (code points, then the rules:
// shortest form, no surrogates, at most U+10FFFF); shown() of any bytes is valid UTF-8
// with no control characters and a bounded length; a SKU is accepted exactly when it is
// non-empty, short enough, free of NUL and valid UTF-8.
#include <algorithm>
#include <memory>
#include <string_view>

#include "fuzz.hpp"
#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace {

bool decodes(std::string_view s) {
  static const std::uint32_t shortest[] = {0, 0, 0x80, 0x800, 0x10000};
  std::size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    std::uint32_t cp = 0;
    std::size_t len = 0;
    if (lead < 0x80) {
      cp = lead, len = 1;
    } else if ((lead >> 5) == 0x6) {
      cp = lead & 0x1Fu, len = 2;
    } else if ((lead >> 4) == 0xE) {
      cp = lead & 0x0Fu, len = 3;
    } else if ((lead >> 3) == 0x1E) {
      cp = lead & 0x07u, len = 4;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b >> 6) != 0x2) return false;
      cp = (cp << 6) | (b & 0x3Fu);
    }
    if (cp < shortest[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

}  // namespace

const std::vector<std::string>& fuzz_seeds() {
  static const std::vector<std::string> seeds = {"boots",
                                                 "na\xc3\xafve\xf0\x9f\x98\x80",
                                                 "\xe9\x9e\x8b-42",
                                                 "\xed\xa0\x80",
                                                 "\xc0\xaf",
                                                 "\xf4\x90\x80\x80",
                                                 "line\nbreak\x1b[31m",
                                                 std::string(300, 'x'),
                                                 ""};
  return seeds;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::unique_ptr<char[]> copy = exact_copy(data, size);
  const std::string_view text(copy.get(), size);
  FUZZ_CHECK(stockade::is_valid_utf8(text) == decodes(text));

  const std::string shown = stockade::shown(text);
  FUZZ_CHECK(decodes(shown));
  FUZZ_CHECK(std::none_of(shown.begin(), shown.end(), [](char c) {
    const auto b = static_cast<unsigned char>(c);
    return b < 0x20 || b == 0x7F;
  }));
  FUZZ_CHECK(shown.size() <= 2 + 4 * 64 + 40);

  const bool acceptable = !text.empty() && text.size() <= stockade::sku_bytes_max &&
                          text.find('\0') == std::string_view::npos && decodes(text);
  try {
    stockade::validate_sku_key({std::string(text), "default"});
    FUZZ_CHECK(acceptable);
  } catch (const stockade::Error& e) {
    FUZZ_CHECK(!acceptable && e.code() == stockade::ErrorCode::invalid_argument);
  }
  return 0;
}
