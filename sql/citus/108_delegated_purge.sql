-- Retention on the Citus layout as one delegated call per Citus shard. The statement form
-- (PostgresStore::purge_step_citus) reads the next old entries from every shard, then
-- purges each shard's in a transaction of several statements through the coordinator:
-- about ten round trips and a distributed plan per few hundred rows. Here the worker that
-- holds the shard runs one server's purge statements (migration 002's, as purge_keys and
-- purge_reservations) on its own shard tables, and commits them itself.
--
-- Distributed by its shard-key argument and co-located with stock: the engine calls it
-- once per Citus shard with a shard key of that shard (through the coordinator, or
-- straight on the worker with direct routing). p_keys: the keys phase, else the
-- reservations phase; p_older_us the horizon's age; p_n at most this many keys (or
-- reservations); p_cursor where this phase of this shard starts (epoch microseconds).
-- Returns the keys and reservations it deleted, the next cursor, whether it ran where the
-- shard lies, the group of the node it ran on (a stale direct route is a miss), and, on
-- the phase's last call here (fewer than p_n deleted), whether this shard holds an old
-- entry it leaves to the statement form (below); the engine runs that form only then.
--
-- What it leaves to the statement form, which runs after it and reads every shard:
--  - a key with a reservation that is not in this shard (an order's line on another
--    shard, or a reservation a purge of another key took first);
--  - a keyed reservation (its key is here and goes with it, or lies elsewhere).
-- So it never decides on what it cannot see, and deletes nothing the statement form
-- would keep.
--
-- Its shard is named by Citus (shard_name) and placed on this node (pg_dist_placement)
-- once it holds the shard's metadata lock in share mode (one lock for the co-located
-- shards of all three tables: Citus keys it by co-location and shard index): a shard
-- move takes that lock exclusively before it switches the placement, so the move waits
-- for this call, and a call after the move finds the shard elsewhere and does nothing
-- (here = false). Called where the shard is not (inside a transaction, which Citus does
-- not delegate, or on the coordinator), it does nothing too; so does a role that does
-- not own the tables, which Citus does not let take that lock (a least-privilege runtime
-- role; the engine checks that first and does not call): the statement form then does
-- it all.
CREATE FUNCTION {{schema}}.purge_shard(p_keys boolean, p_older_us bigint, p_n bigint,
                                       p_cursor bigint, p_shard integer)
RETURNS TABLE (keys bigint, reservations bigint, cursor_us bigint, here boolean,
               node_group integer, leftover boolean)
LANGUAGE plpgsql VOLATILE
AS $fn$
DECLARE
  v_keys bigint := get_shard_id_for_distribution_column('{{schema}}.idempotency', p_shard);
  v_holds bigint := get_shard_id_for_distribution_column('{{schema}}.reservation', p_shard);
  v_horizon timestamptz := now() - p_older_us * interval '1 microsecond';
  v_from timestamptz := 'epoch'::timestamptz + p_cursor * interval '1 microsecond';
  v_group integer := (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g);
  v_idem text;
  v_res text;
  v_deleted_keys bigint := 0;
  v_deleted bigint := 0;
  v_cursor bigint := p_cursor;
  v_left boolean := false;
  -- A reservation id's shard key (Uuid::shard_key: 16 bits from byte 8's low six bits
  -- on), which the primary key (shard_key, id) needs; an id read wrong is not found, and
  -- its key waits for the statement form.
  v_key_of text := $k$((('x' || translate(substr(%s::text, 20, 7), '-', ''))::bit(24)::integer
                       & 4194303) >> 6)$k$;
BEGIN
  IF NOT pg_has_role((SELECT c.relowner FROM pg_catalog.pg_class c
                       WHERE c.oid = '{{schema}}.reservation'::regclass), 'USAGE') THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, p_cursor, false, v_group, true;
    RETURN;
  END IF;
  PERFORM lock_shard_metadata(5, ARRAY[v_holds]);  -- 5: ShareLock
  v_idem := shard_name('{{schema}}.idempotency'::regclass, v_keys);
  v_res := shard_name('{{schema}}.reservation'::regclass, v_holds);
  IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_placement p
                  WHERE p.shardid = v_holds AND p.groupid = v_group)
     OR to_regclass(v_res) IS NULL THEN
    RETURN QUERY SELECT 0::bigint, 0::bigint, p_cursor, false, v_group, true;
    RETURN;
  END IF;
  IF p_keys THEN
    -- purge_keys: old keys whose reservations are all here, terminal and old, with them.
    EXECUTE format($q$
      WITH doomed AS (
        SELECT i.shard_key, i.key, i.reservation_ids, i.created_at FROM %1$s i
         WHERE i.created_at < $1 AND i.created_at >= $2
           AND (SELECT count(*) FROM unnest(i.reservation_ids) AS u(id)
                  JOIN %2$s r ON r.shard_key = %3$s AND r.id = u.id
                 WHERE r.state <> 'held' AND r.updated_at < $1)
               = cardinality(i.reservation_ids)
         ORDER BY i.created_at LIMIT $3 FOR UPDATE OF i SKIP LOCKED),
      keys AS (DELETE FROM %1$s i USING doomed d
                WHERE i.shard_key = d.shard_key AND i.key = d.key RETURNING 1),
      gone AS (DELETE FROM %2$s r
                USING (SELECT unnest(reservation_ids) AS id FROM doomed) d
                WHERE r.shard_key = %4$s AND r.id = d.id AND r.state <> 'held' RETURNING 1)
      SELECT (SELECT count(*) FROM keys), (SELECT count(*) FROM gone),
             coalesce((SELECT max((extract(epoch FROM created_at) * 1000000)::bigint)
                         FROM doomed), $4)
    $q$, v_idem, v_res, format(v_key_of, 'u.id'), format(v_key_of, 'd.id'))
    INTO v_deleted_keys, v_deleted, v_cursor
    USING v_horizon, v_from, p_n, p_cursor;
    IF v_deleted_keys < p_n THEN
      -- What stays: old keys held up here, and keys with a reservation not here.
      EXECUTE format($q$
        SELECT EXISTS (SELECT 1 FROM %1$s i WHERE i.created_at < $1
           AND (SELECT count(*) FROM unnest(i.reservation_ids) AS u(id)
                  JOIN %2$s r ON r.shard_key = %3$s AND r.id = u.id)
               < cardinality(i.reservation_ids))
      $q$, v_idem, v_res, format(v_key_of, 'u.id'))
      INTO v_left USING v_horizon;
    END IF;
  ELSE
    -- purge_reservations, of reservations without a key.
    EXECUTE format($q$
      WITH doomed AS (
        SELECT r.shard_key, r.id, r.updated_at FROM %1$s r
         WHERE r.state <> 'held' AND r.updated_at < $1 AND r.updated_at >= $2
           AND r.idempotency_key IS NULL
         ORDER BY r.updated_at LIMIT $3 FOR UPDATE SKIP LOCKED),
      gone AS (DELETE FROM %1$s r USING doomed d
                WHERE r.shard_key = d.shard_key AND r.id = d.id RETURNING 1)
      SELECT (SELECT count(*) FROM gone),
             coalesce((SELECT max((extract(epoch FROM updated_at) * 1000000)::bigint)
                         FROM doomed), $4)
    $q$, v_res)
    INTO v_deleted, v_cursor
    USING v_horizon, v_from, p_n, p_cursor;
    IF v_deleted < p_n THEN
      -- What stays: keyed reservations whose key is not beside them (a key held up
      -- beside them keeps them, as the statement form would).
      EXECUTE format($q$
        SELECT EXISTS (SELECT 1 FROM %1$s r
         WHERE r.state <> 'held' AND r.updated_at < $1 AND r.idempotency_key IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM %2$s i
                            WHERE i.shard_key = r.shard_key AND i.key = r.idempotency_key))
      $q$, v_res, v_idem)
      INTO v_left USING v_horizon;
    END IF;
  END IF;
  RETURN QUERY SELECT v_deleted_keys, v_deleted, v_cursor, true, v_group, v_left;
END $fn$;

SELECT create_distributed_function(
  '{{schema}}.purge_shard(boolean, bigint, bigint, bigint, integer)',
  'p_shard', colocate_with := '{{schema}}.stock');
