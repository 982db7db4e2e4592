// PostgresStore retention: purge(), which the sweeper also runs when retention is set.
//
// Plain batched deletes, oldest first, through the two indexes of migration 002: each
// statement deletes at most purge_batch keys (with their reservations) or reservations
// and commits by itself, so a purge never holds many locks or one long transaction, and
// it never touches a stock row. A cursor carries each phase past what it deleted. (Time partitions
// that are dropped whole were measured against this; see benchmarks/retention.py and
// docs/design.md for why the deletes were kept.)
//
// On the Citus layout a purge() (and the sweeper with a session of its own) first calls
// the delegated purge_shard in each Citus shard with old entries (migration citus/108),
// which runs the same deletes on the worker's shard tables and leaves what crosses shards
// (purge_citus). Then, if a shard left something (and in a pooled sweeper, each of whose
// steps takes the election lock), each step reads the next old entries in time order from
// every shard, then purges their shards' entries up to the last one's time, in statements
// that each run on one shard (purge_step_citus): Citus plans neither CTE of the plain
// statements, and an order's reservations may lie on other shards than its key, which
// those statements would not see.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "postgres/postgres_store_impl.hpp"
#include "postgres/routes.hpp"

namespace stockade::detail::pg {

namespace {

// A purge's progress: what it deleted, and how much of its limit it took (keys, and
// reservations without a key).
struct PurgeRun {
  std::uint64_t limit;
  std::uint64_t batch;  // purge_batch: at most this many per statement
  const std::function<bool()>& stop;
  Telemetry& telemetry;
  std::uint64_t taken = 0;
  PurgeCounts out;

  // One phase (`statement`: purge_keys or purge_reservations) by delete_some, from its
  // first cursor, until the limit is taken, nothing more is old enough or stop() says so.
  void phase(Stmt statement,
             const std::function<PurgeStep(Stmt, std::uint64_t, std::int64_t)>& delete_some) {
    std::int64_t cursor = purge_cursor_start;
    for (;;) {
      const std::uint64_t room = limit - taken;
      if (room == 0 || (stop && stop())) return;
      const std::uint64_t want = std::min<std::uint64_t>(room, batch);
      const PurgeStep step = delete_some(statement, want, cursor);
      const PurgeCounts got{step.reservations, step.keys};
      out.keys += got.keys;
      out.reservations += got.reservations;
      telemetry.purged(got);
      const std::uint64_t examined = statement == Stmt::purge_keys ? got.keys : got.reservations;
      taken += examined;
      cursor = step.cursor;
      if (examined < want) return;  // nothing more is old enough (or all of it is locked)
    }
  }
};

}  // namespace

PurgeCounts PostgresStore::purge_with(std::uint64_t limit, const PurgeStatement& delete_some,
                                      const std::function<bool()>& stop) {
  PurgeRun run{limit, options_.purge_batch, stop, telemetry(), 0, {}};
  for (Stmt statement : {Stmt::purge_keys, Stmt::purge_reservations}) {
    run.phase(statement, delete_some);
  }
  return run.out;
}

// At most this many of a purge's delegated calls run side by side on Citus (each on a
// connection of the pool, and never more than half the pool).
constexpr std::size_t purge_lanes = 4;

namespace {

// Runs lane(0) here and lane(1) .. lane(n - 1) on threads of their own (or here, if a
// thread cannot start), and once all have ended rethrows the first failure; `failed` tells
// the others to stop early.
void in_lanes(std::size_t n, std::atomic<bool>& failed,
              const std::function<void(std::size_t)>& lane) {
  std::exception_ptr first;
  std::mutex mutex;
  const auto guarded = [&](std::size_t i) {
    try {
      lane(i);
    } catch (...) {
      failed = true;
      std::lock_guard<std::mutex> lock(mutex);
      if (!first) first = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(n);  // no reallocation while threads run
  for (std::size_t i = 1; i < n; ++i) {
    try {
      threads.emplace_back(guarded, i);
    } catch (const std::system_error&) {
      guarded(i);
    }
  }
  guarded(0);
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace

// On Citus, each phase first runs in every Citus shard by the delegated purge_shard
// (migration citus/108): one call per purge_batch entries, which the shard's worker runs
// on its shard tables as one server runs purge_keys and purge_reservations. Without a
// limit, the shards' calls run in up to purge_lanes lanes side by side (at most half the
// pool; the order does not matter then); with one, or for the sweeper (`rest`), one shard
// after another, the shard with the oldest entry first. Then the statement form
// (purge_step_citus) takes what that leaves, if a shard says it left something: keys with
// reservations in other shards, keyed reservations without their key beside them. A
// schema without the function, a shard that moved, or a role that does not own the
// tables takes the statement form alone.
PurgeCounts PostgresStore::purge_citus(std::int64_t older_than_us, std::uint64_t limit,
                                       const Rest& rest) {
  const std::size_t lanes =
      rest || limit != std::numeric_limits<std::uint64_t>::max()
          ? 1
          : std::max<std::size_t>(1, std::min(purge_lanes, options_.pool_size / 2));
  std::atomic<bool> halt{false};  // a lane failed, or the sweeper is to stop
  const std::function<bool()> stop = [&] { return halt.load(); };
  std::vector<PurgeRun> runs(lanes,
                             PurgeRun{limit, options_.purge_batch, stop, telemetry(), 0, {}});
  // A step, then the sweeper's rest (none after a step that deleted nothing, but its
  // word on whether to go on).
  const auto paced = [&](const std::function<PurgeStep()>& step) {
    const auto began = std::chrono::steady_clock::now();
    const PurgeStep out = step();
    const bool some = out.keys + out.reservations > 0;
    if (rest && !rest(some ? std::chrono::steady_clock::now() - began
                           : std::chrono::steady_clock::duration::zero())) {
      halt = true;
    }
    return out;
  };
  for (Stmt statement : {Stmt::purge_keys, Stmt::purge_reservations}) {
    if (halt || runs[0].taken >= limit) break;
    const std::optional<std::vector<std::uint16_t>> old =
        citus_old_shards(statement, older_than_us);
    const std::vector<std::uint16_t> shards = old.value_or(std::vector<std::uint16_t>{});
    // Whether a shard left something to the statement form (all of it: no function).
    std::atomic<bool> left{!old};
    const auto one_call = [&](std::uint16_t shard, std::uint64_t n, std::int64_t cursor) {
      const std::optional<PurgeStep> step = run_delegated(
          Delegated::purge, shard, nullptr, ErrorContext{}, [&](Tx& tx, std::int32_t* ran_on) {
            const pqxx::result r =
                tx.exec_on(shard, Stmt::citus_purge_shard, statement == Stmt::purge_keys,
                           older_than_us, static_cast<std::int64_t>(n), cursor);
            if (ran_on) *ran_on = r.at(0)[4].as<std::int32_t>();
            if (r[0][5].as<bool>()) left = true;  // true too where the shard was not
            return PurgeStep{r[0][0].as<std::uint64_t>(), r[0][1].as<std::uint64_t>(),
                             r[0][2].as<std::int64_t>()};
          });
      if (!step) left = true;  // no function (dropped since): the statement form does it all
      return step.value_or(PurgeStep{0, 0, cursor});
    };
    in_lanes(std::min(lanes, shards.size()), halt, [&](std::size_t lane) {
      for (std::size_t i = lane; i < shards.size(); i += lanes) {
        runs[lane].phase(statement, [&](Stmt, std::uint64_t n, std::int64_t cursor) {
          return paced([&] { return one_call(shards[i], n, cursor); });
        });
      }
    });
    if (!left) continue;
    runs[0].phase(statement, [&](Stmt, std::uint64_t n, std::int64_t cursor) {
      return paced([&] {
        return run(nullptr, ErrorContext{}, [&](Tx& tx) {
          return purge_step_citus(tx, statement, older_than_us, n, cursor);
        });
      });
    });
  }
  PurgeCounts out;
  for (const PurgeRun& lane : runs) {
    out.keys += lane.out.keys;
    out.reservations += lane.out.reservations;
  }
  return out;
}

// The Citus shards that hold old entries of this phase (`statement`), a shard key in each,
// as the next purge_read_citus entries in time order from every shard tell, each shard by
// its oldest entry; then, if there are that many, every other shard. Nothing if the schema
// lacks purge_shard (migrated by an older release), or its path is not usable here
// (shard_path_usable): the role may not take the shard lock the function takes (it does
// not own the tables), or its sessions are not READ COMMITTED, where the function's check
// of the shard's placement, after that lock, could read a snapshot from before a move
// switched it, and purge the old placement's rows. Then the statement form does it all,
// and the reserves' delegation stays on.
std::optional<std::vector<std::uint16_t>> PostgresStore::citus_old_shards(
    Stmt statement, std::int64_t older_than_us) {
  if (!shard_path_usable()) return std::nullopt;
  return run<RunMode::read>(
      nullptr, ErrorContext{}, [&](Tx& tx) -> std::optional<std::vector<std::uint16_t>> {
        if (!tx.exec(Stmt::citus_purge_delegable)[0][0].as<bool>()) return std::nullopt;
        HashRanges ranges;
        for (const auto& row : tx.exec(Stmt::citus_shard_ranges)) {
          ranges.emplace_back(row[0].as<std::int32_t>(), row[1].as<std::int32_t>());
        }
        const std::vector<std::uint16_t> index = shard_of_each_key(ranges);
        std::vector<std::uint16_t> out;
        std::vector<bool> seen(ranges.size());  // the shards of `out`
        bool all = false;
        const auto add = [&](std::uint16_t key) {
          const std::uint16_t shard = index[key];
          if (shard == no_shard) {
            all = true;  // the map changed since: every shard
          } else if (!seen[shard]) {
            seen[shard] = true;
            out.push_back(key);
          }
        };
        const pqxx::result next = tx.exec(
            statement == Stmt::purge_keys ? Stmt::purge_key_shards : Stmt::purge_reservation_shards,
            older_than_us, purge_cursor_start);
        for (const auto& row : next) add(row[0].as<std::uint16_t>());
        if (all || next.size() >= static_cast<std::size_t>(purge_read_citus)) {
          for (const std::uint16_t key : one_key_per_shard(index, ranges.size())) add(key);
        }
        return out;
      });
}

PurgeStep PostgresStore::purge_step(Tx& tx, Stmt statement, std::int64_t older_than_us,
                                    std::uint64_t n, std::int64_t cursor) {
  if (statements_->citus()) return purge_step_citus(tx, statement, older_than_us, n, cursor);
  const pqxx::result r = tx.exec(statement, older_than_us, static_cast<std::int64_t>(n), cursor);
  return PurgeStep{r[0][0].as<std::uint64_t>(), r[0][1].as<std::uint64_t>(),
                   r[0][2].as<std::int64_t>()};
}

namespace {

// The shard keys `keys` by the Citus shard that holds them: a statement that names only
// one group's shard keys runs on that one shard.
std::map<std::int64_t, std::vector<std::int64_t>> citus_groups(Tx& tx,
                                                               const std::set<std::int64_t>& keys) {
  std::map<std::int64_t, std::vector<std::int64_t>> groups;
  if (keys.empty()) return groups;
  const std::vector<std::int64_t> list(keys.begin(), keys.end());
  for (const auto& row : tx.exec(Stmt::citus_shard_groups, int_array(list))) {
    groups[row[1].as<std::int64_t>()].push_back(row[0].as<std::int64_t>());
  }
  return groups;
}

}  // namespace

PurgeStep PostgresStore::purge_step_citus(Tx& tx, Stmt statement, std::int64_t older_than_us,
                                          std::uint64_t n, std::int64_t cursor) {
  const bool keys = statement == Stmt::purge_keys;
  PurgeStep out;
  out.cursor = cursor;
  const auto done = [&] { return keys ? out.keys : out.reservations; };
  while (done() < n) {
    // The next old entries in time order, from every shard: their shard keys, and the
    // time of the last one, up to which each of those shards is purged now.
    const pqxx::result next = tx.exec(
        keys ? Stmt::purge_key_shards : Stmt::purge_reservation_shards, older_than_us, out.cursor);
    if (next.empty()) break;
    const std::int64_t upto = next[next.size() - 1][1].as<std::int64_t>();
    std::set<std::int64_t> shard_keys;
    for (const auto& row : next) shard_keys.insert(row[0].as<std::int64_t>());
    const std::uint64_t before = done();
    for (const auto& [shard, group] : citus_groups(tx, shard_keys)) {
      if (done() >= n) break;
      if (keys) {
        purge_keys_on(tx, shard, group, older_than_us, n - done(), out.cursor, upto, out);
      } else {
        purge_reservations_on(tx, group, older_than_us, n - done(), out.cursor, upto, out);
      }
    }
    if (done() >= n) break;  // the next step starts at this cursor again
    if (next.size() < static_cast<std::size_t>(purge_read_citus)) break;  // nothing more
    // What could go up to `upto` went, but entries of that very time on shard keys not
    // read (a batch writes many rows at one time) may remain: read from `upto` again
    // while that frees something, past it once nothing more goes (what stays is held up,
    // as the plain statements skip it).
    out.cursor = done() > before ? upto : upto + 1;
  }
  return out;
}

void PostgresStore::purge_keys_on(Tx& tx, std::int64_t shard,
                                  const std::vector<std::int64_t>& group,
                                  std::int64_t older_than_us, std::uint64_t n, std::int64_t from,
                                  std::int64_t upto, PurgeStep& out) {
  const std::set<std::int64_t> here(group.begin(), group.end());
  std::vector<std::string> doomed;
  // The reservations to delete, by the Citus shard that holds them, with their shard keys.
  std::map<std::int64_t, std::pair<std::vector<Uuid>, std::set<std::int64_t>>> gone;
  const pqxx::result picked = tx.exec(Stmt::purge_keys_lock, older_than_us,
                                      static_cast<std::int64_t>(n), from, upto, int_array(group));
  for (const auto& row : picked) {
    const std::vector<Uuid> ids = parse_ids(row[1].as<std::string>());
    // An order's reservations in other shards than its key's: the statement did not see
    // them, so the key stays while one of them is held or changed since the horizon.
    std::set<std::int64_t> elsewhere;
    for (const Uuid& id : ids) {
      if (here.count(id.shard_key()) == 0) elsewhere.insert(id.shard_key());
    }
    const auto other_groups = citus_groups(tx, elsewhere);
    bool kept = false;
    for (const auto& [other, keys] : other_groups) {
      std::vector<Uuid> there;
      for (const Uuid& id : ids) {
        if (std::find(keys.begin(), keys.end(), id.shard_key()) != keys.end()) there.push_back(id);
      }
      if (tx.exec(Stmt::purge_blockers, older_than_us, uuid_array(there), int_array(keys))[0][0]
              .as<std::int64_t>() > 0) {
        kept = true;
        break;
      }
    }
    if (kept) continue;
    doomed.push_back(row[0].as<std::string>());
    for (const Uuid& id : ids) {
      std::int64_t where = shard;
      for (const auto& [other, keys] : other_groups) {
        if (std::find(keys.begin(), keys.end(), id.shard_key()) != keys.end()) where = other;
      }
      gone[where].first.push_back(id);
      gone[where].second.insert(id.shard_key());
    }
  }
  if (doomed.empty()) return;
  tx.exec(Stmt::purge_keys_delete, text_array(doomed), int_array(group));
  out.keys += doomed.size();
  for (const auto& [where, entry] : gone) {
    const std::vector<std::int64_t> keys(entry.second.begin(), entry.second.end());
    out.reservations +=
        tx.exec(Stmt::purge_reservations_delete, uuid_array(entry.first), int_array(keys)).size();
  }
}

void PostgresStore::purge_reservations_on(Tx& tx, const std::vector<std::int64_t>& group,
                                          std::int64_t older_than_us, std::uint64_t n,
                                          std::int64_t from, std::int64_t upto, PurgeStep& out) {
  std::vector<Uuid> doomed;
  std::vector<std::pair<Uuid, std::string>> keyed;  // a key that may be in another group
  const pqxx::result picked = tx.exec(Stmt::purge_reservations_lock, older_than_us,
                                      static_cast<std::int64_t>(n), from, upto, int_array(group));
  for (const auto& row : picked) {
    const Uuid id = Uuid::parse(row[0].c_str());
    std::string key = row[1].as<std::string>();
    if (key.empty()) {
      doomed.push_back(id);
    } else {
      keyed.emplace_back(id, std::move(key));
    }
  }
  if (!keyed.empty()) {
    // A reservation whose key lives on: a replay of that key reads it, so it stays.
    std::vector<std::string> names;
    for (const auto& entry : keyed) names.push_back(entry.second);
    std::vector<std::string> present;
    for (const auto& row : tx.exec(Stmt::purge_keys_present, text_array(names))) {
      present.push_back(row[0].as<std::string>());
    }
    std::sort(present.begin(), present.end());
    for (const auto& [id, key] : keyed) {
      if (!std::binary_search(present.begin(), present.end(), key)) doomed.push_back(id);
    }
  }
  if (doomed.empty()) return;
  out.reservations +=
      tx.exec(Stmt::purge_reservations_delete, uuid_array(doomed), int_array(group)).size();
}

PurgeCounts PostgresStore::purge(std::int64_t older_than_us, std::uint64_t limit) {
  const auto delete_some = [&](Stmt statement, std::uint64_t n, std::int64_t cursor) {
    return run<RunMode::one_statement>(nullptr, ErrorContext{}, [&](Tx& tx) {
      return purge_step(tx, statement, older_than_us, n, cursor);
    });
  };
  PurgeCounts out = statements_->citus() ? purge_citus(older_than_us, limit)
                                         : purge_with(limit, delete_some, nullptr);
  if (out.keys + out.reservations < limit) {
    out.transfers = purge_transfers(older_than_us, limit - out.keys - out.reservations);
  }
  return out;
}

std::uint64_t PostgresStore::purge_transfers(std::int64_t older_than_us, std::uint64_t limit) {
  const auto n = static_cast<std::int64_t>(std::min<std::uint64_t>(limit, options_.purge_batch));
  return run(nullptr, ErrorContext{}, [&](Tx& tx) -> std::uint64_t {
    std::vector<std::string> ids;
    for (const auto& row : tx.exec(Stmt::transfers_finished, older_than_us, n)) {
      ids.push_back(row[0].as<std::string>());
    }
    if (ids.empty()) return 0;
    return static_cast<std::uint64_t>(
        rows_changed(tx.exec(Stmt::transfers_purge, text_array(ids))));
  });
}

}  // namespace stockade::detail::pg
