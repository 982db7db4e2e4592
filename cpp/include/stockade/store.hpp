// The Store interface: the seam between the engine and a backend.
//
// The engine and the hot-row batcher talk to a Store; nothing else does. Test-only
// facilities (the oversell canary, holding a lock as another session) are a separate
// interface, TestHooks in stockade/testing.hpp, so the production seam stays this one. A store
// implements every strategy of docs/design.md ("1. The problem and the strategies") in its own
// terms (SQL for PostgreSQL, compare-and-set and locks for memory) and keeps the same semantics and
// errors: inputs reach it already validated by the Engine, and it must never let a committed state
// break 0 <= reserved <= on_hand + backorder_limit.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stockade/batch.hpp"
#include "stockade/errors.hpp"
#include "stockade/journal.hpp"
#include "stockade/telemetry.hpp"
#include "stockade/types.hpp"

namespace stockade {

// How a write may wait and retry. Resolved by the Engine: strategy is never automatic
// or batched by the time a store sees it.
struct WriteOptions {
  Strategy strategy = Strategy::atomic;
  bool nowait = false;  // pessimistic/advisory: fail at once if the lock is held
  std::int64_t lock_timeout_ms = 10000;
  int retries_max = 5;                        // optimistic: attempts after the first
  std::optional<Version> expected_version;    // of the stock row
  std::optional<FencingToken> fencing_token;  // sell: the lease's token (check_writable)
  // reserve and reserve_order: the buyer whose purchase limits apply (none: no limit).
  std::optional<std::string> buyer;
  // reserve and reserve_order: the caller's reference and metadata (a JSON object's text),
  // stored with each reservation; sell: the reference, in the journal. A call with either
  // runs per request.
  std::optional<std::string> ref;
  std::optional<std::string> metadata;
  // How this attempt of a reserve, sell or order counts per SKU (Telemetry::count). The
  // engine runs a call on a SKU with hot-row slots more than once when a slot is short:
  // only its first attempt counts the request, and an OutOfStock counts only where it
  // stands, which the engine decides (and counts) when count_refusal is false.
  bool count_request = true;
  bool count_refusal = true;
};

// A change of a held reservation's state: sold, given back, or held longer. One type for
// the engine's calls and both stores.
enum class Transition { confirm, release, extend };

// One transition of one reservation, the one request type for all three: a field a new
// kind of transition needs is added here once.
struct TransitionRequest {
  Uuid id;
  Transition kind = Transition::confirm;
  std::int64_t ttl_us = 0;  // extend only: the hold's new TTL, counted from now
  std::optional<Version> expected_version;
  // confirm and release: how many of the held units (none: all of them). A part leaves
  // the rest held, with its expiry; more than is held is refused (InvalidState).
  std::optional<Quantity> qty;
  // confirm only: release the units still held after `qty` in the same step, so that the
  // hold ends (a partial shipment that cancels the rest, TigerBeetle's post of part of a
  // pending transfer).
  bool release_rest = false;
  // The same key with the same request returns the first call's reservation, as it was
  // then, without a second effect (store/keyed.hpp).
  std::optional<std::string> idempotency_key;
};

// A return of sold units of one reservation (Engine::return_units): `qty` of its confirmed
// units not yet returned come back, under the reservation's lock.
struct ReturnRequest {
  Uuid id;
  Quantity qty = 0;
  // Back on hand, sellable (at the SKU's own row of `location`, or of the reservation's
  // location); false: recorded on the reservation only (damaged, or kept for inspection).
  bool restock = true;
  std::optional<std::string> location;
  std::optional<Version> expected_version;     // of the reservation
  std::optional<std::string> idempotency_key;  // as TransitionRequest's
};

// A new size for a live hold (Engine::resize): `qty` units held from now on. Growing
// passes the guards of a new hold on the hold's row (room, an open row, the buyer's
// purchase limit) in the same transaction; shrinking gives units back (counted as
// released). A refusal changes nothing.
struct ResizeRequest {
  Uuid id;
  Quantity qty = 0;
  std::optional<Version> expected_version;     // of the reservation
  std::optional<std::string> idempotency_key;  // as TransitionRequest's
};

// One step of a whole order (Engine::confirm_order, release_order, extend_order): every
// line of order `order_id` that still holds units, in one transaction (the lines locked in
// id order, then the buyers' counts, then the stock rows, each in sorted order).
//
// - `parts` (confirm and release): how many units of which line, by the line's reservation
//   id; a line not named is left as it is (unless release_rest). Empty: all that every
//   line holds. A part of a line that holds nothing, or more than it holds, is refused.
// - A line that has lapsed is expired in that transaction, as the sweeper would have.
// - A confirm or an extend without parts takes the order as it stands or not at all: if a
//   line has expired (just now or before), only the expiries are written and it raises
//   ReservationExpired (an order is paid for whole, not in the part that happened to
//   live). With parts, only the named lines matter. A release frees what is left.
// - An order with no line left holding units: InvalidState.
struct OrderStepRequest {
  Uuid order_id;
  Transition kind = Transition::confirm;
  std::int64_t ttl_us = 0;  // extend only: each live line's new TTL, counted from now
  std::vector<std::pair<Uuid, Quantity>> parts;
  bool release_rest = false;  // confirm only: every unit not confirmed here is released
  std::optional<std::string> idempotency_key;  // the first call's lines on a replay
};

// Which reservations Store::find_reservations returns: those with the ref, of the order, or
// of the buyer given (at least one of the three: each has an index), narrowed by the other
// fields given; in id order (the order they were made in), after `after`, at most `limit`.
struct ReservationQuery {
  std::optional<std::string> ref;
  std::optional<Uuid> order_id;
  std::optional<std::string> buyer;
  std::optional<std::string> sku;
  std::optional<std::string> location;
  std::optional<ReservationState> state;
  std::optional<Uuid> after;  // a page's last id: the next page starts past it
  std::size_t limit = 100;
};
inline constexpr std::size_t reservations_limit_max = 1000;

struct ReserveRequest {
  SkuKey key;
  Quantity qty = 0;
  std::int64_t ttl_us = 0;
  std::optional<std::string> idempotency_key;
  WriteOptions options;
  // The order the hold is a line of (an allocation's batched hold): the memory store's
  // batch makes it so; PostgreSQL's batches write it with the reservation.
  std::optional<Uuid> order_id;
};

struct OrderLine {
  SkuKey key;
  Quantity qty = 0;
};

struct OrderRequest {
  std::vector<OrderLine> lines;  // distinct keys; the store sorts them for locking
  std::int64_t ttl_us = 0;
  std::optional<std::string> idempotency_key;
  WriteOptions options;
};

// allocate: which of a pool's locations give their units first (store/allocation.hpp
// decides, on the rows as locked).
enum class AllocationPolicy {
  priority,        // the order the pool lists them in
  most_available,  // the most free units first (ties: the pool's order)
};

const char* allocation_policy_name(AllocationPolicy policy);
// "priority" or "most_available"; InvalidArgument for another name.
AllocationPolicy allocation_policy(const std::string& name);

// One SKU an allocation asks for, and how many units of it.
struct AllocationWant {
  std::string sku;
  Quantity qty = 0;
};

// Holds units of each wanted SKU from a pool of locations, all or nothing, the split
// decided on the pool's rows as locked, in the transaction that writes the holds. The
// holds are one order (they share an order id): one reservation per (SKU, location) used.
struct AllocateRequest {
  std::vector<AllocationWant> wants;   // distinct SKUs
  std::vector<std::string> locations;  // the pool: distinct, in priority order
  AllocationPolicy policy = AllocationPolicy::priority;
  // true: a SKU's units may come from several locations; false: each line from one (and,
  // with several SKUs, the whole order from one location).
  bool split = true;
  std::int64_t ttl_us = 0;
  std::optional<std::string> idempotency_key;
  WriteOptions options;
};

struct SellRequest {
  SkuKey key;
  Quantity qty = 0;
  WriteOptions options;
  std::optional<std::string> idempotency_key;  // the first call's level on a replay
};

// move_units: `qty` units of the row at `key` go from one state to another, in one write
// under the row's lock. From `available` it takes units that are neither held nor in
// another state (the safety stock is a floor on sales, not a bucket: it does not move);
// to `written_off` they leave on_hand.
struct MoveRequest {
  SkuKey key;
  Quantity qty = 0;
  UnitState from = UnitState::available;
  UnitState to = UnitState::damaged;
  std::optional<Version> expected_version;
  std::optional<FencingToken> fencing_token;
  std::optional<std::string> idempotency_key;  // the first call's level on a replay
};

// transfer: `qty` units of `sku` leave `source`'s on_hand and show as `incoming` at
// `destination` (whose row is made at zero units if it has none), in one transaction:
// both rows locked in key order, decided (store/transfers.hpp), written, and the transfer
// inserted. It takes only the source's free units (on hand, neither held nor withheld from
// sale; never backorders): fewer raises OutOfStock. A discontinued source, or a live lease
// on either row, refuses it. `id` is made by the engine and carries the source row's shard
// key.
struct TransferRequest {
  Uuid id;
  std::string sku;
  Quantity qty = 0;
  std::string source;
  std::string destination;
  std::optional<std::string> reason;
  std::optional<std::string> actor;
  std::optional<std::string> idempotency_key;  // the first call's transfer on a replay
};

// A step of a transfer, in one transaction (the transfer locked, then its rows in key
// order): receive puts `accepted` units on hand at the destination and writes `rejected`
// off there (each leaves `incoming`); cancel sends every unit still in transit back to
// the source. More units than are in transit, or none left, raises InvalidState.
struct TransferStepRequest {
  Uuid id;
  bool cancel = false;
  Quantity accepted = 0;
  Quantity rejected = 0;
  std::optional<std::string> idempotency_key;
};

// transfers(): by id (oldest first), optionally one SKU's or in one state, after `after`.
struct TransferQuery {
  std::optional<std::string> sku;
  std::optional<TransferState> state;
  std::optional<Uuid> after;
  std::size_t limit = 100;
};

// What a store tells the layer above about its own writes to stock rows: the version a
// write of this process left the row at, and how many of this process's changes that
// version holds (a batch's writes to one row count as many). The store states facts about
// its writes; the engine's contention tracker, which implements this, decides what they
// mean for routing (`auto`). A store that reports nothing is correct too: `auto` then
// sees only the requests of its own process.
class RowWriteObserver {
 public:
  virtual ~RowWriteObserver() = default;
  virtual void wrote(const SkuKey& row, Version left, std::uint32_t changes) = 0;
};

class Store {
 public:
  // Every store writes its counters to `telemetry`, shared with the engine and the
  // batcher above it (a fresh one with default options when none is given).
  explicit Store(std::shared_ptr<Telemetry> telemetry = nullptr)
      : telemetry_(telemetry ? std::move(telemetry) : std::make_shared<Telemetry>()) {}
  virtual ~Store() = default;

  virtual const char* backend_name() const noexcept = 0;

  // Stock rows. Every write to a row passes check_writable first (not discontinued, the
  // lease, the expected version), except confirm, release, extend and expiry of holds
  // that exist, which a discontinued or leased row still allows.
  // With an idempotency key, a replay returns the first call's level (store/keyed.hpp).
  virtual StockLevel restock(const SkuKey& key, Quantity qty,
                             std::optional<Version> expected_version,
                             std::optional<FencingToken> fencing_token,
                             const std::optional<std::string>& idempotency_key = {}) = 0;
  virtual StockLevel set_on_hand(const SkuKey& key, Quantity on_hand,
                                 std::optional<Version> expected_version,
                                 std::optional<FencingToken> fencing_token,
                                 const std::optional<std::string>& idempotency_key = {}) = 0;
  virtual StockLevel stock(const SkuKey& key) = 0;
  virtual StockLevel sell(const SellRequest& request) = 0;
  // How many units may be held or sold beyond on_hand (>= 0). Lowering it below what is
  // already promised beyond on_hand raises InvalidState.
  virtual StockLevel set_backorder_limit(const SkuKey& key, Quantity limit,
                                         std::optional<Version> expected_version,
                                         std::optional<FencingToken> fencing_token) = 0;
  // Units kept back from sale on the row (>= 0): available is on_hand + backorder_limit -
  // reserved - safety_stock - damaged - quality_control, never below zero. Holds that
  // exist keep their units; a higher floor only refuses new holds and sells.
  virtual StockLevel set_safety_stock(const SkuKey& key, Quantity units,
                                      std::optional<Version> expected_version,
                                      std::optional<FencingToken> fencing_token) = 0;
  // Moves units between the row's states (MoveRequest); too few units in the source state
  // raises OutOfStock (from available) or InvalidState, and changes nothing.
  virtual StockLevel move_units(const MoveRequest& request) = 0;
  // Transfers between locations (TransferRequest, TransferStepRequest); get_transfer
  // answers nothing for an id it does not know.
  virtual Transfer transfer(const TransferRequest& request) = 0;
  virtual Transfer transfer_step(const TransferStepRequest& request) = 0;
  virtual std::optional<Transfer> get_transfer(const Uuid& id) = 0;
  virtual std::vector<Transfer> find_transfers(const TransferQuery& query) = 0;
  // Soft delete (discontinued = true) and its undo, for the SKU at `key` with every
  // hot-row slot row it has, at once. In one transaction: locks the SKU's own row (slot
  // rows are made only under that lock, so none appears meanwhile), finds its slot rows
  // and locks them in key order (waiting at most lock_timeout_ms each), hands every row's
  // level (the own row first, then slot order) to `check`, which may throw an Error to
  // refuse (then nothing changes), and sets each row's tombstone; a row already so keeps
  // its version. Rows stay as tombstones; holds that exist can still be confirmed or
  // released. Returns the rows as they stand after, in the order `check` saw them.
  using RowsCheck = std::function<void(const std::vector<StockLevel>&)>;
  virtual std::vector<StockLevel> set_discontinued(const SkuKey& key, bool discontinued,
                                                   std::int64_t lock_timeout_ms,
                                                   const RowsCheck& check) = 0;

  // Leases (the offline lock with fencing tokens). acquire creates the row at zero if it
  // does not exist, and raises LeaseHeld while another lease is live. renew extends a
  // live lease whose token is still the row's (else FencingTokenStale). release ends it if
  // it is still the row's live lease, and says whether it did. Each moves the row's version.
  virtual Lease acquire_lease(const SkuKey& key, std::int64_t ttl_us, const std::string& owner) = 0;
  virtual Lease renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us) = 0;
  virtual bool release_lease(const SkuKey& key, FencingToken token) = 0;

  // Purchase limits. set_purchase_limit creates or replaces a group (its per_buyer and
  // its SKUs; InvalidState, changing nothing, if a SKU is in another group). A reserve
  // or order with WriteOptions::buyer counts its units in the group of each SKU it
  // touches, against a parent row per (group, buyer) locked before any stock row, and
  // raises LimitExceeded past per_buyer; releases and expiries give the units back,
  // confirmations keep them. remove_purchase_limit drops a group and its counts, and
  // says whether it existed. buyer_held is the units a buyer holds or bought in a group.
  virtual void set_purchase_limit(const PurchaseLimit& limit) = 0;
  virtual bool remove_purchase_limit(const std::string& group) = 0;
  virtual Quantity buyer_held(const std::string& group, const std::string& buyer) = 0;

  // Hot-row slots (Engine::set_slots; every other method sees a slot's row as an ordinary
  // row). sku_rows reads `base` and its slots' rows (slot_key) that exist, as one
  // snapshot (one statement), in slot order.
  virtual std::vector<StockLevel> sku_rows(const SkuKey& base) = 0;
  // The locations where `sku` has a row of its own (slot 0), in bytewise order, those past
  // `after` (none: from the first), at most `limit` (1..locations_limit_max).
  virtual std::vector<std::string> sku_locations(const std::string& sku,
                                                 const std::optional<std::string>& after,
                                                 std::size_t limit) = 0;
  // In one transaction: makes each of `rows` that is missing (at zero, when `create`),
  // locks them in sorted order (waiting at most lock_timeout_ms), hands their levels (in
  // the order of `rows`) to `plan`, and sets each row's on_hand to what plan returns for
  // it (a row whose on_hand stays keeps its version, unless `write_all`). plan may throw
  // an Error to refuse, and then nothing changes; an on_hand below a row's reserved is an
  // invariant_violation. Returns the rows as they stand after. Rows are of one SKU:
  // `rows` <= slots_max. Whenever rows are made, the first row in key order (the SKU's
  // own) gets a new version in the same transaction: the engine relies on a SKU's slot
  // rows never appearing while its own row keeps its version. With `active_slots` > 0,
  // the first row in key order (the SKU's own) is written with that count
  // (StockLevel::active_slots) and a new version, in the same transaction: slots are
  // taken away only so, and the engine orders what it learns by that version.
  using ReshapePlan = std::function<std::vector<Quantity>(const std::vector<StockLevel>&)>;
  virtual std::vector<StockLevel> reshape(const std::vector<SkuKey>& rows, bool create,
                                          bool write_all, std::int64_t lock_timeout_ms,
                                          const ReshapePlan& plan, int active_slots = 0) = 0;

  // Reservations.
  virtual Reservation reserve(const ReserveRequest& request) = 0;
  virtual std::vector<Reservation> reserve_order(const OrderRequest& request) = 0;
  // Locks every row of the pool that exists (each wanted SKU at each location, its own row:
  // not its hot-row slots) in key order, decides on them (plan_allocation), and writes the
  // holds in the same transaction; returns them in the request's SKU order, then the
  // pool's. A refusal (OutOfStock naming each location's free units) changes nothing.
  virtual std::vector<Reservation> allocate(const AllocateRequest& request) = 0;
  // Confirms, releases or extends a held reservation under its row's lock. A hold past
  // its expiry is expired there and then (as the sweeper would have) and refused.
  virtual Reservation transition(const TransitionRequest& request) = 0;
  virtual Reservation return_units(const ReturnRequest& request) = 0;
  virtual Reservation resize(const ResizeRequest& request) = 0;
  virtual Reservation get_reservation(const Uuid& id) = 0;
  // Orders (reserve_order's lines share an order id): a step of every line at once (see
  // OrderStepRequest), and the lines read back, by the order's id or by the key that made
  // it. Lines come back sorted by (sku, location, slot), then id. An unknown order, and one
  // whose lines retention purged, is NotFound (retention purges lines one by one: an order
  // may come back with fewer lines first).
  virtual std::vector<Reservation> order_step(const OrderStepRequest& request) = 0;
  virtual std::vector<Reservation> get_order(const Uuid& order_id) = 0;
  virtual std::vector<Reservation> order_by_key(const std::string& idempotency_key) = 0;
  virtual std::vector<Reservation> find_reservations(const ReservationQuery& query) = 0;
  virtual std::size_t expire_due(std::size_t limit) = 0;
  // A request was refused for want of units: when this store lets holds lapse by itself
  // (its sweeper is on), expires up to `limit` lapsed holds, oldest first, so that the
  // request may run again; returns how many (0 when holds lapse only when asked).
  virtual std::size_t free_lapsed(std::size_t limit) = 0;

  // Applies a batch of reserve, sell, confirm and release requests as one transaction,
  // deciding each in the order given (arrival order): grant while units are available,
  // refuse the rest with OutOfStock; a transition follows the per-request rules (a lapsed
  // hold is expired, and that commits, before ReservationExpired). Reservation rows are
  // locked before stock rows, and each kind in sorted order. Idempotency keys hold
  // inside a batch: a duplicate later in the same batch gets the first one's outcome,
  // and a key committed earlier replays its reservation. On return every item carries
  // its outcome (ok, or a per-item error) and the batch has committed. If the batch as a
  // whole fails it throws, and no item took effect, except that InDoubt means the commit
  // may or may not have landed.
  virtual void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) = 0;

  // The movement journal and its feed (stockade/journal.hpp, docs/journal.md).
  // movements reads entries in position order. feed_open makes a named consumer if it is
  // new (at the journal's start, or its end when `from_start` is false) and returns its
  // committed position (FeedOverrun if retention passed it); feed_poll returns the
  // changes after `from`, at most `limit`, each committed and none skipped, in position
  // order (per row, version order); feed_commit stores a position; feed_drop forgets a
  // consumer. set_low_stock sets a row's low-stock threshold (none: no alerts), moving
  // its version.
  virtual std::vector<Movement> movements(const MovementQuery& query) = 0;
  virtual FeedPosition feed_open(const std::string& consumer, bool from_start) = 0;
  virtual FeedBatch feed_poll(const std::string& consumer, const FeedPosition& from,
                              std::size_t limit) = 0;
  virtual void feed_commit(const std::string& consumer, const FeedPosition& at) = 0;
  virtual bool feed_drop(const std::string& consumer) = 0;
  virtual StockLevel set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) = 0;
  // Checks the invariants from the data (AuditOptions, AuditReport); holds no row lock.
  virtual AuditReport audit(const AuditOptions& options) = 0;
  // Drops journal entries older than `older_than_us` that every feed consumer has read
  // (or older than the store's feed_lag_max, overrunning a consumer that had not), at
  // most `limit`, oldest first; returns how many went.
  virtual std::uint64_t purge_movements(std::int64_t older_than_us, std::uint64_t limit) = 0;
  // Waits up to `timeout_us` for a change to be journaled (by any process, on PostgreSQL:
  // LISTEN/NOTIFY), so that a feed's poll need not spin. `changed` may come early (a poll
  // then finds nothing new) and a change may be missed (a writer that died before its
  // NOTIFY, a manual SQL change): callers poll again after a bounded wait all the same.
  virtual FeedWake feed_wait(std::int64_t timeout_us) = 0;

  // Retention, oldest first: deletes each idempotency key made before `older_than_us` ago
  // together with its reservations, once every one of them is terminal (confirmed,
  // released, expired) and last changed before then; then terminal reservations without a
  // key that last changed before then. A key therefore replays for at least
  // `older_than_us`, and a replay never finds its reservations missing. Holds are never
  // purged. At most `limit` keys and keyless reservations go (a key's reservations go
  // with it), in bounded batches that never lock a stock row. Then, within what `limit`
  // leaves, finished transfers (received or cancelled) last changed before then; one in
  // transit is never purged. `older_than_us` >= 0, `limit` >= 1.
  virtual PurgeCounts purge(std::int64_t older_than_us, std::uint64_t limit) = 0;

  // The store's own figures: its row counts (and nothing the telemetry has). counts() is
  // O(1) in the number of rows and may estimate; exact_counts() counts every row.
  virtual StoreCounts counts() const = 0;
  virtual StoreCounts exact_counts() const { return counts(); }
  // The connection pool's gauges (a store without one reports zeros).
  virtual PoolStats pool_stats() const { return {}; }

  // Creates or upgrades the backend's schema, applying the migrations numbered up to
  // `up_to` (0: all); returns the names of those it applied. A store without a schema
  // applies nothing.
  virtual std::vector<std::string> migrate(int up_to = 0) {
    (void)up_to;
    return {};
  }
  // Drops the store's schema and everything in it (DROP SCHEMA ... CASCADE); for demos and
  // tests. A store without a schema does nothing.
  virtual void drop_schema() {}
  // What migrate(up_to) would run now, as (name, SQL) pairs, without running it.
  virtual std::vector<std::pair<std::string, std::string>> migration_plan(int up_to = 0) {
    (void)up_to;
    return {};
  }

  // Releases connections and stops background work. Calls after close() raise
  // InvalidState on stores that hold such resources; closing twice is harmless.
  virtual void close() {}
  Telemetry& telemetry() { return *telemetry_; }
  const Telemetry& telemetry() const { return *telemetry_; }
  const std::shared_ptr<Telemetry>& shared_telemetry() const { return telemetry_; }
  // Where the store reports its writes (RowWriteObserver); none until an engine is made
  // over it, which sets its own (a store reports to the engine made over it last).
  void observe_writes(std::shared_ptr<RowWriteObserver> observer) {
    std::atomic_store(&observer_, std::move(observer));
  }

 protected:
  void report_write(const SkuKey& row, Version left, std::uint32_t changes = 1) const {
    if (const auto observer = std::atomic_load(&observer_)) observer->wrote(row, left, changes);
  }

 private:
  const std::shared_ptr<Telemetry> telemetry_;
  std::shared_ptr<RowWriteObserver> observer_;
};

}  // namespace stockade
