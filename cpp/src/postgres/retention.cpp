// PostgresStore retention: purge(), which the sweeper also runs when retention is set.
//
// Plain batched deletes, oldest first, through the two indexes of migration 002: each
// statement deletes at most purge_batch keys (with their reservations) or reservations
// and commits by itself, so a purge never holds many locks or one long transaction, and
// it never touches a stock row. A cursor carries each phase past what it deleted. (Time partitions
// that are dropped whole were measured against this; see benchmarks/retention.py and
// docs/design.md for why the deletes were kept.)
//
// On the Citus layout each step reads the next old entries in time order from every
// shard, then purges their shards' entries up to the last one's time, in statements that
// each run on one shard (purge_step_citus): Citus plans neither CTE of the plain
// statements, and an order's reservations may lie on other shards than its key, which
// those statements would not see.
#include <algorithm>
#include <map>
#include <set>

#include "postgres/postgres_store_impl.hpp"

namespace stockade::detail::pg {

PurgeCounts PostgresStore::purge_with(std::uint64_t limit, const PurgeStatement& delete_some,
                                      const std::function<bool()>& stop) {
  PurgeCounts out;
  std::uint64_t taken = 0;  // keys, and reservations without a key: what `limit` bounds
  for (Stmt statement : {Stmt::purge_keys, Stmt::purge_reservations}) {
    std::int64_t cursor = purge_cursor_start;
    for (;;) {
      const std::uint64_t room = limit - taken;
      if (room == 0 || (stop && stop())) return out;
      const std::uint64_t want = std::min<std::uint64_t>(room, options_.purge_batch);
      const PurgeStep step = delete_some(statement, want, cursor);
      const PurgeCounts got{step.reservations, step.keys};
      out.keys += got.keys;
      out.reservations += got.reservations;
      telemetry().purged(got);
      const std::uint64_t examined = statement == Stmt::purge_keys ? got.keys : got.reservations;
      taken += examined;
      cursor = step.cursor;
      if (examined < want) break;  // nothing more is old enough (or all of it is locked)
    }
  }
  return out;
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
    const auto step = [&](Tx& tx) { return purge_step(tx, statement, older_than_us, n, cursor); };
    // On Citus a step is a transaction of several statements.
    if (statements_->citus()) return run(nullptr, ErrorContext{}, step);
    return run<RunMode::one_statement>(nullptr, ErrorContext{}, step);
  };
  PurgeCounts out = purge_with(limit, delete_some, nullptr);
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
        tx.exec(Stmt::transfers_purge, text_array(ids)).affected_rows());
  });
}

}  // namespace stockade::detail::pg
