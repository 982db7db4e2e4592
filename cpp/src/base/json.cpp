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
      if (!digits()) return false;
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
        // \u0000 is valid JSON, but PostgreSQL's jsonb refuses it: refused on both stores.
        if (s_.substr(at_ + 1, 4) == "0000") return false;
        for (int i = 0; i < 4; ++i) {
          if (++at_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[at_]))) {
            return false;
          }
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
  if (text.find('\0') != std::string::npos || !JsonCheck(text).object_only()) {
    throw_invalid_argument("metadata must be one JSON object (at most " +
                           std::to_string(depth_max) + " levels deep, no \\u0000 in a string)");
  }
}

}  // namespace stockade
