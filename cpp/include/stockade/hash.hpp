// Stable hashing: the same bytes give the same value on every machine, process and
// release. Used for shard keys, advisory lock keys and request fingerprints, all of which
// outlive a process (they are stored or shared between engines), so std::hash, which may
// change between library versions, is not allowed here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace stockade {

// FNV-1a over each part, each part prefixed with its length so that ("ab", "c") and
// ("a", "bc") hash differently, followed by a final avalanche (splitmix64) so that the
// low bits are usable on their own.
std::uint64_t stable_hash64(std::initializer_list<std::string_view> parts) noexcept;

// The 16-bit shard key of a stock row, carried inside reservation ids.
std::uint16_t shard_key_of(std::string_view sku, std::string_view location) noexcept;

// The shard key of a stock row at (sku, location), whichever hot-row slot of the SKU it is:
// shard_key_of its SKU, so that a SKU's slots share its shard (on Citus), its batcher
// shard and its contention cell. Every stock row's key is computed here.
std::uint16_t row_shard_key(std::string_view sku, std::string_view location) noexcept;

}  // namespace stockade
