-- reserve_one's body as reserve_local, a function that Citus does not delegate (it has no
-- distribution argument): it runs on the node it is called on. reserve_one (delegated by
-- the coordinator, citus/105) and reserve_routed (called on the worker by direct routing,
-- citus/106) both call it, so the reserve keeps one text.
--
-- reserve_routed called reserve_one, a distributed function, and Citus plans a call of a
-- distributed function with parameters afresh on every execution: it keeps such calls off
-- generic plans, so that a later execution can still be delegated by its argument. On the
-- worker that holds the shard that planning is all it does (the call is not delegated to
-- the same node): about 4% of a worker's time under keyless reserves routed direct (a perf
-- profile, docs/scaling-out.md). A call of reserve_local keeps its generic plan.
--
-- The body is citus/109's, unchanged.
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
