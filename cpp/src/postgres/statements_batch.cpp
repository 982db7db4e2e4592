// The hot-row batcher's statements (statements.hpp): the full path's, which take arrays (one
// element per request or per row) and run once per batch whatever its size, and the fast
// paths' one statement each.
#include <string>

#include "postgres/statements.hpp"
#include "store/keyed.hpp"

namespace stockade::detail::pg {

using sql::open_row;
using sql::room;
using sql::row_key;

namespace {

// The INSERT of a batch's reservations (batch_write, batch_fast), one element per reservation
// in each array: ids $6, rows $7 $8 $16, qtys $9, ttls $10, keys $11, buyers $13, groups
// $14, refs $17, metadata $18 and order ids $19 ('' for none in the text arrays).
std::string batch_holds(const std::string& schema) {
  return " INSERT INTO " + new_reservation(schema + ".reservation", true, true) +
         " SELECT i::uuid, k, l, rs, q, 'held', 1, now() + t * interval '1 microsecond',"
         " NULLIF(ik, ''), now(), now(), NULLIF(rb, ''), NULLIF(rg, ''), NULLIF(od, '')::uuid,"
         " NULLIF(rf, ''), NULLIF(md, '')::jsonb@SKV FROM unnest($6::text[], $7::text[],"
         " $8::text[], $9::bigint[], $10::bigint[], $11::text[], $13::text[], $14::text[],"
         " $16::int[], $17::text[], $18::text[], $19::text[])"
         " AS r(i, k, l, q, t, ik, rb, rg, rs, rf, md, od)";
}

// The quantity states (sql::states) as columns of `alias` ("" for none).
std::string states_of(const std::string& alias) {
  const std::string a = alias.empty() ? "" : alias + ".";
  return a + "safety_stock, " + a + "damaged, " + a + "quality_control, " + a + "incoming";
}

// A batch's key row's reservation ids, from the text of one id ('' for a sell's key: none).
std::string key_ids(const std::string& id) {
  return "CASE WHEN " + id + " = '' THEN '{}'::uuid[] ELSE ARRAY[" + id + "::uuid] END";
}

// The pieces of the one-row batch statements (add_batch_fast_one_statements): the guarded
// UPDATE of the row ($1..$5), its RETURNING, the reservations' INSERT ($6..$9), and the
// answer read from the moved row.
struct OneRowPieces {
  std::string moved, moved_end, made, answer;
};

// The guard of the row's UPDATE in every one-row statement but the one with steps: room for
// the batch's sold and held units, and the row open.
std::string one_row_guard() {
  return std::string(room) + " >= $3::bigint + $4::bigint AND " + open_row;
}

OneRowPieces one_row_pieces(const std::string& schema, const std::string& guard = one_row_guard()) {
  OneRowPieces p;
  p.moved = " moved AS (UPDATE " + schema +
            ".stock SET on_hand = on_hand - $3::bigint, reserved = reserved + $4::bigint,"
            " version = version + $5::bigint, updated_at = now()" +
            row_key + " AND " + guard;
  p.moved_end = " RETURNING sku, location, on_hand, reserved, version, backorder_limit, " +
                states_of("") + "),";
  p.made = " made AS (INSERT INTO " + new_reservation(schema + ".reservation", false) +
           " SELECT i::uuid, $1, $2, @SLOT, q,"
           " 'held', 1,"
           " now() + t * interval '1 microsecond', NULLIF(ik, ''), now(), now()@SKV"
           " FROM unnest($6::text[], $7::bigint[], $8::bigint[], $9::text[]) AS r(i, q, t, ik)"
           " WHERE EXISTS (SELECT 1 FROM moved))";
  p.answer = " SELECT sku, location, on_hand, reserved, version, " + epoch_us("now()") +
             ", backorder_limit, " + states_of("") + " FROM moved";
  return p;
}

}  // namespace

// The hot-row batcher's statements: each takes arrays (one element per request or per
// row) and runs once per batch, whatever its size.
void add_batch_statements(const std::string& schema, const StatementSink& set) {
  const std::string idempotency = schema + ".idempotency";
  // Claims new keys in sorted order (so two batches cannot deadlock on them); a key that
  // another transaction holds is waited for, and comes back missing if it committed.
  // A reserve's key names its reservation ($3); a sell's names none ('') and gets its
  // outcome once the batch decided it (batch_key_outcomes).
  set(Stmt::batch_claim,
      "INSERT INTO " + idempotency +
          " (key, request_fingerprint, reservation_ids, created_at@SKC)"
          " SELECT k, f, " +
          key_ids("i") +
          ", now()@SKV FROM unnest($1::text[], $2::text[], $3::text[])"
          " AS t(k, f, i) ORDER BY k COLLATE \"C\" ON CONFLICT (@SKFkey) DO NOTHING RETURNING key");
  set(Stmt::batch_keys_get,
      "SELECT key, request_fingerprint, array_to_string(reservation_ids, ','), outcome FROM " +
          idempotency + " WHERE key = ANY($1::text[])@PIN FOR KEY SHARE");
  set(Stmt::batch_key_outcomes, "UPDATE " + idempotency +
                                    " SET outcome = ($2::text[])[array_position($1::text[], key)]"
                                    " WHERE key = ANY($1::text[])@PIN");
  // Locks the touched rows in sorted key order, and reads the transaction's now(), each
  // row's backorder limit, and whether it is discontinued or leased.
  set(Stmt::batch_lock,
      "SELECT s.sku, s.location, s.on_hand, s.reserved, s.version, " + epoch_us("now()") +
          ", s.backorder_limit, " + states_of("s") +
          ", s.discontinued_at IS NOT NULL,"
          " coalesce(s.lease_expires_at > now(), false), s.slot FROM " +
          schema +
          ".stock s JOIN unnest($1::text[], $2::text[], $3::int[]) AS k(sku, location, slot)"
          " ON s.sku = k.sku AND s.location = k.location AND s.slot = k.slot@PIN(s)"
          " ORDER BY s.sku COLLATE \"C\", s.location COLLATE \"C\", s.slot FOR UPDATE OF s");
  // One statement writes the summed deltas of every row and inserts every reservation.
  set(Stmt::batch_write,
      "WITH moved AS (UPDATE " + schema +
          ".stock AS s SET on_hand = s.on_hand - d.sold, reserved = s.reserved + d.held,"
          " version = s.version + d.changes, updated_at = now()"
          " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[],"
          " $15::int[]) AS d(sku, location, sold, held, changes, slot)"
          " WHERE s.sku = d.sku AND s.location = d.location AND s.slot = d.slot@PIN(s)"
          " RETURNING 1)" +
          batch_holds(schema) + " WHERE (SELECT count(*) FROM moved) = $12");
  set(Stmt::batch_unclaim, "DELETE FROM " + idempotency + " WHERE key = ANY($1::text[])@PIN");
  // batch_write's deltas on Citus, as a statement of their own (see citus_move_one).
  set(Stmt::citus_move, "UPDATE " + schema +
                            ".stock AS s SET on_hand = s.on_hand - d.sold, reserved = s.reserved +"
                            " d.held, version = s.version + d.changes, updated_at = now()"
                            " FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[],"
                            " $5::bigint[], $6::int[]) AS d(sku, location, sold, held, changes,"
                            " slot) WHERE s.sku = d.sku AND s.location = d.location"
                            " AND s.slot = d.slot@PIN(s)");
  // Confirms and releases: their reservation rows, locked in id order before any stock row
  // (the order a per-request transition keeps), and their new units, states and versions
  // (as the batch decided them on the locked rows), written at once.
  set(Stmt::batch_lock_reservations, "SELECT " + reservation_columns() + " FROM " + schema +
                                         ".reservation WHERE id = ANY($1::uuid[])@PIN"
                                         " ORDER BY id FOR UPDATE");
  set(Stmt::batch_transition,
      "UPDATE " + schema +
          ".reservation AS r SET state = u.state, confirmed = u.confirmed,"
          " released = u.released, expired = u.expired, version = u.version,"
          " updated_at = now() FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::bigint[],"
          " $5::bigint[], $6::bigint[]) AS u(id, state, confirmed, released, expired, version)"
          " WHERE r.id = u.id@PIN(r)");
}

// The batch fast paths: one statement in autocommit each.
void add_batch_fast_statements(const std::string& schema, const StatementSink& set) {
  // The fast path, one statement in autocommit: if every touched row exists and has room
  // for all of its requests, lock the rows (sorted), write the deltas and insert every
  // reservation; otherwise change nothing and return no row. The lock CTE's verdict gates
  // the UPDATE, so every row is locked in sorted order before the UPDATE touches any.
  // The verdict does not decide the write, though: under concurrent writers to the same
  // rows it was seen to admit a row whose newest version, the one the UPDATE changes, had
  // no room (issue 45: about one contended two-row batch in thirty broke the stock CHECK).
  // So the UPDATE checks each row's room and openness itself, in its WHERE, which
  // PostgreSQL evaluates again on the version it writes; the reservations go in only if
  // every row moved; and a statement that moved some rows but not all aborts itself
  // (abort_statement, SK001), which undoes the rows it moved: the caller decides the
  // batch the long way, on rows it reads under their locks.
  set(Stmt::batch_fast,
      "WITH d AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[],"
      " $5::bigint[], $15::int[]) AS d(sku, location, sold, held, changes, slot)),"
      " locked AS (SELECT s.sku, " +
          std::string(room) +
          " >= d.sold + d.held"
          " AND s.discontinued_at IS NULL"
          " AND (s.lease_expires_at IS NULL OR s.lease_expires_at <= now()) AS fits FROM " +
          schema +
          ".stock s JOIN d ON s.sku = d.sku AND s.location = d.location AND s.slot = d.slot@PIN(s)"
          " ORDER BY s.sku COLLATE \"C\", s.location COLLATE \"C\", s.slot FOR UPDATE OF s),"
          " verdict AS (SELECT count(*) = $12 AND coalesce(bool_and(fits), false) AS all_fit"
          " FROM locked),"
          " moved AS (UPDATE " +
          schema +
          ".stock AS s SET on_hand = s.on_hand - d.sold, reserved = s.reserved + d.held,"
          " version = s.version + d.changes, updated_at = now() FROM d, verdict"
          " WHERE verdict.all_fit AND s.sku = d.sku AND s.location = d.location"
          " AND s.slot = d.slot@PIN(s) AND " +
          room + " >= d.sold + d.held AND " + open_row +
          " RETURNING s.sku, s.location, s.on_hand, s.reserved, s.version, s.backorder_limit, " +
          states_of("s") +
          ", s.slot),"
          " made AS (" +
          batch_holds(schema) +
          " WHERE (SELECT count(*) FROM moved) = $12)"
          " SELECT sku, location, on_hand, reserved, version, " +
          epoch_us("now()") + ", backorder_limit, " + states_of("") +
          ", slot FROM moved WHERE CASE WHEN (SELECT count(*) FROM moved) = $12"
          " THEN true ELSE " +
          schema + ".abort_statement() END");
}

// The fast paths for a batch on one row (the hot SKU), with keys, with buyers, and on
// Citus.
void add_batch_fast_one_statements(const std::string& schema, const StatementSink& set) {
  // The fast path for a batch on one row (the hot SKU): the guarded UPDATE takes the row
  // lock and checks the room itself, and the reservations are inserted only if it moved.
  // The keyed form ($10 keys, $11 fingerprints, $12 the ids of their reservations, '' for a
  // sell's; $13 a sell's outcome prefix, store/keyed.hpp, '' for a reserve's) moves
  // the row only if none of its keys is stored yet, then claims the keys. A replay (its
  // key committed) leaves the row unmoved and the statement returns no row: the batch
  // takes the full path, which decides replays and conflicts. So a replay is not a
  // server ERROR: a service's normal retries must not fill the server's log with 23505
  // lines. Only a key claimed by a transaction still in flight when the look ran (two
  // requests with one key at the same moment) makes the claim fail (23505), which rolls
  // the whole statement back, row and reservations included, and takes the full path
  // too. So it stays one statement in autocommit, like the keyless form. The look is a
  // second descent of the key index per key (0.33-0.40 ms per batch of 32 with it against
  // 0.30 without, measured on local disk, where the CPU sets the pace). It is a count, not
  // NOT EXISTS: an EXISTS over `key = ANY(...)` planned while the table was small (a new
  // database: each connection plans its statement once) became a sequential scan, which
  // then read every key under the row lock until the next ANALYZE (keyed batches ran at
  // 0.42x of keyless at a 2 ms flush); a count is planned on the index at any size.
  const OneRowPieces p = one_row_pieces(schema);
  const std::string& moved = p.moved;
  const std::string& moved_end = p.moved_end;
  const std::string& made = p.made;
  const std::string& answer = p.answer;
  set(Stmt::batch_fast_one, "WITH" + moved + moved_end + made + answer);
  // Citus runs a CTE that writes through another CTE's rows by sending them to every
  // worker as an intermediate result, and an INSERT ... SELECT of many rows through COPY;
  // either makes the transaction two-phase. There the row moves first ($1..$5 as above),
  // in a statement of its own; then, only if it moved, its reservations and keys go in
  // through citus/113's delegated calls, or as multi-row INSERT ... VALUES built for the
  // batch (BatchTx::write_one_citus), which Citus routes to the one shard: one worker, a
  // plain COMMIT.
  set(Stmt::citus_move_one, "WITH" + moved + moved_end.substr(0, moved_end.size() - 1) +
                                " SELECT sku, location, on_hand, reserved, version, " +
                                epoch_us("now()") + ", backorder_limit, " + states_of("") +
                                " FROM moved");
  set(Stmt::citus_keys_taken,
      "SELECT count(*) FROM " + schema + ".idempotency WHERE key = ANY($1::text[])@PIN");
  const std::string fresh_keys =
      " AND (SELECT count(*) FROM " + schema + ".idempotency WHERE key = ANY($10::text[])) = 0";
  set(Stmt::batch_fast_one_keyed,
      "WITH" + moved + fresh_keys + moved_end + made + ", claim AS (INSERT INTO " + schema +
          ".idempotency (key, request_fingerprint, reservation_ids, outcome, created_at@SKC)"
          " SELECT k, f, " +
          key_ids("i") +
          ", CASE WHEN o = '' THEN NULL ELSE o || m.tail END, now()@SKV FROM unnest($10::text[],"
          " $11::text[], $12::text[], $13::text[]) AS t(k, f, i, o), (SELECT " +
          batched_level_tail_sql({"on_hand", "reserved", "version", epoch_us("now()"),
                                  "backorder_limit", "safety_stock", "damaged", "quality_control",
                                  "incoming"}) +
          " AS tail FROM moved) m)" + answer);
}

// The one-row fast path with confirms and releases.
void add_batch_fast_steps_statement(const std::string& schema, const StatementSink& set) {
  // The one-row form with confirms and releases of holds on that row (BatchTx::read_steps):
  // the engine read the holds without locks and decided each step as the full path would
  // (store/lifecycle.hpp); the statement applies those decisions if each hold is still as
  // read ($17, its version then: held, as read_steps saw it, since every change of a
  // reservation moves its version) and not lapsed. The holds are found through the array
  // of their ids (`id = ANY`), and no condition names their state or row (a hold's row
  // never changes, and read_steps saw each on this one): with their state among the
  // conditions, a plan made on statistics with few holds read the index of held
  // reservations, and on through every hold of the table (a batch's cost grew with the
  // holds). (On a new database, before its first ANALYZE, a plan may still scan the
  // table: design.md, "Plans".) $11..$16: each changed hold's id (sorted: the plan visits
  // them in that order through the id's index, so holds are locked before the stock row,
  // in id order as a rule; a deadlock with another batch is broken by PostgreSQL and the
  // batch runs again) and its new state, units and version; $18 how many. The row moves by
  // the steps' units too ($3 sold, $4 the net change of reserved), but its room is checked
  // for the new units alone ($10, the new sales and holds: a step only frees units), first
  // on the row as read, so that a row without room changes nothing and returns no row. A hold
  // changed meanwhile, or a row that lost its room after the read, moves the row not at
  // all; if some steps were written, the statement aborts itself (SK001), which undoes
  // them. No row back, or SK001: the full path decides, under the locks.
  // Steps alone need neither room nor an open row, as on the full path (a step only frees
  // units, and may settle a hold on a discontinued or leased row); new units need both.
  const std::string guard =
      "($10::bigint = 0 OR (" + std::string(room) + " >= $10::bigint AND " + open_row + "))";
  const OneRowPieces s = one_row_pieces(schema, guard);
  set(Stmt::batch_fast_one_steps,
      "WITH steps AS (UPDATE " + schema +
          ".reservation AS r SET state = u.state, confirmed = u.confirmed,"
          " released = u.released, expired = u.expired, version = u.version,"
          " updated_at = now() FROM unnest($11::uuid[], $12::text[], $13::bigint[],"
          " $14::bigint[], $15::bigint[], $16::bigint[], $17::bigint[])"
          " AS u(id, state, confirmed, released, expired, version, was)"
          " WHERE r.id = ANY($11::uuid[]) AND r.id = u.id AND r.version = u.was"
          " AND r.expires_at > now() AND (SELECT " +
          guard + " FROM " + schema + ".stock" + row_key + ") RETURNING 1)," + s.moved +
          " AND (SELECT count(*) FROM steps) = $18" + s.moved_end + s.made +
          " SELECT m.sku, m.location, m.on_hand, m.reserved, m.version, " + epoch_us("now()") +
          ", m.backorder_limit, " + states_of("m") +
          " FROM (SELECT 1) AS one LEFT JOIN moved m ON true WHERE CASE WHEN m.sku IS NOT NULL"
          " THEN true WHEN EXISTS (SELECT 1 FROM steps) THEN " +
          schema + ".abort_statement() ELSE false END");
}

// The one-row fast path with buyers (purchase limits).
void add_batch_fast_limited_statement(const std::string& schema, const StatementSink& set) {
  const OneRowPieces p = one_row_pieces(schema);
  const std::string& moved = p.moved;
  const std::string& moved_end = p.moved_end;
  // The one-row form with buyers ($10, '' for none): in one statement, each buyer's units
  // in the SKU's purchase-limit group are taken from its parent row (locked, sorted,
  // before the stock row) if they stay within the limit; the row moves only if every
  // buyer's did; and a statement that took allowances but could not move the row aborts
  // itself (SK001), so it never leaves a count without its reservations. No row back, or
  // SK001: the caller decides the long way. The last column is the group's name.
  set(Stmt::batch_fast_one_limited,
      "WITH lim AS (SELECT l.group_name AS g, l.per_buyer AS cap FROM " + schema +
          ".purchase_limit_sku s JOIN " + schema +
          ".purchase_limit l ON l.group_name = s.group_name WHERE s.sku = $1),"
          " req AS (SELECT * FROM unnest($6::text[], $7::bigint[], $8::bigint[], $9::text[],"
          " $10::text[]) AS r(i, q, t, ik, b)),"
          " asks AS (SELECT b, sum(q)::bigint AS q FROM req WHERE b <> '' AND EXISTS"
          " (SELECT 1 FROM lim) GROUP BY b),"
          " taken AS (INSERT INTO " +
          schema +
          ".buyer_allowance AS a (group_name, buyer, held) SELECT lim.g, asks.b, asks.q"
          " FROM lim, asks WHERE asks.q <= lim.cap ORDER BY asks.b COLLATE \"C\""
          " ON CONFLICT (group_name, buyer) DO UPDATE SET held = a.held + EXCLUDED.held"
          " WHERE a.held + EXCLUDED.held <= (SELECT cap FROM lim) RETURNING 1)," +
          moved + " AND (SELECT count(*) FROM taken) = (SELECT count(*) FROM asks)" + moved_end +
          " made AS (INSERT INTO " + new_reservation(schema + ".reservation", true) +
          " SELECT i::uuid, $1,"
          " $2, @SLOT, q, 'held', 1,"
          " now() + t * interval '1 microsecond', NULLIF(ik, ''), now(), now(), NULLIF(b, ''),"
          " CASE WHEN b <> '' THEN (SELECT g FROM lim) END@SKV FROM req"
          " WHERE EXISTS (SELECT 1 FROM moved))"
          " SELECT m.sku, m.location, m.on_hand, m.reserved, m.version, " +
          epoch_us("now()") + ", m.backorder_limit, " + states_of("m") +
          ", coalesce((SELECT g FROM lim), '')"
          " FROM (SELECT 1) AS one LEFT JOIN moved m ON true WHERE CASE WHEN m.sku IS NOT NULL"
          " THEN true WHEN EXISTS (SELECT 1 FROM taken) THEN " +
          schema + ".abort_statement() ELSE false END");
}

}  // namespace stockade::detail::pg
