-- The writes of the hot-row batcher's statement forms on the Citus layout (the full path,
-- and the one-row form of a batch with a keyed sell or a journal note), as delegated calls
-- inside their transaction, not literal SQL. A batch's multi-row INSERT cannot be a prepared
-- statement there: Citus sends an INSERT ... SELECT of many rows through COPY, which makes
-- the transaction two-phase. So the engine quoted every value into the text of an
-- INSERT ... VALUES (the reservations, the keys) or an UPDATE with a CASE per key (the
-- keys' outcomes), which the coordinator parsed and planned through Citus on every batch,
-- and the worker parsed and planned again.
--
-- Each function here is distributed by its shard-key argument, co-located with stock, and
-- forced to delegation (`force_delegation`): Citus then delegates a call inside a
-- transaction block too, over the connection that already holds the transaction's locks on
-- that worker, and runs it there as part of the same transaction (one commit, not two
-- phases). The engine sends it as a prepared statement whose arrays carry the values. On
-- the worker the statements name the shard tables (shard_tables, citus/109), planned by
-- PostgreSQL alone. Where shard_tables names the distributed tables instead (a role that
-- does not own the tables, a session that is not READ COMMITTED: the engine then sends SQL
-- text, see citus_shard_path_usable, so only a caller of its own meets this), each row is
-- written by its own statement, which Citus routes to the shard's node without COPY.
-- Inside a delegated call in a transaction block Citus runs no remote work, so where the
-- shard has left the node (a move that switched its placement between the coordinator's
-- routing and the call's shard lock, possible only for a transaction's first statement:
-- a routed write holds the shard's metadata lock on the coordinator until its commit), the
-- call fails and its transaction rolls back, changing nothing.
--
-- batch_holds: the batch's new reservations, each held, its times the batch's own
-- (p_now_us, the moment its row lock or move read: a now() here would be the worker's
-- transaction's, which began later). '' stands for NULL in the text arrays; an array
-- shorter than p_ids (buyers, groups) gives NULLs. Returns the rows written.
CREATE FUNCTION {{schema}}.batch_holds(p_now_us bigint, p_ids uuid[], p_skus text[],
                                       p_locations text[], p_slots bigint[], p_qtys bigint[],
                                       p_ttls bigint[], p_keys text[], p_buyers text[],
                                       p_groups text[], p_orders text[], p_refs text[],
                                       p_metadata text[], p_shard integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
  n bigint := 0;
  made bigint;
  now_at timestamptz := 'epoch'::timestamptz + p_now_us * interval '1 microsecond';
  r record;
BEGIN
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF t.here THEN
    EXECUTE format($q$INSERT INTO %s (id, sku, location, slot, qty, state, version,
                                      expires_at, idempotency_key, created_at, updated_at,
                                      buyer, limit_group, order_id, ref, metadata, shard_key)
       SELECT r.i, r.s, r.l, r.sl::smallint, r.q, 'held', 1,
              $1 + r.t * interval '1 microsecond', NULLIF(r.k, ''), $1, $1, NULLIF(r.b, ''),
              NULLIF(r.g, ''), NULLIF(r.o, '')::uuid, NULLIF(r.f, ''), NULLIF(r.m, '')::jsonb,
              $2
         FROM unnest($3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
              AS r(i, s, l, sl, q, t, k, b, g, o, f, m)$q$, t.reservation)
      USING now_at, p_shard, p_ids, p_skus, p_locations, p_slots, p_qtys, p_ttls, p_keys,
            p_buyers, p_groups, p_orders, p_refs, p_metadata;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
  END IF;
  FOR r IN SELECT * FROM unnest(p_ids, p_skus, p_locations, p_slots, p_qtys, p_ttls, p_keys,
                                p_buyers, p_groups, p_orders, p_refs, p_metadata)
                    AS u(i, s, l, sl, q, t, k, b, g, o, f, m) LOOP
    EXECUTE format($q$INSERT INTO %s (id, sku, location, slot, qty, state, version,
                                      expires_at, idempotency_key, created_at, updated_at,
                                      buyer, limit_group, order_id, ref, metadata, shard_key)
       VALUES ($3, $4, $5, $6::smallint, $7, 'held', 1, $1 + $8 * interval '1 microsecond',
               NULLIF($9, ''), $1, $1, NULLIF($10, ''), NULLIF($11, ''), NULLIF($12, '')::uuid,
               NULLIF($13, ''), NULLIF($14, '')::jsonb, $2)$q$, t.reservation)
      USING now_at, p_shard, r.i, r.s, r.l, r.sl, r.q, r.t, r.k, r.b, r.g, r.o, r.f, r.m;
    GET DIAGNOSTICS made = ROW_COUNT;
    n := n + made;
  END LOOP;
  RETURN n;
END $fn$;

SELECT create_distributed_function(
  '{{schema}}.batch_holds(bigint, uuid[], text[], text[], bigint[], bigint[], bigint[],'
  ' text[], text[], text[], text[], text[], text[], integer)',
  'p_shard', colocate_with := '{{schema}}.stock', force_delegation := true);

-- batch_keys: the batch's idempotency keys, in sorted bytewise order (as batch_claim claims
-- them on the plain layout), each with its request's fingerprint, the reservation it names
-- ('': none) and its outcome ('': none yet). With p_skip_taken a key stored already is
-- passed over; without, it fails the call (23505), which the engine reads as a key
-- claimed in flight elsewhere. Returns the keys written.
CREATE FUNCTION {{schema}}.batch_keys(p_names text[], p_prints text[], p_ids text[],
                                      p_outcomes text[], p_skip_taken boolean,
                                      p_shard integer)
RETURNS SETOF text
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
  r record;
  taken text := CASE WHEN p_skip_taken THEN 'ON CONFLICT (shard_key, key) DO NOTHING'
                     ELSE '' END;
BEGIN
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF t.here THEN
    RETURN QUERY EXECUTE format($q$INSERT INTO %s AS x (key, request_fingerprint,
                                                        reservation_ids, outcome, created_at,
                                                        shard_key)
       SELECT c.k, c.f, array_remove(ARRAY[NULLIF(c.i, '')::uuid], NULL),
              NULLIF(c.o, ''), now(), $1
         FROM unnest($2, $3, $4, $5) AS c(k, f, i, o)
        ORDER BY c.k COLLATE "C" %s RETURNING x.key$q$, t.idempotency, taken)
      USING p_shard, p_names, p_prints, p_ids, p_outcomes;
    RETURN;
  END IF;
  FOR r IN SELECT * FROM unnest(p_names, p_prints, p_ids, p_outcomes) AS u(k, f, i, o)
            ORDER BY u.k COLLATE "C" LOOP
    RETURN QUERY EXECUTE format($q$INSERT INTO %s AS x (key, request_fingerprint,
                                                        reservation_ids, outcome, created_at,
                                                        shard_key)
       VALUES ($2, $3, array_remove(ARRAY[NULLIF($4, '')::uuid], NULL),
               NULLIF($5, ''), now(), $1) %s RETURNING x.key$q$, t.idempotency, taken)
      USING p_shard, r.k, r.f, r.i, r.o;
  END LOOP;
END $fn$;

SELECT create_distributed_function(
  '{{schema}}.batch_keys(text[], text[], text[], text[], boolean, integer)',
  'p_shard', colocate_with := '{{schema}}.stock', force_delegation := true);

-- batch_key_outcomes: the outcomes of the batch's keyed sells and steps that went through,
-- each stored with its key (claimed earlier in the same transaction). Returns the keys
-- written, which the engine checks against the count it sent.
CREATE FUNCTION {{schema}}.batch_key_outcomes(p_names text[], p_outcomes text[],
                                              p_shard integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  t record;
  n bigint := 0;
  made bigint;
  r record;
BEGIN
  SELECT * INTO t FROM {{schema}}.shard_tables(p_shard);
  IF t.here THEN
    EXECUTE format($q$UPDATE %s i SET outcome = o.v
       FROM unnest($1, $2) AS o(k, v) WHERE i.shard_key = $3 AND i.key = o.k$q$,
                   t.idempotency)
      USING p_names, p_outcomes, p_shard;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
  END IF;
  FOR r IN SELECT * FROM unnest(p_names, p_outcomes) AS u(k, v) LOOP
    EXECUTE format($q$UPDATE %s i SET outcome = $1 WHERE i.shard_key = $2 AND i.key = $3$q$,
                   t.idempotency)
      USING r.v, p_shard, r.k;
    GET DIAGNOSTICS made = ROW_COUNT;
    n := n + made;
  END LOOP;
  RETURN n;
END $fn$;

SELECT create_distributed_function(
  '{{schema}}.batch_key_outcomes(text[], text[], integer)',
  'p_shard', colocate_with := '{{schema}}.stock', force_delegation := true);
