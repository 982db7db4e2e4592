#include "postgres/statements.hpp"

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include "stockade/hash.hpp"
#include "stockade/postgres_store.hpp"

namespace stockade::detail::pg {

using sql::open_row;
using sql::room;
using sql::row_key;

namespace {

// A stock row as level_from reads it: the counts, then what check_writable needs.
std::string stock_columns() {
  return "on_hand, reserved, version, " + epoch_us("updated_at") +
         ", backorder_limit, discontinued_at IS NOT NULL, lease_token,"
         " coalesce(lease_expires_at > now(), false),"
         " CASE WHEN lease_expires_at > now() THEN " +
         epoch_us("lease_expires_at") + " ELSE 0 END, low_stock, coalesce(slots, 0), " +
         sql::states;
}

// The same with an optional fencing token in parameter $n (-1: none): a token must be the
// row's latest lease's, live or lapsed.
std::string open_row_for(int n) {
  const std::string p = "$" + std::to_string(n) + "::bigint";
  return "discontinued_at IS NULL AND CASE WHEN " + p +
         " < 0 THEN (lease_expires_at IS NULL OR lease_expires_at <= now()) ELSE lease_token = " +
         p + " END";
}

// `write` (an INSERT or UPDATE of stock, without RETURNING) returning the columns of
// stock_columns(). They are computed over a CTE, not in RETURNING: lease liveness compares
// with now(), and Citus refuses non-immutable functions in RETURNING.
std::string returning_stock(const std::string& write) {
  return "WITH w AS (" + write + " RETURNING *) SELECT " + stock_columns() + " FROM w";
}

// `ANY(ARRAY(SELECT column FROM cte))`: the rows a CTE picked, for a write that finds them
// by primary key. Written as a join (`USING cte WHERE key = cte.key`), a generic plan
// estimates the CTE's `LIMIT $n` at a tenth of its input and may hash-join it against a
// sequential scan of the whole table; an array of keys is always looked up by index.
std::string ids_of(const std::string& column, const std::string& cte) {
  return "ANY(ARRAY(SELECT " + column + " FROM " + cte + "))";
}

std::string ttl_from_now(int param) {
  return "now() + $" + std::to_string(param) + "::bigint * interval '1 microsecond'";
}

// The highest $n in `sql`.
int last_parameter(const std::string& sql) {
  int last = 0;
  for (std::size_t i = 0; i < sql.size(); ++i) {
    if (sql[i] != '$') continue;
    int n = 0;
    std::size_t j = i + 1;
    while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9') n = n * 10 + (sql[j++] - '0');
    if (j > i + 1 && n > last) last = n;
  }
  return last;
}

// The sweeper's write of a due hold (settle_units' rule in SQL): the whole remainder
// expires, and the state says how the hold ended. A hold has no expired unit before
// (reservation_units), so the new `expired` is the units to give back, which RETURNING
// reads as `units`.
std::string expire_remainder() {
  return " r SET state = CASE WHEN r.confirmed > 0 THEN 'confirmed' ELSE 'expired' END,"
         " expired = r.qty - r.confirmed - r.released, version = r.version + 1,"
         " updated_at = now()";
}

}  // namespace

std::string epoch_us(const std::string& column) {
  return "(extract(epoch FROM " + column + ") * 1000000)::bigint";
}

std::string reservation_columns() {
  return "id::text, sku, location, qty, state, version, " + epoch_us("expires_at") + ", " +
         epoch_us("created_at") + ", " + epoch_us("updated_at") +
         ", idempotency_key, expires_at <= now(), buyer, limit_group, slot, confirmed, released,"
         " expired, returned, order_id::text, ref, metadata::text";
}

std::string new_reservation(const std::string& table, bool buyer, bool order) {
  return table +
         " (id, sku, location, slot, qty, state, version, expires_at, idempotency_key,"
         " created_at, updated_at" +
         (buyer ? ", buyer, limit_group" : "") + (order ? ", order_id, ref, metadata" : "") +
         "@SKC)";
}

std::string stock_columns_sql() {
  return stock_columns();
}

std::string render_shard_markers(const std::string& sql, bool citus, bool* pinned) {
  const std::string k = "$" + std::to_string(last_parameter(sql) + 1) + "::int";
  std::string out;
  out.reserve(sql.size() + 64);
  bool any = false;
  for (std::size_t i = 0; i < sql.size();) {
    if (sql[i] != '@') {
      out += sql[i++];
      continue;
    }
    const std::string rest = sql.substr(i + 1, 3);
    if (rest == "PIN") {
      std::size_t end = i + 4;
      std::string alias;
      const std::size_t close = end < sql.size() && sql[end] == '(' ? sql.find(')', end) : end;
      if (close != end && close != std::string::npos) {
        alias = sql.substr(end + 1, close - end - 1) + ".";
        end = close + 1;
      }
      if (citus) out += " AND " + alias + "shard_key = " + k;
      i = end;
    } else if (rest == "SKC") {
      if (citus) out += ", shard_key";
      i += 4;
    } else if (rest == "SKV") {
      if (citus) out += ", " + k;
      i += 4;
    } else if (rest == "SKF") {
      if (citus) out += "shard_key, ";
      i += 4;
    } else {
      out += sql[i++];
      continue;
    }
    any = true;
  }
  if (pinned != nullptr) *pinned = citus && any;
  return out;
}

std::string render_slot_marker(const std::string& sql) {
  const std::string mark = "@SLOT";
  if (sql.find(mark) == std::string::npos) return sql;
  const std::string param = "$" + std::to_string(last_parameter(sql) + 1);
  std::string out = sql;
  for (std::size_t at = out.find(mark); at != std::string::npos; at = out.find(mark, at)) {
    out.replace(at, mark.size(), param);
  }
  return out;
}

Statements::Statements(const std::string& schema, bool citus, std::string schema_version)
    : citus_(citus), schema_(schema), schema_version_(std::move(schema_version)) {
  auto set = [&](Stmt s, const std::string& sql) {
    const auto i = static_cast<std::size_t>(s);
    bool pinned = false;
    sql_[i] = render_shard_markers(render_slot_marker(sql), citus, &pinned);
    pinned_[i] = pinned;
  };
  add_stock_statements(schema, set);
  add_lease_statements(schema, set);
  add_reservation_statements(schema, set);
  add_order_statements(schema, set);
  add_retention_statements(schema, set);
  add_count_statements(schema, set);
  add_key_statements(schema, set);
  add_batch_statements(schema, set);
  add_batch_fast_statements(schema, set);
  add_batch_fast_one_statements(schema, set);
  add_batch_fast_limited_statement(schema, set);
  add_batch_fast_steps_statement(schema, set);
  add_expiry_statements(schema, set);
  add_citus_statements(schema, set);
  add_delegated_statements(schema, set);
  add_record_statements(schema, citus, set);
  add_transfer_statements(schema, set);
  for (std::size_t i = 0; i < stmt_count; ++i) parameters_[i] = last_parameter(sql_[i]);
  if (!citus) name_routines();  // see routines()
}

// The sweeper's statements on Citus (expire_pick serves the plain layout).
template <class Set>
void Statements::add_expiry_statements(const std::string& schema, Set& set) {
  // Citus: the shard keys that have due holds, so that the sweeper expires them shard by
  // shard (Citus refuses FOR UPDATE across shards). A read without locks, across shards.
  // (Its LIMIT is a constant: Citus cannot plan a parameter there across shards.)
  set(Stmt::due_shards, "SELECT DISTINCT shard_key FROM " + schema +
                            ".reservation WHERE state = 'held' AND expires_at <= now() LIMIT 256");
  // Then each shard's pick in two statements: Citus could not plan expire_pick's CTE
  // with parameters from libpq ("could not create distributed plan").
  set(Stmt::expire_lock, "SELECT id::text FROM " + schema +
                             ".reservation WHERE state = 'held' AND expires_at <= now()@PIN"
                             " ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED");
  set(Stmt::expire_set,
      "UPDATE " + schema + ".reservation" + expire_remainder() +
          " WHERE r.id = ANY($1::uuid[])@PIN(r) AND r.state = 'held' RETURNING r.sku,"
          " r.location, r.expired AS units, coalesce(r.limit_group, ''), coalesce(r.buyer, ''),"
          " r.slot");
}

// The statements of the Citus layout alone: retention by shard group, and stats()' counts.
template <class Set>
void Statements::add_citus_statements(const std::string& schema, Set& set) {
  // Retention on Citus, which plans neither purge_keys' nor purge_reservations' CTEs, and
  // where an order's reservations may lie on other shards than its key. Each step first
  // reads the next old entries in time order from every shard (a read without locks; $1
  // the horizon's age and $2 the cursor, as in purge_keys), for their shard keys and the
  // time of the last one; groups those shard keys by the Citus shard that holds them
  // (citus_shard_groups); then purges each group's entries up to that time, in statements
  // that name the group's shard keys ($5: a statement whose shard keys all lie in one
  // shard runs on that shard alone; $3 the cursor, $4 that time). Only the Citus layout
  // runs these (their shard keys are arrays, not @PIN markers).
  const std::string old_horizon = "now() - $1::bigint * interval '1 microsecond'";
  const auto at_us = [](const std::string& param) {
    return "'epoch'::timestamptz + " + param + "::bigint * interval '1 microsecond'";
  };
  set(Stmt::purge_key_shards, "SELECT shard_key, " + epoch_us("created_at") + " FROM " + schema +
                                  ".idempotency WHERE created_at < " + old_horizon +
                                  " AND created_at >= " + at_us("$2") + " ORDER BY created_at" +
                                  " LIMIT " + std::to_string(purge_read_citus));
  set(Stmt::purge_reservation_shards,
      "SELECT shard_key, " + epoch_us("updated_at") + " FROM " + schema +
          ".reservation WHERE state <> 'held' AND updated_at < " + old_horizon +
          " AND updated_at >= " + at_us("$2") + " ORDER BY updated_at LIMIT " +
          std::to_string(purge_read_citus));
  // The Citus shard of each shard key $1 (co-located tables share their shards' ranges).
  set(Stmt::citus_shard_groups, "SELECT k, get_shard_id_for_distribution_column('" + schema +
                                    ".idempotency', k) FROM unnest($1::int[]) AS k");
  // A group's old keys ($2 at most) whose reservations in the group are all terminal and
  // old, locked as purge_keys locks them; their reservation ids, for the caller to check
  // those in other groups (purge_blockers) and to delete them all.
  set(Stmt::purge_keys_lock,
      "SELECT i.key, array_to_string(i.reservation_ids, ',') FROM " + schema +
          ".idempotency i WHERE i.shard_key = ANY($5::int[]) AND i.created_at < " + old_horizon +
          " AND i.created_at >= " + at_us("$3") + " AND i.created_at <= " + at_us("$4") +
          " AND NOT EXISTS (SELECT 1 FROM " + schema +
          ".reservation r WHERE r.id = ANY(i.reservation_ids) AND r.shard_key = ANY($5::int[])"
          " AND (r.state = 'held' OR r.updated_at >= " +
          old_horizon + ")) ORDER BY i.created_at LIMIT $2 FOR UPDATE OF i SKIP LOCKED");
  // How many of the reservations $2 (in the group $3) still keep their key: held, or
  // changed since the horizon. Locked (FOR SHARE) so that they stay so until the purge
  // commits.
  set(Stmt::purge_blockers,
      "SELECT count(*) FROM (SELECT 1 FROM " + schema +
          ".reservation WHERE id = ANY($2::uuid[]) AND shard_key = ANY($3::int[]) AND"
          " (state = 'held' OR updated_at >= " +
          old_horizon + ") FOR SHARE) AS b");
  set(Stmt::purge_keys_delete, "DELETE FROM " + schema +
                                   ".idempotency WHERE key = ANY($1::text[])"
                                   " AND shard_key = ANY($2::int[])");
  // A group's old terminal reservations ($2 at most) without a key in the group: their ids
  // and keys ('' for none); a key may still be in another group (purge_keys_present).
  set(Stmt::purge_reservations_lock,
      "SELECT r.id::text, coalesce(r.idempotency_key, '') FROM " + schema +
          ".reservation r WHERE r.shard_key = ANY($5::int[]) AND r.state <> 'held' AND"
          " r.updated_at < " +
          old_horizon + " AND r.updated_at >= " + at_us("$3") + " AND r.updated_at <= " +
          at_us("$4") + " AND (r.idempotency_key IS NULL OR NOT EXISTS (SELECT 1 FROM " + schema +
          ".idempotency i WHERE i.key = r.idempotency_key AND i.shard_key = ANY($5::int[])))"
          " ORDER BY r.updated_at LIMIT $2 FOR UPDATE OF r SKIP LOCKED");
  // Which of the keys $1 exist in any shard (a read of every shard).
  set(Stmt::purge_keys_present,
      "SELECT key FROM " + schema + ".idempotency WHERE key = ANY($1::text[])");
  set(Stmt::purge_reservations_delete,
      "DELETE FROM " + schema +
          ".reservation WHERE id = ANY($1::uuid[]) AND shard_key = ANY($2::int[])"
          " AND state <> 'held' RETURNING 1");
}

// The statement routines (see routines()): the statements whose kind is `routine`, each
// named after its statement and a hash of its SQL and of the schema version.
void Statements::name_routines() {
#define STOCKADE_STMT_ROUTINE(name, kind) \
  if (std::string_view(#kind) == "routine") routines_.push_back(Stmt::name);
  STOCKADE_STATEMENTS(STOCKADE_STMT_ROUTINE)
#undef STOCKADE_STMT_ROUTINE
  for (Stmt r : routines_) {
    const auto i = static_cast<std::size_t>(r);
    routine_[i] = true;
    char hash[17];
    std::snprintf(
        hash, sizeof(hash), "%016llx",
        static_cast<unsigned long long>(stable_hash64({"routine", schema_version_, sql_[i]})));
    routine_names_[i] = std::string(name(r)) + "_" + hash;
    heads_[i] = "SELECT * FROM " + schema_ + "." + routine_names_[i] + "(";
    std::string call = heads_[i];
    for (int n = 1; n <= parameters_[i]; ++n) call += (n > 1 ? ", $" : "$") + std::to_string(n);
    calls_[i] = call + ")";
  }
}

// Stock rows: reads, locks, and the writes of each kind.
template <class Set>
void Statements::add_stock_statements(const std::string& schema, Set& set) {
  const std::string stock = schema + ".stock";
  const std::string key = row_key;
  const std::string stock_get = "SELECT " + stock_columns() + " FROM " + stock + key;

  set(Stmt::stock_get, stock_get);
  set(Stmt::stock_lock, stock_get + " FOR UPDATE");
  // A SKU's own row and its hot-row slots' rows, in one snapshot (with their slot
  // numbers); its slots share its shard key.
  set(Stmt::sku_rows, "SELECT " + stock_columns() + ", slot FROM " + stock +
                          " WHERE sku = $1 AND location = $2@PIN");
  set(Stmt::stock_lock_nowait, stock_get + " FOR UPDATE NOWAIT");
  set(Stmt::stock_lock_skip, stock_get + " FOR UPDATE SKIP LOCKED");
  set(Stmt::stock_insert, returning_stock("INSERT INTO " + stock +
                                          " (sku, location, slot, on_hand, reserved, version,"
                                          " updated_at@SKC) VALUES ($1, $2, @SLOT, $3, 0, 1,"
                                          " now()@SKV) ON CONFLICT (@SKFsku, location, slot)"
                                          " DO NOTHING"));
  set(Stmt::stock_set_on_hand,
      returning_stock("UPDATE " + stock +
                      " SET on_hand = $3, version = version + 1, updated_at = now()" + key));
  // reshape's write of a SKU's own row when it sets how many of the SKU's rows are active.
  set(Stmt::stock_set_slots,
      returning_stock("UPDATE " + stock +
                      " SET on_hand = $3, slots = $4::smallint, version = version + 1,"
                      " updated_at = now()" +
                      key));
  // The one conditional write: moves on_hand and reserved by deltas only while at least
  // $5 units stay available, the row is open to the writer (not discontinued; no lease
  // live, or $7 is its fencing token) and (if $6 >= 0) the version is $6. Every strategy
  // but optimistic writes through it, so even a mix of strategies on one row cannot lose
  // an update or oversell.
  set(Stmt::stock_delta,
      returning_stock("UPDATE " + stock +
                      " SET on_hand = on_hand - $3, reserved = reserved + $4,"
                      " version = version + 1, updated_at = now()" +
                      key + " AND " + room + " >= $5 AND ($6 < 0 OR version = $6) AND " +
                      open_row_for(7)));
  // Settles holds that exist (confirm, release, expiry): units they already hold, so no
  // room check, and allowed on a discontinued or leased row.
  set(Stmt::stock_settle, "UPDATE " + stock +
                              " SET on_hand = on_hand - $3, reserved = reserved - $4,"
                              " version = version + 1, updated_at = now()" +
                              key + " RETURNING version");
  set(Stmt::stock_set_backorder_limit,
      returning_stock("UPDATE " + stock +
                      " SET backorder_limit = $3, version = version + 1, updated_at = now()" +
                      key));
  set(Stmt::stock_set_safety_stock,
      returning_stock("UPDATE " + stock +
                      " SET safety_stock = $3, version = version + 1, updated_at = now()" + key));
  // move_units' write, decided on the row as locked (plan_move): absolute values.
  set(Stmt::stock_set_units,
      returning_stock("UPDATE " + stock +
                      " SET on_hand = $3, damaged = $4, quality_control = $5,"
                      " version = version + 1, updated_at = now()" +
                      key));
  set(Stmt::stock_set_discontinued,
      returning_stock("UPDATE " + stock +
                      " SET discontinued_at = CASE WHEN $3 THEN now() ELSE NULL END,"
                      " version = version + 1, updated_at = now()" +
                      key));
}

// Leases, the optimistic compare-and-set, the canary's overwrite, and the atomic hold that
// writes a row and its reservation in one statement.
template <class Set>
void Statements::add_lease_statements(const std::string& schema, Set& set) {
  const std::string stock = schema + ".stock";
  const std::string reservation = schema + ".reservation";
  const std::string key = row_key;
  // Leases: a new token ($5) from the sequence, drawn by lease_next_token in the same
  // transaction (Citus refuses a volatile function in an UPDATE of a distributed table);
  // expiry on the database clock ($4 microseconds). Timestamps leave through a CTE:
  // Citus refuses non-immutable functions in RETURNING.
  set(Stmt::lease_next_token, "SELECT nextval('" + schema + ".lease_token')");
  set(Stmt::lease_acquire, "WITH w AS (UPDATE " + stock +
                               " SET lease_token = $5, lease_owner = $3,"
                               " lease_expires_at = now() + $4::bigint * interval '1 microsecond',"
                               " version = version + 1, updated_at = now()" +
                               key +
                               " RETURNING lease_token, lease_expires_at) SELECT lease_token, " +
                               epoch_us("lease_expires_at") + " FROM w");
  set(Stmt::lease_renew,
      "WITH w AS (UPDATE " + stock +
          " SET lease_expires_at = now() + $4::bigint * interval '1 microsecond',"
          " version = version + 1, updated_at = now()" +
          key +
          " AND lease_token = $3 AND lease_expires_at > now() RETURNING lease_owner,"
          " lease_expires_at) SELECT coalesce(lease_owner, ''), " +
          epoch_us("lease_expires_at") + " FROM w");
  set(Stmt::lease_release,
      "UPDATE " + stock +
          " SET lease_owner = NULL, lease_expires_at = NULL, version = version + 1,"
          " updated_at = now()" +
          key + " AND lease_token = $3 AND lease_expires_at > now() RETURNING 1");
  // Optimistic: absolute values computed from a read, written only if the version is
  // still the one read.
  set(Stmt::stock_cas, returning_stock("UPDATE " + stock +
                                       " SET on_hand = $3, reserved = $4, version = version + 1,"
                                       " updated_at = now()" +
                                       key + " AND version = $5"));
  // The naive canary's lost update: an absolute value from a stale read, unconditionally.
  set(Stmt::stock_overwrite_reserved,
      "UPDATE " + stock + " SET reserved = $3, version = version + 1, updated_at = now()" + key);
  // atomic reserve in one statement: the conditional UPDATE and the reservation row.
  set(Stmt::hold_atomic,
      "WITH held AS (UPDATE " + stock +
          " SET reserved = reserved + $3, version = version + 1, updated_at = now()" + key +
          " AND " + room + " >= $3 AND ($4 < 0 OR version = $4) AND " + open_row +
          " RETURNING sku, location, slot, version)"
          " INSERT INTO " +
          new_reservation(reservation, false) +
          " SELECT $5::uuid, sku, location, slot, $3, 'held', 1, " + ttl_from_now(6) +
          ", NULLIF($7, ''), now(), now()@SKV FROM held RETURNING " + epoch_us("expires_at") +
          ", " + epoch_us("created_at") + ", (SELECT version FROM held)");
}

// Reservations and the sweeper's pick.
template <class Set>
void Statements::add_reservation_statements(const std::string& schema, Set& set) {
  const std::string reservation = schema + ".reservation";
  set(Stmt::reservation_insert,
      "WITH w AS (INSERT INTO " + new_reservation(reservation, true, true) +
          " VALUES ($1::uuid, $2, $3, @SLOT, $4, 'held', 1, " + ttl_from_now(5) +
          ", NULLIF($6, ''), now(), now(), NULLIF($7, ''), NULLIF($8, ''),"
          " NULLIF($9, '')::uuid, NULLIF($10, ''), NULLIF($11, '')::jsonb@SKV)"
          " RETURNING expires_at, created_at) SELECT " +
          epoch_us("expires_at") + ", " + epoch_us("created_at") + " FROM w");
  const std::string reservation_get =
      "SELECT " + reservation_columns() + " FROM " + reservation + " WHERE id = $1::uuid@PIN";
  set(Stmt::reservation_get, reservation_get);
  set(Stmt::reservation_lock, reservation_get + " FOR UPDATE");
  set(Stmt::reservation_set,
      "WITH w AS (UPDATE " + reservation +
          " SET state = $2, version = version + 1, updated_at = now(), expires_at = CASE WHEN"
          " $3::bigint > 0 THEN " +
          ttl_from_now(3) +
          " ELSE expires_at END, confirmed = $4, released = $5, expired = $6"
          " WHERE id = $1::uuid@PIN RETURNING *) SELECT " +
          reservation_columns() + " FROM w");
  set(Stmt::reservation_resize, "WITH w AS (UPDATE " + reservation +
                                    " SET qty = $2, released = $3, version = version + 1,"
                                    " updated_at = now() WHERE id = $1::uuid@PIN RETURNING *)"
                                    " SELECT " +
                                    reservation_columns() + " FROM w");
  set(Stmt::reservation_return, "WITH w AS (UPDATE " + reservation +
                                    " SET returned = $2, version = version + 1, updated_at ="
                                    " now() WHERE id = $1::uuid@PIN RETURNING *) SELECT " +
                                    reservation_columns() + " FROM w");
  set(Stmt::reservation_get_many, "SELECT " + reservation_columns() + " FROM " + reservation +
                                      " WHERE id = ANY($1::uuid[])@PIN");
  // The sweeper's pick: due holds in expiry order, skipping rows a transition has locked,
  // expired in place (the UPDATE checks `held` again on the version it writes: a verdict
  // read in a locking CTE is not what PostgreSQL rechecks, see batch_fast); the units to return
  // come back per row, sorted for lock order. The update finds the picked rows by id through an
  // array (ids_of), so that its generic plan looks each one up by primary key whatever the table's
  // size (docs/design.md, "Plans").
  set(Stmt::expire_pick,
      "WITH due AS (SELECT id FROM " + reservation +
          " WHERE state = 'held' AND expires_at <= now()@PIN ORDER BY expires_at LIMIT $1"
          " FOR UPDATE SKIP LOCKED),"
          " done AS (UPDATE " +
          reservation + expire_remainder() + " WHERE r.id = " + ids_of("id", "due") +
          "@PIN(r) AND r.state = 'held' RETURNING r.sku, r.location, r.slot, r.expired AS units,"
          " r.limit_group, r.buyer) SELECT sku, location, sum(units)::bigint, count(*),"
          " coalesce(limit_group, ''),"
          " coalesce(buyer, ''), slot FROM done GROUP BY sku, location, slot, limit_group, buyer"
          " ORDER BY sku COLLATE \"C\", location COLLATE \"C\", slot");
}

// Orders and references (migration 012): an order's lines, the reservations a key made,
// and reservations() by ref, order or buyer.
template <class Set>
void Statements::add_order_statements(const std::string& schema, Set& set) {
  const std::string reservation = schema + ".reservation";
  // An order's lines (the reservation_order index of migration 012). On the Citus layout
  // they may lie on several shards: the read goes to all of them, and a step then locks
  // each line on its own (Citus refuses FOR UPDATE across shards); on one server a step
  // locks them all here, in id order as a batch does.
  const std::string order_lines =
      "SELECT " + reservation_columns() + " FROM " + reservation + " WHERE order_id = $1::uuid";
  set(Stmt::order_lines, order_lines);
  set(Stmt::order_lock, order_lines + " ORDER BY id FOR UPDATE");
  // allocate's pool (one server): the own rows of $1[i] at $2[i] that exist, locked in the
  // key order of every other lock (bytewise: COLLATE "C", as SkuKey's operator<).
  const std::string pool_lock = "SELECT " + stock_columns() + ", sku, location FROM " + schema +
                                ".stock WHERE (sku, location) IN (SELECT * FROM unnest($1::text[],"
                                " $2::text[])) AND slot = 0 ORDER BY sku COLLATE \"C\", location"
                                " COLLATE \"C\" FOR UPDATE";
  set(Stmt::pool_lock, pool_lock);
  // stock_by_location's page: a SKU's own rows past $2 (bytewise), at most $3.
  set(Stmt::sku_locations, "SELECT location FROM " + schema +
                               ".stock WHERE sku = $1 AND slot = 0 AND location COLLATE \"C\" >"
                               " $2 COLLATE \"C\" ORDER BY location COLLATE \"C\" LIMIT $3");
  set(Stmt::pool_lock_nowait, pool_lock + " NOWAIT");
  // reservations(): by ref, by order or by buyer (each through its index of migration
  // 012), narrowed by the other fields given ('' for one not given), in id order after a
  // cursor. $1 ref, $2 order id, $3 buyer, $4 sku, $5 location, $6 state, $7 after, $8
  // limit.
  const std::string narrowed =
      " AND (NULLIF($1, '') IS NULL OR ref = $1) AND (NULLIF($2, '') IS NULL OR order_id ="
      " NULLIF($2, '')::uuid) AND (NULLIF($3, '') IS NULL OR buyer = $3) AND (NULLIF($4, '')"
      " IS NULL OR sku = $4) AND (NULLIF($5, '') IS NULL OR location = $5) AND (NULLIF($6,"
      " '') IS NULL OR state = $6) AND (NULLIF($7, '') IS NULL OR id > NULLIF($7, '')::uuid)"
      " ORDER BY id LIMIT $8";
  const std::string found = "SELECT " + reservation_columns() + " FROM " + reservation;
  set(Stmt::find_by_ref, found + " WHERE ref = $1" + narrowed);
  set(Stmt::find_by_order, found + " WHERE order_id = NULLIF($2, '')::uuid" + narrowed);
  set(Stmt::find_by_buyer, found + " WHERE buyer = $3" + narrowed);
  // The reservations a reserve_order's key made, by the key alone (order_by_key): on the
  // Citus layout the key lies on the shard of the order's first line, unknown here, so the
  // read goes to every shard.
  set(Stmt::order_key_get, "SELECT array_to_string(reservation_ids, ',') FROM " + schema +
                               ".idempotency WHERE key = $1 AND (request_fingerprint LIKE 'o%'"
                               " OR request_fingerprint LIKE 'a%')");
}

// Retention on one server (the Citus layout has its own, add_citus_statements) and the
// counts of stats().
template <class Set>
void Statements::add_retention_statements(const std::string& schema, Set& set) {
  const std::string reservation = schema + ".reservation";
  // Retention, oldest first through the indexes of migration 002. $1: the horizon's age
  // in microseconds on the database clock; $2: at most this many keys (or reservations);
  // $3: a cursor (epoch microseconds) below which this purge already looked, so that a
  // long purge does not walk the entries it deleted again. Each returns the keys and
  // the reservations it deleted, and the new cursor. SKIP LOCKED: it never waits for a
  // key, so a replay that holds its key (FOR KEY SHARE) keeps it and its reservations.
  // A key goes with its reservations, once every one of them is terminal and last changed
  // before the horizon; then reservations without a key (a keyed one whose key is gone
  // too). So a replay never finds its reservations missing.
  const std::string horizon = "now() - $1::bigint * interval '1 microsecond'";
  const std::string cursor = "'epoch'::timestamptz + $3::bigint * interval '1 microsecond'";
  set(Stmt::purge_keys,
      "WITH doomed AS (SELECT i.key, i.reservation_ids, i.created_at FROM " + schema +
          ".idempotency i WHERE i.created_at < " + horizon + " AND i.created_at >= " + cursor +
          "@PIN(i) AND NOT EXISTS (SELECT 1 FROM " + reservation +
          " r WHERE r.id = ANY(i.reservation_ids)@PIN(r) AND (r.state = 'held' "
          "OR r.updated_at >= " +
          horizon +
          ")) ORDER BY i.created_at LIMIT $2 FOR UPDATE SKIP LOCKED),"
          " keys AS (DELETE FROM " +
          schema + ".idempotency i WHERE i.key = " + ids_of("key", "doomed") +
          "@PIN(i) RETURNING 1),"
          " gone AS (DELETE FROM " +
          reservation + " r WHERE r.id = " + ids_of("unnest(reservation_ids)", "doomed") +
          "@PIN(r) RETURNING 1)"
          " SELECT (SELECT count(*) FROM keys), (SELECT count(*) FROM gone),"
          " coalesce((SELECT max(" +
          epoch_us("created_at") + ") FROM doomed), $3::bigint)");
  set(Stmt::purge_reservations,
      "WITH doomed AS (SELECT r.id, r.updated_at FROM " + reservation +
          " r WHERE r.state <> 'held' AND r.updated_at < " + horizon + " AND r.updated_at >= " +
          cursor + "@PIN(r) AND (r.idempotency_key IS NULL OR NOT EXISTS (SELECT 1 FROM " + schema +
          ".idempotency i WHERE i.key = r.idempotency_key@PIN(i)))"
          " ORDER BY r.updated_at LIMIT $2 FOR UPDATE SKIP LOCKED),"
          " gone AS (DELETE FROM " +
          reservation + " r WHERE r.id = " + ids_of("id", "doomed") +
          "@PIN(r) RETURNING 1)"
          " SELECT 0::bigint, (SELECT count(*) FROM gone), coalesce((SELECT max(" +
          epoch_us("updated_at") + ") FROM doomed), $3::bigint)");
}

// stats()' counts: O(1), whatever the tables' size.
template <class Set>
void Statements::add_count_statements(const std::string& schema, Set& set) {
  const std::string reservation = schema + ".reservation";
  // stats(): live-tuple figures of the statistics collector (O(1), refreshed within about
  // a second of each commit), and holds counted through their partial index up to $1. In
  // the index's order: a generic plan, which cannot see $1, would otherwise scan the table
  // until it met $1 holds, all of it when holds are few.
  const std::string holds = "(SELECT count(*) FROM (SELECT 1 FROM " + reservation +
                            " WHERE state = 'held' ORDER BY expires_at LIMIT $1) AS h)";
  if (!citus_) {
    const auto live = [&](const std::string& table) {  // n_live_tup, without the view's joins
      return "coalesce(pg_stat_get_live_tuples(to_regclass('" + schema + "." + table +
             "')::oid), 0)";
    };
    set(Stmt::counts_estimate,
        "SELECT " + live("stock") + ", " + live("reservation") + ", " + holds);
  } else {
    // stats() on Citus: the coordinator's statistics see none of the workers' rows, so the
    // live-tuple figures of every shard are summed, one command per shard, run in parallel
    // (a worker flushes its figures within about ten seconds of a commit). Holds are
    // counted as on one server.
    const auto live = [&](const std::string& table) {
      return "(SELECT coalesce(sum(result::bigint), 0) FROM run_command_on_shards('" + schema +
             "." + table +
             "', $$SELECT n_live_tup FROM pg_stat_user_tables WHERE relid = '%s'::regclass$$)"
             " WHERE success)";
    };
    set(Stmt::counts_estimate,
        "SELECT " + live("stock") + ", " + live("reservation") + ", " + holds);
  }
}

// Idempotency keys and advisory locks.
template <class Set>
void Statements::add_key_statements(const std::string& schema, Set& set) {
  set(Stmt::idempotency_claim, "INSERT INTO " + schema +
                                   ".idempotency (key, request_fingerprint, reservation_ids,"
                                   " created_at@SKC) VALUES ($1, $2, $3::uuid[], now()@SKV)"
                                   " ON CONFLICT (@SKFkey) DO NOTHING RETURNING 1");
  // A replay reads its key FOR KEY SHARE, so that a purge (FOR UPDATE SKIP LOCKED) passes
  // the key by, and with it its reservations, until the replay has read them.
  set(Stmt::idempotency_get,
      "SELECT request_fingerprint, array_to_string(reservation_ids, ','), outcome"
      " FROM " +
          schema + ".idempotency WHERE key = $1@PIN FOR KEY SHARE");
  // A write other than a reserve keeps its outcome with its key (store/keyed.hpp).
  set(Stmt::idempotency_outcome_set,
      "UPDATE " + schema + ".idempotency SET outcome = $2 WHERE key = $1@PIN");
  set(Stmt::idempotency_unclaim, "DELETE FROM " + schema + ".idempotency WHERE key = $1@PIN");
  // An allocation's key, claimed with an id for every row of its pool, keeps those it made.
  set(Stmt::idempotency_ids_set,
      "UPDATE " + schema + ".idempotency SET reservation_ids = $2::uuid[] WHERE key = $1@PIN");
  add_limit_statements(schema, set);
  set(Stmt::advisory_lock, "SELECT pg_advisory_xact_lock($1::bigint)");
  set(Stmt::advisory_try_lock, "SELECT pg_try_advisory_xact_lock($1::bigint)");
}

// Purchase limits (migration 004): the groups, and the parent row per (group, buyer).
template <class Set>
void Statements::add_limit_statements(const std::string& schema, Set& set) {
  const std::string allowance = schema + ".buyer_allowance";
  set(Stmt::limit_lookup, "SELECT s.sku, s.group_name, l.per_buyer FROM " + schema +
                              ".purchase_limit_sku s JOIN " + schema +
                              ".purchase_limit l ON l.group_name = s.group_name"
                              " WHERE s.sku = ANY($1::text[])");
  // Takes $3 units of (group $1, buyer $2) if that keeps it within $4, locking its row
  // (made at $3 if it is new, which the caller does only when $3 <= $4); no row back means
  // the limit would be passed. (VALUES, not a SELECT: Citus runs an INSERT ... SELECT
  // through an intermediate result, whose ON CONFLICT on the worker lacks the parameters.)
  set(Stmt::allowance_take,
      "INSERT INTO " + allowance +
          " AS a (group_name, buyer, held@SKC) VALUES ($1::text, $2::text, $3::bigint@SKV)"
          " ON CONFLICT (@SKFgroup_name, buyer) DO UPDATE"
          " SET held = a.held + EXCLUDED.held WHERE a.held + EXCLUDED.held <= $4::bigint"
          " RETURNING held");
  set(Stmt::allowance_get,
      "SELECT held FROM " + allowance + " WHERE group_name = $1::text AND buyer = $2::text@PIN");
  // Gives $3 units back; never below zero (a group removed and made again starts afresh).
  set(Stmt::allowance_give, "UPDATE " + allowance +
                                " SET held = held - least(held, $3::bigint)"
                                " WHERE group_name = $1::text AND buyer = $2::text@PIN");
  set(Stmt::limit_upsert,
      "INSERT INTO " + schema +
          ".purchase_limit (group_name, per_buyer) VALUES ($1::text, $2::bigint)"
          " ON CONFLICT (group_name) DO UPDATE SET per_buyer = EXCLUDED.per_buyer");
  // The group's SKUs become $2: those it no longer names go, the new ones join. A SKU of
  // another group is left alone and missing from the rows returned.
  set(Stmt::limit_skus_set,
      "WITH gone AS (DELETE FROM " + schema +
          ".purchase_limit_sku WHERE group_name = $1::text AND NOT (sku = ANY($2::text[])))"
          " INSERT INTO " +
          schema +
          ".purchase_limit_sku AS s (sku, group_name) SELECT unnest($2::text[]), $1::text"
          " ON CONFLICT (sku) DO UPDATE SET group_name = EXCLUDED.group_name"
          " WHERE s.group_name = EXCLUDED.group_name RETURNING sku");
  set(Stmt::limit_sku_owner, "SELECT sku, group_name FROM " + schema +
                                 ".purchase_limit_sku WHERE sku = ANY($2::text[])"
                                 " AND group_name <> $1::text LIMIT 1");
  set(Stmt::limit_delete, "WITH counts AS (DELETE FROM " + allowance +
                              " WHERE group_name = $1::text) DELETE FROM " + schema +
                              ".purchase_limit WHERE group_name = $1::text RETURNING 1");
  // Batches: make the rows of new (group, buyer) pairs, then lock them all, sorted; then
  // write each pair's net change.
  const std::string pairs = " unnest($1::text[], $2::text[]) AS t(g, b)";
  set(Stmt::batch_allowance_make, "INSERT INTO " + allowance +
                                      " (group_name, buyer, held@SKC) SELECT g, b, 0@SKV FROM" +
                                      pairs +
                                      " ORDER BY g COLLATE \"C\", b COLLATE \"C\" ON CONFLICT "
                                      "(@SKFgroup_name, buyer) DO NOTHING");
  // One pair's row, made if new, for Citus (an INSERT ... SELECT there runs through an
  // intermediate result, which makes the transaction two-phase even on one worker).
  set(Stmt::allowance_make_one, "INSERT INTO " + allowance +
                                    " (group_name, buyer, held@SKC) VALUES ($1::text, $2::text,"
                                    " 0@SKV) ON CONFLICT (@SKFgroup_name, buyer) DO NOTHING");
  set(Stmt::batch_allowance_lock,
      "SELECT a.group_name, a.buyer, a.held FROM " + allowance + " a JOIN" + pairs +
          " ON a.group_name = t.g AND a.buyer = t.b@PIN(a)"
          " ORDER BY a.group_name COLLATE \"C\", a.buyer COLLATE \"C\" FOR UPDATE OF a");
  set(Stmt::batch_allowance_write,
      "UPDATE " + allowance +
          " AS a SET held = greatest(a.held + d.delta, 0) FROM unnest($1::text[], $2::text[],"
          " $3::bigint[]) AS d(g, b, delta) WHERE a.group_name = d.g AND a.buyer = d.b@PIN(a)");
}

const char* Statements::name(Stmt s) {
  static const std::array<const char*, stmt_count> names = {
#define STOCKADE_STMT_NAME(name, kind) "stockade_" #name,
      STOCKADE_STATEMENTS(STOCKADE_STMT_NAME)
#undef STOCKADE_STMT_NAME
  };
  return names[static_cast<std::size_t>(s)];
}

bool Statements::citus_only(Stmt s) {
  static const std::array<bool, stmt_count> citus = {
#define STOCKADE_STMT_CITUS(name, kind) std::string_view(#kind) == "citus",
      STOCKADE_STATEMENTS(STOCKADE_STMT_CITUS)
#undef STOCKADE_STMT_CITUS
  };
  return citus[static_cast<std::size_t>(s)];
}

}  // namespace stockade::detail::pg

namespace stockade {

std::vector<PreparedStatementText> prepared_statements(const std::string& schema) {
  using detail::pg::Statements;
  using detail::pg::Stmt;
  const Statements statements(schema);
  std::vector<PreparedStatementText> out;
  for (std::size_t i = 0; i < detail::pg::stmt_count; ++i) {
    const auto s = static_cast<Stmt>(i);
    if (Statements::citus_only(s)) continue;
    out.push_back({Statements::name(s), statements.sql(s), statements.parameters(s),
                   statements.has_routine(s)});
  }
  return out;
}

}  // namespace stockade
