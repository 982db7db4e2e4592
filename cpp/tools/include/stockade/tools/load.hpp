// A load generator in C++: many clients reserving against one engine, timed together.
// The benchmarks and `stockade bench` drive it, so that the figures measure the engine
// and the database, not a Python client loop.
//
// Each client is a thread. With window == 1 it makes blocking calls, one at a time (a
// request handler per client). With window > 1 it keeps `window` async requests in flight
// through the engine's submit path (a server multiplexing many buyers on one thread).
// Options add an idempotency key to every reservation, or confirm every granted hold.
#pragma once

#include <cstdint>
#include <vector>

#include "stockade/engine.hpp"

namespace stockade {

struct LoadSpec {
  std::vector<SkuKey> keys;  // each request picks one uniformly at random
  std::size_t clients = 64;
  std::size_t window = 1;  // requests each client keeps in flight
  std::int64_t duration_ms = 2000;
  Quantity qty = 1;
  std::int64_t ttl_us = 15LL * 60 * 1000 * 1000;
  CallOptions call;
  std::uint32_t seed = 1;
  // Each reservation carries a fresh random idempotency key (32 hex digits, as a client
  // sending UUIDs would), so the key table grows as a service's does.
  bool keyed = false;
  // Blocking clients only: each granted hold is confirmed at once (reserve, then confirm,
  // as a checkout does); a confirmation counts as a request of its own.
  bool confirm = false;
  // With confirm: confirm only this many of each hold's units, then release the rest,
  // each a request of its own (a partial shipment; 0: confirm the whole hold).
  Quantity confirm_qty = 0;
  // With confirm_qty: the confirm releases the rest itself (confirm's release_rest), one
  // call instead of two.
  bool release_rest = false;
  // Each reservation is made for one of `buyers` buyers, picked at random ("buyer-<n>"),
  // so that purchase limits apply (0: no buyer).
  std::size_t buyers = 0;
  // Sell instead of reserve (with spec.call, a fencing_token included).
  bool sell = false;
  // Blocking clients only: allocate each request's qty of the picked key's SKU from these
  // locations (priority, split) instead of reserving at the key's own location.
  std::vector<std::string> pool;
};

inline constexpr std::size_t load_clients_max = 4096;
inline constexpr std::size_t load_window_max = 65536;

struct LoadResult {
  std::uint64_t requests = 0;
  std::uint64_t granted = 0;
  std::uint64_t refused = 0;  // OutOfStock
  std::uint64_t failed = 0;   // any other error
  double seconds = 0;
  double p50_us = 0;
  double p90_us = 0;
  double p99_us = 0;
  double p999_us = 0;
  double max_us = 0;
  double mean_us = 0;
};

// Runs the load for spec.duration_ms, then waits for requests in flight to finish.
LoadResult drive_load(Engine& engine, const LoadSpec& spec);

}  // namespace stockade
