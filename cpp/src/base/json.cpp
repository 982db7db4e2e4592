// validate_metadata: a reservation's metadata is a small JSON object (RFC 8259), checked
// here so that both stores keep the same rule (PostgreSQL's jsonb would refuse bad text,
// the memory store would keep it).
#include <cctype>
#include <string>
#include <string_view>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade {
namespace {

constexpr int depth_max = 32;

class JsonCheck {
 public:
  explicit JsonCheck(std::string_view text) : s_(text) {}

  // Whether the whole text is one JSON object.
  bool object_only() {
    space();
    if (at_ >= s_.size() || s_[at_] != '{') return false;
    if (!value(0)) return false;
    space();
    return at_ == s_.size();
  }

 private:
  void space() {
    while (at_ < s_.size() &&
           (s_[at_] == ' ' || s_[at_] == '\t' || s_[at_] == '\n' || s_[at_] == '\r')) {
      ++at_;
    }
  }
  bool take(char c) {
    space();
    if (at_ < s_.size() && s_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }
  bool word(std::string_view w) {
    if (s_.substr(at_, w.size()) != w) return false;
    at_ += w.size();
    return true;
  }
  // The four hex digits after "\\u" (at_ on the 'u'; left on the last digit), or -1.
  int hex4() {
    int unit = 0;
    for (int i = 0; i < 4; ++i) {
      if (++at_ >= s_.size()) return -1;
      const char c = s_[at_];
      const int v = c >= '0' && c <= '9'   ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
      if (v < 0) return -1;
      unit = unit * 16 + v;
    }
    return unit;
  }
  bool digits() {
    const std::size_t from = at_;
    while (at_ < s_.size() && s_[at_] >= '0' && s_[at_] <= '9') ++at_;
    return at_ > from;
  }
  bool number() {
    if (at_ < s_.size() && s_[at_] == '-') ++at_;
    if (at_ < s_.size() && s_[at_] == '0') {
      ++at_;
    } else if (!digits()) {
      return false;
    }
    if (at_ < s_.size() && s_[at_] == '.' && (++at_, !digits())) return false;
    if (at_ < s_.size() && (s_[at_] == 'e' || s_[at_] == 'E')) {
      ++at_;
      if (at_ < s_.size() && (s_[at_] == '+' || s_[at_] == '-')) ++at_;
      const std::size_t start = at_;
      while (at_ < s_.size() && s_[at_] == '0') ++at_;
      const std::size_t significant = at_;
      digits();
      if (at_ == start) return false;  // no digit at all
      // jsonb's numeric holds exponents far past 9999, but not 10^1000000: bounded here.
      if (at_ - significant > 4) return false;
    }
    return true;
  }
  bool string() {
    if (at_ >= s_.size() || s_[at_] != '"') return false;
    for (++at_; at_ < s_.size(); ++at_) {
      const auto c = static_cast<unsigned char>(s_[at_]);
      if (c == '"') {
        ++at_;
        return true;
      }
      if (c < 0x20) return false;
      if (c != '\\') continue;
      if (++at_ >= s_.size()) return false;
      const char e = s_[at_];
      if (e == 'u') {
        // PostgreSQL's jsonb refuses \u0000 and a surrogate that is not half of a pair,
        // though JSON allows them: refused on both stores.
        const int unit = hex4();
        if (unit <= 0) return false;
        if (unit >= 0xDC00 && unit <= 0xDFFF) return false;  // a low half alone
        if (unit >= 0xD800 && unit <= 0xDBFF) {
          if (s_.substr(at_ + 1, 2) != "\\u") return false;
          at_ += 2;
          const int low = hex4();
          if (low < 0xDC00 || low > 0xDFFF) return false;
        }
      } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
        return false;
      }
    }
    return false;
  }
  bool value(int depth) {
    if (depth > depth_max) return false;
    space();
    if (at_ >= s_.size()) return false;
    const char c = s_[at_];
    if (c == '{') return members(depth, '}', true);
    if (c == '[') return members(depth, ']', false);
    if (c == '"') return string();
    if (c == 't') return word("true");
    if (c == 'f') return word("false");
    if (c == 'n') return word("null");
    return number();
  }
  // An object's members or an array's elements, after the opening bracket.
  bool members(int depth, char close, bool named) {
    ++at_;
    if (take(close)) return true;
    do {
      if (named) {
        space();
        if (!string() || !take(':')) return false;
      }
      if (!value(depth + 1)) return false;
    } while (take(','));
    return take(close);
  }

  std::string_view s_;
  std::size_t at_ = 0;
};

}  // namespace

void validate_metadata(const std::string& text) {
  if (text.size() > metadata_bytes_max) {
    throw_invalid_argument("metadata is " + std::to_string(text.size()) +
                           " bytes of JSON; the limit is " + std::to_string(metadata_bytes_max) +
                           " bytes (METADATA_BYTES_MAX)");
  }
  if (text.find('\0') != std::string::npos || !is_valid_utf8(text) ||
      !JsonCheck(text).object_only()) {
    throw_invalid_argument("metadata must be one JSON object (at most " +
                           std::to_string(depth_max) +
                           " levels deep, UTF-8, no \\u0000 or unpaired surrogate in a string, "
                           "no exponent past 9999)");
  }
}

}  // namespace stockade
