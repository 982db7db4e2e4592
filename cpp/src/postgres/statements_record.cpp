// The SQL of the movement journal, the change feed and the audit (migrations 007 and
// citus/103, docs/journal.md). On the Citus layout a feed position holds one snapshot per
// node group (feed_snapshots(), feed_snapshot() picks the local one where a statement runs
// on a shard), and every join of two distributed tables names the shard key.
#include "postgres/statements.hpp"

namespace stockade::detail::pg {

namespace {

// A journal entry as movement_from (record.cpp) reads it.
std::string movement_columns(const std::string& m) {
  return m + "id, " + m + "sku, " + m + "location, " + m + "slot, " + m + "version_before, " + m +
         "version_after, " + m + "on_hand_delta, " + m + "reserved_delta, " + m + "on_hand, " + m +
         "reserved, " + m + "available, " + m + "cause, coalesce(" + m + "reason, ''), coalesce(" +
         m + "actor, ''), coalesce(" + m + "ref, ''), " + m + "requests, " + m + "alerts, " +
         epoch_us(m + "at");
}

// A feed position's snapshot from parameter `n`: one server's, or on Citus the snapshot of
// the node the statement runs on, out of the position's per-group object.
std::string snapshot(const std::string& schema, bool citus, int n) {
  const std::string p = "$" + std::to_string(n);
  return citus ? schema + ".feed_snapshot(" + p + "::jsonb)" : p + "::pg_snapshot";
}

void add_feed_statements(const std::string& schema, bool citus, const StatementSink& set) {
  const std::string consumer = schema + ".feed_consumer";
  const std::string now = citus ? schema + ".feed_snapshots()" : "pg_current_snapshot()";
  const std::string start = citus ? "'{}'::jsonb" : "'3:3:'::pg_snapshot";
  const std::string type = citus ? "::jsonb" : "::pg_snapshot";
  // The consumer, made if new (its first snapshot: before every transaction, or now),
  // and its committed position.
  set(Stmt::feed_open,
      "WITH made AS (INSERT INTO " + consumer +
          " (name, snap_from) VALUES ($1, CASE WHEN $2::boolean THEN " + start + " ELSE " + now +
          " END) ON CONFLICT (name) DO NOTHING RETURNING *),"
          " one AS (SELECT * FROM made UNION ALL SELECT * FROM " +
          consumer +
          " WHERE name = $1 AND NOT EXISTS (SELECT 1 FROM made))"
          " SELECT snap_from::text, coalesce(snap_to::text, ''), after_id, overrun_at IS NOT NULL"
          " FROM one");
  // The consumer's standing, and the current snapshot (for a poll that starts a batch).
  set(Stmt::feed_state,
      "SELECT overrun_at IS NOT NULL, " + now + "::text FROM " + consumer + " WHERE name = $1");
  // The changes that committed in snapshot $2 but not in $1, after position $3: a
  // transaction's entries appear once it has ended, whatever the order in which the
  // transactions took their positions (no `WHERE id > last`, which skips one that took
  // its id first and committed last). Below $1's xmin every transaction had ended.
  set(Stmt::feed_read, "SELECT " + movement_columns("m.") + " FROM " + schema +
                           ".movement m WHERE m.xid >= pg_snapshot_xmin(" +
                           snapshot(schema, citus, 1) + ") AND m.xid < pg_snapshot_xmax(" +
                           snapshot(schema, citus, 2) + ") AND pg_visible_in_snapshot(m.xid, " +
                           snapshot(schema, citus, 2) + ") AND NOT pg_visible_in_snapshot(m.xid, " +
                           snapshot(schema, citus, 1) +
                           ") AND m.id > $3::bigint ORDER BY m.id LIMIT $4::bigint");
  set(Stmt::feed_commit, "UPDATE " + consumer + " SET snap_from = $2" + type +
                             ", snap_to = NULLIF($3, '')" + type +
                             ", after_id = $4::bigint, committed_at = now()"
                             " WHERE name = $1 AND overrun_at IS NULL RETURNING 1");
  set(Stmt::feed_drop, "DELETE FROM " + consumer + " WHERE name = $1 RETURNING 1");
  // The wake-up of the feed's waiters (its channel names the schema: feed_channel()).
  set(Stmt::feed_notify, "SELECT pg_notify($1, '')");
}

void add_journal_retention_statements(const std::string& schema, const StatementSink& set) {
  const std::string consumer = schema + ".feed_consumer";
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
  // The same on Citus, where a shard cannot read the coordinator's consumers: their
  // positions first ($4, $5), then one statement. It picks the entries to delete on every
  // shard (by id: one node's after another's, each in the order of its sequence), deletes
  // them, and marks a consumer against each entry's node group, which Citus's metadata
  // gives.
  set(Stmt::feed_consumers_live,
      "SELECT coalesce(jsonb_agg(snap_from), '[]'::jsonb)::text, coalesce(array_agg(name),"
      " '{}'::text[]) FROM " +
          consumer + " WHERE overrun_at IS NULL");
  set(Stmt::purge_movements_citus,
      "WITH gone AS (DELETE FROM " + schema + ".movement WHERE id = ANY(ARRAY(SELECT id FROM " +
          schema +
          ".movement m WHERE m.at < now() - $1::bigint * interval '1 microsecond' AND (m.at <"
          " now() - $2::bigint * interval '1 microsecond' OR NOT EXISTS (SELECT 1 FROM"
          " jsonb_array_elements($4::jsonb) c(s) WHERE NOT pg_visible_in_snapshot(m.xid, " +
          schema +
          ".feed_snapshot(c.s)))) ORDER BY id LIMIT $3::bigint)) RETURNING xid, shard_key),"
          " g AS MATERIALIZED (SELECT xid, (SELECT p.groupid FROM pg_catalog.pg_dist_placement p"
          " WHERE p.shardid = get_shard_id_for_distribution_column('" +
          schema +
          ".movement', gone.shard_key) LIMIT 1) AS grp FROM gone),"
          " marked AS (UPDATE " +
          consumer +
          " c SET overrun_at = now() WHERE c.name = ANY($5::text[]) AND c.overrun_at IS NULL"
          " AND EXISTS (SELECT 1 FROM g WHERE NOT pg_visible_in_snapshot(g.xid,"
          " coalesce((c.snap_from ->> g.grp::text)::pg_snapshot, '3:3:'::pg_snapshot))) RETURNING "
          "1)"
          " SELECT (SELECT count(*) FROM g), (SELECT count(*) FROM marked)");
}

// On Citus, the join of two co-located tables names the shard key, so that it runs on
// each shard.
std::string same_shard(bool citus, const std::string& a, const std::string& b) {
  return citus ? a + ".shard_key = " + b + ".shard_key AND " : std::string();
}

void add_audit_statements(const std::string& schema, bool citus, const StatementSink& set) {
  const std::string sku_is = "($1 = '' OR sku = $1)";
  const std::string key = citus ? "shard_key, " : "";
  // Each row's reserved against the sum of its holds (and holds on rows that do not exist).
  set(Stmt::audit_reserved,
      "SELECT coalesce(s.sku, h.sku), coalesce(s.location, h.location), coalesce(s.slot, h.slot),"
      " s.reserved, coalesce(h.held, 0) FROM (SELECT " +
          key + "sku, location, slot, reserved FROM " + schema + ".stock WHERE " + sku_is +
          ") s FULL JOIN (SELECT " + key +
          "sku, location, slot, sum(qty - confirmed - released - expired)::bigint AS held FROM " +
          schema + ".reservation WHERE state = 'held' AND " + sku_is + " GROUP BY " + key +
          "sku, location, slot) h ON " + same_shard(citus, "h", "s") +
          "h.sku = s.sku AND h.location = s.location"
          " AND h.slot = s.slot WHERE s.reserved IS DISTINCT FROM coalesce(h.held, 0)"
          " LIMIT $2::bigint");
  set(Stmt::audit_lapsed, "SELECT id::text, sku, location, slot FROM " + schema +
                              ".reservation WHERE state = 'held' AND expires_at < now() -"
                              " $2::bigint * interval '1 microsecond' AND " +
                              sku_is + " ORDER BY expires_at LIMIT $3::bigint");
  // A buyer's count must cover the units its buyer holds or bought that are still kept
  // (retention may have purged confirmed ones the count still holds), within the limit.
  set(Stmt::audit_limits,
      "WITH c AS (SELECT limit_group AS g, buyer AS b,"
      " sum(qty - released - expired - returned)::bigint AS n FROM " +
          schema +
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
  // Reservations whose units do not add up (units_consistent, the reservation_units
  // CHECK: a schema without it, or a row written around it).
  set(Stmt::audit_units,
      "SELECT " + reservation_columns() + " FROM " + schema + ".reservation WHERE " + sku_is +
          " AND NOT coalesce(confirmed >= 0 AND released >= 0 AND expired >= 0 AND returned >= 0"
          " AND returned <= confirmed AND confirmed + released + expired <= qty"
          " AND (state = 'held') = (confirmed + released + expired < qty)"
          " AND (state <> 'held' OR expired = 0), false) LIMIT $2::bigint");
  set(Stmt::audit_slots, "SELECT s.sku, s.location, s.slot FROM " + schema +
                             ".stock s WHERE s.slot > 0 AND " + sku_is +
                             " AND NOT EXISTS (SELECT 1 FROM " + schema + ".stock o WHERE " +
                             same_shard(citus, "o", "s") +
                             "o.sku = s.sku AND o.location = s.location AND"
                             " o.slot = 0) LIMIT $2::bigint");
  if (!citus) {
    set(Stmt::audit_keys, "SELECT i.key, u.id::text FROM " + schema +
                              ".idempotency i, unnest(i.reservation_ids) AS u(id) WHERE NOT EXISTS"
                              " (SELECT 1 FROM " +
                              schema + ".reservation r WHERE r.id = u.id) LIMIT $1::bigint");
    return;
  }
  // An order's reservations may lie on other shards than its key: on Citus the keys' ids
  // and the reservations found for them are gathered first, then compared.
  set(Stmt::audit_keys,
      "WITH k AS MATERIALIZED (SELECT i.key, u.id FROM " + schema +
          ".idempotency i, unnest(i.reservation_ids) AS u(id)), r AS MATERIALIZED (SELECT id"
          " FROM " +
          schema +
          ".reservation WHERE id = ANY(ARRAY(SELECT id FROM k))) SELECT k.key, k.id::text FROM k"
          " WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.id = k.id) LIMIT $1::bigint");
}

void add_audit_journal_statements(const std::string& schema, bool citus, const StatementSink& set) {
  const std::string sku_is = "($1 = '' OR sku = $1)";
  // A row's entries in the order they were written. On one server that is the position.
  // On Citus a position comes from the range of the node that wrote it, so a row whose
  // shard moved to a node with a lower range gets lower positions than before: there
  // the versions give the order (a write that keeps the version sorts after the one
  // that reached it).
  const std::string order = citus ? "version_before, version_after, id" : "id";
  const std::string last =
      citus ? "m.version_after DESC, m.version_before DESC, m.id DESC" : "m.id DESC";
  // The journal, row by row in that order: each entry starts where the one before
  // ended, its delta adds up, and the last one is the row as it stands.
  set(Stmt::audit_journal,
      "WITH m AS (SELECT sku, location, slot, id, version_before, on_hand_delta, on_hand,"
      " lag(version_after) OVER w AS prev_v, lag(on_hand) OVER w AS prev_on FROM " +
          schema + ".movement WHERE " + sku_is + " WINDOW w AS (PARTITION BY " +
          (citus ? "shard_key, " : "") + "sku, location, slot ORDER BY " + order +
          "))"
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
          schema + ".movement m WHERE " + same_shard(citus, "m", "s") +
          "m.sku = s.sku AND m.location = s.location AND m.slot = s.slot"
          " ORDER BY " +
          last + " LIMIT 1) l WHERE " +
          "(s.sku = $1 OR $1 = '') AND (l.version_after, l.on_hand, l.reserved) <>"
          " (s.version, s.on_hand, s.reserved) LIMIT $2::bigint");
  // The counts, whether the journal's trigger is on, and the rows without a journal entry
  // (which journal_matches_row cannot check).
  set(Stmt::audit_counts,
      "SELECT (SELECT count(*) FROM " + schema + ".stock WHERE " + sku_is +
          "), (SELECT count(*) FROM " + schema + ".reservation WHERE " + sku_is +
          "), (SELECT count(*) FROM " + schema + ".movement WHERE " + sku_is +
          "), EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'stock_journal' AND tgenabled <> 'D'"
          " AND tgrelid = '" +
          schema + ".stock'::regclass), (SELECT count(*) FROM " + schema +
          ".stock s WHERE (s.sku = $1 OR $1 = '') AND NOT EXISTS (SELECT 1 FROM " + schema +
          ".movement m WHERE " + same_shard(citus, "m", "s") +
          "m.sku = s.sku AND m.location = s.location AND m.slot = s.slot))");
}

}  // namespace

void add_record_statements(const std::string& schema, bool citus, const StatementSink& set) {
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
  add_feed_statements(schema, citus, set);
  add_journal_retention_statements(schema, set);
  add_audit_statements(schema, citus, set);
  add_audit_journal_statements(schema, citus, set);
}

}  // namespace stockade::detail::pg
