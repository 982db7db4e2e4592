#include "stockade/uuid.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "stockade/errors.hpp"

namespace stockade {
namespace {

// Random bytes from the kernel, fetched a block at a time so that making an id costs a
// copy, not a system call. The buffer is per thread, so no locking is needed.
class RandomPool {
 public:
  void fill(std::uint8_t* out, std::size_t n) {
    if (used_ + n > sizeof(buffer_)) refill();
    std::memcpy(out, buffer_ + used_, n);
    used_ += n;
  }

 private:
  void refill() {
    std::size_t got = 0;
    while (got < sizeof(buffer_)) {
      ssize_t r = getrandom(buffer_ + got, sizeof(buffer_) - got, 0);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "getrandom");
      }
      got += static_cast<std::size_t>(r);
    }
    used_ = 0;
  }

  std::uint8_t buffer_[4096];
  std::size_t used_ = sizeof(buffer_);
};

thread_local RandomPool random_pool;

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

Uuid make_uuid_v7(std::int64_t unix_ms, std::uint16_t shard_key) {
  Uuid id;
  random_pool.fill(id.bytes.data(), id.bytes.size());
  const auto ms = static_cast<std::uint64_t>(unix_ms);
  for (int i = 0; i < 6; ++i) id.bytes[i] = static_cast<std::uint8_t>(ms >> (40 - 8 * i));
  id.bytes[6] = static_cast<std::uint8_t>(0x70 | (id.bytes[6] & 0x0F));  // version 7
  id.bytes[8] = static_cast<std::uint8_t>(0x80 | (id.bytes[8] & 0x3F));  // RFC variant
  // rand_b starts after the two variant bits: bytes 8 (low 6 bits) to 15. Its first 16
  // bits, the top 16 of the 22 bits in bytes 8..10, carry the shard key.
  const std::uint32_t bits = (static_cast<std::uint32_t>(id.bytes[8] & 0x3F) << 16) |
                             (static_cast<std::uint32_t>(id.bytes[9]) << 8) | id.bytes[10];
  const std::uint32_t with_key = (bits & 0x3Fu) | (static_cast<std::uint32_t>(shard_key) << 6);
  id.bytes[8] = static_cast<std::uint8_t>(0x80 | ((with_key >> 16) & 0x3F));
  id.bytes[9] = static_cast<std::uint8_t>(with_key >> 8);
  id.bytes[10] = static_cast<std::uint8_t>(with_key);
  return id;
}

std::uint16_t Uuid::shard_key() const {
  const std::uint32_t bits = (static_cast<std::uint32_t>(bytes[8] & 0x3F) << 16) |
                             (static_cast<std::uint32_t>(bytes[9]) << 8) | bytes[10];
  return static_cast<std::uint16_t>(bits >> 6);
}

std::int64_t Uuid::unix_ms() const {
  std::uint64_t ms = 0;
  for (int i = 0; i < 6; ++i) ms = (ms << 8) | bytes[i];
  return static_cast<std::int64_t>(ms);
}

bool Uuid::is_nil() const {
  for (auto b : bytes)
    if (b != 0) return false;
  return true;
}

std::string Uuid::to_string() const {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(digits[bytes[i] >> 4]);
    out.push_back(digits[bytes[i] & 0x0F]);
  }
  return out;
}

Uuid Uuid::parse(std::string_view text) {
  if (text.size() != 36 || text[8] != '-' || text[13] != '-' || text[18] != '-' ||
      text[23] != '-') {
    throw_invalid_argument("reservation id must be a UUID in 8-4-4-4-12 hex form");
  }
  // Every position but the four dashes holds a hex digit: 32 digits, 16 bytes. Reading
  // by position (not by skipping dashes as they come) never leaves the 36 characters.
  Uuid id;
  std::size_t digit = 0;
  for (std::size_t i = 0; i < 36; ++i) {
    if (i == 8 || i == 13 || i == 18 || i == 23) continue;
    const int value = hex_value(text[i]);
    if (value < 0) throw_invalid_argument("reservation id has a non-hex digit");
    std::uint8_t& byte = id.bytes[digit / 2];
    byte = static_cast<std::uint8_t>(digit % 2 == 0 ? value << 4 : byte | value);
    ++digit;
  }
  return id;
}

Uuid Uuid::from_bytes(std::string_view raw) {
  if (raw.size() != 16) throw_invalid_argument("reservation id must be exactly 16 bytes");
  Uuid id;
  std::memcpy(id.bytes.data(), raw.data(), 16);
  return id;
}

std::size_t UuidHash::operator()(const Uuid& id) const noexcept {
  // Bytes 8..15 hold the shard key of the id's row as well as random bits, so they are
  // mixed (splitmix64's finalizer) before use: otherwise every id of one hot SKU would
  // share its low bits and land in one bucket or shard.
  std::uint64_t x;
  std::memcpy(&x, id.bytes.data() + 8, sizeof(x));
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return static_cast<std::size_t>(x ^ (x >> 31));
}

}  // namespace stockade
