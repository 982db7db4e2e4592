// MemoryStore: the embedded, in-process store. Same semantics and errors as the
// PostgreSQL store, no durability. It serves notebooks, fast tests and the demo.
#pragma once

#include <memory>

#include "stockade/clock.hpp"
#include "stockade/store.hpp"

namespace stockade {

struct MemoryOptions {
  // Retention: when > 0, the store purges as it goes (Store::purge with this horizon):
  // every 64th reservation it makes purges up to 256 rows that are past it. The store has
  // no thread of its own, so a store that takes no reservations purges nothing more.
  std::int64_t retention_us = 0;
  // The movement journal keeps at most this many entries, dropping the oldest (a feed
  // consumer that had not read one is overrun); 0 journals nothing.
  std::size_t journal_max = 100000;
  // Store::purge also drops journal entries older than this (0: purge keeps them until
  // journal_max pushes them out), once every feed consumer has read them or they are
  // older than feed_lag_max_us.
  std::int64_t journal_retention_us = 0;
  std::int64_t feed_lag_max_us = 7LL * 24 * 3600 * 1000000;
  // Holds lapse at their expiry by themselves (the memory store's sweeper): stock reads,
  // reserves, sells, orders, batches, set_on_hand and buyer_held first expire the holds
  // past their expiry, at most expire_lapsed_batch of them, oldest first per shard;
  // reservation(id) expires its own; and a refused request frees lapsed holds before its refusal
  // stands. false: holds lapse only when expire_due() runs or a transition finds one lapsed, and
  // until then they keep their units (Engine.memory(sweeper=False)).
  bool expire_lapsed = true;
};

// The most lapsed holds one call expires as the memory store goes (MemoryOptions).
inline constexpr std::size_t expire_lapsed_batch = 1024;

std::shared_ptr<Store> make_memory_store(std::shared_ptr<Clock> clock,
                                         std::shared_ptr<Telemetry> telemetry = nullptr,
                                         MemoryOptions options = {});

}  // namespace stockade
