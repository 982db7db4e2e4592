-- An atomic reserve, keyless or keyed, as one delegated call on the Citus layout. The
-- statement form is five round trips to the coordinator (BEGIN, SET LOCAL lock_timeout,
-- the stock UPDATE, the reservation INSERT, COMMIT), each forwarded to the worker, and its
-- RETURNING columns are computed over a CTE (Citus refuses now() in RETURNING), which the
-- coordinator plans recursively with an intermediate result. Distributed by its shard-key
-- argument and co-located with stock, `SELECT * FROM reserve_one(...)` in autocommit runs
-- on the worker that holds the row: one round trip to the coordinator, one from it to
-- the worker, and the worker commits it itself.
--
-- The guards are hold_atomic's (statements.cpp): the row's room (migrations 003 and 013),
-- the expected version, no tombstone and no live lease. lock_timeout is set inside, for
-- the worker's own transaction. The engine calls it only without a journal note, a buyer,
-- a ref or metadata (those take the statement path).
--
-- With a key (p_key not NULL), the key is claimed first, in the shard of the request's
-- row, as the statement path does (idempotency_claim): a concurrent call with the same key
-- waits for this one's commit, within lock_timeout. A key that is there already changes
-- nothing ('replay'): the engine answers it on the statement path, which reads the key's
-- reservations in the transaction that holds the key. A refusal deletes the claim again,
-- in the same transaction, so that nothing of the call stays ('refused': the engine then
-- reads why). 'made': the hold, with its times and the row's new version.
CREATE FUNCTION {{schema}}.reserve_one(p_sku text, p_location text, p_slot smallint,
                                       p_qty bigint, p_expected bigint, p_id uuid,
                                       p_ttl_us bigint, p_lock_timeout text, p_key text,
                                       p_fingerprint text, p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text)
LANGUAGE plpgsql VOLATILE
-- Custom plans only. Run on the worker, a statement on a distributed table inside a
-- function is planned by Citus; its generic plan (deferred pruning) misses Citus 13.2's
-- local plan cache on every execution and adds another plan to it, so the worker's
-- session grew by about 90 kB a call (citus issues 8371 and 8783). Custom plans keep the
-- session flat, and ran faster too: 1,666 against 1,319 calls/s (16 clients over 2,000
-- SKUs for 24 s, on a three-node cluster on one 2-core machine).
SET plan_cache_mode = force_custom_plan
AS $$
DECLARE
  v bigint;
  expires timestamptz := now() + p_ttl_us * interval '1 microsecond';
BEGIN
  PERFORM set_config('lock_timeout', p_lock_timeout, true);
  IF p_key IS NOT NULL THEN
    INSERT INTO {{schema}}.idempotency (key, request_fingerprint, reservation_ids, created_at,
                                        shard_key)
    VALUES (p_key, p_fingerprint, ARRAY[p_id], now(), p_shard)
    ON CONFLICT (shard_key, key) DO NOTHING;
    IF NOT FOUND THEN
      outcome := 'replay';
      RETURN NEXT;
      RETURN;
    END IF;
  END IF;
  UPDATE {{schema}}.stock
     SET reserved = reserved + p_qty, version = version + 1, updated_at = now()
   WHERE shard_key = p_shard AND sku = p_sku AND location = p_location AND slot = p_slot
     AND on_hand + backorder_limit - reserved - safety_stock - damaged - quality_control
         >= p_qty
     AND (p_expected < 0 OR version = p_expected)
     AND discontinued_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= now())
  RETURNING version INTO v;
  IF NOT FOUND THEN
    IF p_key IS NOT NULL THEN
      DELETE FROM {{schema}}.idempotency WHERE shard_key = p_shard AND key = p_key;
    END IF;
    outcome := 'refused';
    RETURN NEXT;
    RETURN;
  END IF;
  INSERT INTO {{schema}}.reservation (id, sku, location, slot, qty, state, version,
                                      expires_at, idempotency_key, created_at, updated_at,
                                      shard_key)
  VALUES (p_id, p_sku, p_location, p_slot, p_qty, 'held', 1, expires, p_key, now(), now(),
          p_shard);
  outcome := 'made';
  expires_us := (extract(epoch FROM expires) * 1000000)::bigint;
  created_us := (extract(epoch FROM now()) * 1000000)::bigint;
  row_version := v;
  RETURN NEXT;
END $$;

SELECT create_distributed_function(
  '{{schema}}.reserve_one(text, text, smallint, bigint, bigint, uuid, bigint, text, text, text,'
  ' integer)',
  'p_shard', colocate_with := '{{schema}}.stock');
