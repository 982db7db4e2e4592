// PostgresStore internals, shared by its translation units:
//   store.cpp         lifecycle (open, close), options, stats, the runner's backoff
//   stock.cpp         stock rows and the per-request strategies
//   reservations.cpp  holds, transitions, expiry, idempotency
//   batch.cpp         apply_batch: the hot-row batcher's transactions
//   delegated.cpp     on Citus, a reserve, a sell and a hold's step as one delegated call
//   sweeper.cpp       the elected background sweeper
//   migrate.cpp       the schema migrations
//   test_hooks.cpp    the oversell canary and hold_lock (TestHooks)
// and its parts: statements.* (the SQL), pool.* (connections), sqlstate.* (errors).
//
// Every call runs as one transaction through run(), which leases a connection, sets its
// lock_timeout, commits, retries serialization failures and deadlocks within bounds,
// retries once on a connection that broke before COMMIT, and turns a connection lost
// during COMMIT into InDoubt.
//
// Lock order, the rule that keeps engines from deadlocking: stock rows are locked in sorted
// (sku, location) byte order (COLLATE "C" in SQL, std::string's order in C++); a
// transition locks its reservation row first and then one stock row; the sweeper skips
// locked reservations and then locks stock rows in sorted order. Idempotency keys are
// claimed before any stock row is locked.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "base/backoff.hpp"
#include "postgres/arrays.hpp"
#include "postgres/dsn.hpp"
#include "postgres/pool.hpp"
#include "postgres/purge.hpp"
#include "postgres/routes.hpp"
#include "postgres/sqlstate.hpp"
#include "postgres/statements.hpp"
#include "postgres/watchdog.hpp"
#include "stockade/hash.hpp"
#include "stockade/log.hpp"
#include "stockade/postgres_store.hpp"
#include "stockade/testing.hpp"
#include "store/allocation.hpp"
#include "store/error_helpers.hpp"
#include "store/fingerprint.hpp"
#include "store/keyed.hpp"
#include "store/lifecycle.hpp"
#include "store/purchase_limits.hpp"

namespace stockade::detail::pg {

class BatchTx;  // batch.cpp

// How run() runs its function; see run().
enum class RunMode { transaction, read, one_statement, delegated };

// The kinds of delegated call on the Citus layout, by the migrations that make their
// functions: reserves (citus/105, 106), one-row batches (citus/107), the purge (citus/108)
// and sells and steps (citus/111). Each is turned off on its own when its function is
// missing (lacks_delegation). The count follows the last kind; what a kind's warning calls
// it is delegated_calls(), whose switch the compiler checks for every kind.
enum class Delegated : std::uint8_t { reserve, batch, purge, write };
constexpr std::size_t delegated_kinds = static_cast<std::size_t>(Delegated::write) + 1;

// One transaction on one connection (or, for single reads, one autocommit statement).
struct Tx {
  pqxx::transaction_base& work;
  Connection& conn;

  // A statement that names no shard key.
  template <class... Args>
  pqxx::result exec(Stmt s, Args&&... args) {
    if (conn.statements().pinned(s)) {
      throw Error(ErrorCode::invariant_violation,
                  std::string("statement ") + Statements::name(s) +
                      " needs the shard key it touches (Citus layout)");
    }
    return conn.exec(work, s, std::forward<Args>(args)...);
  }
  // A statement on the rows of one shard key: on the Citus layout the key goes last, so
  // that Citus routes it to one shard; the plain layout's SQL does not take it.
  template <class... Args>
  pqxx::result exec_on(std::uint16_t shard, Stmt s, Args&&... args) {
    if (conn.statements().pinned(s)) {
      return conn.exec(work, s, std::forward<Args>(args)..., static_cast<int>(shard));
    }
    return conn.exec(work, s, std::forward<Args>(args)...);
  }
};

// The rows a write statement changed (affected_rows() is an int in libpqxx 7 and unsigned
// in 6.4).
inline std::size_t rows_changed(const pqxx::result& r) {
  return static_cast<std::size_t>(r.affected_rows());
}
// The rows a batch's write changed, where Citus's delegated write functions (citus/113)
// return their count as a one-column row (`as_row`) and a statement reports it itself.
inline std::size_t rows_written(const pqxx::result& r, bool as_row) {
  if (!as_row) return rows_changed(r);
  return r.empty() ? 0 : r[0][0].as<std::size_t>();
}

// The NOTIFY channel of the change feed of `schema` (record.cpp).
std::string feed_channel(const std::string& schema);

// A stock row read with the columns of stock_columns_sql() (stock.cpp).
StockLevel level_from(const SkuKey& key, const pqxx::row& row);

// Whether run() wraps its function in a transaction. A one-statement write behind a
// transaction-mode pooler runs in a transaction of its own after all. That is where SET
// LOCAL can bound its lock wait, and it keeps the outcome of a cut connection certain:
// the engine cannot end a session it cannot see behind the pooler, but a transaction
// whose COMMIT was never sent cannot commit, whereas an autocommit statement cut while it
// waits for a lock still may. So does one whose changes carry a journal note (set_config
// is local to a transaction).
bool note_in_scope() noexcept;
inline bool runs_in_transaction(RunMode mode, bool pooled) {
  return mode == RunMode::transaction ||
         (mode == RunMode::one_statement && (pooled || note_in_scope()));
}
// Whether the call's one statement commits by itself (a cut may leave it in doubt).
inline bool commits_itself(RunMode mode, bool in_transaction) {
  return !in_transaction && (mode == RunMode::one_statement || mode == RunMode::delegated);
}

// Whether the call on this thread carries a journal note (stockade/journal.hpp), and its
// setting for the transaction (migration 007's trigger reads `stockade.note`): the text of
// that setting ('' for none), which a delegated step sets itself (citus/111).
void set_note(Tx& tx);
std::string note_text();

inline std::uint16_t shard_of(const SkuKey& key) {
  return row_shard_key(key.sku, key.location);
}

// Thrown inside a transaction to commit what it did and then raise `error` (a lapsed hold
// is expired on the way to ReservationExpired).
struct CommitThenRaise {
  Error error;
};

// A write's idempotency key, as PostgresStore::keyed takes it: the key, its request's
// fingerprint, and the shard key of the rows it writes (where the key lives on Citus).
struct KeyedWrite {
  std::string key;
  std::string fingerprint;
  std::uint16_t shard = 0;
};
// A step of the reservation `request.id`, if it has a key.
template <class Request>
std::optional<KeyedWrite> keyed_write(const Request& request) {
  if (!request.idempotency_key) return std::nullopt;
  return KeyedWrite{*request.idempotency_key, fingerprint(request), request.id.shard_key()};
}

// An optimistic write lost its compare-and-set; the attempt's transaction rolls back.
struct OptimisticRace {};

// A commit, or a one-statement write, whose connection was lost: InDoubt to the caller.
// `settled`: the store ended the server session that ran it (end_session), so the write
// has committed or rolled back for good and a fresh read shows which. A caller that knows
// what the write made (the ids of new reservations) looks, and answers for certain.
struct LostCommit : Error {
  LostCommit(Error error, bool settled_, std::string prelude_)
      : Error(std::move(error)), settled(settled_), prelude(std::move(prelude_)) {}
  bool settled;
  // The start of the log line that says what became of it: the cause in plain words and
  // what the engine did about the session ("connection lost during COMMIT (...); ...").
  std::string prelude;
};

struct Migration;

class PostgresStore final : public Store, public TestHooks {
 public:
  PostgresStore(PostgresOptions options, std::shared_ptr<Telemetry> telemetry);
  ~PostgresStore() override;

  const char* backend_name() const noexcept override { return "postgres"; }

  StockLevel restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                     std::optional<FencingToken> token,
                     const std::optional<std::string>& idempotency_key = {}) override;
  StockLevel set_on_hand(const SkuKey& key, Quantity on_hand, std::optional<Version> expected,
                         std::optional<FencingToken> token,
                         const std::optional<std::string>& idempotency_key = {}) override;
  StockLevel stock(const SkuKey& key) override;
  std::vector<StockLevel> sku_rows(const SkuKey& base) override;
  std::vector<StockLevel> reshape(const std::vector<SkuKey>& rows, bool create, bool write_all,
                                  std::int64_t lock_timeout_ms, const ReshapePlan& plan,
                                  int active_slots) override;
  StockLevel sell(const SellRequest& request) override;
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

  Reservation reserve(const ReserveRequest& request) override;
  std::vector<Reservation> reserve_order(const OrderRequest& request) override;
  std::vector<Reservation> allocate(const AllocateRequest& request) override;
  std::vector<std::string> sku_locations(const std::string& sku,
                                         const std::optional<std::string>& after,
                                         std::size_t limit) override;
  Reservation transition(const TransitionRequest& request) override;
  Reservation return_units(const ReturnRequest& request) override;
  Reservation resize(const ResizeRequest& request) override;
  Reservation get_reservation(const Uuid& id) override;
  std::vector<Reservation> order_step(const OrderStepRequest& request) override;
  std::vector<Reservation> get_order(const Uuid& order_id) override;
  std::vector<Reservation> order_by_key(const std::string& idempotency_key) override;
  std::vector<Reservation> find_reservations(const ReservationQuery& query) override;
  std::size_t expire_due(std::size_t limit) override;
  std::size_t free_lapsed(std::size_t limit) override;
  // How long free_lapsed() waits for each stock-row lock.
  static constexpr std::int64_t free_lapsed_lock_timeout_ms = 100;
  void apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) override;
  // On Citus: a batch over several shard keys, one batch each (batch.cpp).
  bool apply_by_shard(const std::vector<BatchItem*>& items, const BatchOptions& options);

  PurgeCounts purge(std::int64_t older_than_us, std::uint64_t limit) override;
  // purge()'s last step: finished transfers, one batch (postgres/retention.cpp).
  std::uint64_t purge_transfers(std::int64_t older_than_us, std::uint64_t limit);
  StoreCounts counts() const override;
  StoreCounts exact_counts() const override;

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
  FeedWake feed_wait(std::int64_t timeout_us) override;
  PoolStats pool_stats() const override {
    const PoolGauges g = pool_.gauges();
    return PoolStats{g.size,    g.in_use,         g.idle,
                     g.waiting, g.pooled,         g.routines,
                     g.server,  g.server_changes, routes_ ? routes_->stats() : RoutingStats{}};
  }
  std::vector<std::string> migrate(int up_to) override;
  std::vector<std::pair<std::string, std::string>> migration_plan(int up_to) override;
  void drop_schema() override;
  void close() override;

  Reservation naive_reserve_unsafe(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                   std::int64_t window_us) override;
  std::unique_ptr<LockHold> hold_lock(const SkuKey& key, Strategy kind,
                                      std::int64_t timeout_ms) override;
  Reservation limited_reserve_by_check(const SkuKey& key, Quantity qty, const std::string& buyer,
                                       bool serializable, std::int64_t window_us) override;

  // The reservations with these ids, in this order (NotFound if one is missing). Used by
  // idempotent replays, per request and inside batches.
  std::vector<Reservation> fetch(Tx& tx, const std::vector<Uuid>& ids);
  std::vector<Reservation> read_many(Tx& tx, const std::vector<Uuid>& ids);

 private:
  using Level = std::optional<StockLevel>;

  // Runs fn(Tx&) as one transaction; see the file comment. RunMode::read runs a read of
  // one statement in autocommit instead: one round trip instead of three. RunMode::
  // one_statement runs a write of exactly one statement in autocommit, which commits as
  // it completes: a connection lost while it runs leaves it in doubt (never retried).
  // RunMode::delegated runs one call of a function that Citus delegates to a worker, in
  // autocommit even on the Citus layout's stateless connections (in a transaction block
  // the coordinator would run it itself); it sets its lock_timeout inside. A worker it
  // could not connect to (never_reached) is Unavailable; any other cut is in doubt.
  // `via`: a Citus worker's pool (direct routing, routes.hpp); none, the coordinator's.
  template <RunMode Mode = RunMode::transaction, class Fn>
  auto run(const WriteOptions* options, const ErrorContext& context, Fn&& fn, Pool* via = nullptr)
      -> std::invoke_result_t<Fn&, Tx&>;
  // One attempt of run() on `lease`: fn(tx), then the commit. `committing` turns true
  // once a lost connection could mean a commit (run() then resolves, never retries).
  template <RunMode Mode, class Fn>
  auto run_attempt(Pool::Lease& lease, const WriteOptions* options, bool in_transaction,
                   bool& committing, Fn& fn) -> std::invoke_result_t<Fn&, Tx&>;
  // After a rolled-back transaction (40001, 40P01): sleeps with jitter before another
  // attempt, or throws Overloaded once serialization_retries_max attempts failed.
  void back_off_or_give_up(const WriteOptions* options, const ErrorContext& context,
                           const std::string& sqlstate, int attempt, const char* cause);
  // After a connection broke before COMMIT: the first time, closes the idle connections of
  // `pool` (a restart or failover broke them too), logs at INFO and returns, for run() to
  // run the call again; the second time, throws Unavailable.
  void run_again_or_give_up(Pool& pool, bool& reconnected, const ErrorContext& context,
                            const char* cause);
  // After the Citus coordinator answered with a connection error (class 08) over a
  // connection that is still up: a worker is out of reach. This connection and the idle
  // ones are sound, so none is closed: a dead worker costs only the calls that need it.
  // A COMMIT that was sent, or a `delegated` call that may have reached the worker (not
  // never_reached), is InDoubt (remote_commit_failed). Otherwise nothing was changed: the first
  // time it returns for run() to run the call once more (a worker that restarted leaves each
  // coordinator session a stale connection to it, which fails once); then Unavailable.
  void remote_node_failed(bool& retried, bool committing, bool delegated,
                          const ErrorContext& context, const char* cause);
  // The deadline of a run() that starts now: the enclosing CallDeadline's, else
  // call_timeout from now (steady clock, microseconds).
  std::int64_t call_deadline_us() const;
  // The answer of a call whose deadline fired: DeadlineExceeded (nothing changed) while
  // no COMMIT was sent, InDoubt once one was. Logs a WARNING (rate-limited).
  Error past_deadline(const ErrorContext& context, bool commit_sent) const;
  // The InDoubt error for a commit whose connection was lost, after ending its session.
  LostCommit lost_commit(const Backend& backend, const ErrorContext& context,
                         const char* cause) const;
  // The error of a statement the server answered with an error (not 40001/40P01 that
  // run() retries): `fired`, the call's deadline cancelled it; `at_commit`, the answer
  // came to COMMIT. An error reply is definite, even to COMMIT: the transaction rolled
  // back. Not on Citus: there a COMMIT's error, or a `delegated` call cancelled (the
  // worker may have committed before the coordinator read its answer), is InDoubt.
  [[noreturn]] void sql_failed(const pqxx::sql_error& e, Pool::Lease& lease, bool fired,
                               bool at_commit, bool delegated, const Failure& failure);
  // The InDoubt error for a COMMIT, or a delegated call, that the Citus coordinator
  // answered with an error (XX000 "could not commit transaction for shard ...", or a
  // worker's connection lost mid-call): the worker may have committed; the coordinator
  // cannot tell.
  LostCommit remote_commit_failed(const ErrorContext& context, const char* cause) const;
  // Runs attempt(), which makes the reservations `ids`. After a lost commit whose session
  // was ended, reads them back: all there, the call succeeded; none, nothing changed and
  // attempt() runs once more. A second loss, or one that is not settled, stays InDoubt.
  template <class Fn>
  std::vector<Reservation> run_resolving(const std::vector<Uuid>& ids, const ErrorContext& context,
                                         Fn&& attempt);
  // A write other than a reserve, in one transaction with its idempotency key if it has
  // one (store/keyed.hpp): the key is claimed first (a concurrent duplicate's claim waits
  // for this one's transaction), then body(tx) runs, then its outcome is stored with the
  // key. A replay returns the stored outcome; another request's key is a conflict. After a
  // lost commit the key says whether the write landed: stored, its outcome is the answer;
  // absent after an ended session, the write runs once more; else InDoubt, whose hint is to
  // retry with the key (keys.cpp).
  // `shard`: the shard key of the write's main row, to route it by (run_on).
  template <class Result, class Fn>
  Result keyed(const std::optional<KeyedWrite>& k, const WriteOptions* options,
               ErrorContext context, Fn&& body, std::optional<std::uint16_t> shard = std::nullopt);
  // keyed()'s steps (keys.cpp): claim or replay (nothing: claimed), and after a lost
  // commit, the outcome the key holds (nothing: not landed, so run again).
  std::optional<std::string> claim_or_replay(Tx& tx, const KeyedWrite& k);
  // `ours`: the outcome this attempt would have stored (`whole`), or its start; a key that
  // holds another (a concurrent duplicate's, an older call's) says the attempt did not land.
  struct OutcomeMatch {
    std::string expected;
    bool whole = true;
  };
  std::optional<std::string> landed_outcome(const KeyedWrite& k, const LostCommit& lost,
                                            const ErrorContext& context,
                                            const OutcomeMatch* ours = nullptr);
  // find_landed's and landed_outcome's one way to log and decide what the look found
  // (`returned`: how a write found is answered), and to give up when it cannot read.
  void settle_landing(const LostCommit& lost, bool found, const char* returned) const;
  [[noreturn]] void landing_unreadable(const LostCommit& lost, const Error& e) const;
  // Retries attempt() after OptimisticRace, at most options.retries_max times.
  template <class Fn>
  auto optimistic_retry(const SkuKey* key, const WriteOptions& options, Fn&& attempt)
      -> std::invoke_result_t<Fn&>;

  // Stock rows inside a transaction.
  Level read_row(Tx& tx, Stmt s, const SkuKey& key);
  // A transfer's write of a row it locked: its on_hand and incoming (postgres/transfers.cpp).
  StockLevel write_transit(Tx& tx, const StockLevel& row, Quantity on_hand, Quantity incoming);
  // The audit's checks of holds, limits, slot rows and keys (record.cpp).
  void audit_holds(const AuditOptions& options, const std::string& sku, std::int64_t limit,
                   AuditReport& report);
  void audit_transit(const AuditOptions& options, const std::string& sku, AuditReport& report);
  // Reads the row under the lock the strategy takes (none for atomic and optimistic).
  StockLevel lock_row(Tx& tx, const SkuKey& key, const WriteOptions& options);
  void lock_advisory(Tx& tx, const SkuKey& key, const WriteOptions& options);
  // Writes on_hand -= sold, reserved += held for a row the strategy has read (and, except
  // for optimistic, locked). Optimistic throws OptimisticRace when the version moved.
  StockLevel write_row(Tx& tx, const StockLevel& read, Quantity sold, Quantity held,
                       const WriteOptions& options);
  // The SKU's rows (own first, then its slots), and NotSupported for `feature` if it has
  // slots; both in `tx`, whole under the own row's lock (see stock.cpp).
  std::vector<StockLevel> read_sku_rows(Tx& tx, const SkuKey& base);
  void refuse_if_slotted(Tx& tx, const SkuKey& key, const char* feature);
  // Tells `auto`'s tracker the version a write of this process left; returns `level`.
  StockLevel observed_write(StockLevel level);
  // After a conditional write matched no row: NotFound, then check_writable's errors
  // (Discontinued, FencingTokenStale, LeaseHeld, VersionConflict), else OutOfStock,
  // counted per SKU if `count` (WriteOptions::count_refusal).
  [[noreturn]] void refuse(Tx& tx, const SkuKey& key, Quantity qty,
                           const std::optional<Version>& expected,
                           const std::optional<FencingToken>& token, bool count);
  // refuse() in a read of its own, after a write of one statement or call changed nothing.
  // It throws; a caller returning an optional writes `return refused_by_read(...)`.
  std::nullopt_t refused_by_read(const SkuKey& key, Quantity qty, const WriteOptions& options,
                                 const std::optional<FencingToken>& token);
  StockLevel upsert(const SkuKey& key, Quantity value, bool add, std::optional<Version> expected,
                    std::optional<FencingToken> token,
                    const std::optional<std::string>& idempotency_key);
  // The same, inside `tx` (a return puts units back on hand in its reservation's
  // transaction).
  StockLevel upsert_in(Tx& tx, const SkuKey& key, Quantity value, bool add,
                       std::optional<Version> expected, std::optional<FencingToken> token);
  // Locks the row (NotFound if there is none), passes `check` on it, and runs `write`.
  template <class Check, class Write>
  StockLevel admin_write(const SkuKey& key, Check&& check, Write&& write);
  // The forms of an atomic reserve in one statement or one call (stock.cpp), if one
  // applies; `print`: the request's fingerprint, if it has a key.
  std::optional<Reservation> reserve_in_one_call(const ReserveRequest& request, const Uuid& id,
                                                 const std::string& print);
  std::optional<Reservation> reserve_in_one_statement(const ReserveRequest& request,
                                                      const Uuid& id);
  std::optional<Reservation> reserve_delegated(const ReserveRequest& request, const Uuid& id,
                                               const std::string& print);
  std::optional<StockLevel> sell_delegated(const SellRequest& request);
  std::optional<Reservation> transition_delegated(const TransitionRequest& request);
  // Direct routing (routes.hpp): the worker that holds `shard`'s rows, reading the map
  // first when it is due; nothing: through the coordinator.
  std::optional<Routes::Route> route_of(std::uint16_t shard);
  void load_routes();
  // A delegated call on `shard`'s rows (RunMode::delegated): fn(tx, ran_on) runs on the
  // worker the map names, with `ran_on` where it writes the group of the node the call ran
  // on (a group other than the route's is a miss); or through the coordinator, with
  // `ran_on` null: without direct routing, or after the worker's pool answered Unavailable
  // (a fallback). Nothing, when the schema lacks the functions (lacks_delegation).
  template <class Fn>
  auto run_delegated(Delegated which, std::uint16_t shard, const WriteOptions* options,
                     const ErrorContext& context, Fn&& fn)
      -> std::optional<std::invoke_result_t<Fn&, Tx&, std::int32_t*>>;
  // run() routed by the shard key of the work's main row (`shard`; nothing: the
  // coordinator), through via_route: on that row's worker with direct routing, where
  // Citus runs its statements locally (design.md: another shard's, a distributed
  // transaction). Counted as routed, never as a miss: the map's reload fixes a stale route.
  template <RunMode Mode = RunMode::transaction, class Fn>
  auto run_on(std::optional<std::uint16_t> shard, const WriteOptions* options,
              const ErrorContext& context, Fn&& fn) -> std::invoke_result_t<Fn&, Tx&>;
  // The one way a call takes its route (run_delegated, run_on): call(route) on the worker
  // the map names for `shard`, then, if its pool answered Unavailable, call(nullptr)
  // through the coordinator (the fallback is counted, the worker passed over for a while).
  template <class Call>
  auto via_route(std::uint16_t shard, Call&& call)
      -> std::invoke_result_t<Call&, const Routes::Route*>;
  // apply_batch's fast statement: one statement, or on Citus one delegated call
  // (BatchTx::delegable); false if some row lacked room.
  bool run_fast_path(BatchTx& batch, const WriteOptions& write, const ErrorContext& context);
  // Whether `e` says a delegated call's function is missing (a schema an older release
  // migrated): then the store stops delegating `which` (logged once) until migrate() runs,
  // and run_delegated gives nothing; nothing ran. The other kinds go on as they were: a
  // schema migrated up to citus/110 lacks the sells' and steps' functions only.
  bool lacks_delegation(const Error& e, Delegated which);
  bool delegates(Delegated which) const {
    return delegation_[static_cast<std::size_t>(which)].on.load(std::memory_order_relaxed);
  }
  struct DelegationOn {  // each kind on until its function is found missing
    std::atomic<bool> on{true};
  };
  DelegationOn delegation_[delegated_kinds];
  // Whether step_one and purge_shard can take the shard tables' path here (the role owns
  // the tables, its sessions are READ COMMITTED): 0 unknown, 1 yes, -1 no (delegated.cpp).
  std::atomic<int> shard_path_{0};
  bool shard_path_usable();
  // Whether the batch's full path writes through the delegated calls of citus/113 (the
  // schema has them and shard_path_usable), else literal SQL: 0 unknown, 1 yes, -1 no.
  // migrate() forgets it.
  std::atomic<int> batch_writes_{0};
  bool batch_writes_delegable();
  void say_no_batch_writes();  // the warning that the schema lacks them
  // fn() with the batch's Citus writes through those calls or as SQL text (batch.cpp).
  template <class Fn>
  bool with_batch_writes(BatchTx& batch, Fn&& fn);
  // The same for a keyless atomic reserve with a buyer: allowance, row and reservation in
  // one statement (batch_fast_one_limited); nothing if it could not apply in full (the
  // transaction path then decides and says why).
  std::optional<Reservation> reserve_limited_in_one_statement(const ReserveRequest& request,
                                                              const Uuid& id);

  // Reservations inside a transaction.
  Reservation insert_reservation(Tx& tx, const Uuid& id, const SkuKey& key, Quantity qty,
                                 std::int64_t ttl_us, const std::optional<std::string>& key_name,
                                 const std::optional<std::string>& buyer = std::nullopt,
                                 const std::optional<std::string>& group = std::nullopt,
                                 const std::optional<Uuid>& order_id = std::nullopt,
                                 const std::optional<std::string>& ref = std::nullopt,
                                 const std::optional<std::string>& metadata = std::nullopt);
  // Purchase limits inside a transaction. take_allowances counts the lines' units against
  // `buyer` in each group they touch (parent rows locked in group order, before any stock
  // row) or raises LimitExceeded; it returns each line's group. give_back returns a
  // released or expired hold's units.
  LineGroups take_allowances(Tx& tx, const std::vector<OrderLine>& lines, const std::string& buyer);
  void give_back(Tx& tx, const Reservation& r, Quantity units);
  [[noreturn]] void throw_lapsed(Tx& tx, Reservation& r);
  void settle_in(Tx& tx, const Reservation& r, const Settlement& moved);
  Reservation write_units(Tx& tx, const Reservation& r, std::int64_t ttl_us);
  Reservation lock_live_hold(Tx& tx, const Uuid& id, const std::optional<Version>& expected);
  // `order_id`: the order the lines make (reserve_order), none for a reserve.
  std::vector<Reservation> hold(Tx& tx, const std::vector<OrderLine>& sorted_lines,
                                const std::vector<Uuid>& ids, std::int64_t ttl_us,
                                const std::optional<std::string>& idempotency_key,
                                const WriteOptions& options,
                                const std::optional<Uuid>& order_id = std::nullopt);
  // Orders (orders.cpp): an order's lines, locked in id order, each with whether it lapsed.
  std::vector<Reservation> lock_order(Tx& tx, const Uuid& order_id, std::vector<bool>& lapsed);
  std::vector<Reservation> order_step_in(Tx& tx, const OrderStepRequest& request);
  // allocate's transaction: the buyer's counts, the pool locked (`pool`: pool_rows, each
  // with its id in `ids`), the plan, its holds (orders.cpp).
  std::vector<Reservation> allocate_in(Tx& tx, const AllocateRequest& request,
                                       const std::vector<PoolRow>& pool,
                                       const std::vector<Uuid>& ids, const Uuid& order_id,
                                       const WriteOptions& options);
  // `asked`: what the request asks, for the message of a conflict (store/fingerprint.hpp).
  // `shard`: where the key lives on Citus (none: the first id's shard, the request's row's).
  std::vector<Reservation> with_idempotency(Tx& tx, const std::string& key,
                                            const std::string& fingerprint, const Asked& asked,
                                            const std::vector<Uuid>& ids,
                                            const std::function<std::vector<Reservation>()>& run,
                                            std::optional<std::uint16_t> shard = std::nullopt);
  void move_stock(Tx& tx, const SkuKey& key, Quantity sold, Quantity released);
  // Expires at most `limit` due holds inside `tx`; returns how many.
  std::size_t expire_in(Tx& tx, std::size_t limit);
  // One sweeper transaction on the leader's own session (the one holding the election
  // lock): expires at most sweep_batch due holds; returns how many. Behind a
  // transaction-mode pooler there is no session to hold the lock: the transaction takes
  // `election_key` as a transaction-scoped advisory lock first, and returns nullopt
  // (having done nothing) when another engine holds it.
  std::optional<std::size_t> sweep_batch(Connection& leader, std::int64_t election_key);
  void purge_on_leader(Connection& leader, std::int64_t election_key);
  void log_purged(const PurgeCounts& purged);
  bool stand_for_sweeper(std::unique_ptr<Connection>& leader, bool elected,
                         std::int64_t election_key);
  std::uint64_t expire_as_leader(Connection& leader, std::int64_t election_key, bool& elected);
  Watchdog::Guard arm_leader(Connection& leader);
  // Pooled: takes the sweeper's election lock for this transaction, if free.
  static bool elected_for(pqxx::transaction_base& work, const Connection& leader,
                          std::int64_t election_key);
  // Purges batch by batch (keys with their reservations, then reservations without a key;
  // purge_batch per statement) until `limit` keys and keyless reservations are gone, nothing
  // old is left, or stop() says so. delete_some(statement, n, cursor) runs one and commits.
  using PurgeStatement = std::function<PurgeStep(Stmt, std::uint64_t, std::int64_t)>;
  PurgeCounts purge_with(std::uint64_t limit, const PurgeStatement& delete_some,
                         const std::function<bool()>& stop);
  PurgeStep purge_step(Tx& tx, Stmt statement, std::int64_t older_than_us, std::uint64_t n,
                       std::int64_t cursor);
  // purge() on Citus: each shard's by its delegated call, then the rest; `rest`: the sweeper's.
  PurgeCounts purge_citus(std::int64_t older_than_us, std::uint64_t limit, const Rest& rest = {});
  // The Citus shards (a shard key in each) that hold old entries of a purge's phase.
  std::optional<std::vector<std::uint16_t>> citus_old_shards(Stmt statement,
                                                             std::int64_t older_than_us);
  // purge_step on Citus, one Citus shard at a time (`group`: its shard keys with entries
  // in the window [from, upto] of times, epoch us).
  PurgeStep purge_step_citus(Tx& tx, Stmt statement, std::int64_t older_than_us, std::uint64_t n,
                             std::int64_t cursor);
  void purge_keys_on(Tx& tx, std::int64_t shard, const std::vector<std::int64_t>& group,
                     std::int64_t older_than_us, std::uint64_t n, std::int64_t from,
                     std::int64_t upto, PurgeStep& out);
  void purge_reservations_on(Tx& tx, const std::vector<std::int64_t>& group,
                             std::int64_t older_than_us, std::uint64_t n, std::int64_t from,
                             std::int64_t upto, PurgeStep& out);

  std::int64_t advisory_key(const SkuKey& key) const;
  void count_batch(const std::vector<BatchItem*>& items);
  bool takes_fast_path(BatchTx& batch, const ErrorContext& context);
  std::optional<bool> resolve_fast(BatchTx& batch, const LostCommit& lost,
                                   const ErrorContext& context);
  // After a lost commit: whether reservation `id` moved from `version` (the batch's fast
  // statement with steps, or another write, may have moved it); a read that fails leaves
  // the call in doubt (throws `lost`).
  bool step_moved(const Uuid& id, Version version, const LostCommit& lost,
                  const ErrorContext& context);
  void run_full_resolving(BatchTx& batch, const WriteOptions& write, const ErrorContext& context);
  // After a lost commit: the reservations `ids` if the write landed (all of them; with
  // `some`, those of them it made: an allocation's ids are its pool's, and it used some).
  // If not, none when the loss is settled (the write can no longer land), and `lost`
  // (InDoubt) when it is not. A read that fails leaves the call in doubt (throws `lost`).
  std::vector<Reservation> find_landed(const std::vector<Uuid>& ids, const LostCommit& lost,
                                       const ErrorContext& context, bool some = false);
  // After a lost commit: the reservations `ids` as they are now (those found), on a fresh
  // session; a read that fails leaves the call in doubt (throws `lost`).
  std::vector<Reservation> read_after_loss(const std::vector<Uuid>& ids, const LostCommit& lost,
                                           const ErrorContext& context);
  void sweep_loop();
  std::vector<const Migration*> pending(
      const std::map<int, std::pair<std::string, std::string>>& applied, int up_to) const;
  std::vector<Stmt> missing_routines(pqxx::transaction_base& work);
  int make_routines(pqxx::connection& conn, const std::string& lock_key,
                    const std::vector<Stmt>& missing);

  const PostgresOptions options_;
  const std::shared_ptr<const Statements> statements_;
  mutable Watchdog watchdog_;  // before pool_: the pool's connections are armed with it
  mutable Pool pool_;
  std::unique_ptr<Routes> routes_;  // citus_routing = direct only

  // Batches left to run without trying the fast path, after one found no room.
  static constexpr int fast_skips_after_miss = 16;
  std::atomic<int> fast_skips_{0};

  // The change feed's wake-ups (record.cpp): a write that committed marks feed_dirty_,
  // and the notifier thread sends one NOTIFY for what committed in each short interval;
  // feed_wait LISTENs on a connection of its own (listener_, used by one waiter at a time:
  // `listening_`), and the others wait for its news (listen_generation_).
  void note_commit() {
    if (!feed_dirty_.load(std::memory_order_relaxed) &&
        !feed_dirty_.exchange(true, std::memory_order_relaxed)) {
      notify_wake_.notify_one();
    }
  }
  void notify_loop();
  void send_notify();
  bool listen_once(std::int64_t until_us);
  void drain_listener();
  std::atomic<bool> feed_dirty_{false};
  std::condition_variable notify_wake_;  // with sweeper_mutex_ (which guards stopping_)
  std::thread notifier_;
  std::unique_ptr<Connection> notifier_conn_;  // the notifier thread's alone
  std::mutex listen_mutex_;
  std::condition_variable listen_cv_;
  std::uint64_t listen_generation_ = 0;
  bool listening_ = false;
  bool listen_refused_ = false;  // behind a transaction-mode pooler: LISTEN cannot work
  std::unique_ptr<Connection> listener_;
  std::string channel_;

  mutable std::mutex sweeper_mutex_;  // guards stopping_
  std::condition_variable sweeper_wake_;
  bool stopping_ = false;
  std::thread sweeper_;
};

// Reads a reservation from the columns of reservation_columns(); lapsed_out, if given,
// receives whether expires_at <= now().
Reservation read_reservation(const pqxx::row& row, bool* lapsed_out = nullptr);
ReservationState parse_state(const std::string& name);
// A new hold as inserted; `times` holds its expires_at and created_at (epoch us).
Reservation new_hold(const Uuid& id, const SkuKey& key, Quantity qty,
                     const std::optional<std::string>& idempotency_key, const pqxx::row& times);
// The reservations `found` in the order of `ids`; NotFound for one that is missing.
std::vector<Reservation> in_order(const std::vector<Reservation>& found,
                                  const std::vector<Uuid>& ids);
bool valid_schema_name(const std::string& schema);
bool reserved_schema_name(const std::string& schema);

// The migrations compiled in from sql/ (generated at build time), in file-name order.
struct Migration {
  const char* name;
  const char* sql;
};
const std::vector<Migration>& migrations();

// One limiter for the reconnect warning of every store in the process.
LogLimiter& reconnect_log();

// stats() counts holds up to this many (an index-only walk of the held index); more
// reads as this figure.
inline constexpr std::uint64_t held_count_cap = 10000;

}  // namespace stockade::detail::pg

// The runners' definitions.
#include "postgres/run_inl.hpp"
