// The Citus layout's delegated calls (add_delegated_statements), and the SQL a batch sends
// there on a schema without citus/113's calls (or where the shard tables' path is not
// usable), since it cannot be a prepared statement: multi-row INSERT ... VALUES of new
// reservations and of their idempotency keys, with every value quoted into the text (see
// citus_move_one in statements.cpp). Citus routes such an INSERT to the one shard its
// shard key names; an INSERT ... SELECT of many rows would go through COPY and make the
// transaction two-phase.
#include <algorithm>
#include <string>
#include <vector>

#include "postgres/statements.hpp"

namespace stockade::detail::pg {

namespace {

// The full path's writes as delegated calls inside its transaction (migration citus/113,
// force_delegation): its new reservations ($1 the batch's now, $2..$13 their columns, ''
// for NULL), its keys ($1..$4, $5: pass over a key stored already, else fail with 23505;
// returns the keys written) and its keys' outcomes ($1, $2; returns how many it wrote).
// The shard key comes last, as in every call here.
void add_batch_write_statements(const std::string& schema, const StatementSink& set) {
  set(Stmt::citus_batch_holds,
      "SELECT * FROM " + schema +
          ".batch_holds($1, $2::uuid[], $3::text[], $4::text[], $5::bigint[], $6::bigint[],"
          " $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[],"
          " $13::text[]@SKV)");
  set(Stmt::citus_batch_keys, "SELECT * FROM " + schema +
                                  ".batch_keys($1::text[], $2::text[], $3::text[], $4::text[],"
                                  " $5::boolean@SKV)");
  set(Stmt::citus_batch_outcomes,
      "SELECT * FROM " + schema + ".batch_key_outcomes($1::text[], $2::text[]@SKV)");
  // Whether the schema has them (citus/113); else the full path sends literal SQL.
  set(Stmt::citus_batch_delegable, "SELECT to_regprocedure('" + schema +
                                       ".batch_key_outcomes(text[], text[], integer)')"
                                       " IS NOT NULL");
}

}  // namespace

void add_delegated_statements(const std::string& schema, const StatementSink& set) {
  // An atomic reserve as one call that Citus delegates to the worker holding the row
  // (migration citus/105): the row ($1, $2, its slot $3), the units ($4), the expected
  // version ($5, -1: none), the new id ($6) and TTL ($7), the transaction's lock_timeout
  // ($8, as set_config takes it), and the idempotency key ($9, '': none) with its
  // request's fingerprint ($10). Its row: hold_atomic's columns, then what became of the
  // call ('made', 'replay': the key is there already, or 'refused').
  const std::string args =
      "($1, $2, $3::smallint, $4, $5, $6::uuid, $7, $8, NULLIF($9, ''), $10@SKV)";
  set(Stmt::citus_reserve_one, "SELECT * FROM " + schema + ".reserve_one" + args);
  // The same sent straight to a worker (citus_routing='direct', migration citus/106); its
  // row adds the group of the node it ran on, which tells a stale route (routes.hpp).
  set(Stmt::citus_reserve_routed, "SELECT * FROM " + schema + ".reserve_routed" + args);
  // The one-row fast batch as one call (migration citus/107, BatchTx::write_one_delegated):
  // the row ($1..$3), the batch's sums ($4 sold, $5 held, $6 changes), its reservations
  // ($7..$13, '' for NULL), its keys ($14..$16) and lock_timeout ($17). Its row:
  // citus_move_one's columns, then the group of the node it ran on.
  set(Stmt::citus_batch_one,
      "SELECT * FROM " + schema +
          ".batch_one($1, $2, $3::smallint, $4, $5, $6, $7::uuid[], $8::bigint[], $9::bigint[],"
          " $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[],"
          " $16::text[], $17@SKV)");
  // An atomic sell as one call that Citus delegates to the worker holding the row
  // (migration citus/111): the row ($1..$3), the units ($4), the expected version ($5, -1:
  // none), the fencing token ($6, -1: none) and lock_timeout ($7). Its row: level_from's
  // columns, then the group of the node it ran on; no row: refused, nothing changed.
  set(Stmt::citus_sell_one,
      "SELECT * FROM " + schema + ".sell_one($1, $2, $3::smallint, $4, $5, $6, $7@SKV)");
  // A step of a held reservation as one delegated call (migration citus/111), decided by
  // the engine: the reservation ($1) as read at version $2, its new state ($3) and units
  // ($4 confirmed, $5 released, $6 expired), a new TTL ($7, 0: none), its stock row
  // ($8..$10) and what that row moves by ($11 sold, $12 settled), the journal's note ($13,
  // '': none) and lock_timeout ($14). Its row: the reservation's new version, update time
  // and expiry, the row's new version (NULL: none moved), the group of the node it ran on;
  // no row: the reservation moved on, or the node does not hold the shard.
  set(Stmt::citus_step_one, "SELECT * FROM " + schema +
                                ".step_one($1::uuid, $2, $3, $4, $5, $6, $7, $8, $9,"
                                " $10::smallint, $11, $12, $13, $14@SKV)");
  // Retention's delegated step on one Citus shard (migration citus/108): the keys phase
  // ($1, else the reservations phase), the horizon's age ($2), at most $3 entries from the
  // cursor $4, and a shard key of the shard. Its row: keys and reservations deleted, the
  // next cursor, whether the shard was where the call ran, that node's group, and
  // whether the shard holds old entries the call leaves to the statement form.
  set(Stmt::citus_purge_shard,
      "SELECT * FROM " + schema + ".purge_shard($1::boolean, $2, $3, $4@SKV)");
  // Whether the schema has purge_shard (migration citus/108); whether this role may take
  // the shard lock it takes is citus_shard_path_usable's to say.
  set(Stmt::citus_purge_delegable, "SELECT to_regprocedure('" + schema +
                                       ".purge_shard(boolean, bigint, bigint, bigint, integer)')"
                                       " IS NOT NULL");
  add_batch_write_statements(schema, set);
  // Whether this role's sessions can take shard_tables' path (citus/109) and purge_shard's
  // (citus/108): the role owns the tables (Citus lets only the owner take the shard lock)
  // and its transactions are READ COMMITTED. shard_tables' own conditions, read once by a
  // store.
  set(Stmt::citus_shard_path_usable,
      "SELECT pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = '" + schema +
          ".stock'::regclass), 'USAGE') AND current_setting('transaction_isolation') ="
          " 'read committed'");
  // The hash range of each Citus shard of the co-located tables (purge_citus calls the
  // delegated purge once per shard).
  set(Stmt::citus_shard_ranges,
      "SELECT shardminvalue::int, shardmaxvalue::int FROM"
      " pg_dist_shard WHERE logicalrelid = '" +
          schema + ".stock'::regclass ORDER BY 1");
}

// Empty strings stand for NULL, as in the prepared statements' NULLIF. The times are the
// batch's `now_us` (from the statement that locked or moved its row): a now() in the INSERT
// would be the worker's, which Citus began later than the coordinator's.
std::string citus_holds_sql(const Quote& quote, const std::string& schema, std::uint16_t shard,
                            std::int64_t now_us, const CitusHolds& h) {
  const auto text_or_null = [&](const std::string& v) { return v.empty() ? "NULL" : quote(v); };
  const auto at = [](const std::vector<std::string>& values, std::size_t i) {
    return values.empty() ? std::string() : values[i];
  };
  const std::string now =
      "('epoch'::timestamptz + " + std::to_string(now_us) + " * interval '1 microsecond')";
  std::string sql =
      "INSERT INTO " +
      render_shard_markers(new_reservation(schema + ".reservation", true, true), true, nullptr) +
      " VALUES ";
  for (std::size_t i = 0; i < h.ids.size(); ++i) {
    sql += (i == 0 ? "(" : ", (") + quote(h.ids[i]) + "::uuid, " + quote(h.skus[i]) + ", " +
           quote(h.locations[i]) + ", " + std::to_string(h.slots[i]) + ", " +
           std::to_string(h.qtys[i]) + ", 'held', 1, " + now + " + " + std::to_string(h.ttls[i]) +
           " * interval '1 microsecond', " + text_or_null(h.keys[i]) + ", " + now + ", " + now +
           ", " + text_or_null(at(h.buyers, i)) + ", " + text_or_null(at(h.groups, i)) + ", " +
           text_or_null(at(h.orders, i)) + "::uuid, " + text_or_null(at(h.refs, i)) + ", " +
           text_or_null(at(h.metadata, i)) + "::jsonb, " + std::to_string(shard) + ")";
  }
  return sql;
}

// Keys go in sorted bytewise, as batch_claim claims them.
std::string citus_keys_sql(const Quote& quote, const std::string& schema, std::uint16_t shard,
                           const std::vector<std::string>& names,
                           const std::vector<std::string>& prints,
                           const std::vector<std::string>& ids, bool skip_taken,
                           const std::vector<std::string>& outcomes) {
  std::vector<std::size_t> order(names.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return names[a] < names[b];  // std::string compares bytewise, as COLLATE "C"
  });
  std::string sql = "INSERT INTO " + schema +
                    ".idempotency (key, request_fingerprint, reservation_ids, outcome,"
                    " created_at, shard_key) VALUES ";
  for (std::size_t n = 0; n < order.size(); ++n) {
    const std::size_t i = order[n];
    const std::string outcome = outcomes.empty() ? std::string() : outcomes[i];
    sql += (n == 0 ? "(" : ", (") + quote(names[i]) + ", " + quote(prints[i]) + ", " +
           (ids[i].empty() ? std::string("'{}'::uuid[]") : "ARRAY[" + quote(ids[i]) + "::uuid]") +
           ", " + (outcome.empty() ? std::string("NULL") : quote(outcome)) + ", now(), " +
           std::to_string(shard) + ")";
  }
  if (skip_taken) sql += " ON CONFLICT (shard_key, key) DO NOTHING RETURNING key";
  return sql;
}

// batch_key_outcomes on Citus, whose 13.2 worker crashed (signal 11) running that prepared
// UPDATE with its array subscript: each key's outcome spelled out in a CASE.
std::string citus_key_outcomes_sql(const Quote& quote, const std::string& schema,
                                   std::uint16_t shard, const std::vector<std::string>& names,
                                   const std::vector<std::string>& outcomes) {
  std::string cases, keys;
  for (std::size_t i = 0; i < names.size(); ++i) {
    cases += " WHEN " + quote(names[i]) + " THEN " + quote(outcomes[i]);
    keys += (i == 0 ? "" : ", ") + quote(names[i]);
  }
  return "UPDATE " + schema + ".idempotency SET outcome = CASE key" + cases +
         " END WHERE shard_key = " + std::to_string(shard) + " AND key IN (" + keys + ")";
}

}  // namespace stockade::detail::pg
