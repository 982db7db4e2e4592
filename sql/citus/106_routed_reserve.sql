-- The delegated reserve for direct routing (citus_routing='direct'), where the engine sends
-- the call straight to the worker its shard map names: reserve_one (migration citus/105),
-- plus the group (pg_dist_node.groupid) of the node it ran on. A node that does not hold
-- the shard delegates the call to the one that does (every node has the metadata), so a
-- stale map is only slower; the group tells the engine that it missed, and it reads the
-- map again. Distributed and co-located as reserve_one; inside the delegated call the
-- nested reserve_one runs where it is, on the shard's node.
CREATE FUNCTION {{schema}}.reserve_routed(p_sku text, p_location text, p_slot smallint,
                                          p_qty bigint, p_expected bigint, p_id uuid,
                                          p_ttl_us bigint, p_lock_timeout text, p_key text,
                                          p_fingerprint text, p_shard integer)
RETURNS TABLE (expires_us bigint, created_us bigint, row_version bigint, outcome text,
               node_group integer)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_custom_plan  -- as reserve_one's (citus issues 8371, 8783)
AS $$
BEGIN
  RETURN QUERY
    SELECT r.expires_us, r.created_us, r.row_version, r.outcome,
           (SELECT g.groupid FROM pg_catalog.pg_dist_local_group g)
      FROM {{schema}}.reserve_one(p_sku, p_location, p_slot, p_qty, p_expected, p_id,
                                  p_ttl_us, p_lock_timeout, p_key, p_fingerprint, p_shard) r;
END $$;

SELECT create_distributed_function(
  '{{schema}}.reserve_routed(text, text, smallint, bigint, bigint, uuid, bigint, text, text,'
  ' text, integer)',
  'p_shard', colocate_with := '{{schema}}.stock');
