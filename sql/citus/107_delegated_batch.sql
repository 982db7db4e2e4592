-- The hot-row batcher's one-row fast path as one delegated call on the Citus layout. The
-- statement form is a transaction through the coordinator (BEGIN and SET LOCAL
-- lock_timeout, the row's UPDATE, the reservations' multi-row INSERT, the keys' INSERT,
-- COMMIT), and the worker holds the hot row's lock across each of those hops. Here the
-- worker runs them in one call and commits it itself: the row is locked only while the
-- function runs. Distributed by its shard-key argument and co-located with stock; the
-- engine calls it through the coordinator, or straight on the row's worker (direct
-- routing, migration citus/106), and it returns the group of the node it ran on.
--
-- The writes are the statement form's (BatchTx::write_one_citus): the row moves by the
-- batch's sums (p_sold, p_held, its version by p_changes) only if it has room for them
-- all (migrations 003 and 013's room), is not discontinued and has no live lease; then its
-- reservations go in (p_ids.. with '' for a NULL), and the batch's keys are claimed (a
-- reserve's names its reservation). A key that is stored already changes nothing and
-- returns no row, as does a row without room: the engine's full path decides those. A key
-- claimed by a call still in flight fails the claim (23505), which rolls the whole call
-- back. The engine calls it only for a batch on one row without buyers, keyed sells
-- or a journal note.
CREATE FUNCTION {{schema}}.batch_one(p_sku text, p_location text, p_slot smallint,
                                     p_sold bigint, p_held bigint, p_changes bigint,
                                     p_ids uuid[], p_qtys bigint[], p_ttls bigint[],
                                     p_keys text[], p_refs text[], p_metadata text[],
                                     p_orders text[], p_key_names text[],
                                     p_key_prints text[], p_key_ids text[],
                                     p_lock_timeout text, p_shard integer)
RETURNS TABLE (sku text, location text, on_hand bigint, reserved bigint, version bigint,
               now_us bigint, backorder_limit bigint, safety_stock bigint, damaged bigint,
               quality_control bigint, incoming bigint, node_group integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan  -- as reserve_one's (citus issues 8371, 8783)
AS $$
DECLARE
  s {{schema}}.stock%ROWTYPE;
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  IF cardinality(p_key_names) > 0 AND
     (SELECT count(*) FROM {{schema}}.idempotency i
       WHERE i.shard_key = p_shard AND i.key = ANY(p_key_names)) > 0 THEN
    RETURN;
  END IF;
  UPDATE {{schema}}.stock t
     SET on_hand = t.on_hand - p_sold, reserved = t.reserved + p_held,
         version = t.version + p_changes, updated_at = now()
   WHERE t.shard_key = p_shard AND t.sku = p_sku AND t.location = p_location
     AND t.slot = p_slot
     AND t.on_hand + t.backorder_limit - t.reserved - t.safety_stock - t.damaged
         - t.quality_control >= p_sold + p_held
     AND t.discontinued_at IS NULL
     AND (t.lease_expires_at IS NULL OR t.lease_expires_at <= now())
  RETURNING t.* INTO s;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  IF cardinality(p_ids) > 0 THEN
    INSERT INTO {{schema}}.reservation (id, sku, location, slot, qty, state, version,
                                        expires_at, idempotency_key, created_at, updated_at,
                                        order_id, ref, metadata, shard_key)
    SELECT r.i, p_sku, p_location, p_slot, r.q, 'held', 1,
           now() + r.t * interval '1 microsecond', NULLIF(r.k, ''), now(), now(),
           NULLIF(r.o, '')::uuid, NULLIF(r.f, ''), NULLIF(r.m, '')::jsonb, p_shard
      FROM unnest(p_ids, p_qtys, p_ttls, p_keys, p_orders, p_refs, p_metadata)
           AS r(i, q, t, k, o, f, m);
  END IF;
  IF cardinality(p_key_names) > 0 THEN
    INSERT INTO {{schema}}.idempotency (key, request_fingerprint, reservation_ids, created_at,
                                        shard_key)
    SELECT c.k, c.f, CASE WHEN c.i = '' THEN '{}'::uuid[] ELSE ARRAY[c.i::uuid] END, now(),
           p_shard
      FROM unnest(p_key_names, p_key_prints, p_key_ids) AS c(k, f, i)
     ORDER BY c.k COLLATE "C";
  END IF;
  RETURN QUERY SELECT s.sku, s.location, s.on_hand, s.reserved, s.version,
                      (extract(epoch FROM now()) * 1000000)::bigint, s.backorder_limit,
                      s.safety_stock, s.damaged, s.quality_control, s.incoming,
                      (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
END $$;

SELECT create_distributed_function(
  '{{schema}}.batch_one(text, text, smallint, bigint, bigint, bigint, uuid[], bigint[],'
  ' bigint[], text[], text[], text[], text[], text[], text[], text[], text, integer)',
  'p_shard', colocate_with := '{{schema}}.stock');
