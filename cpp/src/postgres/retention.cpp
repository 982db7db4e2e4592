// PostgresStore retention: purge(), which the sweeper also runs when retention is set.
//
// Plain batched deletes, oldest first, through the two indexes of migration 002: each
// statement deletes at most purge_batch keys (with their reservations) or reservations
// and commits by itself, so a purge never holds many locks or one long transaction, and
// it never touches a stock row. A cursor carries each phase past what it deleted. (Time partitions
// that are dropped whole were measured against this; see benchmarks/retention.py and
// docs/design.md for why the deletes were kept.)
//
// On the Citus layout each step walks the shard keys that have old entries, in order, and
// purges each shard's in statements pinned to it (purge_step_citus): Citus plans neither
// CTE of the plain statements, and an order's reservations may lie on other shards than
// its key, which those statements would not see.
#include <algorithm>
#include <map>

#include "postgres_store_impl.hpp"

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
  if (statements_->citus()) return purge_step_citus(tx, statement, older_than_us, n);
  const pqxx::result r = tx.exec(statement, older_than_us, static_cast<std::int64_t>(n), cursor);
  return PurgeStep{r[0][0].as<std::uint64_t>(), r[0][1].as<std::uint64_t>(),
                   r[0][2].as<std::int64_t>()};
}

PurgeStep PostgresStore::purge_step_citus(Tx& tx, Stmt statement, std::int64_t older_than_us,
                                          std::uint64_t n) {
  const bool keys = statement == Stmt::purge_keys;
  PurgeStep out;
  out.cursor = purge_cursor_start;  // each step walks the shards from the first
  const auto done = [&] { return (keys ? out.keys : out.reservations) >= n; };
  int after = -1;  // the last shard key walked
  for (;;) {
    const pqxx::result shards = tx.exec(
        keys ? Stmt::purge_key_shards : Stmt::purge_reservation_shards, older_than_us, after);
    for (const auto& row : shards) {
      if (done()) return out;
      after = row[0].as<int>();
      const auto shard = static_cast<std::uint16_t>(after);
      if (keys) {
        purge_keys_on(tx, shard, older_than_us, n - out.keys, out);
      } else {
        purge_reservations_on(tx, shard, older_than_us, n - out.reservations, out);
      }
    }
    if (shards.size() < 256 || done()) return out;
  }
}

void PostgresStore::purge_keys_on(Tx& tx, std::uint16_t shard, std::int64_t older_than_us,
                                  std::uint64_t n, PurgeStep& out) {
  std::vector<std::string> doomed;
  std::map<std::uint16_t, std::vector<Uuid>> ids;  // their reservations, by shard key
  const pqxx::result picked =
      tx.exec_on(shard, Stmt::purge_keys_lock, older_than_us, static_cast<std::int64_t>(n));
  for (const auto& row : picked) {
    const std::vector<Uuid> own = parse_ids(row[1].as<std::string>());
    // An order's reservations on other shards than its key's: this shard's statement did
    // not see them, so the key stays while one of them is held or changed since.
    std::map<std::uint16_t, std::vector<Uuid>> elsewhere;
    for (const Uuid& id : own) {
      if (id.shard_key() != shard) elsewhere[id.shard_key()].push_back(id);
    }
    bool kept = false;
    for (const auto& [other, list] : elsewhere) {
      if (tx.exec_on(other, Stmt::purge_blockers, older_than_us, uuid_array(list))[0][0]
              .as<std::int64_t>() > 0) {
        kept = true;
        break;
      }
    }
    if (kept) continue;
    doomed.push_back(row[0].as<std::string>());
    for (const Uuid& id : own) ids[id.shard_key()].push_back(id);
  }
  if (doomed.empty()) return;
  tx.exec_on(shard, Stmt::purge_keys_delete, text_array(doomed));
  out.keys += doomed.size();
  for (const auto& [where, list] : ids) {
    out.reservations += tx.exec_on(where, Stmt::purge_reservations_delete, uuid_array(list)).size();
  }
}

void PostgresStore::purge_reservations_on(Tx& tx, std::uint16_t shard, std::int64_t older_than_us,
                                          std::uint64_t n, PurgeStep& out) {
  std::vector<Uuid> doomed;
  std::vector<std::pair<Uuid, std::string>> keyed;  // a key that may be on another shard
  const pqxx::result picked =
      tx.exec_on(shard, Stmt::purge_reservations_lock, older_than_us, static_cast<std::int64_t>(n));
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
  out.reservations += tx.exec_on(shard, Stmt::purge_reservations_delete, uuid_array(doomed)).size();
}

PurgeCounts PostgresStore::purge(std::int64_t older_than_us, std::uint64_t limit) {
  const auto delete_some = [&](Stmt statement, std::uint64_t n, std::int64_t cursor) {
    return run<RunMode::one_statement>(nullptr, ErrorContext{}, [&](Tx& tx) {
      return purge_step(tx, statement, older_than_us, n, cursor);
    });
  };
  return purge_with(limit, delete_some, nullptr);
}

}  // namespace stockade::detail::pg
