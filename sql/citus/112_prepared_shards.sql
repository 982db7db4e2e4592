-- The delegated one-shard writes' statements on the shard tables, prepared once per worker
-- session instead of parsed and planned on every call.
--
-- citus/109 moved reserve_one and batch_one onto the shard tables as dynamic SQL, and
-- citus/110 and 111 did the same for the journal's entry, sell_one and step_one: each
-- statement was parsed, analysed and planned for its call and cached nowhere. A perf
-- profile of a worker under delegated reserves over many SKUs on the direct route showed
-- that work (PostgreSQL's parser, Citus's planner hook, then PostgreSQL's planner) as about
-- a quarter of the worker's time (docs/scaling-out.md). On one server the same statements
-- are prepared once per session.
--
-- shard_statement(kind, table, types, sql, here) gives the name of this session's
-- prepared statement of `sql` (its table formatted in) on `table`, preparing it the first
-- time, or NULL where the call must not prepare:
--   - `here` is false: the names are the distributed tables (shard_tables found the shard
--     elsewhere, or could not lock it). A cached plan of a statement on a distributed
--     table is what Citus 13.2's local plan cache grows on (citus/105, 109): those stay
--     dynamic, planned for their call as before;
--   - the name would pass PostgreSQL's 63 bytes (a schema name longer than about 30).
-- The caller then runs the same text as dynamic SQL. Either form runs the same statement
-- with the same parameters: one text for both.
--
-- Where a statement is named: `sk112_<kind>.<shard table>` (the shard table with its
-- schema, or public.). A shard's table name is fixed by its shard id, which Citus never
-- reuses; a table that left this node and came back under the same name is the same
-- statement, and PostgreSQL re-analyses a prepared statement whose table changed. A later
-- migration that changes a statement's text changes its kind's prefix, so a session never
-- runs an older text.
--
-- Whether a session has it: a session setting, stockade_prepared.<name> = '1', read in
-- about a microsecond (pg_prepared_statements lists every statement of the session on each
-- read: about 18 us with a hundred). A PREPARE outlives a rollback but the setting does
-- not; then the next call finds the statement in pg_prepared_statements and sets it again.
-- DISCARD ALL drops both. The engine never deallocates them, and nothing else runs on
-- these sessions (the engine's own on the direct route, Citus's on the coordinator route).
--
-- What it holds: one prepared statement per kind (at most eleven) and shard table that the
-- session wrote on this node, with its plan: bounded by the shard count, not by traffic. A
-- statement runs five custom plans and then, as PostgreSQL decides, its generic plan.
--
-- Values travel as literals of their own types (format's %L of the typed value, read back
-- by the statement's parameter types): text, numbers, uuids, timestamps and arrays of them
-- read back exactly in the same session.
CREATE OR REPLACE FUNCTION {{schema}}.shard_statement(p_kind text, p_table text, p_types text,
                                                      p_sql text, p_here boolean)
RETURNS text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  v_name text := 'sk112_' || p_kind || '.' || p_table;
BEGIN
  IF NOT p_here OR octet_length(v_name) > 63 THEN
    RETURN NULL;
  END IF;
  IF current_setting('stockade_prepared.' || v_name, true) = '1' THEN
    RETURN v_name;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements s WHERE s.name = v_name) THEN
    EXECUTE format('PREPARE %I%s AS ', v_name, coalesce('(' || p_types || ')', ''))
            || format(p_sql, p_table);
  END IF;
  PERFORM set_config('stockade_prepared.' || v_name, '1', false);
  RETURN v_name;
END $fn$;

-- reserve_one of citus/109, each statement prepared where the shard is, as a function that
-- Citus does not distribute: reserve_local runs on the node it is called on. reserve_one
-- (delegated by the coordinator) and reserve_routed (called on the worker by direct
-- routing, citus/106) call it. reserve_routed called reserve_one, a distributed function,
-- whose call Citus planned afresh on every execution (it keeps calls of distributed
-- functions with parameters off generic plans): about 4% of a worker's time under keyless
-- reserves routed direct. A call of reserve_local keeps its generic plan.
--
-- The key's claim returns its row, so that either form says whether it claimed (a
-- prepared statement run by EXECUTE reports no row count).
CREATE OR REPLACE FUNCTION {{schema}}.reserve_local(p_sku text, p_location text,
                                                    p_slot smallint, p_qty bigint,
                                                    p_expected bigint, p_id uuid,
                                                    p_ttl_us bigint, p_lock_timeout text,
                                                    p_key text, p_fingerprint text,
                                                    p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  q_claim CONSTANT text := $q$INSERT INTO %s (key, request_fingerprint, reservation_ids,
                                              created_at, shard_key)
    VALUES ($1, $2, ARRAY[$3], now(), $4)
    ON CONFLICT (shard_key, key) DO NOTHING RETURNING 1$q$;
  q_take CONSTANT text := $q$UPDATE %s
     SET reserved = reserved + $1, version = version + 1, updated_at = now()
   WHERE shard_key = $2 AND sku = $3 AND location = $4 AND slot = $5
     AND on_hand + backorder_limit - reserved - safety_stock - damaged - quality_control
         >= $1
     AND ($6 < 0 OR version = $6)
     AND discontinued_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= now())
  RETURNING version$q$;
  q_hold CONSTANT text := $q$INSERT INTO %s (id, sku, location, slot, qty, state, version,
                                             expires_at, idempotency_key, created_at,
                                             updated_at, shard_key)
    VALUES ($1, $2, $3, $4, $5, 'held', 1, $6, $7, now(), now(), $8)$q$;
  t record;
  n text;
  v bigint;
  claimed integer;
  expires timestamptz := now() + p_ttl_us * interval '1 microsecond';
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF p_key IS NOT NULL THEN
    n := {{schema}}.shard_statement('claim', t.idempotency, 'text, text, uuid, integer',
                                    q_claim, t.here);
    IF n IS NULL THEN
      EXECUTE format(q_claim, t.idempotency) INTO claimed
        USING p_key, p_fingerprint, p_id, p_shard;
    ELSE
      EXECUTE format('EXECUTE %I(%L, %L, %L, %L)', n, p_key, p_fingerprint, p_id, p_shard)
        INTO claimed;
    END IF;
    IF claimed IS NULL THEN
      outcome := 'replay';
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  n := {{schema}}.shard_statement('take', t.stock,
                                  'bigint, integer, text, text, smallint, bigint', q_take,
                                  t.here);
  IF n IS NULL THEN
    EXECUTE format(q_take, t.stock) INTO v
      USING p_qty, p_shard, p_sku, p_location, p_slot, p_expected;
  ELSE
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L)', n, p_qty, p_shard, p_sku,
                   p_location, p_slot, p_expected)
      INTO v;
  END IF;
  IF v IS NULL THEN
    IF p_key IS NOT NULL THEN  -- rare: a refusal of a keyed reserve
      EXECUTE format('DELETE FROM %s WHERE shard_key = $1 AND key = $2', t.idempotency)
        USING p_shard, p_key;
    END IF;
    outcome := 'refused';
    RETURN NEXT;
    RETURN;
  END IF;
  n := {{schema}}.shard_statement(
    'hold', t.reservation, 'uuid, text, text, smallint, bigint, timestamptz, text, integer',
    q_hold, t.here);
  IF n IS NULL THEN
    EXECUTE format(q_hold, t.reservation)
      USING p_id, p_sku, p_location, p_slot, p_qty, expires, p_key, p_shard;
  ELSE
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L)', n, p_id, p_sku, p_location,
                   p_slot, p_qty, expires, p_key, p_shard);
  END IF;
  outcome := 'made';
  expires_us := (extract(epoch FROM expires) * 1000000)::bigint;
  created_us := (extract(epoch FROM now()) * 1000000)::bigint;
  row_version := v;
  RETURN NEXT;
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.reserve_one(p_sku text, p_location text,
                                                  p_slot smallint, p_qty bigint,
                                                  p_expected bigint, p_id uuid,
                                                  p_ttl_us bigint, p_lock_timeout text,
                                                  p_key text, p_fingerprint text,
                                                  p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text)
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
  RETURN QUERY SELECT * FROM {{schema}}.reserve_local(p_sku, p_location, p_slot, p_qty,
                                                      p_expected, p_id, p_ttl_us,
                                                      p_lock_timeout, p_key, p_fingerprint,
                                                      p_shard);
END $fn$;

CREATE OR REPLACE FUNCTION {{schema}}.reserve_routed(p_sku text, p_location text,
                                                     p_slot smallint, p_qty bigint,
                                                     p_expected bigint, p_id uuid,
                                                     p_ttl_us bigint, p_lock_timeout text,
                                                     p_key text, p_fingerprint text,
                                                     p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text,
               node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
  RETURN QUERY
    SELECT r.expires_us, r.created_us, r.row_version, r.outcome,
           (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
      FROM {{schema}}.reserve_local(p_sku, p_location, p_slot, p_qty, p_expected, p_id,
                                    p_ttl_us, p_lock_timeout, p_key, p_fingerprint,
                                    p_shard) r;
END $fn$;

-- batch_one of citus/109, each statement prepared where the shard is.
CREATE OR REPLACE FUNCTION {{schema}}.batch_one(p_sku text, p_location text, p_slot smallint,
                                                p_sold bigint, p_held bigint,
                                                p_changes bigint, p_ids uuid[],
                                                p_qtys bigint[], p_ttls bigint[],
                                                p_keys text[], p_refs text[],
                                                p_metadata text[], p_orders text[],
                                                p_key_names text[], p_key_prints text[],
                                                p_key_ids text[], p_lock_timeout text,
                                                p_shard integer)
RETURNS TABLE (sku text, location text, on_hand bigint, reserved bigint, version bigint,
               now_us bigint, backorder_limit bigint, safety_stock bigint, damaged bigint,
               quality_control bigint, incoming bigint, node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  q_taken CONSTANT text :=
    'SELECT count(*) FROM %s i WHERE i.shard_key = $1 AND i.key = ANY($2)';
  q_move CONSTANT text := $q$UPDATE %s t
     SET on_hand = t.on_hand - $1, reserved = t.reserved + $2,
         version = t.version + $3, updated_at = now()
   WHERE t.shard_key = $4 AND t.sku = $5 AND t.location = $6 AND t.slot = $7
     AND t.on_hand + t.backorder_limit - t.reserved - t.safety_stock - t.damaged
         - t.quality_control >= $1 + $2
     AND t.discontinued_at IS NULL
     AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now())
  RETURNING t.*$q$;
  q_holds CONSTANT text := $q$INSERT INTO %s (id, sku, location, slot, qty, state, version,
                                              expires_at, idempotency_key, created_at,
                                              updated_at, order_id, ref, metadata, shard_key)
    SELECT r.i, $1, $2, $3, r.q, 'held', 1, now() + r.t * interval '1 microsecond',
           NULLIF(r.k, ''), now(), now(), NULLIF(r.o, '')::uuid, NULLIF(r.f, ''),
           NULLIF(r.m, '')::jsonb, $4
      FROM unnest($5::uuid[], $6::bigint[], $7::bigint[], $8::text[], $9::text[],
                  $10::text[], $11::text[]) AS r(i, q, t, k, o, f, m)$q$;
  q_claims CONSTANT text := $q$INSERT INTO %s (key, request_fingerprint, reservation_ids,
                                               created_at, shard_key)
    SELECT c.k, c.f, CASE WHEN c.i = '' THEN '{}'::uuid[] ELSE ARRAY[c.i::uuid] END, now(),
           $1
      FROM unnest($2::text[], $3::text[], $4::text[]) AS c(k, f, i)
     ORDER BY c.k COLLATE "C"$q$;
  t record;
  n text;
  s {{schema}}.stock%ROWTYPE;
  taken bigint;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF cardinality(p_key_names) > 0 THEN
    n := {{schema}}.shard_statement('taken', t.idempotency, 'integer, text[]', q_taken,
                                    t.here);
    IF n IS NULL THEN
      EXECUTE format(q_taken, t.idempotency) INTO taken USING p_shard, p_key_names;
    ELSE
      EXECUTE format('EXECUTE %I(%L, %L)', n, p_shard, p_key_names) INTO taken;
    END IF;
    IF taken > 0 THEN
      RETURN;
    END IF;
  END IF;
  n := {{schema}}.shard_statement(
    'move', t.stock, 'bigint, bigint, bigint, integer, text, text, smallint', q_move, t.here);
  IF n IS NULL THEN
    EXECUTE format(q_move, t.stock) INTO s
      USING p_sold, p_held, p_changes, p_shard, p_sku, p_location, p_slot;
  ELSE
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L)', n, p_sold, p_held, p_changes,
                   p_shard, p_sku, p_location, p_slot)
      INTO s;
  END IF;
  IF s.sku IS NULL THEN
    RETURN;
  END IF;
  IF cardinality(p_ids) > 0 THEN
    n := {{schema}}.shard_statement(
      'holds', t.reservation,
      'text, text, smallint, integer, uuid[], bigint[], bigint[], text[], text[], text[],'
      ' text[]', q_holds, t.here);
    IF n IS NULL THEN
      EXECUTE format(q_holds, t.reservation)
        USING p_sku, p_location, p_slot, p_shard, p_ids, p_qtys, p_ttls, p_keys, p_orders,
              p_refs, p_metadata;
    ELSE
      EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L, %L, %L, %L)', n, p_sku,
                     p_location, p_slot, p_shard, p_ids, p_qtys, p_ttls, p_keys, p_orders,
                     p_refs, p_metadata);
    END IF;
  END IF;
  IF cardinality(p_key_names) > 0 THEN
    n := {{schema}}.shard_statement('claims', t.idempotency, 'integer, text[], text[], text[]',
                                    q_claims, t.here);
    IF n IS NULL THEN
      EXECUTE format(q_claims, t.idempotency)
        USING p_shard, p_key_names, p_key_prints, p_key_ids;
    ELSE
      EXECUTE format('EXECUTE %I(%L, %L, %L, %L)', n, p_shard, p_key_names, p_key_prints,
                     p_key_ids);
    END IF;
  END IF;
  RETURN QUERY SELECT s.sku, s.location, s.on_hand, s.reserved, s.version,
                      (extract(epoch FROM now()) * 1000000)::bigint, s.backorder_limit,
                      s.safety_stock, s.damaged, s.quality_control, s.incoming,
                      (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $fn$;

-- sell_one of citus/111, its statement prepared where the shard is.
CREATE OR REPLACE FUNCTION {{schema}}.sell_one(p_sku text, p_location text, p_slot smallint,
                                               p_qty bigint, p_expected bigint,
                                               p_token bigint, p_lock_timeout text,
                                               p_shard integer)
RETURNS TABLE (on_hand bigint, reserved bigint, version bigint, updated_us bigint,
               backorder_limit bigint, discontinued boolean, lease_token bigint,
               leased boolean, lease_expires_us bigint, low_stock bigint, slots integer,
               safety_stock bigint, damaged bigint, quality_control bigint,
               incoming bigint, node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  q_sell CONSTANT text := $q$UPDATE %s t
     SET on_hand = t.on_hand - $1, version = t.version + 1, updated_at = now()
   WHERE t.shard_key = $2 AND t.sku = $3 AND t.location = $4 AND t.slot = $5
     AND t.on_hand + t.backorder_limit - t.reserved - t.safety_stock - t.damaged
         - t.quality_control >= $1
     AND ($6 < 0 OR t.version = $6)
     AND t.discontinued_at IS NULL
     AND (($7 < 0 AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now()))
          OR ($7 >= 0 AND t.lease_token = $7))
  RETURNING t.*$q$;
  t record;
  n text;
  s {{schema}}.stock%ROWTYPE;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  n := {{schema}}.shard_statement(
    'sell', t.stock, 'bigint, integer, text, text, smallint, bigint, bigint', q_sell, t.here);
  IF n IS NULL THEN
    EXECUTE format(q_sell, t.stock) INTO s
      USING p_qty, p_shard, p_sku, p_location, p_slot, p_expected, p_token;
  ELSE
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L)', n, p_qty, p_shard, p_sku,
                   p_location, p_slot, p_expected, p_token)
      INTO s;
  END IF;
  IF s.sku IS NULL THEN
    RETURN;
  END IF;
  RETURN QUERY SELECT
    s.on_hand, s.reserved, s.version, (extract(epoch FROM s.updated_at) * 1000000)::bigint,
    s.backorder_limit, s.discontinued_at IS NOT NULL, s.lease_token,
    coalesce(s.lease_expires_at > now(), false),
    CASE WHEN s.lease_expires_at > now()
         THEN (extract(epoch FROM s.lease_expires_at) * 1000000)::bigint ELSE 0 END,
    s.low_stock, coalesce(s.slots, 0)::integer, s.safety_stock, s.damaged,
    s.quality_control, s.incoming, (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $fn$;

-- step_one of citus/111, its statements prepared (it runs only where the shard is).
CREATE OR REPLACE FUNCTION {{schema}}.step_one(p_id uuid, p_version bigint, p_state text,
                                               p_confirmed bigint, p_released bigint,
                                               p_expired bigint, p_ttl_us bigint,
                                               p_sku text, p_location text, p_slot smallint,
                                               p_sold bigint, p_settled bigint, p_note text,
                                               p_lock_timeout text, p_shard integer)
RETURNS TABLE (version bigint, updated_us bigint, expires_us bigint, row_version bigint,
               node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  q_step CONSTANT text := $q$UPDATE %s r
     SET state = $1, version = r.version + 1, updated_at = now(),
         expires_at = CASE WHEN $2 > 0 THEN now() + $2 * interval '1 microsecond'
                           ELSE r.expires_at END,
         confirmed = $3, released = $4, expired = $5
   WHERE r.shard_key = $6 AND r.id = $7 AND r.version = $8 AND r.state = 'held'
     AND r.expires_at > now()
  RETURNING r.version, r.updated_at, r.expires_at$q$;
  q_settle CONSTANT text := $q$UPDATE %s s
     SET on_hand = s.on_hand - $1, reserved = s.reserved - $2, version = s.version + 1,
         updated_at = now()
   WHERE s.shard_key = $3 AND s.sku = $4 AND s.location = $5 AND s.slot = $6
  RETURNING s.version$q$;
  t record;
  n text;
  v bigint;
  updated timestamptz;
  expires timestamptz;
  moved bigint;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF NOT t.here THEN
    RETURN;
  END IF;
  IF p_note <> '' THEN
    PERFORM set_config('stockade.note', p_note, true);
  END IF;
  n := {{schema}}.shard_statement(
    'step', t.reservation, 'text, bigint, bigint, bigint, bigint, integer, uuid, bigint',
    q_step, t.here);
  IF n IS NULL THEN
    EXECUTE format(q_step, t.reservation) INTO v, updated, expires
      USING p_state, p_ttl_us, p_confirmed, p_released, p_expired, p_shard, p_id, p_version;
  ELSE
    EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L, %L, %L)', n, p_state, p_ttl_us,
                   p_confirmed, p_released, p_expired, p_shard, p_id, p_version)
      INTO v, updated, expires;
  END IF;
  IF v IS NULL THEN
    RETURN;
  END IF;
  IF p_sold <> 0 OR p_settled <> 0 THEN
    n := {{schema}}.shard_statement(
      'settle', t.stock, 'bigint, bigint, integer, text, text, smallint', q_settle, t.here);
    IF n IS NULL THEN
      EXECUTE format(q_settle, t.stock) INTO moved
        USING p_sold, p_settled, p_shard, p_sku, p_location, p_slot;
    ELSE
      EXECUTE format('EXECUTE %I(%L, %L, %L, %L, %L, %L)', n, p_sold, p_settled, p_shard,
                     p_sku, p_location, p_slot)
        INTO moved;
    END IF;
    IF moved IS NULL THEN
      RAISE EXCEPTION 'the stock row of reservation % is missing', p_id
        USING ERRCODE = 'SK002';  -- InvariantViolation, as the transaction's check
    END IF;
  END IF;
  RETURN QUERY SELECT v, (extract(epoch FROM updated) * 1000000)::bigint,
                      (extract(epoch FROM expires) * 1000000)::bigint, moved,
                      (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $fn$;

-- The journal trigger's entry on the journal's shard (citus/110), prepared. That branch
-- runs only where the call found the stock shard here, so the journal's co-located shard
-- is here too. It is rebuilt from the trigger's own INSERT (the ELSE branch, migration
-- 013's statement as migrated), as citus/110 built it: the column and value lists keep one
-- text. Already done where this runs again (the functions above dropped and made anew).
DO $$
DECLARE
    def    text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    head   text := E'IF current_setting(''stockade.local_journal'', true) = TG_RELID::text'
                   || E' THEN\n';
    tail   text := E'\n    ELSE\n';
    from_  integer := position(head IN def);
    upto   integer;
    stmt   text;
    parts  text[];
    params text;
    quoted text;
    id_seq text := pg_get_serial_sequence('{{schema}}.movement', 'id');  -- qualified
BEGIN
    IF position('shard_statement' IN def) <> 0 THEN
        RETURN;
    END IF;
    upto := position(tail IN substr(def, from_));
    IF from_ = 0 OR upto = 0 OR id_seq IS NULL THEN
        RAISE EXCEPTION 'journal_stock() is not the function of migration citus/110';
    END IF;
    stmt := substr(def, from_ + upto - 1 + length(tail));
    stmt := btrim(substr(stmt, 1, position(E';\n    END IF;' IN stmt)), E' \n');
    parts := regexp_match(stmt, '^INSERT INTO \S+ \(([^()]*)\)\s+VALUES \((.*)\);$', 's');
    IF parts IS NULL THEN
        RAISE EXCEPTION 'journal_stock() is not the function of migration citus/110 (its INSERT)';
    END IF;
    SELECT string_agg('$' || n, ', '), string_agg('%L', ', ') INTO params, quoted
      FROM generate_series(1, array_length(regexp_split_to_array(parts[1], ','), 1)) AS n;
    def := substr(def, 1, from_ - 1) || head
        || E'        EXECUTE format(' || quote_literal('EXECUTE %I(' || quoted || ')') || E',\n'
        || E'            {{schema}}.shard_statement(''journal'',\n'
        || E'                CASE WHEN ''{{schema}}'' = ''public'' THEN ''public.'' ELSE '''' END\n'
        || E'                || shard_name(''{{schema}}.movement''::regclass,\n'
        || E'                       get_shard_id_for_distribution_column('
        || E'''{{schema}}.movement'', NEW.shard_key)),\n'
        || E'                NULL,\n'
        || '                ' || quote_literal('INSERT INTO %s (id, ' || parts[1] || ') VALUES ('
                                               || format('nextval(%L::regclass)', id_seq)
                                               || ', ' || params || ')')
        || E',\n                true),\n'
        || '            ' || parts[2] || ');'
        || substr(def, from_ + upto - 1);
    EXECUTE def;
END
$$;
