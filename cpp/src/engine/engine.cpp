#include "stockade/engine.hpp"

#include <unistd.h>

#include "base/fork.hpp"
#include "hotrow/auto_slots.hpp"
#include "hotrow/slot_router.hpp"
#include "store/error_helpers.hpp"

#include <set>

#include "stockade/errors.hpp"
#include "stockade/log.hpp"
#include "stockade/memory_store.hpp"

namespace stockade {
namespace {

bool waits_for_locks(Strategy s) {
  return s == Strategy::pessimistic || s == Strategy::advisory;
}

void validate_lock_timeout_ms(std::int64_t ms) {
  if (ms <= 0 || ms > lock_timeout_ms_max) {
    throw_invalid_argument("lock_timeout must be between 1 ms and " +
                           std::to_string(lock_timeout_ms_max) + " ms, got " + std::to_string(ms) +
                           " ms");
  }
}

// The batcher's records for each kind of request.
BatchItem reserve_item(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                       std::optional<std::string> idempotency_key, Strategy asked) {
  BatchItem item;
  item.op = BatchOp::reserve;
  item.started_us = steady_now_us();
  item.counted_as = asked;
  item.key = key;
  item.qty = qty;
  item.ttl_us = ttl_us;
  item.idempotency_key = std::move(idempotency_key);
  return item;
}

// Purchase limits count holds: a sell takes no buyer.
void refuse_buyer(const CallOptions& call) {
  if (call.buyer) {
    throw_invalid_argument("sell takes no buyer: purchase limits count holds (reserve)");
  }
}

BatchItem sell_item(const SkuKey& key, Quantity qty, Strategy asked) {
  BatchItem item;
  item.op = BatchOp::sell;
  item.started_us = steady_now_us();
  item.counted_as = asked;
  item.key = key;
  item.qty = qty;
  return item;
}

BatchItem transition_item(BatchOp op, const Uuid& id, std::optional<Version> expected) {
  BatchItem item;
  item.op = op;
  item.started_us = steady_now_us();
  item.id = id;
  item.expected_version = expected;
  return item;
}

// Leaves the contention tracker when a per-request call ends, however it ends.
class InFlight {
 public:
  InFlight(ContentionTracker& tracker, std::uint16_t shard_key)
      : tracker_(&tracker), shard_key_(shard_key) {}
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    if (tracker_ != nullptr) tracker_->leave(shard_key_);
  }

 private:
  ContentionTracker* tracker_;
  std::uint16_t shard_key_;
};

}  // namespace

void validate_engine_options(const EngineOptions& options) {
  if (options.retries_max < 0 || options.retries_max > retries_max_limit) {
    throw_invalid_argument("retries_max must be between 0 and " +
                           std::to_string(retries_max_limit));
  }
  validate_lock_timeout_ms(options.lock_timeout_ms);
  validate_ttl_us(options.default_ttl_us);
  validate_batcher_options(options.batcher);
  validate_telemetry_options(telemetry_options(options));
  validate_auto_options(options.automatic);
  if (options.async_workers < 1 || options.async_workers > async_workers_max) {
    throw_invalid_argument("async_workers must be between 1 and " +
                           std::to_string(async_workers_max));
  }
  if (options.home_slot < -1 || options.home_slot >= slots_max) {
    throw_invalid_argument("home_slot must be between 0 and " + std::to_string(slots_max - 1) +
                           ", or -1 (from the process id)");
  }
  if (options.slot_directory < 1 || options.slot_directory > slot_directory_max) {
    throw_invalid_argument("slot_directory must be between 1 and " +
                           std::to_string(slot_directory_max));
  }
  detail::validate_auto_slots_max(options.auto_slots_max);
  if (options.auto_slots_cool_ms < 0 || options.auto_slots_cool_ms > auto_slots_cool_ms_max) {
    throw_invalid_argument("auto_slots_cool_ms must be between 0 (never merge) and " +
                           std::to_string(auto_slots_cool_ms_max));
  }
  if (options.async_queue_max < 1 || options.async_queue_max > batcher_queue_capacity_max) {
    throw_invalid_argument("async_queue_max must be between 1 and " +
                           std::to_string(batcher_queue_capacity_max));
  }
}

TelemetryOptions telemetry_options(const EngineOptions& options) {
  TelemetryOptions out;
  out.sku_slots = options.sku_slots;
  return out;
}

namespace {

detail::AutoSlotsOptions auto_slots_options(const EngineOptions& options) {
  detail::AutoSlotsOptions out;
  out.slots_max = options.auto_slots_max;
  out.cool_ms = options.auto_slots_cool_ms;
  return out;
}

detail::SlotRouterOptions slot_router_options(const EngineOptions& options, std::int64_t pid) {
  detail::SlotRouterOptions out;
  out.home = options.home_slot >= 0 ? options.home_slot : static_cast<int>(pid % slots_max);
  out.directory = options.slot_directory;
  out.probe_entries = slot_probe_entries;
  out.lock_timeout_ms = options.lock_timeout_ms;
  out.retries_max = options.retries_max;
  return out;
}

std::shared_ptr<Telemetry> telemetry_of(const std::shared_ptr<Store>& store) {
  if (!store) throw_invalid_argument("an engine needs a store");
  return store->shared_telemetry();
}

// The engine's contention tracker, to which its store reports its writes from now on.
std::shared_ptr<ContentionTracker> contention_for(Store& store, const AutoOptions& options) {
  auto tracker = std::make_shared<ContentionTracker>(options);
  store.observe_writes(tracker);
  return tracker;
}

}  // namespace

// Counts the outcome of one strategy-routed call.
template <class Result, class Fn>
Result Engine::counted(Op op, Strategy strategy, bool refusal_final, std::int64_t started_us,
                       Fn&& fn) {
  try {
    Result result = fn();
    record_outcome(op, strategy, nullptr, started_us);
    return result;
  } catch (const Error& e) {
    if (refusal_final || e.code() != ErrorCode::out_of_stock) {
      record_outcome(op, strategy, &e, started_us);
    }
    throw;
  }
}

template <class Fn>
auto Engine::observed(Op op, Fn&& fn) -> decltype(fn()) {
  const std::int64_t started = steady_now_us();
  try {
    auto result = fn();
    telemetry_->record_call(op, std::nullopt, nullptr, steady_now_us() - started);
    return result;
  } catch (const Error& e) {
    telemetry_->record_call(op, std::nullopt, &e, steady_now_us() - started);
    throw;
  }
}

Engine::Engine(std::shared_ptr<Store> store, EngineOptions options)
    : generation_(detail::fork_generation()),
      creator_pid_(static_cast<std::int64_t>(::getpid())),
      store_(std::move(store)),
      options_((validate_engine_options(options), options)),
      telemetry_(telemetry_of(store_)),
      contention_(contention_for(*store_, options_.automatic)),
      tracker_(*contention_),
      slots_(std::make_unique<detail::SlotRouter>(*store_,
                                                  slot_router_options(options_, creator_pid_))),
      auto_slots_(std::make_unique<detail::AutoSlots>(auto_slots_options(options_))) {
  // A batched call on a slotted SKU starts on a row whose flusher is idle (pipelining).
  slots_->choose_slots_with([this](const SkuKey& key, int slots, int home) {
    const HotRowBatcher* batcher = started_batcher_.load(std::memory_order_acquire);
    return batcher != nullptr ? batcher->pick_slot(key, slots, home) : home;
  });
}

Engine::~Engine() {
  if (forked_away()) {
    abandon();
    return;
  }
  // Queued requests complete before the store goes: nothing acknowledged is dropped.
  if (batcher_) batcher_->close();
  if (executor_) executor_->close();
}

std::unique_ptr<Engine> Engine::memory(EngineOptions options, std::shared_ptr<Clock> clock,
                                       MemoryOptions memory) {
  validate_engine_options(options);
  auto telemetry = std::make_shared<Telemetry>(telemetry_options(options));
  return std::make_unique<Engine>(make_memory_store(std::move(clock), std::move(telemetry), memory),
                                  options);
}

std::unique_ptr<Engine> Engine::postgres(PostgresOptions postgres, EngineOptions options) {
  validate_engine_options(options);  // before connecting
  postgres.lock_timeout_ms = options.lock_timeout_ms;
  auto telemetry = std::make_shared<Telemetry>(telemetry_options(options));
  return std::make_unique<Engine>(make_postgres_store(std::move(postgres), std::move(telemetry)),
                                  options);
}

bool Engine::forked_away() const {
  return detail::fork_generation() != generation_;
}

void Engine::check_process() const {
  if (!forked_away()) return;
  throw Error(ErrorCode::invalid_state,
              "this engine was created in process " + std::to_string(creator_pid_) +
                  ", which has since forked; its threads and connections belong to that "
                  "process. Create the engine after the fork, in the process that uses it "
                  "(for example in a post-fork hook, or lazily on first use)");
}

// In a forked child: the batcher's and sweeper's threads do not exist here, and the
// connections are the parent's sockets (closing them would end the parent's sessions), so
// nothing may be joined, closed or freed. The parts are leaked on purpose, once.
void Engine::abandon() {
  if (abandoned_) return;
  abandoned_ = true;
  (void)batcher_.release();
  (void)executor_.release();
  new std::shared_ptr<Store>(std::move(store_));
  new std::shared_ptr<Telemetry>(std::move(telemetry_));
}

std::vector<std::string> Engine::migrate(int up_to) {
  check_process();
  if (up_to < 0) throw_invalid_argument("up_to must be 0 (all) or a migration number");
  return store_->migrate(up_to);
}

void Engine::drop_schema() {
  check_process();
  store_->drop_schema();
}

std::vector<std::pair<std::string, std::string>> Engine::migration_plan(int up_to) {
  check_process();
  if (up_to < 0) throw_invalid_argument("up_to must be 0 (all) or a migration number");
  return store_->migration_plan(up_to);
}

void Engine::close() {
  if (forked_away()) {
    abandon();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(lazy_mutex_);
    closed_ = true;
  }
  // Applies every queued request first; a refusal among them may still ask the executor
  // to look for the SKU's hot-row slots, so the executor closes after.
  if (batcher_) batcher_->close();
  {
    std::lock_guard<std::mutex> lock(lazy_mutex_);
    executor_closed_ = true;
  }
  if (executor_) executor_->close();  // runs every queued call first
  store_->close();
}

HotRowBatcher& Engine::batcher() {
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (!batcher_) {
    if (closed_) throw Error(ErrorCode::invalid_state, "the engine is closed");
    batcher_ = std::make_unique<HotRowBatcher>(
        store_, options_.batcher, contention_,
        [this](const SkuKey& row, std::size_t batch, std::optional<Strategy> routed) {
          on_row_shared(row, batch, routed);
        });
    started_batcher_.store(batcher_.get(), std::memory_order_release);
  }
  return *batcher_;
}

// On a flusher's thread: decides cheaply, and leaves the reads and the split to a worker
// (dropped when the workers' queue is full or closed: the next trace asks again).
void Engine::on_row_shared(const SkuKey& row, std::size_t batch, std::optional<Strategy> routed) {
  if (row.slot != 0 || slots_->known_slots(row) > 1) return;  // slotted, and known to be
  auto action = auto_slots_->on_shared(row, batch, steady_now_us());
  if (action == detail::AutoSlots::Action::none) return;
  // Only `auto` splits; any strategy learns a split another engine made.
  const bool split = action == detail::AutoSlots::Action::split && routed == Strategy::automatic;
  bool queued = false;
  try {
    queued = executor().try_submit([this, row, split, batch] { settle_slots(row, split, batch); });
  } catch (const Error&) {  // the engine is closing
  }
  if (!queued) auto_slots_->done(row);
}

void Engine::settle_slots(const SkuKey& key, bool split, std::size_t batch) {
  struct Done {  // however this ends, the SKU may have its next action
    detail::AutoSlots& slots;
    const SkuKey& key;
    ~Done() { slots.done(key); }
  } done{*auto_slots_, key};
  const std::int64_t now = steady_now_us();
  detail::AutoSlotDecision decision{key, 1, false, "", now};
  try {
    decision.slots = slots_->slot_count(key);  // reads the rows; remembers a split
    if (decision.slots > 1) {
      decision.why = "another engine split it into " + std::to_string(decision.slots) +
                     " slots; this one found them when its row was shared";
    } else if (split) {
      const std::int64_t shared_ms = auto_slots_->shared_ms(key, now);
      (void)slots_->set_slots(key, options_.auto_slots_max);
      decision.slots = options_.auto_slots_max;
      decision.split = true;
      decision.why = "its row was shared with another writer for " + std::to_string(shared_ms) +
                     " ms in batches of " + std::to_string(batch) +
                     " requests: several processes took turns at one row lock";
    } else {
      return;
    }
  } catch (const Error& e) {
    // set_slots refuses what slots do not support; anything else (a pool or lock timeout,
    // a lost connection) failed for now, and the next trace of the other writer asks again.
    const ErrorCode c = e.code();
    const bool refused = c == ErrorCode::invalid_state || c == ErrorCode::discontinued ||
                         c == ErrorCode::not_supported || c == ErrorCode::invalid_argument;
    if (!split || !refused) return;
    decision.slots = 1;
    decision.why = std::string("kept on one row: ") + e.what();
  }
  log(LogLevel::info, "stockade.slots",
      detail::outcome_of(decision, detail::describe(key)) + ": " + decision.why);
  auto_slots_->record(std::move(decision));
}

void Engine::on_slotted_routed(const SkuKey& key, bool hot) {
  if (auto_slots_->on_slotted(key, hot, steady_now_us()) != detail::AutoSlots::Action::merge) {
    return;
  }
  bool queued = false;
  try {
    queued = executor().try_submit([this, key] { cool_slots(key); });
  } catch (const Error&) {  // the engine is closing
  }
  if (!queued) auto_slots_->cooled(key);
}

void Engine::cool_slots(const SkuKey& key) {
  struct Done {  // however this ends, the measure starts over
    detail::AutoSlots& slots;
    const SkuKey& key;
    ~Done() { slots.cooled(key); }
  } done{*auto_slots_, key};
  const std::int64_t now = steady_now_us();
  const std::int64_t cool_ms = auto_slots_->cool_ms(key, now);
  detail::AutoSlotDecision decision{key, 1, false, "", now};
  try {
    const int had = slots_->slot_count(key);
    if (had <= 1) return;  // another engine (or a caller) took them away first
    (void)slots_->set_slots(key, 1);
    decision.merged = true;
    decision.why = "none of its requests here ran batched for " + std::to_string(cool_ms) +
                   " ms: its " + std::to_string(had) + " slots were merged back into one row";
  } catch (const Error& e) {
    // A lock or pool timeout, a lost connection: the SKU keeps its slots for now, and the
    // measure starts over.
    log(LogLevel::info, "stockade.slots",
        "auto could not merge the slots of " + detail::describe(key) + " back: " + e.what());
    return;
  }
  log(LogLevel::info, "stockade.slots",
      detail::outcome_of(decision, detail::describe(key)) + ": " + decision.why);
  auto_slots_->record(std::move(decision));
}

AsyncExecutor& Engine::executor() {
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (!executor_) {
    if (executor_closed_) throw Error(ErrorCode::invalid_state, "the engine is closed");
    executor_ = std::make_unique<AsyncExecutor>(options_.async_workers, options_.async_queue_max,
                                                options_.batcher.enqueue_timeout_ms);
  }
  return *executor_;
}

// Sends one request through the batcher: blocking when `sink` is empty, else queued for
// `sink`. The batcher counts its outcome and leaves the tracker for it, also when it
// cannot be queued; if the batcher cannot even start, that is done here.
void Engine::through_batcher(BatchItem& item, const Route& route,
                             std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  item.in_flight = true;  // route() or transition() entered the tracker
  item.count_request = route.options.count_request;
  item.count_refusal = route.options.count_refusal;
  if (route.started_us != 0) item.started_us = route.started_us;
  HotRowBatcher* b = nullptr;
  try {
    b = &batcher();
  } catch (const Error& e) {
    tracker_.leave(item.shard_key());
    if (item.counted_as) {
      bump(telemetry_->of(*item.counted_as).requests);
      telemetry_->count_outcome(*item.counted_as, &e);
    }
    throw;
  }
  if (sink) {
    b->submit(item, route.options.lock_timeout_ms, std::move(sink), token);
  } else {
    b->run(item, route.options.lock_timeout_ms);
  }
}

void Engine::record_outcome(Op op, Strategy strategy, const Error* error, std::int64_t started_us) {
  bump(telemetry_->of(strategy).requests);
  telemetry_->count_outcome(strategy, error);
  telemetry_->record_call(op, strategy, error, steady_now_us() - started_us);
}

void Engine::record_call_end(Op op, Strategy strategy, const SkuKey& key, const Error& error,
                             std::int64_t started_us) {
  if (error.code() == ErrorCode::out_of_stock && !key.sku.empty()) {
    telemetry_->count(key, SkuEvent::refused);
  }
  record_outcome(op, strategy, &error, started_us);
}

WriteOptions Engine::resolve(const CallOptions& call) const {
  WriteOptions out;
  out.strategy = call.strategy.value_or(options_.default_strategy);
  if (call.nowait && !waits_for_locks(out.strategy)) {
    throw_invalid_argument(std::string("nowait applies to the pessimistic and advisory "
                                       "strategies, not '") +
                           strategy_name(out.strategy) + "'");
  }
  // lock_timeout bounds every wait for a lock a strategy takes (in PostgreSQL even an
  // atomic UPDATE waits for a row lock), so it is accepted whatever the strategy.
  if (call.lock_timeout_ms) validate_lock_timeout_ms(*call.lock_timeout_ms);
  validate_expected_version(call.expected_version);
  validate_fencing_token(call.fencing_token);
  out.fencing_token = call.fencing_token;
  if (call.buyer) validate_buyer(*call.buyer);
  out.buyer = call.buyer;
  out.nowait = call.nowait;
  out.lock_timeout_ms = call.lock_timeout_ms.value_or(options_.lock_timeout_ms);
  out.retries_max = options_.retries_max;
  out.expected_version = call.expected_version;
  return out;
}

// Decides where a reserve or sell on `key` runs, and enters the contention tracker (the
// caller leaves it when the call ends).
Route Engine::route(const SkuKey& key, const CallOptions& call) {
  Route r;
  r.started_us = steady_now_us();
  r.options = resolve(call);
  r.asked = r.options.strategy;
  const Strategy mode = tracker_.enter(key);
  if (r.asked == Strategy::automatic && slots_->known_slots(key) > 1) {
    on_slotted_routed(key, mode == Strategy::batched);
  }
  Strategy run = r.asked == Strategy::automatic ? mode : r.asked;
  if (run == Strategy::batched && (r.options.expected_version || r.options.fencing_token)) {
    run = Strategy::atomic;
  }
  r.batched = run == Strategy::batched;
  r.options.strategy = r.batched ? Strategy::atomic : run;
  return r;
}

StockLevel Engine::set_backorder_limit(const SkuKey& key, Quantity limit,
                                       std::optional<Version> expected,
                                       std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  if (limit < 0 || limit > quantity_max) {
    throw_invalid_argument("backorder_limit must be between 0 and " + std::to_string(quantity_max) +
                           ", got " + std::to_string(limit));
  }
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::set_backorder_limit, [&] {
    slots_->refuse_on_slots(key, "a backorder limit");
    return store_->set_backorder_limit(key, limit, expected, token);
  });
}

StockLevel Engine::discontinue(const SkuKey& key, std::optional<Version> expected,
                               std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::discontinue,
                  [&] { return slots_->set_tombstone(key, true, expected, token); });
}

StockLevel Engine::reinstate(const SkuKey& key, std::optional<Version> expected,
                             std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::reinstate,
                  [&] { return slots_->set_tombstone(key, false, expected, token); });
}

Lease Engine::acquire_lease(const SkuKey& key, std::int64_t ttl_us, const std::string& owner) {
  check_process();
  validate_sku_key(key);
  validate_ttl_us(ttl_us);
  validate_lease_owner(owner);
  return observed(Op::acquire_lease, [&] {
    slots_->refuse_on_slots(key, "a lease");
    return store_->acquire_lease(key, ttl_us, owner);
  });
}

Lease Engine::renew_lease(const SkuKey& key, FencingToken token, std::int64_t ttl_us) {
  check_process();
  validate_sku_key(key);
  validate_fencing_token(token);
  validate_ttl_us(ttl_us);
  return observed(Op::renew_lease, [&] { return store_->renew_lease(key, token, ttl_us); });
}

void Engine::set_purchase_limit(const PurchaseLimit& limit) {
  check_process();
  validate_purchase_limit(limit);
  observed(Op::set_purchase_limit, [&] {
    store_->set_purchase_limit(limit);
    return true;
  });
}

bool Engine::remove_purchase_limit(const std::string& group) {
  check_process();
  validate_limit_group(group);
  return observed(Op::remove_purchase_limit, [&] { return store_->remove_purchase_limit(group); });
}

Quantity Engine::buyer_held(const std::string& group, const std::string& buyer) {
  check_process();
  validate_limit_group(group);
  validate_buyer(buyer);
  return observed(Op::buyer_held, [&] { return store_->buyer_held(group, buyer); });
}

bool Engine::release_lease(const SkuKey& key, FencingToken token) {
  check_process();
  validate_sku_key(key);
  validate_fencing_token(token);
  return observed(Op::release_lease, [&] { return store_->release_lease(key, token); });
}

// --- stock of a SKU, over its hot-row slots (detail::SlotRouter) ---

StockLevel Engine::stock(const SkuKey& key) {
  check_process();
  validate_sku_key(key);
  return observed(Op::stock, [&] { return slots_->stock(key); });
}

StockLevel Engine::restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                           std::optional<FencingToken> token, const std::string& reason,
                           const std::string& actor) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  validate_expected_version(expected);
  validate_fencing_token(token);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  const NoteScope note({"restock", reason, actor, ""});
  return observed(Op::restock, [&] { return slots_->restock(key, qty, expected, token); });
}

StockLevel Engine::set_on_hand(const SkuKey& key, Quantity on_hand, std::optional<Version> expected,
                               std::optional<FencingToken> token, const std::string& reason,
                               const std::string& actor) {
  check_process();
  validate_sku_key(key);
  if (on_hand < 0) {
    throw_invalid_argument("on_hand must not be negative, got " + std::to_string(on_hand));
  }
  validate_expected_version(expected);
  validate_fencing_token(token);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  const NoteScope note({"set_on_hand", reason, actor, ""});
  return observed(Op::set_on_hand,
                  [&] { return slots_->set_on_hand(key, on_hand, expected, token); });
}

StockLevel Engine::set_slots(const SkuKey& key, int slots) {
  check_process();
  validate_sku_key(key);
  if (slots < 1 || slots > slots_max) {
    throw_invalid_argument("slots must be between 1 and " + std::to_string(slots_max) + ", got " +
                           std::to_string(slots));
  }
  return observed(Op::set_slots, [&] { return slots_->set_slots(key, slots); });
}

int Engine::slot_count(const SkuKey& key) {
  check_process();
  validate_sku_key(key);
  return observed(Op::stock, [&] { return slots_->slot_count(key); });
}

// --- reserve and sell ---

template <class Result, class Attempt>
Result Engine::on_slots(const SkuKey& key, Quantity qty, Op op, const Route& first, bool continued,
                        Attempt&& attempt) {
  return slots_->run<Result>(
      key, qty, first.options.expected_version, continued, first.batched,
      [&](const SkuKey& row, const detail::SlotAttempt& a) {
        Route r = first;
        r.options.expected_version = a.expected_version;
        r.options.count_request = a.count_request;
        r.options.count_refusal = a.count_refusal;
        return attempt(row, r);
      },
      [&](const Error& e, bool request_counted) {
        if (!request_counted) telemetry_->count(key, SkuEvent::request);
        record_call_end(op, first.asked, key, e, first.started_us);
      });
}

Reservation Engine::reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  return reserve_on_slots(key, qty, ttl_us.value_or(options_.default_ttl_us), idempotency_key, call,
                          /*continued=*/false, 0);
}

Reservation Engine::reserve_on_slots(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                     const std::optional<std::string>& idempotency_key,
                                     const CallOptions& call, bool continued,
                                     std::int64_t started_us) {
  Route first = route(key, call);  // entered the tracker
  if (started_us != 0) first.started_us = started_us;
  bool entered = true;  // and no call has taken that over yet
  const auto attempt = [&](const SkuKey& row, const Route& r) {
    if (!entered) tracker_.enter(key);
    entered = false;  // reserve_checked leaves the tracker however it ends
    return reserve_checked(row, qty, ttl_us, idempotency_key, r);
  };
  try {
    Reservation out = on_slots<Reservation>(key, qty, Op::reserve, first, continued, attempt);
    detail::unslot(out);
    return out;
  } catch (...) {
    if (entered) tracker_.leave(key);
    throw;
  }
}

StockLevel Engine::sell(const SkuKey& key, Quantity qty, const CallOptions& call) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  refuse_buyer(call);
  return sell_on_slots(key, qty, call, /*continued=*/false, 0);
}

StockLevel Engine::sell_on_slots(const SkuKey& key, Quantity qty, const CallOptions& call,
                                 bool continued, std::int64_t started_us) {
  Route first = route(key, call);
  if (started_us != 0) first.started_us = started_us;
  bool entered = true;
  const auto attempt = [&](const SkuKey& row, const Route& r) {
    if (!entered) tracker_.enter(key);
    entered = false;
    return sell_checked(row, qty, r);
  };
  try {
    return slots_->level_after_sell(
        key, on_slots<StockLevel>(key, qty, Op::sell, first, continued, attempt));
  } catch (...) {
    if (entered) tracker_.leave(key);
    throw;
  }
}

void Engine::throw_if_refusal_stands(const SkuKey& key, const Error& refusal, Op op, Strategy asked,
                                     std::int64_t started_us) {
  std::optional<Error> outcome;
  try {
    if (!slots_->refusal_stands(key, refusal)) return;
    outcome = refusal;
  } catch (const Error& e) {
    outcome = e;
  }
  record_call_end(op, asked, key, *outcome, started_us);
  throw *outcome;
}

// An order is counted once too (see on_slots): its first attempt counts each line's
// request, and a refusal is recorded where it stands.
std::vector<Reservation> Engine::order_on_slots(OrderRequest& request, Strategy asked) {
  const std::int64_t started = steady_now_us();
  for (int round = 1;; ++round) {
    request.options.count_request = round == 1;
    request.options.count_refusal = false;
    try {
      return counted<std::vector<Reservation>>(Op::reserve_order, asked, /*refusal_final=*/false,
                                               started,
                                               [&] { return store_->reserve_order(request); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_stock) throw;  // counted() recorded it
      try {
        if (round >= slots_->rounds()) throw;
        slots_->refill_order_line(request.lines, e);  // then the order runs again
      } catch (const Error& stands) {                 // the order's outcome, on the line it names
        record_call_end(Op::reserve_order, asked,
                        SkuKey{stands.context().sku, stands.context().location}, stands, started);
        throw;
      }
    }
  }
}

std::shared_ptr<CompletionSink> Engine::slot_checked_sink(
    std::shared_ptr<CompletionSink> sink,
    std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)> retry, Op op,
    Strategy asked, std::int64_t started_us) {
  return detail::slot_checked_sink(
      std::move(sink), std::move(retry),
      [this, op, asked, started_us](const Error& e) { record_outcome(op, asked, &e, started_us); });
}

StockLevel Engine::sell_checked(const SkuKey& key, Quantity qty, const Route& route) {
  if (route.batched) {
    BatchItem item = sell_item(key, qty, route.asked);
    through_batcher(item, route, nullptr, 0);
    return std::move(item.level);
  }
  InFlight in_flight(tracker_, row_shard_key(key.sku, key.location));
  SellRequest request{key, qty, route.options};
  return counted<StockLevel>(Op::sell, route.asked, route.options.count_refusal, route.started_us,
                             [&] { return store_->sell(request); });
}

Reservation Engine::reserve_checked(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                    const std::optional<std::string>& idempotency_key,
                                    const Route& route) {
  if (route.batched) {
    BatchItem item = reserve_item(key, qty, ttl_us, idempotency_key, route.asked);
    item.buyer = route.options.buyer;
    through_batcher(item, route, nullptr, 0);
    return std::move(item.reservation);
  }
  InFlight in_flight(tracker_, row_shard_key(key.sku, key.location));
  ReserveRequest request{key, qty, ttl_us, idempotency_key, route.options};
  return counted<Reservation>(Op::reserve, route.asked, route.options.count_refusal,
                              route.started_us, [&] { return store_->reserve(request); });
}

OrderRequest Engine::order_request(const std::vector<OrderLine>& lines,
                                   std::optional<std::int64_t> ttl_us,
                                   std::optional<std::string> idempotency_key,
                                   const CallOptions& call) const {
  if (lines.empty()) throw_invalid_argument("an order needs at least one line");
  if (lines.size() > order_lines_max) {
    throw_invalid_argument("an order has at most " + std::to_string(order_lines_max) +
                           " lines (ORDER_LINES_MAX), got " + std::to_string(lines.size()));
  }
  std::set<SkuKey> seen;
  for (const OrderLine& line : lines) {
    validate_sku_key(line.key);
    validate_qty(line.qty);
    if (!seen.insert(line.key).second) {
      throw_invalid_argument("the order names " + detail::describe(line.key) + " twice");
    }
  }
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  if (call.expected_version) {
    throw_invalid_argument("reserve_order does not take expected_version");
  }
  return OrderRequest{lines, ttl_us.value_or(options_.default_ttl_us), std::move(idempotency_key),
                      resolve(call)};
}

std::vector<Reservation> Engine::reserve_order(const std::vector<OrderLine>& lines,
                                               std::optional<std::int64_t> ttl_us,
                                               std::optional<std::string> idempotency_key,
                                               const CallOptions& call) {
  check_process();
  OrderRequest request = order_request(lines, ttl_us, std::move(idempotency_key), call);
  // An order is all or nothing over many rows: it runs per request, as atomic when the
  // caller asked for batched or auto.
  const Strategy asked = request.options.strategy;
  if (asked == Strategy::batched || asked == Strategy::automatic) {
    request.options.strategy = Strategy::atomic;
  }
  return order_on_slots(request, asked);
}

// Whether a confirm or release of a reservation of the row with `shard_key` goes through
// the batcher: when the engine runs batched, or auto on a SKU that is hot right now.
bool Engine::batches_transitions(std::uint16_t shard_key) const {
  const Strategy s = options_.default_strategy;
  return s == Strategy::batched ||
         (s == Strategy::automatic && tracker_.mode(shard_key) == Strategy::batched);
}

// How a batched transition runs: no strategy is counted, and it waits for locks as long as
// the engine's lock_timeout.
Route Engine::transition_route() const {
  Route route;
  route.batched = true;
  route.options.lock_timeout_ms = options_.lock_timeout_ms;
  return route;
}

Reservation Engine::transition(BatchOp op, const Uuid& id, std::optional<Version> expected) {
  check_process();
  validate_expected_version(expected);
  const std::uint16_t shard_key = id.shard_key();
  if (batches_transitions(shard_key)) {
    tracker_.enter(shard_key);  // the batcher leaves
    BatchItem item = transition_item(op, id, expected);
    through_batcher(item, transition_route(), nullptr, 0);
    return std::move(item.reservation);
  }
  tracker_.enter(shard_key);
  InFlight in_flight(tracker_, shard_key);
  const NoteScope note({op == BatchOp::confirm ? "confirm" : "release", "", "", id.to_string()});
  if (op == BatchOp::confirm) {
    return observed(Op::confirm, [&] { return store_->confirm(id, expected); });
  }
  return observed(Op::release, [&] { return store_->release(id, expected); });
}

Reservation Engine::confirm(const Uuid& id, std::optional<Version> expected) {
  Reservation out = transition(BatchOp::confirm, id, expected);
  detail::unslot(out);
  return out;
}

Reservation Engine::release(const Uuid& id, std::optional<Version> expected) {
  Reservation out = transition(BatchOp::release, id, expected);
  detail::unslot(out);
  return out;
}

Reservation Engine::extend(const Uuid& id, std::int64_t ttl_us, std::optional<Version> expected) {
  check_process();
  validate_ttl_us(ttl_us);
  validate_expected_version(expected);
  Reservation out = observed(Op::extend, [&] { return store_->extend(id, ttl_us, expected); });
  detail::unslot(out);
  return out;
}

Reservation Engine::get_reservation(const Uuid& id) {
  check_process();
  Reservation out = observed(Op::reservation, [&] { return store_->get_reservation(id); });
  detail::unslot(out);
  return out;
}

std::size_t Engine::expire_due(std::size_t limit) {
  check_process();
  if (limit == 0 || limit > expire_batch_max) {
    throw_invalid_argument("limit must be between 1 and " + std::to_string(expire_batch_max) +
                           ", got " + std::to_string(limit));
  }
  return observed(Op::expire_due, [&] { return store_->expire_due(limit); });
}

PurgeCounts Engine::purge(std::int64_t older_than_us, std::uint64_t limit) {
  check_process();
  if (older_than_us < 0) throw_invalid_argument("older_than must not be negative");
  if (limit == 0) throw_invalid_argument("limit must be at least 1");
  return observed(Op::purge, [&] { return store_->purge(older_than_us, limit); });
}

StoreCounts Engine::row_counts() const {
  check_process();
  return store_->exact_counts();
}

StoreStats Engine::stats(std::size_t sku_limit) const {
  check_process();
  StoreStats out = telemetry_->snapshot(sku_limit);
  for (SkuStats& sku : out.hottest_skus) {
    const SkuHeat h = tracker_.heat(sku.key);
    sku.mode = h.mode;
    sku.in_flight = h.in_flight;
    sku.peak_in_flight = h.peak_in_flight;
    sku.row_queue = h.row_queue;
    sku.slots = slots_->known_slots(sku.key);
  }
  out.slots.auto_slots_max = options_.auto_slots_max;
  out.slots.auto_splits = auto_slots_->splits();
  out.slots.learned = auto_slots_->learned();
  out.slots.kept = auto_slots_->refused();
  out.slots.auto_merges = auto_slots_->merges();
  const std::int64_t now = steady_now_us();
  for (const detail::AutoSlotDecision& d : auto_slots_->recent()) {
    out.slots.recent.push_back(
        {d.key, d.slots, d.split, d.merged, d.why, static_cast<double>(now - d.at_us) / 1e6});
  }
  out.backend = store_->backend_name();
  const StoreCounts counts = store_->counts();
  out.sku_count = counts.sku_count;
  out.reservation_count = counts.reservation_count;
  out.held_count = counts.held_count;
  out.counts_exact = counts.exact;
  out.pool = store_->pool_stats();
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (batcher_) out.batcher.queued = batcher_->queued();
  return out;
}

Advice Engine::recommend(const SkuKey& key) const {
  check_process();
  validate_sku_key(key);
  Advice advice = advise(key, tracker_.heat(key), options_.automatic);
  const int slots = slots_->known_slots(key);
  if (const auto decided = auto_slots_->decision(key)) {
    advice.reasons.push_back("slots: " + detail::outcome_of(*decided, "it") + ": " + decided->why);
  }
  if (slots > 1) {
    advice.reasons.push_back("slots: its units are spread over " + std::to_string(slots) +
                             " rows; this engine reserves and sells on slot " +
                             std::to_string(slots_->home_of(slots)) +
                             " (batched: first on a row whose batcher is idle)");
  } else if (advice.strategy == Strategy::batched) {
    // What this process cannot see is whether others batch the same row: say when it pays.
    advice.reasons.push_back(
        "slots: if several processes batch this SKU at once, their batches take turns at "
        "one row lock, one commit flush each; auto sees that (the row's version moves "
        "between its batches) and splits the SKU into auto_slots_max slots by itself, and "
        "set_slots(k) does it by hand. It pays most where a commit flush is slow against CPU "
        "(network disks, a synchronous standby; docs/scaling-out.md)");
  }
  return advice;
}

// --- async ---

// Runs fn() on an async worker and posts its outcome (or error) to `sink`.
template <class Fn>
void Engine::run_async(std::shared_ptr<CompletionSink> sink, std::uint64_t token, Fn fn) {
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  executor().submit([sink = std::move(sink), token, fn = std::move(fn)]() mutable {
    std::vector<Completion> out(1);
    out[0].token = token;
    try {
      out[0].value = fn();
    } catch (const Error& e) {
      out[0].error = e;
    } catch (const std::exception& e) {
      out[0].error = Error(ErrorCode::in_doubt,
                           std::string("an async call failed unexpectedly; its outcome is "
                                       "unknown: ") +
                               e.what());
    }
    sink->post(out);
  });
}

void Engine::submit_reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call,
                            std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  const std::int64_t ttl = ttl_us.value_or(options_.default_ttl_us);
  if (call.expected_version) {
    // If-Match may name a slotted SKU's summed version: the blocking path, on a worker,
    // which knows slots.
    (void)resolve(call);  // bad options raise here, not in the sink
    run_async(std::move(sink), token, [this, key, qty, ttl_us, idempotency_key, call] {
      return reserve(key, qty, ttl_us, idempotency_key, call);
    });
    return;
  }
  // This engine's slot of a slotted SKU (a batched call: the row the batcher picks; else
  // the SKU's own row). A refusal there, or
  // from a SKU with slots this engine has not seen yet, is checked by the sink before
  // it answers: the blocking path then fills the slot and runs again. Until then the
  // refusal is not recorded (see on_slots): whichever ends the call records it.
  Route r = route(key, call);
  const SkuKey row = slots_->first_row(key, r.batched);
  r.options.count_refusal = false;
  sink = slot_checked_sink(
      std::move(sink),
      [this, key, qty, ttl, idempotency_key, call, asked = r.asked, started = r.started_us](
          std::uint64_t t, std::shared_ptr<CompletionSink> inner, const Error& refusal) {
        run_async(std::move(inner), t,
                  [this, key, qty, ttl, idempotency_key, call, asked, started, refusal] {
                    throw_if_refusal_stands(key, refusal, Op::reserve, asked, started);
                    return reserve_on_slots(key, qty, ttl, idempotency_key, call,
                                            /*continued=*/true, started);
                  });
      },
      Op::reserve, r.asked, r.started_us);
  if (r.batched) {
    BatchItem item = reserve_item(row, qty, ttl, std::move(idempotency_key), r.asked);
    item.buyer = r.options.buyer;
    through_batcher(item, r, std::move(sink), token);
    return;
  }
  try {  // reserve_checked leaves the tracker when the call ends
    run_async(std::move(sink), token,
              [this, row, qty, ttl, idempotency_key = std::move(idempotency_key), r] {
                return reserve_checked(row, qty, ttl, idempotency_key, r);
              });
  } catch (...) {
    tracker_.leave(key);
    throw;
  }
}

void Engine::submit_sell(const SkuKey& key, Quantity qty, const CallOptions& call,
                         std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  refuse_buyer(call);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  if (slots_->known_slots(key) > 1 || call.expected_version) {  // as submit_reserve
    (void)resolve(call);
    run_async(std::move(sink), token, [this, key, qty, call] { return sell(key, qty, call); });
    return;
  }
  Route r = route(key, call);
  r.options.count_refusal = false;  // as submit_reserve
  sink = slot_checked_sink(
      std::move(sink),
      [this, key, qty, call, asked = r.asked, started = r.started_us](
          std::uint64_t t, std::shared_ptr<CompletionSink> inner, const Error& refusal) {
        run_async(std::move(inner), t, [this, key, qty, call, asked, started, refusal] {
          throw_if_refusal_stands(key, refusal, Op::sell, asked, started);
          return sell_on_slots(key, qty, call, /*continued=*/true, started);
        });
      },
      Op::sell, r.asked, r.started_us);
  if (r.batched) {
    BatchItem item = sell_item(key, qty, r.asked);
    through_batcher(item, r, std::move(sink), token);
    return;
  }
  try {  // sell_checked leaves the tracker when the call ends
    run_async(std::move(sink), token, [this, key, qty, r] { return sell_checked(key, qty, r); });
  } catch (...) {
    tracker_.leave(key);
    throw;
  }
}

void Engine::submit_reserve_order(const std::vector<OrderLine>& lines,
                                  std::optional<std::int64_t> ttl_us,
                                  std::optional<std::string> idempotency_key,
                                  const CallOptions& call, std::shared_ptr<CompletionSink> sink,
                                  std::uint64_t token) {
  check_process();
  order_request(lines, ttl_us, idempotency_key, call);  // bad input raises here
  run_async(std::move(sink), token,
            [this, lines, ttl_us, idempotency_key = std::move(idempotency_key), call] {
              return reserve_order(lines, ttl_us, idempotency_key, call);
            });
}

void Engine::submit_transition(Transition kind, const Uuid& id, std::int64_t ttl_us,
                               std::optional<Version> expected_version,
                               std::shared_ptr<CompletionSink> sink, std::uint64_t token) {
  check_process();
  validate_expected_version(expected_version);
  if (kind == Transition::extend) validate_ttl_us(ttl_us);
  if (!sink) throw_invalid_argument("an async call needs a completion sink");
  if (kind != Transition::extend && batches_transitions(id.shard_key())) {
    tracker_.enter(id.shard_key());  // the batcher leaves
    BatchItem item = transition_item(
        kind == Transition::confirm ? BatchOp::confirm : BatchOp::release, id, expected_version);
    through_batcher(item, transition_route(), std::move(sink), token);
    return;
  }
  run_async(std::move(sink), token, [this, kind, id, ttl_us, expected_version] {
    switch (kind) {
      case Transition::confirm:
        return confirm(id, expected_version);
      case Transition::release:
        return release(id, expected_version);
      case Transition::extend:
        break;
    }
    return extend(id, ttl_us, expected_version);
  });
}

}  // namespace stockade
