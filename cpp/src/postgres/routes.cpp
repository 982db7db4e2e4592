#include "postgres/routes.hpp"

#include <algorithm>

#include "postgres/dsn.hpp"
#include "stockade/log.hpp"

namespace stockade::detail::pg {
namespace {

constexpr std::size_t shard_keys = 65536;  // row_shard_key() is 16 bits
// Keys whose shard the map must place where Citus does (map_sql() asks Citus for theirs).
constexpr std::int32_t probes[] = {0, 12345, 65535};
// A stale map (after a miss) is read again at most this often: a shard move makes every
// call for the shard miss until it ends, and one read per call would load the coordinator.
constexpr std::int64_t stale_reload_gap_ms = 200;

constexpr std::uint32_t rotate_left(std::uint32_t x, int k) {
  return (x << k) | (x >> (32 - k));
}

std::string quoted(const std::string& value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\'' || c == '\\') out += '\\';
    out += c;
  }
  return out + "'";
}

}  // namespace

std::int32_t pg_hash_int4(std::int32_t value) noexcept {
  // hash_bytes_uint32: Bob Jenkins's lookup3 `final` mix of one 32-bit word.
  std::uint32_t a = 0x9e3779b9U + static_cast<std::uint32_t>(sizeof(std::uint32_t)) + 3923095U;
  std::uint32_t b = a, c = a;
  a += static_cast<std::uint32_t>(value);
  c ^= b;
  c -= rotate_left(b, 14);
  a ^= c;
  a -= rotate_left(c, 11);
  b ^= a;
  b -= rotate_left(a, 25);
  c ^= b;
  c -= rotate_left(b, 16);
  a ^= c;
  a -= rotate_left(c, 4);
  b ^= a;
  b -= rotate_left(a, 14);
  c ^= b;
  c -= rotate_left(b, 24);
  return static_cast<std::int32_t>(c);
}

std::vector<std::uint16_t> shard_of_each_key(const HashRanges& ranges) {
  std::vector<std::size_t> order;  // the ranges that are not empty, by their start
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    if (ranges[i].first <= ranges[i].second) order.push_back(i);
  }
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return ranges[a].first < ranges[b].first; });
  std::vector<std::uint16_t> index(shard_keys, no_shard);
  for (std::size_t k = 0; k < shard_keys; ++k) {
    const std::int32_t h = pg_hash_int4(static_cast<std::int32_t>(k));
    const auto after =
        std::upper_bound(order.begin(), order.end(), h,
                         [&](std::int32_t v, std::size_t i) { return v < ranges[i].first; });
    if (after == order.begin() || ranges[*std::prev(after)].second < h) continue;
    index[k] = static_cast<std::uint16_t>(*std::prev(after));
  }
  return index;
}

std::vector<std::uint16_t> one_key_per_shard(const std::vector<std::uint16_t>& index,
                                             std::size_t shards) {
  std::vector<std::int32_t> first(shards, -1);
  for (std::size_t k = index.size(); k-- > 0;) {
    if (index[k] < shards) first[index[k]] = static_cast<std::int32_t>(k);
  }
  std::vector<std::uint16_t> out;
  for (std::int32_t k : first) {
    if (k >= 0) out.push_back(static_cast<std::uint16_t>(k));
  }
  return out;
}

std::string dsn_at(const std::string& dsn, const std::string& host, int port) {
  std::string out;
  for (const auto& [keyword, value] : parse_conninfo(dsn)) {
    if (keyword == "host" || keyword == "hostaddr" || keyword == "port") continue;
    out += keyword + "=" + quoted(value) + " ";
  }
  return out + "host=" + quoted(host) + " port=" + std::to_string(port);
}

Routes::Routes(std::string dsn, std::shared_ptr<const Statements> statements, std::size_t pool_size,
               std::int64_t pool_timeout_ms, Watchdog& watchdog)
    : dsn_(std::move(dsn)),
      statements_(std::move(statements)),
      pool_size_(pool_size),
      pool_timeout_ms_(pool_timeout_ms),
      watchdog_(watchdog) {
  stats_.mode = "direct";
}

std::optional<Routes::Route> Routes::route(std::uint16_t shard_key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!map_) return std::nullopt;
  const std::uint16_t at = map_->shard_of_key[shard_key];
  if (at == no_shard) return std::nullopt;
  const Route& route = map_->routes[at];
  const auto node = nodes_.find(route.group);
  if (node != nodes_.end() && node->second.avoid_until_us > steady_now_us()) return std::nullopt;
  return route;
}

bool Routes::claim_reload() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || reloading_ || steady_now_us() < next_reload_us_) return false;
  reloading_ = true;
  return true;
}

std::string Routes::map_sql(const std::string& schema) {
  const std::string table = "'" + schema + ".stock'";
  std::string probe_columns;
  for (std::int32_t k : probes) {
    probe_columns +=
        ", get_shard_id_for_distribution_column(" + table + ", " + std::to_string(k) + ")";
  }
  // One row per placement of each shard of stock (its reservations and keys are
  // co-located), on an active primary node.
  return "SELECT s.shardid, s.shardminvalue::int, s.shardmaxvalue::int, n.groupid, "
         "n.nodename, n.nodeport" +
         probe_columns +
         " FROM pg_dist_shard s JOIN pg_dist_placement p ON p.shardid = s.shardid"
         " JOIN pg_dist_node n ON n.groupid = p.groupid AND n.noderole = 'primary'"
         " AND n.isactive WHERE s.logicalrelid = " +
         table + "::regclass ORDER BY 2, 4";
}

bool Routes::install(const pqxx::result& rows) {
  struct Shard {
    std::int64_t id;
    std::int32_t lo, hi, group;
    std::string host;
    int port;
  };
  std::vector<Shard> shards;
  for (const pqxx::row& row : rows) {
    const auto id = row[0].as<std::int64_t>();
    if (!shards.empty() && shards.back().id == id) continue;  // one placement per shard
    shards.push_back(Shard{id, row[1].as<std::int32_t>(), row[2].as<std::int32_t>(),
                           row[3].as<std::int32_t>(), row[4].as<std::string>(), row[5].as<int>()});
  }
  auto map = std::make_shared<Map>();
  HashRanges ranges;
  for (const Shard& shard : shards) ranges.emplace_back(shard.lo, shard.hi);
  map->shard_of_key = shard_of_each_key(ranges);
  bool agrees = !rows.empty() && shards.size() < no_shard;
  for (std::size_t i = 0; agrees && i < std::size(probes); ++i) {
    const std::uint16_t at = map->shard_of_key[static_cast<std::size_t>(probes[i])];
    agrees = at != no_shard && shards[at].id == rows[0][6 + static_cast<int>(i)].as<std::int64_t>();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  reloading_ = false;
  if (closed_) return false;
  ++stats_.reloads;
  next_reload_us_ = steady_now_us() + reload_interval_ms * 1000;
  if (!agrees) {
    map_.reset();
    log(LogLevel::warning, "stockade.postgres",
        "citus_routing='direct': the shard map read from the coordinator does not place keys "
        "where Citus does (or has no shards); calls go through the coordinator");
    return false;
  }
  std::map<std::int32_t, Node> kept;  // the workers of this map, with their pools
  for (const Shard& s : shards) {
    map->routes.push_back(Route{pool_for(kept, s.group, s.host, s.port), s.group});
  }
  nodes_ = std::move(kept);  // a worker that left the map: its pool closes with its calls
  map_ = std::move(map);
  stale_ = false;
  installed_us_ = steady_now_us();
  stats_.nodes = nodes_.size();
  return true;
}

void Routes::reload_failed() {
  std::lock_guard<std::mutex> lock(mutex_);
  reloading_ = false;
  const std::int64_t now = steady_now_us();
  next_reload_us_ = now + retry_interval_ms * 1000;
  // A map that could not be read again for this long may name a node that was replaced.
  if (map_ && now - installed_us_ > reload_interval_ms * 1000) map_.reset();
}

void Routes::ran(const Route& route, std::int32_t ran_on) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.routed;
  if (ran_on == route.group) return;
  ++stats_.misses;
  go_stale();
}

void Routes::sent() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.routed;
}

void Routes::fell_back(const Route& route) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++stats_.fallbacks;
  const auto node = nodes_.find(route.group);
  if (node != nodes_.end()) node->second.avoid_until_us = steady_now_us() + node_backoff_ms * 1000;
  go_stale();
}

void Routes::go_stale() {
  if (stale_) return;
  stale_ = true;
  next_reload_us_ = std::min(next_reload_us_, steady_now_us() + stale_reload_gap_ms * 1000);
}

RoutingStats Routes::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

// Under mutex_: the node of `group` in `kept`, from nodes_ if it is there at the same
// address. A node whose address changed gets a new pool; the old one lives on while calls
// hold a Route to it, and closes its connections when the last one ends.
std::shared_ptr<Pool> Routes::pool_for(std::map<std::int32_t, Node>& kept, std::int32_t group,
                                       const std::string& host, int port) {
  Node& node = kept[group];
  if (node.pool) return node.pool;  // a shard before this one is on it
  const auto known = nodes_.find(group);
  if (known != nodes_.end() && known->second.host == host && known->second.port == port) {
    node = known->second;
  } else {
    node = Node{host, port,
                std::make_shared<Pool>(dsn_at(dsn_, host, port), statements_, pool_size_,
                                       pool_timeout_ms_, Pooler::transaction, watchdog_),
                0};
  }
  return node.pool;
}

void Routes::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  map_.reset();
  for (auto& [group, node] : nodes_) node.pool->close();
}

}  // namespace stockade::detail::pg
