// The engine facade: the one entry point for callers (the Python bindings, the C++ tests,
// the benchmarks). It validates every input before a store sees it, resolves the strategy
// for each call, counts outcomes, and routes to the store. Bad input raises
// Error(invalid_argument) and changes nothing.
#pragma once

#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "stockade/async.hpp"
#include "stockade/batcher.hpp"
#include "stockade/contention.hpp"
#include "stockade/memory_store.hpp"
#include "stockade/postgres_store.hpp"
#include "stockade/store.hpp"

namespace stockade {

struct EngineOptions {
  Strategy default_strategy = Strategy::automatic;
  int retries_max = 5;
  std::int64_t lock_timeout_ms = 10000;
  std::int64_t default_ttl_us = 15LL * 60 * 1000 * 1000;
  BatcherOptions batcher;          // the hot-row layer, started by the first batched request
  AutoOptions automatic;           // when `auto` switches a SKU between atomic and batched
  std::size_t sku_entries = 1024;  // per-SKU counters kept at most (Telemetry)
  std::size_t async_workers = 8;   // C++ threads for async calls that run per request
  std::size_t async_queue_max = 65536;
  // Hot-row slots: which slot of a slotted SKU this engine sends its reserves and sells
  // to (its home; -1: the process id's, so that replicas forked one after another take
  // different slots), and how many slotted SKUs it remembers (routing hints only: a
  // forgotten SKU is found again on its first refusal).
  int home_slot = -1;
  std::size_t slot_directory = 4096;
  // How many rows `auto` splits a SKU into when several processes batch its one row
  // (hotrow/auto_slots.hpp); 1: never.
  int auto_slots_max = 4;
  // How long a slotted SKU's requests that `auto` routes here must run unbatched before
  // this engine takes its slots away (set_slots(key, 1)); 0: never.
  std::int64_t auto_slots_cool_ms = 60000;
};

inline constexpr std::int64_t auto_slots_cool_ms_max = 7LL * 24 * 3600 * 1000;  // a week

inline constexpr std::size_t slot_directory_max = 1 << 20;
// Entries of the table through which refusals share their reads of a SKU's rows.
inline constexpr std::size_t slot_probe_entries = 256;

namespace detail {
class SlotRouter;
class AutoSlots;
namespace engine {
class InFlight;
}  // namespace engine
}  // namespace detail

inline constexpr std::size_t async_workers_max = 1024;

// How a strategy-routed call runs: the strategy the caller asked for (counted under it),
// whether it goes through the batcher, and the per-request options for the store.
struct Route {
  Strategy asked = Strategy::atomic;
  bool batched = false;
  WriteOptions options;
  std::optional<std::string> idempotency_key;  // a sell's (CallOptions::idempotency_key)
  // When the call began (steady clock, microseconds): its latency is recorded from here,
  // whichever of its attempts ends it.
  std::int64_t started_us = 0;
};

// Per-call overrides; empty fields take the engine's defaults.
struct CallOptions {
  std::optional<Strategy> strategy;
  bool nowait = false;
  std::optional<std::int64_t> lock_timeout_ms;
  std::optional<Version> expected_version;
  std::optional<FencingToken> fencing_token;  // sell: runs per request, like expected_version
  std::optional<std::string> buyer;           // reserve, reserve_order: purchase limits
  std::optional<std::string> ref;             // reserve, reserve_order, sell (WriteOptions)
  std::optional<std::string> metadata;        // reserve, reserve_order (WriteOptions)
  // sell's idempotency key (reserve and reserve_order take theirs as an argument). A keyed
  // sell runs per request, like expected_version.
  std::optional<std::string> idempotency_key;
};

// Routing: `batched` sends reserve and sell through the hot-row batcher; `auto` asks the
// contention tracker, per SKU, whether to run them atomic or batched. confirm and release
// take no strategy: they go through the batcher when the engine's default is batched, or
// auto on a SKU that is hot right now (found by the shard key inside the reservation id). A call
// the batcher cannot express runs per request with `atomic` instead: reserve_order (many rows, all
// or nothing) and any call with expected_version (a check against one particular version).
//
// Async calls (submit_*) never block the caller beyond queueing: batched ones go to the
// batcher, the rest to a small pool of C++ workers; outcomes go to a CompletionSink.
class Engine {
 public:
  Engine(std::shared_ptr<Store> store, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // An engine over an in-process MemoryStore; clock defaults to the system clock.
  static std::unique_ptr<Engine> memory(EngineOptions options = {},
                                        std::shared_ptr<Clock> clock = nullptr,
                                        MemoryOptions memory = {});
  // An engine over PostgreSQL; connects at once (Unavailable if it cannot).
  static std::unique_ptr<Engine> postgres(PostgresOptions postgres, EngineOptions options = {});

  // Creates or upgrades the store's schema; returns the migrations applied. the migrations numbered
  // up to `up_to` (0: all); see Store::migrate.
  std::vector<std::string> migrate(int up_to = 0);
  std::vector<std::pair<std::string, std::string>> migration_plan(int up_to = 0);
  void drop_schema();
  // Drains the batcher and the async workers (every queued request completes), then
  // releases the store's connections and background work. In a process forked from the
  // one that made the engine, it only lets go of the engine (see check_process).
  void close();

  // `reason` and `actor` go into the change's journal entry (validate_note_text).
  // `idempotency_key`, on every write below that takes one: the same key with the same
  // request returns the first call's outcome without a second effect, also after a lost
  // COMMIT; with another request, IdempotencyConflict (store/keyed.hpp). A keyed
  // set_on_hand on a SKU with hot-row slots raises NotSupported; a keyed restock there
  // adds its units to the SKU's own row and answers with the SKU's level as it is then
  // (a replay too, as a sell on slots does).
  StockLevel restock(const SkuKey& key, Quantity qty, std::optional<Version> expected_version = {},
                     std::optional<FencingToken> fencing_token = {}, const std::string& reason = {},
                     const std::string& actor = {},
                     const std::optional<std::string>& idempotency_key = {});
  StockLevel set_on_hand(const SkuKey& key, Quantity on_hand,
                         std::optional<Version> expected_version = {},
                         std::optional<FencingToken> fencing_token = {},
                         const std::string& reason = {}, const std::string& actor = {},
                         const std::optional<std::string>& idempotency_key = {});
  StockLevel set_backorder_limit(const SkuKey& key, Quantity limit,
                                 std::optional<Version> expected_version = {},
                                 std::optional<FencingToken> fencing_token = {});
  // Quantity states (Store::set_safety_stock, Store::move_units). Neither is built for a
  // SKU with hot-row slots (NotSupported); `reason` and `actor` go on the move's journal
  // entry.
  StockLevel set_safety_stock(const SkuKey& key, Quantity units,
                              std::optional<Version> expected_version = {},
                              std::optional<FencingToken> fencing_token = {});
  StockLevel move_units(MoveRequest request, const std::string& reason = {},
                        const std::string& actor = {});
  // Transfers between locations (Store::transfer, Store::transfer_step): the engine makes
  // the transfer's id (with the source row's shard key); `reason` and `actor` go on the
  // journal entries of the transfer's rows, with its id as their ref. get_transfer raises
  // NotFound for an id it does not know; transfers() lists at most transfers_limit_max.
  Transfer transfer(TransferRequest request);
  Transfer transfer_step(const TransferStepRequest& request);
  Transfer get_transfer(const Uuid& id);
  std::vector<Transfer> transfers(const TransferQuery& query);
  // Soft delete and its undo (Store::set_discontinued), for every row of a SKU with
  // hot-row slots at once.
  StockLevel discontinue(const SkuKey& key, std::optional<Version> expected_version = {},
                         std::optional<FencingToken> fencing_token = {});
  StockLevel reinstate(const SkuKey& key, std::optional<Version> expected_version = {},
                       std::optional<FencingToken> fencing_token = {});
  // Leases (Store::acquire_lease): ttl within validate_ttl_us, owner a short text.
  Lease acquire_lease(const SkuKey& key, std::int64_t ttl_us, const std::string& owner);
  Lease renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us);
  bool release_lease(const SkuKey& key, FencingToken token);
  // Purchase limits (Store::set_purchase_limit).
  void set_purchase_limit(const PurchaseLimit& limit);
  bool remove_purchase_limit(const std::string& group);
  Quantity buyer_held(const std::string& group, const std::string& buyer);
  StockLevel stock(const SkuKey& key);
  // Hot-row slots (docs/design.md, section 10): spreads the SKU's free units over `slots`
  // rows (1..slots_max; the SKU's own row is slot 0), so that up to that many batches,
  // one per replica, can each hold a row lock and commit together. Reserves and sells
  // then go to this engine's home slot; a slot without room takes free units from the
  // others (every row locked, in order) before it may refuse, so OutOfStock stays true
  // for the SKU as a whole. stock() sums the rows (version: the sum of their versions);
  // restock and set_on_hand spread over them. Fewer slots than the SKU has takes them
  // away (set_slots(key, 1): one row again): the rows past `slots` retire, their free
  // units move to the active rows at once, and the holds on them stay there until
  // confirmed, released or expired. A SKU with a lease, a backorder limit or
  // discontinued cannot take slots (InvalidState), and those features raise
  // NotSupported on a slotted SKU (one whose retired rows still keep units, too).
  // Returns the SKU's summed level.
  StockLevel set_slots(const SkuKey& key, int slots);
  // How many of the SKU's rows take new reserves (1: not slotted; 0: no such SKU).
  int slot_count(const SkuKey& key);
  StockLevel sell(const SkuKey& key, Quantity qty, const CallOptions& call = {});

  Reservation reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us = {},
                      std::optional<std::string> idempotency_key = {},
                      const CallOptions& call = {});
  std::vector<Reservation> reserve_order(const std::vector<OrderLine>& lines,
                                         std::optional<std::int64_t> ttl_us = {},
                                         std::optional<std::string> idempotency_key = {},
                                         const CallOptions& call = {});
  // The SKU at each location where it has a row, in bytewise order of location: a page of
  // at most `limit` (1..LOCATIONS_LIMIT_MAX) past `after` (none: from the first). Each
  // level is the location's as stock() gives it (its hot-row slots summed).
  std::vector<StockLevel> stock_by_location(const std::string& sku,
                                            const std::optional<std::string>& after,
                                            std::size_t limit);
  // Holds each wanted SKU's units from a pool of locations (distinct, at most
  // ALLOCATE_LOCATIONS_MAX, in priority order), all or nothing, as one order: one
  // reservation per (SKU, location) used, sharing an order id, in the wants' order, then
  // the pool's. The split is decided on the pool's rows locked in key order, in the
  // transaction that writes the holds (Store::allocate; store/allocation.hpp says how each
  // policy splits); every strategy locks the rows. On a hot SKU (batched, or auto) a
  // priority allocation of one SKU without a key walks the pool through the batcher first
  // (allocate_batched). No expected_version.
  std::vector<Reservation> allocate(const std::vector<AllocationWant>& wants,
                                    const std::vector<std::string>& locations,
                                    AllocationPolicy policy, bool split,
                                    std::optional<std::int64_t> ttl_us = {},
                                    std::optional<std::string> idempotency_key = {},
                                    const CallOptions& call = {});
  // `qty`: how many of the held units (none: all); the rest stay held, or with
  // `release_rest` are released in the same step.
  Reservation confirm(const Uuid& id, std::optional<Version> expected_version = {},
                      std::optional<Quantity> qty = {}, bool release_rest = false,
                      const std::optional<std::string>& idempotency_key = {});
  Reservation release(const Uuid& id, std::optional<Version> expected_version = {},
                      std::optional<Quantity> qty = {},
                      const std::optional<std::string>& idempotency_key = {});
  Reservation extend(const Uuid& id, std::int64_t ttl_us,
                     std::optional<Version> expected_version = {},
                     const std::optional<std::string>& idempotency_key = {});
  // The three above in one call, the way both stores take them.
  Reservation transition(const TransitionRequest& request);
  // Sold units of a reservation come back (a return): back on hand at the SKU's own row of
  // `location` (default: the reservation's) with `restock`, or recorded only (damaged);
  // never more than were confirmed and not returned yet (InvalidState). The buyer's
  // purchase-limit count gives them back. Journaled as cause "return", with reason and
  // actor.
  Reservation return_units(const ReturnRequest& request, const std::string& reason = {},
                           const std::string& actor = {});
  // A live hold's new size: `qty` units held from now on (its expiry as it was). Growing
  // passes a new hold's guards on the hold's row (room, an open row, the buyer's purchase
  // limit; on a SKU with hot-row slots, free units move into that row first), shrinking
  // gives units back at once (counted as released). A refusal changes nothing.
  Reservation resize(const Uuid& id, Quantity qty, std::optional<Version> expected_version = {},
                     const std::optional<std::string>& idempotency_key = {});
  Reservation get_reservation(const Uuid& id);
  // An order as one handle (reserve_order's lines share Reservation::order_id): a confirm,
  // release or extend of every line that holds units, in one transaction, optionally with a
  // part per line (Store's OrderStepRequest says the rules); the order's lines read back by
  // its id or by the key that made it. Lines come back sorted by (sku, location). These run
  // per request, never through the batcher.
  std::vector<Reservation> order_step(const OrderStepRequest& request);
  std::vector<Reservation> get_order(const Uuid& order_id);
  std::vector<Reservation> order_by_key(const std::string& idempotency_key);
  // Reservations by ref, order or buyer (ReservationQuery; InvalidArgument without one of
  // them, or with a limit past reservations_limit_max).
  std::vector<Reservation> reservations(const ReservationQuery& query);
  std::size_t expire_due(std::size_t limit = 1000);

  // Async twins. Each validates and queues, then returns; the outcome reaches `sink` as a
  // Completion with `token`. Bad input and a full queue throw here, synchronously.
  void submit_reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                      std::optional<std::string> idempotency_key, const CallOptions& call,
                      std::shared_ptr<CompletionSink> sink, std::uint64_t token);
  void submit_sell(const SkuKey& key, Quantity qty, const CallOptions& call,
                   std::shared_ptr<CompletionSink> sink, std::uint64_t token);
  void submit_reserve_order(const std::vector<OrderLine>& lines, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call,
                            std::shared_ptr<CompletionSink> sink, std::uint64_t token);
  void submit_transition(const TransitionRequest& request, std::shared_ptr<CompletionSink> sink,
                         std::uint64_t token);
  void submit_allocate(const std::vector<AllocationWant>& wants,
                       const std::vector<std::string>& locations, AllocationPolicy policy,
                       bool split, std::optional<std::int64_t> ttl_us,
                       std::optional<std::string> idempotency_key, const CallOptions& call,
                       std::shared_ptr<CompletionSink> sink, std::uint64_t token);

  // The movement journal, the change feed, stock alerts and the audit (Store, docs/journal.md).
  std::vector<Movement> movements(const MovementQuery& query);
  FeedPosition feed_open(const std::string& consumer, bool from_start = true);
  FeedBatch feed_poll(const std::string& consumer, const FeedPosition& from, std::size_t limit);
  void feed_commit(const std::string& consumer, const FeedPosition& at);
  bool feed_drop(const std::string& consumer);
  // Waits up to timeout_ms (0..60000) for a change to be journaled (Store::feed_wait).
  FeedWake feed_wait(std::int64_t timeout_ms);
  // The row's low-stock threshold (none: no low-stock alerts); NotSupported on a slotted SKU.
  StockLevel set_low_stock(const SkuKey& key, std::optional<Quantity> threshold);
  AuditReport audit(const AuditOptions& options);
  // How many violations the last audit() of this engine found (-1: none ran yet).
  std::int64_t last_audit_violations() const { return last_audit_violations_.load(); }
  // Retention (Store::purge, Store::purge_movements): older_than_us >= 0, and limit (none:
  // no bound) >= 1, checked here once for both.
  std::uint64_t purge_movements(std::int64_t older_than_us,
                                std::optional<std::int64_t> limit = std::nullopt);
  PurgeCounts purge(std::int64_t older_than_us, std::optional<std::int64_t> limit = std::nullopt);
  // stats() costs O(1) in the number of rows (its counts may be estimates, see
  // StoreCounts); row_counts() counts every row, exactly.
  StoreStats stats(std::size_t sku_limit = 20) const;
  StoreCounts row_counts() const;
  // What the measured contention on `key` recommends, with reasons.
  Advice recommend(const SkuKey& key) const;
  SkuHeat heat(const SkuKey& key) const { return tracker_.heat(key); }
  const EngineOptions& options() const { return options_; }
  Store& store() { return *store_; }
  Telemetry& telemetry() { return *telemetry_; }

 private:
  WriteOptions resolve(const CallOptions& call) const;
  // `op`: reserve or sell (a sale's ref goes on its journal entry, which a batch cannot
  // give each sale: a sell with a ref runs per request).
  Route route(const SkuKey& key, const CallOptions& call, BatchOp op);
  // Runs a strategy-routed store call: counts its outcome per strategy and records it
  // (operation, strategy, outcome, latency since `started_us`). With `refusal_final`
  // false an OutOfStock is not recorded: the call may run again on another of the SKU's
  // rows, and its caller records the outcome (record_outcome) if the refusal stands.
  template <class Result, class Fn>
  Result counted(Op op, Strategy strategy, bool refusal_final, std::int64_t started_us, Fn&& fn);
  void record_outcome(Op op, Strategy strategy, const Error* error, std::int64_t started_us);
  // A call that ends outside its attempts (whose refusals went unrecorded): records
  // `error` as its outcome, and counts an OutOfStock per SKU on `key` (if it names one).
  void record_call_end(Op op, Strategy strategy, const SkuKey& key, const Error& error,
                       std::int64_t started_us);
  // Runs any other store call and records it (strategy: none).
  template <class Fn>
  auto observed(Op op, Fn&& fn) -> decltype(fn());
  // Runs a reserve or sell on this engine's slot of `key` (detail::SlotRouter::run): each
  // attempt through `attempt(row, route)`, `first` with the attempt's own If-Match
  // version and counting flags; an outcome that ends the call in the router is recorded
  // as `op` under the strategy asked, timed from `first.started_us`.
  template <class Result, class Attempt>
  Result on_slots(const SkuKey& key, Quantity qty, Op op, const Route& first, bool continued,
                  Attempt&& attempt);
  // reserve() and sell(), after their checks; `continued` (from `started_us`) for an async
  // call whose first attempt was refused: that attempt counted the request.
  Reservation reserve_on_slots(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                               const std::optional<std::string>& idempotency_key,
                               const CallOptions& call, bool continued, std::int64_t started_us);
  StockLevel sell_on_slots(const SkuKey& key, Quantity qty, const CallOptions& call, bool continued,
                           std::int64_t started_us);
  // An async call's first attempt was refused and left unrecorded: if the refusal is the
  // SKU's (or reading its rows fails), records it and throws it; else returns.
  void throw_if_refusal_stands(const SkuKey& key, const Error& refusal, Op op, Strategy asked,
                               std::int64_t started_us);
  std::vector<Reservation> order_on_slots(OrderRequest& request, Strategy asked);
  // allocate's paths (engine/orders.cpp): the batched walk over the pool (nothing: the
  // locked path decides) and the locked path; `entry` the tracker's count of the call on
  // its first location's row.
  std::optional<Reservation> allocate_batched(const AllocateRequest& request, const Route& first,
                                              detail::engine::InFlight& entry,
                                              std::int64_t started);
  std::vector<Reservation> allocate_locked(AllocateRequest request, Strategy asked,
                                           std::int64_t started);
  // An allocation was refused: moves free units into the SKU's own row at each location of
  // the pool where the SKU is known to have slots; whether any moved.
  bool refilled_pool(const AllocateRequest& request, const Error& refusal);
  // The sink of an async reserve or sell (detail::slot_checked_sink), recording as `op`.
  std::shared_ptr<CompletionSink> slot_checked_sink(
      std::shared_ptr<CompletionSink> sink,
      std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)> retry,
      Op op, Strategy asked, std::int64_t started_us);
  Reservation reserve_checked(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                              const std::optional<std::string>& idempotency_key,
                              const Route& route);
  StockLevel sell_checked(const SkuKey& key, Quantity qty, const Route& route);
  AllocateRequest allocate_request(const std::vector<AllocationWant>& wants,
                                   const std::vector<std::string>& locations,
                                   AllocationPolicy policy, bool split,
                                   std::optional<std::int64_t> ttl_us,
                                   std::optional<std::string> idempotency_key,
                                   const CallOptions& call) const;
  OrderRequest order_request(const std::vector<OrderLine>& lines,
                             std::optional<std::int64_t> ttl_us,
                             std::optional<std::string> idempotency_key,
                             const CallOptions& call) const;
  HotRowBatcher& batcher();
  AsyncExecutor& executor();
  // The batcher found `row` shared with another writer (HotRowBatcher::RowShared): may
  // learn or make the SKU's slots, on an async worker (settle_slots).
  void on_row_shared(const SkuKey& row, std::size_t batch, std::optional<Strategy> routed);
  void settle_slots(const SkuKey& key, bool split, std::size_t batch);
  // A request `auto` routed to a slotted SKU (`hot`: batched): when the SKU has cooled,
  // takes its slots away on an async worker (cool_slots).
  void on_slotted_routed(const SkuKey& key, bool hot);
  void cool_slots(const SkuKey& key);
  void through_batcher(BatchItem& item, const Route& route, std::shared_ptr<CompletionSink> sink,
                       std::uint64_t token);
  bool batches_transitions(std::uint16_t shard_key) const;
  Route transition_route() const;
  void check_transition(const TransitionRequest& request) const;
  bool batches(const TransitionRequest& request) const;
  Reservation run_transition(const TransitionRequest& request);
  template <class Fn>
  void run_async(std::shared_ptr<CompletionSink> sink, std::uint64_t token, Fn fn);

  // fork(): an engine belongs to the process that made it. In a child, every call raises
  // InvalidState, and close() and the destructor leave the parent's threads and
  // connections alone (abandon()).
  bool forked_away() const;
  void check_process() const;
  void abandon();

  const std::uint64_t generation_;  // detail::fork_generation() when made
  const std::int64_t creator_pid_;
  bool abandoned_ = false;
  std::shared_ptr<Store> store_;
  EngineOptions options_;
  std::shared_ptr<Telemetry> telemetry_;  // the store's: one owner of every counter
  // The contention tracker behind `auto`: the engine's, and the store reports its writes
  // to it (Store::observe_writes).
  std::shared_ptr<ContentionTracker> contention_;
  ContentionTracker& tracker_;     // *contention_
  mutable std::mutex lazy_mutex_;  // guards starting the batcher and the executor
  std::unique_ptr<HotRowBatcher> batcher_;
  std::atomic<HotRowBatcher*> started_batcher_{nullptr};  // batcher_, read without the lock
  std::unique_ptr<AsyncExecutor> executor_;
  bool closed_ = false;                        // no new batcher
  bool executor_closed_ = false;               // no new executor (set once the batcher has drained)
  std::unique_ptr<detail::SlotRouter> slots_;  // hot-row slots: where reserves and sells go
  std::unique_ptr<detail::AutoSlots> auto_slots_;  // when `auto` splits a SKU into slots
  std::atomic<std::int64_t> last_audit_violations_{-1};
};

// Checks engine-wide options; throws InvalidArgument.
void validate_engine_options(const EngineOptions& options);
// The telemetry an engine with these options writes to (Engine::memory and ::postgres
// hand it to their store; an engine over a store of yours writes to that store's).
TelemetryOptions telemetry_options(const EngineOptions& options);

}  // namespace stockade
