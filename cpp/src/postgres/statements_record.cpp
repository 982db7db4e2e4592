// The SQL of the movement journal, the change feed and the audit (migration 007,
// docs/journal.md). Plain layout only: the Citus layout refuses these calls.
#include "postgres/statements.hpp"

namespace stockade::detail::pg {

namespace {

std::string epoch(const std::string& column) {
  return "(extract(epoch from " + column + ") * 1000000)::bigint";
}

// A journal entry as movement_from (record.cpp) reads it.
std::string movement_columns(const std::string& m) {
  return m + "id, " + m + "sku, " + m + "location, " + m + "slot, " + m + "version_before, " + m +
         "version_after, " + m + "on_hand_delta, " + m + "reserved_delta, " + m + "on_hand, " + m +
         "reserved, " + m + "available, " + m + "cause, coalesce(" + m + "reason, ''), coalesce(" +
         m + "actor, ''), coalesce(" + m + "ref, ''), " + m + "requests, " + m + "alerts, " +
         epoch(m + "at");
}

void add_feed_statements(const std::string& schema, const StatementSink& set) {
  const std::string consumer = schema + ".feed_consumer";
  // The consumer, made if new (its first snapshot: before every transaction, or now),
  // and its committed position.
  set(Stmt::feed_open,
      "WITH made AS (INSERT INTO " + consumer +
          " (name, snap_from) VALUES ($1, CASE WHEN $2::boolean THEN '3:3:'::pg_snapshot"
          " ELSE pg_current_snapshot() END) ON CONFLICT (name) DO NOTHING RETURNING *),"
          " one AS (SELECT * FROM made UNION ALL SELECT * FROM " +
          consumer +
          " WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM made))"
          " SELECT snap_from::text, coalesce(snap_to::text, ''), after_id, overrun_at IS NOT NULL"
          " FROM one");
  // The consumer's standing, and the current snapshot (for a poll that starts a batch).
  set(Stmt::feed_state, "SELECT overrun_at IS NOT NULL, pg_current_snapshot()::text FROM " +
                            consumer + " WHERE name = $1");
  // The changes that committed in snapshot $2 but not in $1, after position $3: a
  // transaction's entries appear once it has ended, whatever the order in which the
  // transactions took their positions (no `WHERE id > last`, which skips one that took
  // its id first and committed last). Below $1's xmin every transaction had ended.
  set(Stmt::feed_read,
      "SELECT " + movement_columns("m.") + " FROM " + schema +
          ".movement m WHERE m.xid >= pg_snapshot_xmin($1::pg_snapshot)"
          " AND m.xid < pg_snapshot_xmax($2::pg_snapshot)"
          " AND pg_visible_in_snapshot(m.xid, $2::pg_snapshot)"
          " AND NOT pg_visible_in_snapshot(m.xid, $1::pg_snapshot) AND m.id > $3::bigint"
          " ORDER BY m.id LIMIT $4::bigint");
  set(Stmt::feed_commit,
      "UPDATE " + consumer +
          " SET snap_from = $2::pg_snapshot, snap_to = NULLIF($3, '')::pg_snapshot,"
          " after_id = $4::bigint, committed_at = now()"
          " WHERE name = $1 AND overrun_at IS NULL RETURNING 1");
  set(Stmt::feed_drop, "DELETE FROM " + consumer + " WHERE name = $1 RETURNING 1");
  // The wake-up of the feed's waiters (its channel names the schema: feed_channel()).
  set(Stmt::feed_notify, "SELECT pg_notify($1, '')");
  // Retention of the journal: of the oldest $3 entries, those older than $1 microseconds
  // that every consumer has passed, or older than $2 (feed_lag_max) whatever the
  // consumers; a consumer that had not passed one it deletes is marked overrun.
  set(Stmt::purge_movements,
      "WITH w AS (SELECT id, xid, at FROM " + schema +
          ".movement ORDER BY id LIMIT $3::bigint),"
          " victims AS (SELECT id FROM w WHERE at < now() - $1::bigint * interval '1 microsecond'"
          " AND (at < now() - $2::bigint * interval '1 microsecond' OR NOT EXISTS (SELECT 1 FROM " +
          consumer +
          " c WHERE c.overrun_at IS NULL AND NOT pg_visible_in_snapshot(w.xid, c.snap_from)))),"
          " gone AS (DELETE FROM " +
          schema +
          ".movement WHERE id = ANY(ARRAY(SELECT id FROM victims)) RETURNING xid),"
          " marked AS (UPDATE " +
          consumer +
          " c SET overrun_at = now() WHERE c.overrun_at IS NULL AND EXISTS (SELECT 1 FROM gone"
          " WHERE NOT pg_visible_in_snapshot(gone.xid, c.snap_from)) RETURNING 1)"
          " SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM marked)");
}

void add_audit_statements(const std::string& schema, const StatementSink& set) {
  const std::string sku_is = "($1 = '' OR sku = $1)";
  // Each row's reserved against the sum of its holds (and holds on rows that do not exist).
  set(Stmt::audit_reserved,
      "SELECT coalesce(s.sku, h.sku), coalesce(s.location, h.location), coalesce(s.slot, h.slot),"
      " s.reserved, coalesce(h.held, 0) FROM (SELECT sku, location, slot, reserved FROM " +
          schema + ".stock WHERE " + sku_is +
          ") s FULL JOIN (SELECT sku, location, slot, sum(qty)::bigint AS held FROM " + schema +
          ".reservation WHERE state = 'held' AND " + sku_is +
          " GROUP BY sku, location, slot) h ON h.sku = s.sku AND h.location = s.location"
          " AND h.slot = s.slot WHERE s.reserved IS DISTINCT FROM coalesce(h.held, 0)"
          " LIMIT $2::bigint");
  set(Stmt::audit_lapsed, "SELECT id::text, sku, location, slot FROM " + schema +
                              ".reservation WHERE state = 'held' AND expires_at < now() -"
                              " $2::bigint * interval '1 microsecond' AND " +
                              sku_is + " ORDER BY expires_at LIMIT $3::bigint");
  // A buyer's count must cover the units its buyer holds or bought that are still kept
  // (retention may have purged confirmed ones the count still holds), within the limit.
  set(Stmt::audit_limits,
      "WITH c AS (SELECT limit_group AS g, buyer AS b, sum(qty)::bigint AS n FROM " + schema +
          ".reservation WHERE state IN ('held', 'confirmed') AND limit_group IS NOT NULL"
          " AND buyer IS NOT NULL GROUP BY 1, 2)"
          " SELECT coalesce(a.group_name, c.g), coalesce(a.buyer, c.b), coalesce(c.n, 0),"
          " coalesce(a.held, 0), coalesce(l.per_buyer, 0) FROM " +
          schema +
          ".buyer_allowance a FULL JOIN c ON a.group_name = c.g AND a.buyer = c.b LEFT JOIN " +
          schema +
          ".purchase_limit l ON l.group_name = coalesce(a.group_name, c.g)"
          " WHERE coalesce(a.held, 0) < coalesce(c.n, 0) OR coalesce(a.held, 0) > l.per_buyer"
          " LIMIT $1::bigint");
  set(Stmt::audit_slots, "SELECT s.sku, s.location, s.slot FROM " + schema +
                             ".stock s WHERE s.slot > 0 AND " + sku_is +
                             " AND NOT EXISTS (SELECT 1 FROM " + schema +
                             ".stock o WHERE o.sku = s.sku AND o.location = s.location AND"
                             " o.slot = 0) LIMIT $2::bigint");
  set(Stmt::audit_keys, "SELECT i.key, u.id::text FROM " + schema +
                            ".idempotency i, unnest(i.reservation_ids) AS u(id) WHERE NOT EXISTS"
                            " (SELECT 1 FROM " +
                            schema + ".reservation r WHERE r.id = u.id) LIMIT $1::bigint");
}

void add_audit_journal_statements(const std::string& schema, const StatementSink& set) {
  const std::string sku_is = "($1 = '' OR sku = $1)";
  // The journal, row by row in position order: each entry starts where the one before
  // ended, its delta adds up, and the last one is the row as it stands.
  set(Stmt::audit_journal,
      "WITH m AS (SELECT sku, location, slot, id, version_before, on_hand_delta, on_hand,"
      " lag(version_after) OVER w AS prev_v, lag(on_hand) OVER w AS prev_on FROM " +
          schema + ".movement WHERE " + sku_is +
          " WINDOW w AS (PARTITION BY sku, location, slot ORDER BY id))"
          " SELECT sku, location, slot, id, 'journal_chain', 'version_before = ' || prev_v,"
          " 'version_before = ' || version_before FROM m WHERE prev_v <> version_before"
          " UNION ALL SELECT sku, location, slot, id, 'journal_adds_up', 'on_hand = ' ||"
          " (prev_on + on_hand_delta), 'on_hand = ' || on_hand FROM m"
          " WHERE prev_on + on_hand_delta <> on_hand LIMIT $2::bigint");
  set(Stmt::audit_journal_rows,
      "SELECT s.sku, s.location, s.slot, l.id, 'journal_matches_row', 'on_hand = ' || l.on_hand || "
      "', reserved = ' ||"
      " l.reserved || ', version = ' || l.version_after, 'on_hand = ' || s.on_hand ||"
      " ', reserved = ' || s.reserved || ', version = ' || s.version FROM " +
          schema +
          ".stock s CROSS JOIN LATERAL (SELECT id, version_after, on_hand, reserved FROM " +
          schema +
          ".movement m WHERE m.sku = s.sku AND m.location = s.location AND m.slot = s.slot"
          " ORDER BY m.id DESC LIMIT 1) l WHERE " +
          "(s.sku = $1 OR $1 = '') AND (l.version_after, l.on_hand, l.reserved) <>"
          " (s.version, s.on_hand, s.reserved) LIMIT $2::bigint");
  set(Stmt::audit_counts,
      "SELECT (SELECT count(*) FROM " + schema + ".stock WHERE " + sku_is +
          "), (SELECT count(*) FROM " + schema + ".reservation WHERE " + sku_is +
          "), (SELECT count(*) FROM " + schema + ".movement WHERE " + sku_is +
          "), EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'stock_journal' AND tgenabled <> 'D'"
          " AND tgrelid = '" +
          schema + ".stock'::regclass)");
}

}  // namespace

void add_record_statements(const std::string& schema, const StatementSink& set) {
  set(Stmt::note_set, "SELECT set_config('stockade.note', $1, true)");
  set(Stmt::stock_set_low_stock,
      "WITH w AS (UPDATE " + schema +
          ".stock SET low_stock = CASE WHEN $4::boolean THEN $3::bigint END, version = version + "
          "1, updated_at = now()"
          " WHERE sku = $1 AND location = $2 AND slot = @SLOT@PIN RETURNING *) SELECT " +
          stock_columns_sql() + " FROM w");
  set(Stmt::movements_all, "SELECT " + movement_columns("") + " FROM " + schema +
                               ".movement WHERE id > $1::bigint AND at >= to_timestamp($2::bigint"
                               " / 1000000.0) ORDER BY id LIMIT $3::bigint");
  set(Stmt::movements_sku, "SELECT " + movement_columns("") + " FROM " + schema +
                               ".movement WHERE sku = $4 AND ($5 = '' OR location = $5) AND"
                               " id > $1::bigint AND at >= to_timestamp($2::bigint / 1000000.0)"
                               " ORDER BY id LIMIT $3::bigint");
  add_feed_statements(schema, set);
  add_audit_statements(schema, set);
  add_audit_journal_statements(schema, set);
}

}  // namespace stockade::detail::pg
