// MemoryStore internals.
//
// What it guarantees: the semantics of docs/design.md ("2. Guarantees", "3. Errors")
// without durability.
// Committed stock rows never break 0 <= reserved <= on_hand + backorder_limit, whatever the
// strategy, the number of threads, or the mix of strategies on one row: every write to a row goes
// through its RowCell latch, and every strategy decides on the values it then commits
// (compare-and-set, or a decision made under the latch). Reservations change state under
// their shard's mutex, together with the stock delta they imply, so a hold is confirmed,
// released or expired at most once.
//
// How the strategies map to memory:
//   atomic       a compare-and-set over the row (RowCell::try_latch on the read's seq).
//   pessimistic  the row's own mutex, held across read and write (FOR UPDATE); honours
//                nowait and lock_timeout.
//   advisory     a mutex from a fixed table of named-lock stripes, keyed by a stable hash
//                of (sku, location); same wait rules as pessimistic.
//   optimistic   read (with version), decide, then write only if the version is
//                unchanged; bounded retries with full-jitter backoff, then VersionConflict.
//
// What it does not do: persist anything, or expire holds by itself (expire_due does, and
// confirm/release/extend expire a lapsed hold lazily). Stock rows are never removed, so a
// StockRow pointer stays valid for the store's life. Terminal reservations and keys are
// (purge(), and as it goes with MemoryOptions::retention_us), under the rules of
// Store::purge. Lock order: a reservation shard's mutex before idempotency_mutex_.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "memory/journal.hpp"
#include "memory/row_cell.hpp"
#include "memory/timed_lock.hpp"
#include "stockade/clock.hpp"
#include "stockade/hash.hpp"
#include "stockade/memory_store.hpp"
#include "stockade/store.hpp"
#include "stockade/testing.hpp"
#include "store/fingerprint.hpp"
#include "store/keyed.hpp"
#include "store/lifecycle.hpp"
#include "store/purchase_limits.hpp"

namespace stockade::detail {

struct StockRow {
  StockRow(SkuKey k, const RowValues& initial, RowJournal* journal)
      : key(std::move(k)),
        shard_key(row_shard_key(key.sku, key.location)),
        cell(initial, journal) {}
  const SkuKey key;
  const std::uint16_t shard_key;  // carried by the ids of this row's reservations
  RowCell cell;
  TimedLock row_lock;  // pessimistic: the FOR UPDATE lock
};

struct ReservationRecord {
  Reservation value;
  StockRow* row = nullptr;
};

// Decides the next row values from the current ones, or throws to refuse. A non-owning
// reference to a callable (no allocation on the write path); it must not outlive the
// call it is passed to.
class Decide {
 public:
  template <class F>
  Decide(const F& fn)  // NOLINT: implicit by design, like std::function_ref
      : target_(&fn),
        call_([](const void* f, const RowValues& v) { return (*static_cast<const F*>(f))(v); }) {}
  RowValues operator()(const RowValues& current) const { return call_(target_, current); }

 private:
  const void* target_;
  RowValues (*call_)(const void*, const RowValues&);
};

// The reservation rule itself: hold `qty` more units of `row` if that many are available,
// else refuse with OutOfStock, counted per SKU in `telemetry` unless it is null (see
// WriteOptions::count_refusal). Every reserve path, single or order, decides through it.
RowValues hold_units(Telemetry* telemetry, StockRow& row, const RowValues& current, Quantity qty,
                     TimestampUs now);
// now + ttl, or InvalidArgument (before anything is written) when `what` (a hold, a
// lease) would outlive the last instant a timestamp can hold: a ManualClock near 9999.
TimestampUs expiry_of(TimestampUs now, std::int64_t ttl_us, const char* what);
// The row as it stands after a change by a write: every field kept, the version moved.
RowValues changed(const RowValues& v, TimestampUs now);
// check_writable on a row read at `now`, without building a StockLevel when the row is
// open (not discontinued, no lease live) and no token is given: the hot path.
void check_row(const SkuKey& key, const RowValues& v, TimestampUs now,
               const std::optional<Version>& expected, const std::optional<FencingToken>& token);
// The row as a StockLevel at `now` (whether its lease is live depends on the time).
StockLevel level_at(const SkuKey& key, const RowValues& v, TimestampUs now);

class MemoryStore final : public Store, public TestHooks {
 public:
  MemoryStore(std::shared_ptr<Clock> clock, std::shared_ptr<Telemetry> telemetry,
              MemoryOptions options = {});

  const char* backend_name() const noexcept override { return "memory"; }

  StockLevel restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                     std::optional<FencingToken> token,
                     const std::optional<std::string>& idempotency_key = {}) override;
  StockLevel set_on_hand(const SkuKey& key, Quantity on_hand, std::optional<Version> expected,
                         std::optional<FencingToken> token,
                         const std::optional<std::string>& idempotency_key = {}) override;
  StockLevel set_backorder_limit(const SkuKey& key, Quantity limit, std::optional<Version> expected,
                                 std::optional<FencingToken> token) override;
  StockLevel set_safety_stock(const SkuKey& key, Quantity units, std::optional<Version> expected,
                              std::optional<FencingToken> token) override;
  StockLevel move_units(const MoveRequest& request) override;
  Transfer transfer(const TransferRequest& request) override;
  Transfer transfer_step(const TransferStepRequest& request) override;
  std::optional<Transfer> get_transfer(const Uuid& id) override;
  std::vector<Transfer> find_transfers(const TransferQuery& query) override;
  std::vector<StockLevel> set_discontinued(const SkuKey& key, bool discontinued,
                                           std::int64_t lock_timeout_ms,
                                           const RowsCheck& check) override;
  Lease acquire_lease(const SkuKey& key, std::int64_t ttl_us, const std::string& owner) override;
  Lease renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us) override;
  bool release_lease(const SkuKey& key, FencingToken token) override;
  void set_purchase_limit(const PurchaseLimit& limit) override;
  bool remove_purchase_limit(const std::string& group) override;
  Quantity buyer_held(const std::string& group, const std::string& buyer) override;
  StockLevel stock(const SkuKey& key) override;
  std::vector<StockLevel> sku_rows(const SkuKey& base) override;
  std::vector<std::string> sku_locations(const std::string& sku,
                                         const std::optional<std::string>& after,
                                         std::size_t limit) override;
  std::vector<StockLevel> reshape(const std::vector<SkuKey>& rows, bool create, bool write_all,
                                  std::int64_t lock_timeout_ms, const ReshapePlan& plan,
                                  int active_slots) override;
  StockLevel sell(const SellRequest& request) override;

  Reservation reserve(const ReserveRequest& request) override;
  std::vector<Reservation> reserve_order(const OrderRequest& request) override;
  std::vector<Reservation> allocate(const AllocateRequest& request) override;
  std::vector<Reservation> order_step(const OrderStepRequest& request) override;
  std::vector<Reservation> get_order(const Uuid& order_id) override;
  std::vector<Reservation> order_by_key(const std::string& idempotency_key) override;
  std::vector<Reservation> find_reservations(const ReservationQuery& query) override;
  Reservation transition(const TransitionRequest& request) override;
  Reservation return_units(const ReturnRequest& request) override;
  Reservation resize(const ResizeRequest& request) override;
  Reservation get_reservation(const Uuid& id) override;
  std::size_t expire_due(std::size_t limit) override;
  std::size_t free_lapsed(std::size_t limit) override;
  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override;

  PurgeCounts purge(std::int64_t older_than_us, std::uint64_t limit) override;
  StoreCounts counts() const override;

  // The journal, its feed and the audit (record.cpp).
  std::vector<Movement> movements(const MovementQuery& query) override;
  FeedPosition feed_open(const std::string& consumer, bool from_start) override;
  FeedBatch feed_poll(const std::string& consumer, const FeedPosition& from,
                      std::size_t limit) override;
  void feed_commit(const std::string& consumer, const FeedPosition& at) override;
  bool feed_drop(const std::string& consumer) override;
  StockLevel set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) override;
  AuditReport audit(const AuditOptions& options) override;
  std::uint64_t purge_movements(std::int64_t older_than_us, std::uint64_t limit) override;
  FeedWake feed_wait(std::int64_t timeout_us) override { return journal_->wait(timeout_us); }

  Reservation naive_reserve_unsafe(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                   std::int64_t window_us) override;
  std::unique_ptr<LockHold> hold_lock(const SkuKey& key, Strategy kind,
                                      std::int64_t timeout_ms) override;
  Reservation limited_reserve_by_check(const SkuKey& key, Quantity qty, const std::string& buyer,
                                       bool serializable, std::int64_t window_us) override;

 private:
  static constexpr std::size_t stock_shards = 64;
  static constexpr std::size_t reservation_shards = 64;
  static constexpr std::size_t advisory_stripes = 4096;
  static constexpr std::uint32_t cas_attempts_max = 1u << 20;
  static constexpr std::int64_t backoff_base_us = 20;
  static constexpr std::int64_t backoff_cap_us = 5000;
  static_assert((advisory_stripes & (advisory_stripes - 1)) == 0, "stripes: a power of two");

  struct StockShard {
    mutable std::shared_mutex mutex;
    std::unordered_map<SkuKey, std::unique_ptr<StockRow>, SkuKeyHash> rows;
  };
  struct ReservationShard {
    mutable std::mutex mutex;
    std::unordered_map<Uuid, ReservationRecord, UuidHash> records;
    std::set<std::pair<TimestampUs, Uuid>> held_by_expiry;
    std::set<std::pair<TimestampUs, Uuid>> terminal_by_time;  // by updated_at, for purge
  };
  struct IdempotencyEntry {
    std::string fingerprint;
    std::vector<Uuid> ids;
    bool pending = true;
    TimestampUs created_us = 0;
    std::string outcome;  // any other write's: its outcome, encoded (store/keyed.hpp)
  };

  // Stock rows (stock.cpp).
  StockRow* find_row(const SkuKey& key) const;
  StockRow& require_row(const SkuKey& key) const;
  // The SKU's own row and its slot rows that exist, in key order (see stock.cpp).
  std::vector<StockRow*> rows_of_sku(const SkuKey& base) const;
  // NotSupported when the SKU at `key` has hot-row slot rows (see stock.cpp).
  void refuse_if_slotted(const SkuKey& key, const char* feature) const;
  // Inserts a row with `initial` unless one exists; returns it and whether it was new.
  std::pair<StockRow*, bool> insert_row(const SkuKey& key, const RowValues& initial);
  // Inserts the row with `initial`, or applies `decide` to the row that exists.
  StockLevel upsert(const SkuKey& key, std::optional<Version> expected,
                    std::optional<FencingToken> token, const RowValues& initial,
                    const Decide& decide);
  RowValues apply(StockRow& row, const WriteOptions& options, const Decide& decide);
  RowValues compare_and_set(StockRow& row, const Decide& decide, StrategyCounters* counters);
  RowValues optimistic(StockRow& row, const WriteOptions& options, const Decide& decide);
  void apply_order(const std::vector<StockRow*>& rows, const std::vector<Quantity>& qtys,
                   const WriteOptions& options, TimestampUs now);
  bool try_apply_latched(const std::vector<StockRow*>& rows, const std::vector<Quantity>& qtys,
                         TimestampUs now, const std::vector<RowSnapshot>* read_versions,
                         Telemetry* counting);
  std::vector<std::unique_lock<TimedLock>> lock_for(const std::vector<StockRow*>& rows,
                                                    const WriteOptions& options);
  TimedLock& advisory_lock_of(const SkuKey& key);
  StockLevel level_of(const StockRow& row, const RowValues& values) const;

  // Reservations (reservations.cpp).
  Reservation new_reservation(const StockRow& row, Quantity qty, std::int64_t ttl_us,
                              TimestampUs now, const std::optional<std::string>& key) const;
  void insert_reservation(const Reservation& reservation, StockRow* row);
  ReservationShard& shard_of(const Uuid& id) const;
  void expire_locked(ReservationShard& shard, ReservationRecord& record, TimestampUs now);
  // `now` is set to the time it was found live at: the step writes at that time.
  ReservationRecord& live_hold(ReservationShard& shard, const Uuid& id,
                               const std::optional<Version>& expected, TimestampUs& now);
  void settle_locked(ReservationRecord& record, Reservation next, const Settlement& moved,
                     TimestampUs now);
  // Settles units a hold had: `sold` leave on_hand and reserved, `freed` leave reserved.
  void release_stock(StockRow& row, Quantity sold, Quantity freed, TimestampUs now);
  Reservation reserve_now(StockRow& row, const ReserveRequest& request,
                          const std::optional<std::string>& group);
  std::vector<Reservation> order_now(const OrderRequest& request, const LineGroups& groups);
  // allocate's rows latched and decided (plan_allocation), then written; `groups`: the
  // purchase-limit group of each wanted SKU.
  std::vector<Reservation> allocate_now(const AllocateRequest& request, const LineGroups& groups);
  // Runs make(groups) for `buyer` under the parent locks of (group, buyer) for every group
  // the lines touch (stripes of buyer_stripes_, taken in index order), after checking
  // that no group would pass its per_buyer (LimitExceeded); then counts the units.
  std::vector<Reservation> within_limits(
      const std::vector<OrderLine>& lines, const std::string& buyer,
      const std::function<std::vector<Reservation>(const LineGroups&)>& make);
  // A released or expired hold gives its units back to its buyer's count.
  void give_back(const Reservation& r, Quantity units);
  // `asked`: what the request asks, for the message of a conflict (store/fingerprint.hpp).
  std::vector<Reservation> with_idempotency(const std::string& key, const std::string& fingerprint,
                                            const Asked& asked, const WriteOptions& options,
                                            const std::function<std::vector<Reservation>()>& run);
  std::vector<Reservation> fetch_all(const std::vector<Uuid>& ids);
  // transition, return_units and resize once their key (if any) is claimed.
  Reservation transition_now(const TransitionRequest& request);
  Reservation return_now(const ReturnRequest& request);
  Reservation resize_now(const ResizeRequest& request);
  // Orders (orders.cpp): the lines of each order, by its id.
  void note_order(const Uuid& order_id, const std::vector<Reservation>& lines);
  void forget_line(const Reservation& r);  // a line purged by retention
  std::vector<Uuid> order_ids(const Uuid& order_id) const;
  std::vector<Reservation> lines_of(const std::vector<Uuid>& ids);
  std::vector<Reservation> order_step_now(const OrderStepRequest& request);
  // Idempotency keys (keys.cpp).
  std::optional<IdempotencyEntry> claim_key(
      const std::string& key, const std::string& fingerprint, std::int64_t wait_ms,
      const std::function<void(const IdempotencyEntry&)>& conflict);
  void free_key(const std::string& key);
  void settle_key(const std::string& key, std::vector<Uuid> ids, std::string outcome);
  // A write other than a reserve, under its key if it has one: the first call runs `run`
  // and keeps its outcome; a replay returns that outcome (store/keyed.hpp). A duplicate in
  // flight is waited for at most `wait_ms` (a sell's lock_timeout; the default one's for
  // the steps, which take none).
  template <class Result, class Run>
  Result keyed(const std::optional<std::string>& key, const std::string& fingerprint, Run&& run,
               std::int64_t wait_ms = WriteOptions{}.lock_timeout_ms) {
    if (!key) return run();
    const auto no_more = [](const IdempotencyEntry&) {};
    const std::optional<IdempotencyEntry> done = claim_key(*key, fingerprint, wait_ms, no_more);
    if (done) return decode_outcome<Result>(done->outcome);
    std::optional<Result> out;
    try {
      out.emplace(run());
    } catch (...) {
      free_key(*key);
      throw;
    }
    settle_key(*key, {}, encode_outcome(*out));
    return std::move(*out);
  }
  void mark_terminal(ReservationShard& shard, const Reservation& r);
  bool all_purgeable(const std::vector<Uuid>& ids, TimestampUs horizon) const;
  bool erase_reservation(const Uuid& id);
  PurgeCounts purge_keys(TimestampUs horizon, std::uint64_t limit);
  std::uint64_t purge_reservations(TimestampUs horizon, std::uint64_t limit);
  std::uint64_t purge_transfers(TimestampUs horizon, std::uint64_t limit);
  void purge_as_you_go();  // retention: every 64th reservation purges a little
  // Holds lapse as the store goes (MemoryOptions::expire_lapsed): expires the holds past
  // their expiry, unless the earliest expiry the store knows of is still ahead (then it
  // costs a clock read and one atomic load). Call with no latch or shard lock held.
  void expire_lapsed();
  // Expires up to `limit` holds due at `now`, from a rotating first shard; sets `*next`
  // to the earliest expiry left in the shards it went through (not past `now` when it
  // stopped at the limit). Returns how many it expired.
  std::size_t expire_until(TimestampUs now, std::size_t limit, TimestampUs* next);
  // The earliest expiry of a hold may now be `at`.
  void note_expiry(TimestampUs at);

  // The audit's passes (record.cpp): each appends what it finds to `report`.
  struct AuditSums;
  AuditSums audit_sums(const AuditOptions& options) const;
  void audit_rows(const AuditOptions& options, const AuditSums& sums, AuditReport& report) const;
  void audit_limits(const AuditOptions& options, const AuditSums& sums, AuditReport& report);
  void audit_keys(const AuditOptions& options, AuditReport& report);
  void audit_journal(const AuditOptions& options, AuditReport& report) const;
  void audit_transit(const AuditOptions& options, AuditReport& report);

  std::shared_ptr<Clock> clock_;
  std::unique_ptr<MemoryJournal> journal_;
  std::unique_ptr<std::array<StockShard, stock_shards>> stock_;
  std::unique_ptr<std::array<ReservationShard, reservation_shards>> reservations_;
  std::unique_ptr<std::array<TimedLock, advisory_stripes>> advisory_;
  // The line ids of each order (a leaf lock): an entry goes when retention purges its last
  // line, so it is bounded as the reservations are.
  mutable std::mutex orders_mutex_;
  std::unordered_map<Uuid, std::vector<Uuid>, UuidHash> orders_;
  // Each SKU's locations (its own rows; a leaf lock, taken under a stock shard's): rows are
  // never removed, so neither are these, and they are bounded as the rows are.
  // Transfers by id (memory/transfers.cpp; a step holds the lock while it latches its
  // rows). Finished ones go with retention (purge), as terminal reservations do.
  mutable std::mutex transfers_mutex_;
  std::map<Uuid, Transfer> transfers_;
  std::set<std::pair<TimestampUs, Uuid>> finished_transfers_;  // by updated_at, for purge
  mutable std::mutex locations_mutex_;
  std::unordered_map<std::string, std::set<std::string>> locations_;
  std::mutex idempotency_mutex_;
  std::condition_variable idempotency_done_;
  std::unordered_map<std::string, IdempotencyEntry> idempotency_;
  std::deque<std::pair<TimestampUs, std::string>> keys_by_time_;  // as made; may hold stale
  std::deque<std::pair<TimestampUs, std::string>> keys_kept_;     // old, but not purgeable yet
  // Leases: acquire, renew and release take lease_mutex_, so lease fields change one at a
  // time; the owners of live leases are kept here (bounded by the rows).
  std::mutex lease_mutex_;
  // Purchase limits: the groups and their SKUs (limits_mutex_), and each buyer's units
  // per group (allowance_mutex_, a leaf lock; an entry goes when it falls to zero), keyed
  // by group + '\0' + buyer. A reserve with a buyer holds its stripes of buyer_stripes_
  // from the check through the write: the memory form of the parent row's lock.
  mutable std::shared_mutex limits_mutex_;
  std::unordered_map<std::string, Quantity> group_limits_;
  std::unordered_map<std::string, std::string> sku_group_;
  std::mutex allowance_mutex_;
  std::unordered_map<std::string, Quantity> allowances_;
  std::unique_ptr<std::array<std::mutex, 256>> buyer_stripes_ =
      std::make_unique<std::array<std::mutex, 256>>();
  std::unordered_map<SkuKey, std::string, SkuKeyHash> lease_owners_;
  std::atomic<FencingToken> lease_tokens_{0};
  std::atomic<std::size_t> expire_cursor_{0};
  // No hold expires before this (it may be earlier than the true earliest, never later).
  std::atomic<TimestampUs> earliest_expiry_{std::numeric_limits<TimestampUs>::max()};
  std::atomic<std::size_t> purge_cursor_{0};
  std::atomic<std::uint64_t> reservations_made_{0};
  const MemoryOptions options_;
};

}  // namespace stockade::detail
