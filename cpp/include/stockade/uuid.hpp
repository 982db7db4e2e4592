// Reservation ids: UUIDv7 (RFC 9562), made in C++.
//
// The first 48 bits are Unix milliseconds, so ids sort by creation time and new rows land
// at the right edge of a B-tree index (good locality). The rest is random from the
// kernel's CSPRNG (getrandom), so ids cannot be guessed from one another. Sixteen of the
// random bits (the first 16 bits of rand_b) carry the row's shard key, a stable hash of
// (sku, location), so a sharded layout can route `confirm(id)` to one shard without a
// lookup table (docs/design.md, "10. Scale-out").
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace stockade {

struct Uuid {
  std::array<std::uint8_t, 16> bytes{};

  // Canonical 8-4-4-4-12 lowercase hex form.
  std::string to_string() const;
  // Parses the canonical form (hyphens required, either case); throws InvalidArgument.
  static Uuid parse(std::string_view text);
  // Builds from exactly 16 bytes; throws InvalidArgument on any other length.
  static Uuid from_bytes(std::string_view raw);

  std::uint8_t version() const { return bytes[6] >> 4; }
  std::int64_t unix_ms() const;
  std::uint16_t shard_key() const;
  bool is_nil() const;

  friend bool operator==(const Uuid& a, const Uuid& b) { return a.bytes == b.bytes; }
  friend bool operator!=(const Uuid& a, const Uuid& b) { return a.bytes != b.bytes; }
  friend bool operator<(const Uuid& a, const Uuid& b) { return a.bytes < b.bytes; }
};

// Makes a UUIDv7 for the given wall-clock milliseconds, carrying `shard_key`.
Uuid make_uuid_v7(std::int64_t unix_ms, std::uint16_t shard_key);

struct UuidHash {
  std::size_t operator()(const Uuid& id) const noexcept;
};

}  // namespace stockade
