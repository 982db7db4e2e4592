// Engine: the movement journal, the change feed, stock alerts and the audit
// (docs/journal.md). Each call checks its input and hands it to the store.
#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "stockade/engine.hpp"

namespace stockade {

namespace {

void check_limit(std::size_t limit, std::size_t max, const char* field) {
  if (limit < 1 || limit > max) {
    throw_invalid_argument(std::string(field) + " must be between 1 and " + std::to_string(max) +
                           ", got " + std::to_string(limit));
  }
}

void check_position(const FeedPosition& at) {
  if (at.after < 0 || at.from.size() > 1'000'000 || at.to.size() > 1'000'000) {
    throw_invalid_argument("not a feed position");
  }
}

}  // namespace

std::vector<Movement> Engine::movements(const MovementQuery& query) {
  check_process();
  if (query.sku) validate_sku_key(SkuKey{*query.sku, query.location.value_or(default_location)});
  if (!query.sku && query.location) throw_invalid_argument("location needs a sku");
  if (query.after < 0) throw_invalid_argument("after must not be negative");
  check_limit(query.limit, movements_limit_max, "limit");
  return store_->movements(query);
}

FeedPosition Engine::feed_open(const std::string& consumer, bool from_start) {
  check_process();
  validate_consumer_name(consumer);
  return store_->feed_open(consumer, from_start);
}

FeedBatch Engine::feed_poll(const std::string& consumer, const FeedPosition& from,
                            std::size_t limit) {
  check_process();
  validate_consumer_name(consumer);
  check_position(from);
  check_limit(limit, feed_limit_max, "limit");
  return store_->feed_poll(consumer, from, limit);
}

void Engine::feed_commit(const std::string& consumer, const FeedPosition& at) {
  check_process();
  validate_consumer_name(consumer);
  check_position(at);
  store_->feed_commit(consumer, at);
}

bool Engine::feed_drop(const std::string& consumer) {
  check_process();
  validate_consumer_name(consumer);
  return store_->feed_drop(consumer);
}

FeedWake Engine::feed_wait(std::int64_t timeout_ms) {
  check_process();
  if (timeout_ms < 0 || timeout_ms > 60'000) {
    throw_invalid_argument("a feed wait is 0 to 60000 ms, got " + std::to_string(timeout_ms));
  }
  return store_->feed_wait(timeout_ms * 1000);
}

StockLevel Engine::set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) {
  check_process();
  validate_sku_key(key);
  if (threshold && (*threshold < 0 || *threshold > quantity_max)) {
    throw_invalid_argument("threshold must be between 0 and " + std::to_string(quantity_max) +
                           ", got " + std::to_string(*threshold));
  }
  slots_->refuse_on_slots(key, "a low-stock threshold");
  return store_->set_low_stock(key, threshold);
}

AuditReport Engine::audit(const AuditOptions& options) {
  check_process();
  if (options.sku) validate_sku_key(SkuKey{*options.sku, default_location});
  check_limit(options.limit, movements_limit_max, "limit");
  if (options.expiry_lag_us < 0) throw_invalid_argument("expiry_lag must not be negative");
  AuditReport report = store_->audit(options);
  last_audit_violations_.store(static_cast<std::int64_t>(report.violations.size()));
  return report;
}

std::uint64_t Engine::purge_movements(std::int64_t older_than_us,
                                      std::optional<std::int64_t> limit) {
  check_process();
  return store_->purge_movements(older_than_us, detail::engine::purge_limit(older_than_us, limit));
}

}  // namespace stockade
