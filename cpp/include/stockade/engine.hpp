// The engine facade: the one entry point for callers (the Python bindings, the C++ tests,
// the benchmarks). It validates every input before a store sees it, resolves the strategy
// for each call, counts outcomes, and routes to the store. Bad input raises
// Error(invalid_argument) and changes nothing.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stockade/postgres_store.hpp"
#include "stockade/store.hpp"

namespace stockade {

struct EngineOptions {
  Strategy default_strategy = Strategy::atomic;
  int retries_max = 5;
  std::int64_t lock_timeout_ms = 10000;
  std::int64_t default_ttl_us = 15LL * 60 * 1000 * 1000;
};

// Per-call overrides; empty fields take the engine's defaults.
struct CallOptions {
  std::optional<Strategy> strategy;
  bool nowait = false;
  std::optional<std::int64_t> lock_timeout_ms;
  std::optional<Version> expected_version;
};

class Engine {
 public:
  Engine(std::shared_ptr<Store> store, EngineOptions options);

  // An engine over an in-process MemoryStore; clock defaults to the system clock.
  static std::unique_ptr<Engine> memory(EngineOptions options = {},
                                        std::shared_ptr<Clock> clock = nullptr);
  // An engine over PostgreSQL; connects at once (Unavailable if it cannot).
  static std::unique_ptr<Engine> postgres(PostgresOptions postgres, EngineOptions options = {});

  // Creates or upgrades the store's schema; returns the migrations applied.
  std::vector<std::string> migrate();
  // Releases the store's connections and background work.
  void close();

  StockLevel restock(const SkuKey& key, Quantity qty, std::optional<Version> expected_version = {});
  StockLevel set_on_hand(const SkuKey& key, Quantity on_hand,
                         std::optional<Version> expected_version = {});
  StockLevel stock(const SkuKey& key);
  StockLevel sell(const SkuKey& key, Quantity qty, const CallOptions& call = {});

  Reservation reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us = {},
                      std::optional<std::string> idempotency_key = {},
                      const CallOptions& call = {});
  std::vector<Reservation> reserve_order(const std::vector<OrderLine>& lines,
                                         std::optional<std::int64_t> ttl_us = {},
                                         std::optional<std::string> idempotency_key = {},
                                         const CallOptions& call = {});
  Reservation confirm(const Uuid& id, std::optional<Version> expected_version = {});
  Reservation release(const Uuid& id, std::optional<Version> expected_version = {});
  Reservation extend(const Uuid& id, std::int64_t ttl_us,
                     std::optional<Version> expected_version = {});
  Reservation get_reservation(const Uuid& id);
  std::size_t expire_due(std::size_t limit = 1000);

  StoreStats stats(std::size_t sku_limit = 20) const;
  const EngineOptions& options() const { return options_; }
  Store& store() { return *store_; }

 private:
  WriteOptions resolve(const CallOptions& call) const;
  template <class Result, class Fn>
  Result counted(Strategy strategy, Fn&& fn);

  std::shared_ptr<Store> store_;
  EngineOptions options_;
};

// Checks engine-wide options; throws InvalidArgument.
void validate_engine_options(const EngineOptions& options);

}  // namespace stockade
