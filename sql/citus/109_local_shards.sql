-- The delegated one-shard writes (reserve_one, citus/105; batch_one, citus/107) on the
-- shard tables themselves. Run on the worker, a statement of those functions that names a
-- distributed table is planned by Citus on every call (their plans are custom: see
-- citus/105 on Citus 13.2's local plan cache): the distributed planner, then a deparse of
-- the shard query, which local execution parses and plans again. That was about a third of
-- a worker's time under delegated reserves (a perf profile, docs/scaling-out.md). On the
-- shard table, the statement is one server's, planned by PostgreSQL alone.
--
-- shard_tables(p_shard) names the tables a call writes: the shards of p_shard on this node
-- once it holds their metadata lock in share mode (one lock for the co-located shards of
-- all the tables: Citus keys it by co-location and shard index) and finds the placement
-- here, else the distributed tables. A shard move takes that lock exclusively before it
-- switches the placement, so it waits for the call's commit; a call after the switch finds
-- the shard elsewhere. So a write never lands in a shard this node no longer serves (the
-- copy a move leaves behind until Citus drops it). Called where the shard is not (on the
-- coordinator inside a transaction, which Citus does not delegate, or on a node a move
-- took the shard from while the call waited for the lock), or by a role that does not own
-- the tables (Citus lets only the owner take that lock), the call writes the distributed
-- tables as before: Citus routes them, and nothing is lost but time. (A stale direct route
-- is delegated on by the node it reaches, so the call runs where the shard is.)
-- purge_shard (citus/108) takes the same lock.
--
-- Each function keeps one text per statement: it formats the table names in, for either
-- case. A shard table has no sequence defaults (Citus evaluates those where it plans);
-- these statements use none.
--
-- The functions no longer force custom plans (citus/105 did, against Citus 13.2's local
-- plan cache, which grew a worker's session by about 90 kB a call under generic plans of
-- their statements on distributed tables): a dynamic statement is planned for its call
-- and cached nowhere. What a session still caches is the journal trigger's INSERT
-- (citus/103), which the forced custom plans had planned through Citus on every call; its
-- generic plan leaves the sessions flat (benchmarks/citus_sessions.py over a million
-- calls; tests/python/test_citus.py over 2,000 on each route).
--
-- Only under READ COMMITTED: there each statement reads the placement after the lock wait.
-- Under REPEATABLE READ or SERIALIZABLE (a session's default, or a caller's transaction)
-- the snapshot may predate a move that committed during the wait, and would show the old
-- placement; the call then writes the distributed tables, whose shard Citus picks from its
-- metadata cache. shard_name() leaves out the schema `public`: it is put back.
CREATE FUNCTION {{schema}}.shard_tables(p_shard integer)
RETURNS TABLE (stock text, reservation text, idempotency text, here boolean)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  v_stock bigint := get_shard_id_for_distribution_column('{{schema}}.stock', p_shard);
  v_public text := CASE WHEN '{{schema}}' = 'public' THEN 'public.' ELSE '' END;
BEGIN
  IF current_setting('transaction_isolation') = 'read committed'
     AND pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c
                       WHERE c.oid = '{{schema}}.stock'::regclass), 'USAGE') THEN
    PERFORM lock_shard_metadata(5, ARRAY[v_stock]);  -- 5: ShareLock
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p
                WHERE p.shardid = v_stock AND p.shardstate = 1
                  AND p.groupid = (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)) THEN
      RETURN QUERY SELECT
        v_public || shard_name('{{schema}}.stock'::regclass, v_stock),
        v_public || shard_name('{{schema}}.reservation'::regclass,
                   get_shard_id_for_distribution_column('{{schema}}.reservation', p_shard)),
        v_public || shard_name('{{schema}}.idempotency'::regclass,
                   get_shard_id_for_distribution_column('{{schema}}.idempotency', p_shard)),
        true;
      RETURN;
    END IF;
  END IF;
  RETURN QUERY SELECT '{{schema}}.stock'::text, '{{schema}}.reservation'::text,
                      '{{schema}}.idempotency'::text, false;
END $fn$;

-- reserve_one of citus/105, its statements on shard_tables(p_shard).
CREATE OR REPLACE FUNCTION {{schema}}.reserve_one(p_sku text, p_location text,
                                                  p_slot smallint, p_qty bigint,
                                                  p_expected bigint, p_id uuid,
                                                  p_ttl_us bigint, p_lock_timeout text,
                                                  p_key text, p_fingerprint text,
                                                  p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
  v bigint;
  claimed integer;
  expires timestamptz := now() + p_ttl_us * interval '1 microsecond';
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF p_key IS NOT NULL THEN
    EXECUTE format($q$INSERT INTO %s (key, request_fingerprint, reservation_ids, created_at,
                                      shard_key)
                      VALUES ($1, $2, ARRAY[$3], now(), $4)
                      ON CONFLICT (shard_key, key) DO NOTHING$q$, t.idempotency)
      USING p_key, p_fingerprint, p_id, p_shard;
    GET DIAGNOSTICS claimed = ROW_COUNT;
    IF claimed = 0 THEN
      outcome := 'replay';
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  EXECUTE format($q$UPDATE %s
     SET reserved = reserved + $1, version = version + 1, updated_at = now()
   WHERE shard_key = $2 AND sku = $3 AND location = $4 AND slot = $5
     AND on_hand + backorder_limit - reserved - safety_stock - damaged - quality_control
         >= $1
     AND ($6 < 0 OR version = $6)
     AND discontinued_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= now())
  RETURNING version$q$, t.stock)
    INTO v USING p_qty, p_shard, p_sku, p_location, p_slot, p_expected;
  IF v IS NULL THEN
    IF p_key IS NOT NULL THEN
      EXECUTE format('DELETE FROM %s WHERE shard_key = $1 AND key = $2', t.idempotency)
        USING p_shard, p_key;
    END IF;
    outcome := 'refused';
    RETURN NEXT;
    RETURN;
  END IF;
  EXECUTE format($q$INSERT INTO %s (id, sku, location, slot, qty, state, version, expires_at,
                                    idempotency_key, created_at, updated_at, shard_key)
                    VALUES ($1, $2, $3, $4, $5, 'held', 1, $6, $7, now(), now(), $8)$q$,
                 t.reservation)
    USING p_id, p_sku, p_location, p_slot, p_qty, expires, p_key, p_shard;
  outcome := 'made';
  expires_us := (extract(epoch FROM expires) * 1000000)::bigint;
  created_us := (extract(epoch FROM now()) * 1000000)::bigint;
  row_version := v;
  RETURN NEXT;
END $fn$;

-- batch_one of citus/107, its statements on shard_tables(p_shard).
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
  t record;
  s {{schema}}.stock%ROWTYPE;
  taken bigint;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF cardinality(p_key_names) > 0 THEN
    EXECUTE format('SELECT count(*) FROM %s i WHERE i.shard_key = $1 AND i.key = ANY($2)',
                   t.idempotency)
      INTO taken USING p_shard, p_key_names;
    IF taken > 0 THEN
      RETURN;
    END IF;
  END IF;
  EXECUTE format($q$UPDATE %s t
     SET on_hand = t.on_hand - $1, reserved = t.reserved + $2,
         version = t.version + $3, updated_at = now()
   WHERE t.shard_key = $4 AND t.sku = $5 AND t.location = $6 AND t.slot = $7
     AND t.on_hand + t.backorder_limit - t.reserved - t.safety_stock - t.damaged
         - t.quality_control >= $1 + $2
     AND t.discontinued_at IS NULL
     AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now())
  RETURNING t.*$q$, t.stock)
    INTO s USING p_sold, p_held, p_changes, p_shard, p_sku, p_location, p_slot;
  IF s.sku IS NULL THEN
    RETURN;
  END IF;
  IF cardinality(p_ids) > 0 THEN
    EXECUTE format($q$INSERT INTO %s (id, sku, location, slot, qty, state, version,
                                      expires_at, idempotency_key, created_at, updated_at,
                                      order_id, ref, metadata, shard_key)
      SELECT r.i, $1, $2, $3, r.q, 'held', 1, now() + r.t * interval '1 microsecond',
             NULLIF(r.k, ''), now(), now(), NULLIF(r.o, '')::uuid, NULLIF(r.f, ''),
             NULLIF(r.m, '')::jsonb, $4
        FROM unnest($5::uuid[], $6::bigint[], $7::bigint[], $8::text[], $9::text[],
                    $10::text[], $11::text[]) AS r(i, q, t, k, o, f, m)$q$, t.reservation)
      USING p_sku, p_location, p_slot, p_shard, p_ids, p_qtys, p_ttls, p_keys, p_orders,
            p_refs, p_metadata;
  END IF;
  IF cardinality(p_key_names) > 0 THEN
    EXECUTE format($q$INSERT INTO %s (key, request_fingerprint, reservation_ids, created_at,
                                      shard_key)
      SELECT c.k, c.f, CASE WHEN c.i = '' THEN '{}'::uuid[] ELSE ARRAY[c.i::uuid] END, now(),
             $1
        FROM unnest($2::text[], $3::text[], $4::text[]) AS c(k, f, i)
       ORDER BY c.k COLLATE "C"$q$, t.idempotency)
      USING p_shard, p_key_names, p_key_prints, p_key_ids;
  END IF;
  RETURN QUERY SELECT s.sku, s.location, s.on_hand, s.reserved, s.version,
                      (extract(epoch FROM now()) * 1000000)::bigint, s.backorder_limit,
                      s.safety_stock, s.damaged, s.quality_control, s.incoming,
                      (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $fn$;

-- reserve_routed of citus/106 calls reserve_one, and forces no custom plans either.
ALTER FUNCTION {{schema}}.reserve_routed(text, text, smallint, bigint, bigint, uuid, bigint,
                                         text, text, text, integer)
  RESET plan_cache_mode;
