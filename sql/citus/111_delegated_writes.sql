-- A sell, and a step of a held reservation, as one delegated call each on the Citus layout.
--
-- A sell, as reserve_one (citus/105, 109) is for a reserve. Through statements, an atomic
-- sell is a transaction of four round trips (BEGIN with its Citus setting, SET LOCAL
-- lock_timeout, the guarded UPDATE, COMMIT), and Citus plans the UPDATE and the journal trigger's INSERT
-- wherever they run: 2.2 ms of the cluster's CPU a sell on the direct route, against
-- 0.9 ms a delegated reserve (benchmarks/citus.py, wide/sell and wide/auto). Distributed
-- by its shard-key argument and co-located with stock, `SELECT * FROM sell_one(...)` in
-- autocommit runs on the worker that holds the row, which commits it; there its UPDATE
-- names the shard table (shard_tables, citus/109) and the journal trigger writes the
-- co-located journal shard (citus/110).
--
-- The guards are stock_delta's (statements.cpp): the row's room (migrations 003 and 013),
-- the expected version (-1: none), no tombstone, and no live lease unless the call
-- carries the token of the row's latest lease (p_token, -1: none). That last one is not
-- a CASE as there: Citus refuses now() inside a CASE when the call writes the distributed
-- table (where the node does not hold the shard). No row back: refused, nothing changed
-- (the engine then reads why). Its row: the stock row as level_from reads it
-- (stock_columns in statements.cpp), then the group of the node it ran on, which tells a
-- stale direct route. The engine calls it only without an idempotency key or a journal
-- note (a ref): those take the statement path.
CREATE FUNCTION {{schema}}.sell_one(p_sku text, p_location text, p_slot smallint,
                                    p_qty bigint, p_expected bigint, p_token bigint,
                                    p_lock_timeout text, p_shard integer)
RETURNS TABLE (on_hand bigint, reserved bigint, version bigint, updated_us bigint,
               backorder_limit bigint, discontinued boolean, lease_token bigint,
               leased boolean, lease_expires_us bigint, low_stock bigint, slots integer,
               safety_stock bigint, damaged bigint, quality_control bigint,
               incoming bigint, node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
  s {{schema}}.stock%ROWTYPE;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  EXECUTE format($q$UPDATE %s t
     SET on_hand = t.on_hand - $1, version = t.version + 1, updated_at = now()
   WHERE t.shard_key = $2 AND t.sku = $3 AND t.location = $4 AND t.slot = $5
     AND t.on_hand + t.backorder_limit - t.reserved - t.safety_stock - t.damaged
         - t.quality_control >= $1
     AND ($6 < 0 OR t.version = $6)
     AND t.discontinued_at IS NULL
     AND (($7 < 0 AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now()))
          OR ($7 >= 0 AND t.lease_token = $7))
  RETURNING t.*$q$, t.stock)
    INTO s USING p_qty, p_shard, p_sku, p_location, p_slot, p_expected, p_token;
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

SELECT create_distributed_function(
  '{{schema}}.sell_one(text, text, smallint, bigint, bigint, bigint, text, integer)',
  'p_shard', colocate_with := '{{schema}}.stock');

-- A step of a held reservation (a confirm, a release, an extend) as one delegated call,
-- its decision the engine's. Through statements, a step is a transaction of five round
-- trips (BEGIN with SET LOCAL, the reservation locked, the stock row settled, the
-- reservation written, COMMIT), each planned by Citus: about 4.6 ms of the cluster's CPU
-- a confirm on the direct route (benchmarks/citus.py, wide/confirm). Instead the engine
-- reads the reservation on its worker, decides the step as the transaction would
-- (store/lifecycle.hpp, the one place the lifecycle's rules live), and this call applies
-- that decision if the reservation is still as read: the same version (p_version), held,
-- and not lapsed. Then, in the lock order of every step (the reservation, then the stock
-- row), the stock row settles by what the step moved: on_hand by p_sold, reserved by
-- p_settled. The journal's note (cause, reason, actor, reference) is set inside, for the
-- trigger on the stock shard.
--
-- Only where the node holds the shard (shard_tables): elsewhere Citus would run the
-- statements on another node, where a setting made by set_config() does not reach the
-- trigger, and the call changes nothing. No row back, from either check: the engine takes
-- the transaction, which decides afresh under the reservation's lock. Its row: the
-- reservation's new version, update time and expiry, the stock row's new version (NULL
-- when nothing moved: an extend), and the group of the node it ran on.
CREATE FUNCTION {{schema}}.step_one(p_id uuid, p_version bigint, p_state text,
                                    p_confirmed bigint, p_released bigint, p_expired bigint,
                                    p_ttl_us bigint, p_sku text, p_location text,
                                    p_slot smallint, p_sold bigint, p_settled bigint,
                                    p_note text, p_lock_timeout text, p_shard integer)
RETURNS TABLE (version bigint, updated_us bigint, expires_us bigint, row_version bigint,
               node_group integer)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
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
  EXECUTE format($q$UPDATE %s r
     SET state = $1, version = r.version + 1, updated_at = now(),
         expires_at = CASE WHEN $2 > 0 THEN now() + $2 * interval '1 microsecond'
                           ELSE r.expires_at END,
         confirmed = $3, released = $4, expired = $5
   WHERE r.shard_key = $6 AND r.id = $7 AND r.version = $8 AND r.state = 'held'
     AND r.expires_at > now()
  RETURNING r.version, r.updated_at, r.expires_at$q$, t.reservation)
    INTO v, updated, expires
    USING p_state, p_ttl_us, p_confirmed, p_released, p_expired, p_shard, p_id, p_version;
  IF v IS NULL THEN
    RETURN;
  END IF;
  IF p_sold <> 0 OR p_settled <> 0 THEN
    EXECUTE format($q$UPDATE %s s
       SET on_hand = s.on_hand - $1, reserved = s.reserved - $2, version = s.version + 1,
           updated_at = now()
     WHERE s.shard_key = $3 AND s.sku = $4 AND s.location = $5 AND s.slot = $6
    RETURNING s.version$q$, t.stock)
      INTO moved USING p_sold, p_settled, p_shard, p_sku, p_location, p_slot;
    IF moved IS NULL THEN
      RAISE EXCEPTION 'the stock row of reservation % is missing', p_id
        USING ERRCODE = 'SK002';  -- InvariantViolation, as the transaction's check
    END IF;
  END IF;
  RETURN QUERY SELECT v, (extract(epoch FROM updated) * 1000000)::bigint,
                      (extract(epoch FROM expires) * 1000000)::bigint, moved,
                      (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $fn$;

SELECT create_distributed_function(
  '{{schema}}.step_one(uuid, bigint, text, bigint, bigint, bigint, bigint, text, text,'
  ' smallint, bigint, bigint, text, text, integer)',
  'p_shard', colocate_with := '{{schema}}.stock');
