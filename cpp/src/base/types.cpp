#include "stockade/types.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "base/invariant.hpp"
#include "stockade/errors.hpp"
#include "stockade/hash.hpp"

namespace stockade {
namespace {

constexpr const char* strategy_names[strategy_count] = {
    "atomic", "pessimistic", "advisory", "optimistic", "batched", "auto",
};

// Length of the UTF-8 sequence starting at `lead`, or 0 if `lead` cannot start one.
std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

}  // namespace

bool is_valid_utf8(std::string_view text) noexcept {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_sequence_length(lead);
    if (n == 0 || i + n > text.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    if (n == 3) {
      const auto second = static_cast<unsigned char>(text[i + 1]);
      if (lead == 0xE0 && second < 0xA0) return false;   // overlong
      if (lead == 0xED && second >= 0xA0) return false;  // UTF-16 surrogate
    }
    if (n == 4) {
      const auto second = static_cast<unsigned char>(text[i + 1]);
      if (lead == 0xF0 && second < 0x90) return false;   // overlong
      if (lead == 0xF4 && second >= 0x90) return false;  // past U+10FFFF
    }
    i += n;
  }
  return true;
}

std::string shown(std::string_view text, std::size_t limit) {
  static constexpr char hex[] = "0123456789abcdef";
  std::size_t cut = std::min(text.size(), limit);
  // Never cut inside a UTF-8 sequence: back up to the byte that starts one.
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  const std::string_view head = text.substr(0, cut);
  const bool utf8 = is_valid_utf8(head);
  std::string out = "'";
  for (char c : head) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\\' || c == '\'') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7F || (byte >= 0x80 && !utf8)) {
      out += "\\x";
      out += hex[byte >> 4];
      out += hex[byte & 0x0F];
    } else {
      out += c;
    }
  }
  out += '\'';
  if (cut < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

namespace {

// Text that becomes a PostgreSQL `text` value: non-empty, bounded, valid UTF-8, no NUL.
// `constant` names the limit as the Python package exports it (stockade.SKU_BYTES_MAX).
void validate_text(std::string_view value, const char* field, std::size_t bytes_max,
                   const char* constant) {
  const std::string name(field);
  if (value.empty()) throw_invalid_argument(name + " must not be empty");
  if (value.size() > bytes_max) {
    throw_invalid_argument(name + " is " + std::to_string(value.size()) +
                           " bytes long (UTF-8); the limit is " + std::to_string(bytes_max) +
                           " bytes (" + constant + ")");
  }
  if (value.find('\0') != std::string_view::npos) {
    throw_invalid_argument(name + " must not contain NUL bytes");
  }
  if (!is_valid_utf8(value)) throw_invalid_argument(name + " must be valid UTF-8");
}

}  // namespace

const char* library_version() noexcept {
  return STOCKADE_VERSION;
}

const char* strategy_name(Strategy strategy) noexcept {
  return strategy_names[static_cast<std::size_t>(strategy)];
}

Strategy parse_strategy(std::string_view name) {
  for (std::size_t i = 0; i < strategy_count; ++i) {
    if (name == strategy_names[i]) return static_cast<Strategy>(i);
  }
  throw_invalid_argument("unknown strategy " + shown(name) +
                         "; expected one of atomic, pessimistic, advisory, optimistic, "
                         "batched, auto");
}

void settle_units(Reservation& r, Settle how, Quantity units) {
  STOCKADE_ASSERT(units > 0 && units <= r.held());
  switch (how) {
    case Settle::confirm:
      r.confirmed += units;
      break;
    case Settle::release:
      r.released += units;
      break;
    case Settle::expire:
      r.expired += units;
      break;
  }
  if (r.held() > 0) {
    r.state = ReservationState::held;
  } else if (r.confirmed > 0) {
    r.state = ReservationState::confirmed;
  } else {
    r.state = how == Settle::expire ? ReservationState::expired : ReservationState::released;
  }
}

bool units_consistent(const Reservation& r) {
  const bool holding = r.state == ReservationState::held;
  return r.confirmed >= 0 && r.released >= 0 && r.expired >= 0 && r.returned >= 0 &&
         r.returned <= r.confirmed && r.held() >= 0 && holding == (r.held() > 0) &&
         (!holding || r.expired == 0);
}

std::string units_of(const Reservation& r) {
  return "qty " + std::to_string(r.qty) + ": held " + std::to_string(r.held()) + ", confirmed " +
         std::to_string(r.confirmed) + ", released " + std::to_string(r.released) + ", expired " +
         std::to_string(r.expired) + ", returned " + std::to_string(r.returned) + "; state " +
         reservation_state_name(r.state);
}

const char* reservation_state_name(ReservationState state) noexcept {
  switch (state) {
    case ReservationState::held:
      return "held";
    case ReservationState::confirmed:
      return "confirmed";
    case ReservationState::released:
      return "released";
    case ReservationState::expired:
      return "expired";
  }
  return "unknown";
}

namespace {
constexpr UnitState unit_states[] = {UnitState::available, UnitState::damaged,
                                     UnitState::quality_control, UnitState::written_off};
}  // namespace

const char* unit_state_name(UnitState state) noexcept {
  switch (state) {
    case UnitState::available:
      return "available";
    case UnitState::damaged:
      return "damaged";
    case UnitState::quality_control:
      return "quality_control";
    case UnitState::written_off:
      return "written_off";
  }
  return "unknown";
}

UnitState parse_unit_state(std::string_view name) {
  for (UnitState state : unit_states) {
    if (name == unit_state_name(state)) return state;
  }
  throw_invalid_argument(
      "a unit state is one of 'available', 'damaged', 'quality_control' or 'written_off' "
      "(a destination only)");
}

const char* transfer_state_name(TransferState state) noexcept {
  switch (state) {
    case TransferState::in_transit:
      return "in_transit";
    case TransferState::received:
      return "received";
    case TransferState::cancelled:
      return "cancelled";
  }
  return "unknown";
}

TransferState parse_transfer_state(std::string_view name) {
  for (TransferState state :
       {TransferState::in_transit, TransferState::received, TransferState::cancelled}) {
    if (name == transfer_state_name(state)) return state;
  }
  throw_invalid_argument("a transfer's state is 'in_transit', 'received' or 'cancelled'");
}

std::size_t SkuKeyHash::operator()(const SkuKey& key) const noexcept {
  const std::uint64_t h = stable_hash64({key.sku, key.location});
  return static_cast<std::size_t>(h ^
                                  (static_cast<std::uint64_t>(key.slot) * 0x9e3779b97f4a7c15ULL));
}

void validate_sku_key(const SkuKey& key) {
  validate_text(key.sku, "sku", sku_bytes_max, "SKU_BYTES_MAX");
  validate_text(key.location, "location", location_bytes_max, "LOCATION_BYTES_MAX");
  if (key.slot != 0) {
    throw_invalid_argument("a hot-row slot's row (slot " + std::to_string(key.slot) +
                           ") is the engine's: name the SKU");
  }
}

SkuKey slot_key(const SkuKey& base, int slot) {
  return SkuKey{base.sku, base.location, slot};
}

SkuKey base_key(const SkuKey& key) {
  return SkuKey{key.sku, key.location, 0};
}

int slot_of(const SkuKey& key) {
  return key.slot;
}

void validate_qty(Quantity qty, const char* field) {
  if (qty <= 0) {
    throw_invalid_argument(std::string(field) + " must be positive, got " + std::to_string(qty));
  }
  if (qty > quantity_max) {
    throw_invalid_argument(std::string(field) + " must be at most " + std::to_string(quantity_max) +
                           " (QUANTITY_MAX), got " + std::to_string(qty));
  }
}

std::string seconds_text(std::int64_t us) {
  const bool negative = us < 0;
  // the magnitude, without overflow for the most negative value
  const std::uint64_t m = negative ? 0 - static_cast<std::uint64_t>(us) : us;
  std::string out = (negative ? "-" : "") + std::to_string(m / 1'000'000);
  if (const std::uint64_t fraction = m % 1'000'000; fraction != 0) {
    std::string digits = std::to_string(fraction);
    digits.insert(0, 6 - digits.size(), '0');
    digits.erase(digits.find_last_not_of('0') + 1);
    out += "." + digits;
  }
  return out + " s";
}

void validate_ttl_us(std::int64_t ttl_us) {
  if (ttl_us <= 0) {
    throw_invalid_argument("ttl must be positive, got " + seconds_text(ttl_us));
  }
  if (ttl_us > ttl_us_max) {
    throw_invalid_argument("ttl is " + seconds_text(ttl_us) + "; the limit is " +
                           seconds_text(ttl_us_max) + " (366 days, TTL_MAX)");
  }
}

void validate_idempotency_key(const std::string& key) {
  validate_text(key, "idempotency_key", idempotency_key_bytes_max, "IDEMPOTENCY_KEY_BYTES_MAX");
}

void validate_lease_owner(const std::string& owner) {
  validate_text(owner, "owner", lease_owner_bytes_max, "LEASE_OWNER_BYTES_MAX");
}

void validate_buyer(const std::string& buyer) {
  validate_text(buyer, "buyer", buyer_bytes_max, "BUYER_BYTES_MAX");
}

void validate_ref(const std::string& ref) {
  validate_text(ref, "ref", ref_bytes_max, "REF_BYTES_MAX");
}

void validate_limit_group(const std::string& group) {
  validate_text(group, "group", limit_group_bytes_max, "LIMIT_GROUP_BYTES_MAX");
}

void validate_purchase_limit(const PurchaseLimit& limit) {
  validate_limit_group(limit.group);
  if (limit.per_buyer <= 0 || limit.per_buyer > quantity_max) {
    throw_invalid_argument("per_buyer must be between 1 and " + std::to_string(quantity_max) +
                           ", got " + std::to_string(limit.per_buyer));
  }
  if (limit.skus.empty() || limit.skus.size() > limit_group_skus_max) {
    throw_invalid_argument("a purchase limit names 1 to " + std::to_string(limit_group_skus_max) +
                           " skus (LIMIT_GROUP_SKUS_MAX), got " +
                           std::to_string(limit.skus.size()));
  }
  std::vector<std::string> sorted = limit.skus;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    validate_text(sorted[i], "sku", sku_bytes_max, "SKU_BYTES_MAX");
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      throw_invalid_argument("the purchase limit names sku " + shown(sorted[i]) + " twice");
    }
  }
}

void validate_fencing_token(const std::optional<FencingToken>& token) {
  if (token && *token <= 0) {
    throw_invalid_argument("fencing_token must be positive (a lease's token), got " +
                           std::to_string(*token));
  }
}

void validate_expected_version(const std::optional<Version>& expected) {
  if (expected && *expected < 0) {
    throw_invalid_argument("expected_version must not be negative, got " +
                           std::to_string(*expected));
  }
}

Quantity checked_on_hand(Quantity on_hand, Quantity units, const char* what) {
  Quantity out = 0;
  if (__builtin_add_overflow(on_hand, units, &out) || out > on_hand_max) {
    throw_invalid_argument(std::string(what) + " would take on_hand past " +
                           std::to_string(on_hand_max) + " (ON_HAND_MAX); nothing changed");
  }
  return out;
}

void validate_on_hand(Quantity on_hand) {
  if (on_hand < 0 || on_hand > on_hand_max) {
    throw_invalid_argument("on_hand must be between 0 and " + std::to_string(on_hand_max) +
                           " (ON_HAND_MAX), got " + std::to_string(on_hand));
  }
}

Quantity checked_add(Quantity a, Quantity b, const char* what) {
  Quantity out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    throw_invalid_argument(std::string(what) + " would overflow a 64-bit quantity");
  }
  return out;
}

}  // namespace stockade
