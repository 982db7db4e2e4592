// Direct routing on the Citus layout (PostgresOptions::citus_routing = direct): which
// worker holds each shard key's rows, and a pool of connections to each worker, so that a
// one-shard call goes to that worker instead of through the coordinator.
//
// Why it is correct whatever the map says: every node of a Citus 11+ cluster has the
// metadata, and a call sent to a node that does not hold the shard is forwarded by that
// node (a delegated function is delegated again, a statement runs remotely). A stale
// route is only slower. A delegated call reports the group of the node it ran on, and one
// that ran elsewhere than its route said is a miss: it is counted, and the next call reloads
// the map (from the coordinator's pg_dist_* tables).
//
// What it sends a worker: the delegated calls (reserves, sells, the steps of a hold, the
// batch's one-row statements, the purge's steps), and the transactions of statements
// routed by their main row (keyed sells and steps, restocks, returns, resizes, the
// batch's full path, a reserve with a note or a buyer, a read of one SKU's rows), which
// Citus then executes locally there (a statement on another shard, such as a buyer's
// count, runs where that shard is). migrate(), DDL, orders and transfers over many rows,
// leases and the SKU-wide admin writes, reads of a reservation and reads across shards
// stay on the coordinator. It does not balance over replicas: one placement per shard.
//
// Bounds: a pool per worker of the map of the store's pool_size connections (so at most
// pool_size times the number of workers, besides the coordinator's pool; a worker that
// leaves the map loses its pool), a map of 65,536 entries, and at most one reload at a
// time, not more often than reload_interval_ms unless a miss asks for it.
//
// A node's new address (citus_update_node, after a failover) keeps its group, so calls
// follow it only when the map is read again, within reload_interval_ms: the old node must
// be fenced first, as Citus's own failover procedure does. A map that could not be read
// for longer than that is dropped, and calls go through the coordinator.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pqxx/pqxx>
#include <string>
#include <utility>
#include <vector>

#include "postgres/pool.hpp"
#include "stockade/telemetry.hpp"

namespace stockade::detail::pg {

// PostgreSQL's hashint4 (hash_bytes_uint32 in src/common/hashfn.c): the hash Citus takes of
// an integer distribution column to find its shard.
std::int32_t pg_hash_int4(std::int32_t value) noexcept;

// The hash ranges [first, second] of Citus shards (pg_dist_shard's min and max values).
using HashRanges = std::vector<std::pair<std::int32_t, std::int32_t>>;
// No shard: a shard key whose hash no range holds.
inline constexpr std::uint16_t no_shard = 0xFFFF;

// For each shard key 0..65535, the index in `ranges` (in any order; an empty range holds
// nothing) of the range its hash falls in, or no_shard.
std::vector<std::uint16_t> shard_of_each_key(const HashRanges& ranges);

// One shard key (the least) of each of `shards` shards that `index` (shard_of_each_key)
// places one in, in the shards' order: a call with it runs on that shard.
std::vector<std::uint16_t> one_key_per_shard(const std::vector<std::uint16_t>& index,
                                             std::size_t shards);

// `dsn` with its host and port replaced by `host` and `port` (everything else kept: the
// database, the role and its password, TLS settings), as a key=value string.
std::string dsn_at(const std::string& dsn, const std::string& host, int port);

class Routes {
 public:
  // How often a map that is not stale is read again at most (a node's address may change
  // without a miss showing it, say after citus_update_node).
  static constexpr std::int64_t reload_interval_ms = 5000;
  // After a failed read (no schema yet, the coordinator out of reach): the wait before the
  // next try, during which calls go through the coordinator.
  static constexpr std::int64_t retry_interval_ms = 1000;
  // A worker whose pool answered Unavailable is passed over (its calls go through the
  // coordinator) for this long, so that calls do not each wait to connect to it.
  static constexpr std::int64_t node_backoff_ms = 5000;

  struct Route {
    std::shared_ptr<Pool> pool;
    std::int32_t group = 0;  // pg_dist_node.groupid
  };

  Routes(std::string dsn, std::shared_ptr<const Statements> statements, std::size_t pool_size,
         std::int64_t pool_timeout_ms, Watchdog& watchdog);

  // The worker that holds the rows of `shard_key`, or nothing (no map yet, or the map
  // does not cover it): then the call goes through the coordinator.
  std::optional<Route> route(std::uint16_t shard_key) const;
  // Whether this caller should read the map now (none yet, a miss made it stale, or it is
  // older than reload_interval_ms); true for one caller at a time, who then calls install()
  // or reload_failed().
  bool claim_reload();
  // The SQL that reads the map on the coordinator; its rows go to install().
  static std::string map_sql(const std::string& schema);
  // Installs the map read by map_sql(). Returns false (and keeps routing through the
  // coordinator) if the rows do not match Citus's own placement of the probe keys.
  bool install(const pqxx::result& rows);
  void reload_failed();
  // A call routed by `route` ran on the node of group `ran_on`: a hit, or a miss (counted,
  // and the map goes stale).
  void ran(const Route& route, std::int32_t ran_on);
  // A routed call that cannot tell the node it ran on (a transaction of statements, not a
  // delegated call) went: counted as routed, never as a miss.
  void sent();
  // A routed call could not reach its worker (Unavailable, nothing changed) and went
  // through the coordinator; the map goes stale, and the worker is passed over for
  // node_backoff_ms.
  void fell_back(const Route& route);
  RoutingStats stats() const;
  void close();

 private:
  struct Map {
    std::vector<std::uint16_t> shard_of_key;  // per shard key: an index into `routes`
    std::vector<Route> routes;                // per Citus shard
  };
  struct Node;
  std::shared_ptr<Pool> pool_for(std::map<std::int32_t, Node>& kept, std::int32_t group,
                                 const std::string& host, int port);
  // Under mutex_: the map is to be read again soon (after a gap, see routes.cpp).
  void go_stale();

  const std::string dsn_;
  const std::shared_ptr<const Statements> statements_;
  const std::size_t pool_size_;
  const std::int64_t pool_timeout_ms_;
  Watchdog& watchdog_;

  mutable std::mutex mutex_;
  std::shared_ptr<const Map> map_;
  struct Node {
    std::string host;
    int port = 0;
    std::shared_ptr<Pool> pool;
    std::int64_t avoid_until_us = 0;  // steady clock: fell_back()
  };
  std::map<std::int32_t, Node> nodes_;  // per group
  bool stale_ = false;
  bool reloading_ = false;
  bool closed_ = false;
  std::int64_t next_reload_us_ = 0;  // steady clock
  std::int64_t installed_us_ = 0;    // steady clock: the map's read
  RoutingStats stats_;
};

}  // namespace stockade::detail::pg
