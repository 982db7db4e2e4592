#include "stockade/engine.hpp"

#include <set>

#include "stockade/errors.hpp"
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

// batched and auto need the hot-row batching layer, which is not built yet.
void refuse_unbuilt(Strategy s) {
  if (s == Strategy::batched || s == Strategy::automatic) {
    throw Error(ErrorCode::not_supported,
                std::string("strategy '") + strategy_name(s) +
                    "' is not built yet: the hot-row batching layer has not landed; use "
                    "atomic, pessimistic, advisory or optimistic");
  }
}

}  // namespace

void validate_engine_options(const EngineOptions& options) {
  refuse_unbuilt(options.default_strategy);
  if (options.retries_max < 0 || options.retries_max > retries_max_limit) {
    throw_invalid_argument("retries_max must be between 0 and " +
                           std::to_string(retries_max_limit));
  }
  validate_lock_timeout_ms(options.lock_timeout_ms);
  validate_ttl_us(options.default_ttl_us);
}

Engine::Engine(std::shared_ptr<Store> store, EngineOptions options)
    : store_(std::move(store)), options_(options) {
  if (!store_) throw_invalid_argument("an engine needs a store");
  validate_engine_options(options_);
}

std::unique_ptr<Engine> Engine::memory(EngineOptions options, std::shared_ptr<Clock> clock) {
  return std::make_unique<Engine>(make_memory_store(std::move(clock)), options);
}

std::unique_ptr<Engine> Engine::postgres(PostgresOptions postgres, EngineOptions options) {
  validate_engine_options(options);  // before connecting
  postgres.lock_timeout_ms = options.lock_timeout_ms;
  return std::make_unique<Engine>(make_postgres_store(std::move(postgres)), options);
}

std::vector<std::string> Engine::migrate() {
  return store_->migrate();
}

void Engine::close() {
  store_->close();
}

WriteOptions Engine::resolve(const CallOptions& call) const {
  WriteOptions out;
  out.strategy = call.strategy.value_or(options_.default_strategy);
  refuse_unbuilt(out.strategy);
  if (call.nowait && !waits_for_locks(out.strategy)) {
    throw_invalid_argument(std::string("nowait applies to the pessimistic and advisory "
                                       "strategies, not '") +
                           strategy_name(out.strategy) + "'");
  }
  // lock_timeout bounds every wait for a lock a strategy takes (in PostgreSQL even an
  // atomic UPDATE waits for a row lock), so it is accepted whatever the strategy.
  if (call.lock_timeout_ms) validate_lock_timeout_ms(*call.lock_timeout_ms);
  validate_expected_version(call.expected_version);
  out.nowait = call.nowait;
  out.lock_timeout_ms = call.lock_timeout_ms.value_or(options_.lock_timeout_ms);
  out.retries_max = options_.retries_max;
  out.expected_version = call.expected_version;
  return out;
}

// Counts the outcome of one strategy-routed call.
template <class Result, class Fn>
Result Engine::counted(Strategy strategy, Fn&& fn) {
  StrategyCounters& c = store_->metrics().of(strategy);
  bump(c.requests);
  try {
    Result result = fn();
    bump(c.granted);
    return result;
  } catch (const Error& e) {
    switch (e.code()) {
      case ErrorCode::out_of_stock:
        bump(c.refused);
        break;
      case ErrorCode::version_conflict:
        bump(c.version_conflicts);
        bump(c.failed);
        break;
      case ErrorCode::lock_not_available:
        bump(c.lock_not_available);
        bump(c.failed);
        break;
      case ErrorCode::lock_timeout:
        bump(c.lock_timeouts);
        bump(c.failed);
        break;
      default:
        bump(c.failed);
        break;
    }
    throw;
  }
}

StockLevel Engine::restock(const SkuKey& key, Quantity qty, std::optional<Version> expected) {
  validate_sku_key(key);
  validate_qty(qty);
  validate_expected_version(expected);
  return store_->restock(key, qty, expected);
}

StockLevel Engine::set_on_hand(const SkuKey& key, Quantity on_hand,
                               std::optional<Version> expected) {
  validate_sku_key(key);
  if (on_hand < 0) {
    throw_invalid_argument("on_hand must not be negative, got " + std::to_string(on_hand));
  }
  validate_expected_version(expected);
  return store_->set_on_hand(key, on_hand, expected);
}

StockLevel Engine::stock(const SkuKey& key) {
  validate_sku_key(key);
  return store_->stock(key);
}

StockLevel Engine::sell(const SkuKey& key, Quantity qty, const CallOptions& call) {
  validate_sku_key(key);
  validate_qty(qty);
  SellRequest request{key, qty, resolve(call)};
  return counted<StockLevel>(request.options.strategy, [&] { return store_->sell(request); });
}

Reservation Engine::reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call) {
  validate_sku_key(key);
  validate_qty(qty);
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  ReserveRequest request{key, qty, ttl_us.value_or(options_.default_ttl_us),
                         std::move(idempotency_key), resolve(call)};
  return counted<Reservation>(request.options.strategy, [&] { return store_->reserve(request); });
}

std::vector<Reservation> Engine::reserve_order(const std::vector<OrderLine>& lines,
                                               std::optional<std::int64_t> ttl_us,
                                               std::optional<std::string> idempotency_key,
                                               const CallOptions& call) {
  if (lines.empty()) throw_invalid_argument("an order needs at least one line");
  if (lines.size() > order_lines_max) {
    throw_invalid_argument("an order has at most " + std::to_string(order_lines_max) +
                           " lines, got " + std::to_string(lines.size()));
  }
  std::set<SkuKey> seen;
  for (const OrderLine& line : lines) {
    validate_sku_key(line.key);
    validate_qty(line.qty);
    if (!seen.insert(line.key).second) {
      throw_invalid_argument("the order names sku '" + line.key.sku + "' at location '" +
                             line.key.location + "' twice");
    }
  }
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  if (call.expected_version) {
    throw_invalid_argument("reserve_order does not take expected_version");
  }
  OrderRequest request{lines, ttl_us.value_or(options_.default_ttl_us), std::move(idempotency_key),
                       resolve(call)};
  return counted<std::vector<Reservation>>(request.options.strategy,
                                           [&] { return store_->reserve_order(request); });
}

Reservation Engine::confirm(const Uuid& id, std::optional<Version> expected) {
  validate_expected_version(expected);
  return store_->confirm(id, expected);
}

Reservation Engine::release(const Uuid& id, std::optional<Version> expected) {
  validate_expected_version(expected);
  return store_->release(id, expected);
}

Reservation Engine::extend(const Uuid& id, std::int64_t ttl_us, std::optional<Version> expected) {
  validate_ttl_us(ttl_us);
  validate_expected_version(expected);
  return store_->extend(id, ttl_us, expected);
}

Reservation Engine::get_reservation(const Uuid& id) {
  return store_->get_reservation(id);
}

std::size_t Engine::expire_due(std::size_t limit) {
  if (limit == 0 || limit > expire_batch_max) {
    throw_invalid_argument("limit must be between 1 and " + std::to_string(expire_batch_max) +
                           ", got " + std::to_string(limit));
  }
  return store_->expire_due(limit);
}

StoreStats Engine::stats(std::size_t sku_limit) const {
  return store_->stats(sku_limit);
}

}  // namespace stockade
