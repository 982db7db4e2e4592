// The domain vocabulary: SKU keys, quantities, strategies, reservation states and the
// value objects returned to callers, with the limits every input is checked against.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "stockade/clock.hpp"
#include "stockade/uuid.hpp"

namespace stockade {

// The size of a cache line on the machines stockade targets (x86-64, arm64). Fields that
// different threads write go on lines of their own, so one thread's writes do not evict
// another's (false sharing). std::hardware_destructive_interference_size would say the
// same, but GCC warns that its value is not ABI-stable across -mtune settings.
inline constexpr std::size_t cache_line_size = 64;

using Quantity = std::int64_t;
using Version = std::int64_t;  // PostgreSQL bigint; starts at 1 and grows on every change
// A lease's fencing token: drawn from one sequence, so tokens strictly increase across
// every holder, process and resource. 0 means "never leased".
using FencingToken = std::int64_t;

// Limits on input. Each is checked by validate_* below before anything is changed.
inline constexpr std::size_t sku_bytes_max = 256;
inline constexpr std::size_t location_bytes_max = 256;
inline constexpr std::size_t idempotency_key_bytes_max = 256;
inline constexpr std::size_t lease_owner_bytes_max = 256;
inline constexpr std::size_t buyer_bytes_max = 256;
inline constexpr std::size_t ref_bytes_max = 256;        // a reservation's or a sale's ref
inline constexpr std::size_t metadata_bytes_max = 4096;  // a reservation's metadata (JSON)
inline constexpr std::size_t limit_group_bytes_max = 256;
inline constexpr std::size_t limit_group_skus_max = 10000;
inline constexpr std::size_t order_lines_max = 1000;
// The most locations one allocation's pool names (Engine::allocate): each is a row locked
// per SKU, and a refusal names each one's free units.
inline constexpr std::size_t allocate_locations_max = 32;
// The most locations one page of Engine::stock_by_location holds (LOCATIONS_LIMIT_MAX).
inline constexpr std::size_t locations_limit_max = 1000;
// The most transfers one page of Engine::transfers holds (TRANSFERS_LIMIT_MAX).
inline constexpr std::size_t transfers_limit_max = 1000;
inline constexpr std::size_t expire_batch_max = 100000;
inline constexpr std::int64_t ttl_us_max = 366LL * 24 * 3600 * 1000 * 1000;
// 9999-12-31T23:59:59.999999Z in microseconds since the epoch: the last instant Python's
// datetime holds. No hold may expire later, and a ManualClock cannot be set later.
inline constexpr std::int64_t timestamp_us_max = 253'402'300'799'999'999;
inline constexpr std::int64_t lock_timeout_ms_max = 10LL * 60 * 1000;
inline constexpr int retries_max_limit = 100;
inline constexpr const char* default_location = "default";

enum class Strategy : std::uint8_t {
  atomic,       // one conditional update: no read-modify-write window at all
  pessimistic,  // row lock (SELECT ... FOR UPDATE) held across read and write
  advisory,     // a named lock on a key that is not a row
  optimistic,   // version compare-and-set with bounded, jittered retries
  batched,      // the hot-row layer: many requests, one transaction
  automatic,    // per-SKU choice from measured contention ("auto" in Python)
};
inline constexpr std::size_t strategy_count = 6;

const char* strategy_name(Strategy strategy) noexcept;
// Accepts the names strategy_name() gives; throws InvalidArgument for anything else.
Strategy parse_strategy(std::string_view name);

enum class ReservationState : std::uint8_t { held, confirmed, released, expired };

const char* reservation_state_name(ReservationState state) noexcept;

// A stock row's key: the SKU and location callers name, and which of the SKU's hot-row
// slots the row is (0, the SKU's own row, for every key a caller passes; the stores keep
// the slot in a column of its own).
struct SkuKey {
  std::string sku;
  std::string location = default_location;
  int slot = 0;

  friend bool operator==(const SkuKey& a, const SkuKey& b) {
    return a.sku == b.sku && a.location == b.location && a.slot == b.slot;
  }
  friend bool operator!=(const SkuKey& a, const SkuKey& b) { return !(a == b); }
  // Sorted lock order everywhere: (sku, location) bytewise, then the slot: a SKU's slot
  // rows come right after its own row.
  friend bool operator<(const SkuKey& a, const SkuKey& b) {
    if (a.sku != b.sku) return a.sku < b.sku;
    if (a.location != b.location) return a.location < b.location;
    return a.slot < b.slot;
  }
};

// Hot-row slots (Engine::set_slots): a slotted SKU keeps its units in its own row and in
// up to slots_max - 1 more rows of `stock`, each an ordinary row with the SKU's sku and
// location and a slot number of its own. Callers cannot name a slot's row
// (validate_sku_key refuses a slot), and any valid text is a location.
inline constexpr int slots_max = 64;
// The row of slot `slot` (0: the SKU's own row) of `base`.
SkuKey slot_key(const SkuKey& base, int slot);
// The SKU a row belongs to: `key` itself, or the SKU whose slot it is.
SkuKey base_key(const SkuKey& key);
// Which slot of its SKU the row is (0: the SKU's own row).
int slot_of(const SkuKey& key);

struct SkuKeyHash {
  std::size_t operator()(const SkuKey& key) const noexcept;
};

// The units a row can still promise: on hand plus the backorder limit, less the units
// held and the units withheld from sale (safety stock, damaged, in quality control),
// never below zero. The one formula both stores decide by (StockLevel::available, and the
// memory store's rows); sql::room is its SQL form, which the guarded writes check.
inline Quantity available_units(Quantity on_hand, Quantity backorder_limit, Quantity reserved,
                                Quantity withheld) {
  const Quantity room = on_hand + backorder_limit - reserved - withheld;
  return room > 0 ? room : 0;
}

// Where a unit on hand is (move_units): free to sell, or in a state that is on hand and
// never sold. `written_off` is a destination only: the units leave on_hand.
enum class UnitState { available, damaged, quality_control, written_off };
const char* unit_state_name(UnitState state) noexcept;
// "available", "damaged", "quality_control" or "written_off"; anything else raises
// InvalidArgument naming the states.
UnitState parse_unit_state(std::string_view name);

// A stock row. The invariant every committed row keeps (the schema's CHECK constraint):
// 0 <= reserved and reserved + damaged + quality_control <= on_hand + backorder_limit,
// with backorder_limit, safety_stock, damaged and quality_control >= 0. With the default
// backorder_limit of 0 that is reserved + damaged + quality_control <= on_hand. With
// backorders, holds may pass on_hand, and sells and confirmations may take on_hand below
// zero (units owed), down to -backorder_limit. safety_stock is a floor, not a bucket: it
// may exceed what is free (available is then 0), and only new holds and sells respect it.
struct StockLevel {
  SkuKey key;
  Quantity on_hand = 0;
  Quantity reserved = 0;
  Version version = 0;
  TimestampUs updated_at_us = 0;
  Quantity backorder_limit = 0;
  bool discontinued = false;            // soft-deleted: a tombstone that refuses new writes
  FencingToken lease_token = 0;         // the token of the row's latest lease (0: never leased)
  bool leased = false;                  // a lease is live right now
  TimestampUs lease_expires_at_us = 0;  // when the live lease lapses (0: none live)
  std::optional<Quantity> low_stock = std::nullopt;  // the threshold of the feed's low-stock alerts
  // On a SKU's own row (slot 0): how many of the SKU's rows take new reserves and sells,
  // the first ones in slot order (0: every row it has). Rows past them are *retired*
  // hot-row slots: they keep their holds until those end, and their free units go home.
  int active_slots = 0;
  Quantity safety_stock = 0;     // on hand, kept back from sale (a floor under available)
  Quantity damaged = 0;          // on hand, never sold (move_units)
  Quantity quality_control = 0;  // on hand, never sold until moved back (move_units)
  Quantity incoming = 0;         // in transit to this location (transfers): not on hand

  Quantity withheld() const { return safety_stock + damaged + quality_control; }
  Quantity available() const {
    return available_units(on_hand, backorder_limit, reserved, withheld());
  }
  // Units promised beyond the physical stock: held past on_hand, or sold below zero.
  Quantity backordered() const { return reserved > on_hand ? reserved - on_hand : 0; }
};

// A lease on one stock row (the offline lock): while it is live, writes to the row need
// its fencing token. Expiry runs on the store's clock (the database's on PostgreSQL).
struct Lease {
  SkuKey key;
  std::string owner;
  FencingToken token = 0;
  TimestampUs expires_at_us = 0;
};

// A reservation: what was asked (qty), and where each of those units is now. The
// identity every committed reservation keeps (the schema's CHECK, and the memory store
// before each write): held + confirmed + released + expired == qty, each >= 0, and
// returned <= confirmed. Units leave `held` by confirm (sold), release (given back) or
// expiry (given back), in parts or all at once (settle_units); the state says whether any
// unit is still held, and how the hold ended when none is.
struct Reservation {
  Uuid id;
  SkuKey key;
  Quantity qty = 0;        // asked for when it was made
  Quantity confirmed = 0;  // sold
  Quantity released = 0;   // given back by a release
  Quantity expired = 0;    // given back by expiry (only ever the whole remainder, once)
  Quantity returned = 0;   // of the confirmed units, the ones that came back (a return)
  ReservationState state = ReservationState::held;
  Version version = 0;
  TimestampUs expires_at_us = 0;
  TimestampUs created_at_us = 0;
  TimestampUs updated_at_us = 0;
  std::optional<std::string> idempotency_key;
  // The buyer it counts against, and the purchase-limit group it counts in (fixed when
  // it is made, so that a release gives the units back where they were taken).
  std::optional<std::string> buyer;
  std::optional<std::string> limit_group;
  // The order it is a line of (reserve_order), none for a reserve's: every line of an
  // order carries the same id, which order steps and Engine::order find them by.
  std::optional<Uuid> order_id;
  // What the caller told of it (reserve and reserve_order's ref= and metadata=): a short
  // text, and a JSON object's text.
  std::optional<std::string> ref;
  std::optional<std::string> metadata;

  // Units still held: on the stock row's `reserved`, and expiring at expires_at_us.
  Quantity held() const { return qty - confirmed - released - expired; }
  // Units the buyer's purchase-limit count holds for it: held or sold, not returned.
  Quantity counted() const { return qty - released - expired - returned; }
};

// How units leave a hold.
enum class Settle { confirm, release, expire };

// Moves `units` (0 < units <= held()) of `r`'s held units out by `how`, and sets its state
// from what is left: held while any unit is held; then confirmed if any unit was sold,
// else released or expired, by the step that ended it. The one place that rule is written;
// both stores and the batch call it under the reservation's lock. Does not touch the
// version or the times.
void settle_units(Reservation& r, Settle how, Quantity units);
// Whether `r` keeps the identity above, with its state 'held' exactly when units are held
// and no expired unit on a hold (the schema's reservation_units CHECK, for the audit).
bool units_consistent(const Reservation& r);
// Its units as an audit report shows them: "qty 5: held 2, confirmed 3, ...; state held".
std::string units_of(const Reservation& r);

// A transfer of a SKU's units from one location to another (Engine::transfer): they leave
// the source's on_hand at once and show as `incoming` at the destination until received
// (accepted onto on_hand, or rejected: written off) or cancelled (back to the source).
// The identity every committed transfer keeps (the schema's transfer_units CHECK, and the
// memory store before each write): received + rejected + cancelled <= qty, each >= 0; the
// state is in_transit while units are in transit, then received if any unit was received
// or rejected, else cancelled.
enum class TransferState { in_transit, received, cancelled };
const char* transfer_state_name(TransferState state) noexcept;
TransferState parse_transfer_state(std::string_view name);

struct Transfer {
  Uuid id;  // carries the source row's shard key, as a reservation id does
  std::string sku;
  std::string source;
  std::string destination;
  Quantity qty = 0;
  Quantity received = 0;   // put on hand at the destination
  Quantity rejected = 0;   // written off at the destination
  Quantity cancelled = 0;  // back on hand at the source
  TransferState state = TransferState::in_transit;
  Version version = 1;
  TimestampUs created_at_us = 0;
  TimestampUs updated_at_us = 0;
  std::optional<std::string> reason;
  std::optional<std::string> actor;

  Quantity in_transit() const { return qty - received - rejected - cancelled; }
  SkuKey source_key() const { return SkuKey{sku, source, 0}; }
  SkuKey destination_key() const { return SkuKey{sku, destination, 0}; }
};

// "At most per_buyer units per buyer across these SKUs" (at every location). A SKU
// belongs to at most one group.
struct PurchaseLimit {
  std::string group;
  Quantity per_buyer = 0;
  std::vector<std::string> skus;
};

// The largest quantity one request may ask for (reserve, sell, restock, an order line):
// 10^12 units. It keeps every sum the engine forms safe from overflow: a batch holds at
// most batch_size_limit (65536) requests, whose quantities add up to at most 6.6×10^16,
// far below the 9.2×10^18 of a 64-bit stock level.
inline constexpr Quantity quantity_max = 1'000'000'000'000;

// The most units a stock row may have on hand: the int64 range less one quantity_max, so
// that on_hand + backorder_limit (at most quantity_max), the row's room, never leaves 64
// bits. set_on_hand refuses more, and so does a restock, return or transfer that would
// take a row past it (InvalidArgument, nothing changed).
inline constexpr Quantity on_hand_max = std::numeric_limits<Quantity>::max() - quantity_max;

// `text` as an error message or a log line may show it: in single quotes, with control
// characters and bytes that are not UTF-8 escaped (\n, \x1b; a newline cannot forge a
// log line), cut after about `limit` bytes with the full length noted (a 1 MB input does
// not make a 1 MB message). Every caller-supplied value a message quotes goes through it.
std::string shown(std::string_view text, std::size_t limit = 64);
bool is_valid_utf8(std::string_view text) noexcept;

// Input checks. Each throws Error(invalid_argument) naming the field and the rule broken.
void validate_sku_key(const SkuKey& key);
void validate_qty(Quantity qty, const char* field = "qty");
void validate_ttl_us(std::int64_t ttl_us);

// A span of `us` microseconds in seconds, as callers give them ("1 s", "0.25 s", "-1 s"):
// the messages of bad input quote a value in the unit it came in.
std::string seconds_text(std::int64_t us);
void validate_idempotency_key(const std::string& key);
inline void validate_idempotency_key(const std::optional<std::string>& key) {
  if (key) validate_idempotency_key(*key);
}
void validate_lease_owner(const std::string& owner);
void validate_buyer(const std::string& buyer);
// A caller's reference (an order line's id): 1..ref_bytes_max bytes of UTF-8, no NUL.
void validate_ref(const std::string& ref);
// Metadata: one JSON object of at most metadata_bytes_max bytes (base/json.cpp).
void validate_metadata(const std::string& text);
// The group name, per_buyer (1..quantity_max) and the SKUs (1..limit_group_skus_max,
// distinct, each a valid sku).
void validate_purchase_limit(const PurchaseLimit& limit);
void validate_limit_group(const std::string& group);
void validate_fencing_token(const std::optional<FencingToken>& token);
// The library version, from pyproject.toml (the one place it is written).
const char* library_version() noexcept;

void validate_expected_version(const std::optional<Version>& expected);

// a + b, or InvalidArgument naming `what` if it would leave the int64 range.
Quantity checked_add(Quantity a, Quantity b, const char* what);
// A row's on_hand after `what` adds `units` to it, or InvalidArgument past on_hand_max.
Quantity checked_on_hand(Quantity on_hand, Quantity units, const char* what);
void validate_on_hand(Quantity on_hand);

}  // namespace stockade
