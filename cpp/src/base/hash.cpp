#include "stockade/hash.hpp"

namespace stockade {
namespace {

constexpr std::uint64_t fnv_offset = 0xcbf29ce484222325ULL;
constexpr std::uint64_t fnv_prime = 0x100000001b3ULL;

std::uint64_t fnv_mix(std::uint64_t h, unsigned char byte) {
  return (h ^ byte) * fnv_prime;
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t stable_hash64(std::initializer_list<std::string_view> parts) noexcept {
  std::uint64_t h = fnv_offset;
  for (std::string_view part : parts) {
    const std::uint64_t size = part.size();
    for (int i = 0; i < 8; ++i) h = fnv_mix(h, static_cast<unsigned char>(size >> (8 * i)));
    for (char c : part) h = fnv_mix(h, static_cast<unsigned char>(c));
  }
  return splitmix64(h);
}

std::uint16_t shard_key_of(std::string_view sku, std::string_view location) noexcept {
  return static_cast<std::uint16_t>(stable_hash64({sku, location}) >> 48);
}

std::uint16_t row_shard_key(std::string_view sku, std::string_view location) noexcept {
  return shard_key_of(sku, location);
}

}  // namespace stockade
