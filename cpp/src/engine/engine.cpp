#include "stockade/engine.hpp"

#include <unistd.h>

#include "base/fork.hpp"
#include "engine/internal.hpp"
#include "hotrow/auto_slots.hpp"
#include "hotrow/slot_router.hpp"
#include "store/error_helpers.hpp"

#include <set>

#include "stockade/errors.hpp"
#include "stockade/log.hpp"
#include "stockade/memory_store.hpp"

namespace stockade {

using namespace detail::engine;  // NOLINT(google-build-using-namespace): the engine's helpers

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
  throw Error(ErrorCode::misconfigured,  // the service's set-up, not the caller's request
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
    if (closed_) throw Error(ErrorCode::unavailable, "the engine is closed");
    batcher_ = std::make_unique<HotRowBatcher>(
        store_, options_.batcher, contention_,
        [this](const SkuKey& row, std::size_t batch, std::optional<Strategy> routed) {
          on_row_shared(row, batch, routed);
        });
    started_batcher_.store(batcher_.get(), std::memory_order_release);
  }
  return *batcher_;
}

AsyncExecutor& Engine::executor() {
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (!executor_) {
    if (executor_closed_) throw Error(ErrorCode::unavailable, "the engine is closed");
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
  if (call.ref) validate_ref(*call.ref);
  if (call.metadata) validate_metadata(*call.metadata);
  out.ref = call.ref;
  out.metadata = call.metadata;
  out.nowait = call.nowait;
  out.lock_timeout_ms = call.lock_timeout_ms.value_or(options_.lock_timeout_ms);
  out.retries_max = options_.retries_max;
  out.expected_version = call.expected_version;
  return out;
}

// Decides where a reserve or sell on `key` runs, and enters the contention tracker (the
// caller leaves it when the call ends).
Route Engine::route(const SkuKey& key, const CallOptions& call, BatchOp op) {
  Route r;
  r.started_us = steady_now_us();
  r.options = resolve(call);
  r.asked = r.options.strategy;
  const Strategy mode = tracker_.enter(key);
  if (r.asked == Strategy::automatic && slots_->known_slots(key) > 1) {
    on_slotted_routed(key, mode == Strategy::batched);
  }
  Strategy run = r.asked == Strategy::automatic ? mode : r.asked;
  // A keyed sell batches: the batch claims its key and stores its outcome with it. So does
  // a reserve with a ref or metadata (kept with its reservation); a sell with a ref runs
  // per request (route() in engine.hpp).
  r.idempotency_key = call.idempotency_key;
  const bool sale_ref = op == BatchOp::sell && r.options.ref;
  if (run == Strategy::batched &&
      (r.options.expected_version || r.options.fencing_token || sale_ref)) {
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
                           const std::string& actor,
                           const std::optional<std::string>& idempotency_key) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  validate_expected_version(expected);
  validate_fencing_token(token);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  validate_idempotency_key(idempotency_key);
  const NoteScope note({"restock", reason, actor, ""});
  return observed(Op::restock,
                  [&] { return slots_->restock(key, qty, expected, token, idempotency_key); });
}

StockLevel Engine::set_on_hand(const SkuKey& key, Quantity on_hand, std::optional<Version> expected,
                               std::optional<FencingToken> token, const std::string& reason,
                               const std::string& actor,
                               const std::optional<std::string>& idempotency_key) {
  check_process();
  validate_sku_key(key);
  validate_idempotency_key(idempotency_key);
  validate_on_hand(on_hand);
  validate_expected_version(expected);
  validate_fencing_token(token);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  const NoteScope note({"set_on_hand", reason, actor, ""});
  return observed(Op::set_on_hand, [&] {
    return slots_->set_on_hand(key, on_hand, expected, token, idempotency_key);
  });
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
        if (first.idempotency_key && a.expected_version != first.options.expected_version) {
          // The SKU has slots, and its version stands for a slot row's here: a key's replay
          // would be checked against the SKU's version, which the first call moved.
          throw Error(ErrorCode::not_supported,
                      "an idempotency key with expected_version is not built for a SKU with "
                      "hot-row slots (" +
                          detail::describe(key) + ")",
                      detail::context_of(key));
        }
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
  Route first = route(key, call, BatchOp::reserve);  // entered the tracker
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
  validate_idempotency_key(call.idempotency_key);
  return sell_on_slots(key, qty, call, /*continued=*/false, 0);
}

StockLevel Engine::sell_on_slots(const SkuKey& key, Quantity qty, const CallOptions& call,
                                 bool continued, std::int64_t started_us) {
  Route first = route(key, call, BatchOp::sell);
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
  bool lapsed_tried = false;
  for (int round = 1, attempt = 1;; ++round, ++attempt) {
    request.options.count_request = attempt == 1;
    request.options.count_refusal = false;
    try {
      return counted<std::vector<Reservation>>(Op::reserve_order, asked, /*refusal_final=*/false,
                                               started,
                                               [&] { return store_->reserve_order(request); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_stock) throw;  // counted() recorded it
      if (!lapsed_tried) {
        lapsed_tried = true;
        if (slots_->freed_lapsed_holds()) {
          --round;  // the same round again: the lapsed holds' units are back
          continue;
        }
      }
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
    BatchItem item = sell_item(key, qty, route.asked, route.idempotency_key);
    through_batcher(item, route, nullptr, 0);
    return std::move(item.level);
  }
  InFlight in_flight(tracker_, row_shard_key(key.sku, key.location));
  SellRequest request{key, qty, route.options, route.idempotency_key};
  std::optional<NoteScope> note;  // a sale's ref: on its journal entry
  if (route.options.ref) note.emplace(JournalNote{"", "", "", *route.options.ref});
  return counted<StockLevel>(Op::sell, route.asked, route.options.count_refusal, route.started_us,
                             [&] { return store_->sell(request); });
}

Reservation Engine::reserve_checked(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                    const std::optional<std::string>& idempotency_key,
                                    const Route& route) {
  if (route.batched) {
    BatchItem item = reserve_item(key, qty, ttl_us, idempotency_key, route.asked);
    item.buyer = route.options.buyer;
    item.ref = route.options.ref;
    item.metadata = route.options.metadata;
    through_batcher(item, route, nullptr, 0);
    return std::move(item.reservation);
  }
  InFlight in_flight(tracker_, row_shard_key(key.sku, key.location));
  ReserveRequest request{key, qty, ttl_us, idempotency_key, route.options, std::nullopt};
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

void Engine::check_transition(const TransitionRequest& request) const {
  check_process();
  if (request.kind == Transition::extend) validate_ttl_us(request.ttl_us);
  validate_expected_version(request.expected_version);
  if (request.qty) {
    if (request.kind == Transition::extend) {
      throw_invalid_argument("qty applies to confirm and release, not to extend");
    }
    validate_qty(*request.qty);
  }
  if (request.release_rest && request.kind != Transition::confirm) {
    throw_invalid_argument("release_rest applies to confirm only");
  }
  validate_idempotency_key(request.idempotency_key);
}

// A confirm or release goes through the batcher when the row's SKU batches
// (batches_transitions); an extend writes the reservation alone, and runs on the store.
bool Engine::batches(const TransitionRequest& request) const {
  // A keyed step batches too: its batch claims the key and stores the step's outcome.
  return request.kind != Transition::extend && batches_transitions(request.id.shard_key());
}

Reservation Engine::run_transition(const TransitionRequest& request) {
  if (request.kind == Transition::extend) {
    return observed(Op::extend, [&] { return store_->transition(request); });
  }
  const bool confirm = request.kind == Transition::confirm;
  const std::uint16_t shard_key = request.id.shard_key();
  tracker_.enter(shard_key);
  InFlight in_flight(tracker_, shard_key);
  const NoteScope note({confirm ? "confirm" : "release", "", "", request.id.to_string()});
  return observed(confirm ? Op::confirm : Op::release, [&] { return store_->transition(request); });
}

Reservation Engine::transition(const TransitionRequest& request) {
  check_transition(request);
  Reservation out;
  if (batches(request)) {
    tracker_.enter(request.id.shard_key());  // the batcher leaves
    BatchItem item = transition_item(request);
    through_batcher(item, transition_route(), nullptr, 0);
    out = std::move(item.reservation);
  } else {
    out = run_transition(request);
  }
  detail::unslot(out);
  return out;
}

Reservation Engine::confirm(const Uuid& id, std::optional<Version> expected,
                            std::optional<Quantity> qty, bool release_rest,
                            const std::optional<std::string>& idempotency_key) {
  return transition({id, Transition::confirm, 0, expected, qty, release_rest, idempotency_key});
}

Reservation Engine::release(const Uuid& id, std::optional<Version> expected,
                            std::optional<Quantity> qty,
                            const std::optional<std::string>& idempotency_key) {
  return transition({id, Transition::release, 0, expected, qty, false, idempotency_key});
}

Reservation Engine::extend(const Uuid& id, std::int64_t ttl_us, std::optional<Version> expected,
                           const std::optional<std::string>& idempotency_key) {
  return transition(
      {id, Transition::extend, ttl_us, expected, std::nullopt, false, idempotency_key});
}

Reservation Engine::return_units(const ReturnRequest& request, const std::string& reason,
                                 const std::string& actor) {
  check_process();
  validate_qty(request.qty);
  if (request.location) validate_sku_key({"sku", *request.location});  // the location's rules
  validate_expected_version(request.expected_version);
  validate_note_text(reason, "reason");
  validate_note_text(actor, "actor");
  validate_idempotency_key(request.idempotency_key);
  const NoteScope note({"return", reason, actor, request.id.to_string()});
  Reservation out = observed(Op::return_units, [&] { return store_->return_units(request); });
  detail::unslot(out);
  return out;
}

Reservation Engine::resize(const Uuid& id, Quantity qty, std::optional<Version> expected,
                           const std::optional<std::string>& idempotency_key) {
  check_process();
  validate_qty(qty);
  validate_expected_version(expected);
  validate_idempotency_key(idempotency_key);
  const NoteScope note({"resize", "", "", id.to_string()});
  const ResizeRequest request{id, qty, expected, idempotency_key};
  Reservation out = observed(Op::resize, [&] {
    try {
      return store_->resize(request);
    } catch (const Error& refusal) {
      // The hold's row is short. On a SKU with hot-row slots, the SKU may not be: free
      // units move into that row, and the resize runs once more.
      if (refusal.code() != ErrorCode::out_of_stock) throw;
      const Reservation hold = store_->get_reservation(id);
      const Quantity growth = qty - hold.held();  // the hold may have changed meanwhile
      if (growth > 0) slots_->refill_row(hold.key, growth, refusal);
      return store_->resize(request);
    }
  });
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

PurgeCounts Engine::purge(std::int64_t older_than_us, std::optional<std::int64_t> limit) {
  check_process();
  const std::uint64_t count = purge_limit(older_than_us, limit);
  return observed(Op::purge, [&] { return store_->purge(older_than_us, count); });
}

}  // namespace stockade
