-- The movement journal and the change feed on the Citus layout (see 007_journal.sql).
--
-- movement is distributed on shard_key, co-located with stock: a stock row's entries lie
-- on its shard, and the journal's trigger runs on the shards themselves (Citus copies a
-- distributed table's triggers to its shards under citus.enable_unsafe_triggers). There
-- the trigger's INSERT names the row's shard key, so it runs on the same shard, in the
-- local transaction of the change: one worker, a plain COMMIT, as before. `xid` is then
-- the worker's transaction id and `id` comes from the worker's range of the sequence
-- (Citus gives each node its own), so per row both follow the versions as on one server.
--
-- Each node counts transactions on its own, so a feed consumer's position is one
-- snapshot per node group (a jsonb object, group id to pg_snapshot text; a group that is
-- missing has delivered nothing yet): feed_snapshots() takes them on every node (through
-- feed_clock, a table of one row per shard, co-located), and feed_snapshot() picks the
-- local node's out of such an object where a statement runs on a shard. A shard moved to another node (a rebalance) brings its entries' transaction
-- ids from the old node: drop and reopen feeds after one (docs/journal.md).
--
-- The trigger function is the one of 007 with shard_key added to its INSERT (rewritten
-- here rather than copied, so that the journal's rules have one text).

-- Citus runs a function's DDL on one connection per node, which it cannot do after a
-- parallel command on a distributed table in the same transaction: the functions first.

CREATE FUNCTION {{schema}}.feed_snapshot(snaps jsonb) RETURNS pg_snapshot
    LANGUAGE sql STABLE AS $$
    SELECT coalesce((snaps ->> groupid::text)::pg_snapshot, '3:3:'::pg_snapshot)
      FROM pg_catalog.pg_dist_local_group
$$;

CREATE FUNCTION {{schema}}.feed_node() RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT groupid FROM pg_catalog.pg_dist_local_group
$$;

-- Every node's snapshot, from a read of feed_clock (one row per shard: the statement runs
-- on each shard, on the connections Citus keeps, in under a millisecond). A node that
-- holds journal shards but no clock row (after a shard split) is asked directly, over
-- new connections (run_command_on_all_nodes, about 20 ms): a node missing from a
-- position would read as "nothing delivered" there.
CREATE FUNCTION {{schema}}.feed_snapshots() RETURNS jsonb LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    snaps jsonb := '{}'::jsonb;
    r     record;
BEGIN
    FOR r IN SELECT {{schema}}.feed_node() AS g, pg_current_snapshot()::text AS s
               FROM {{schema}}.feed_clock LOOP
        snaps := snaps || jsonb_build_object(r.g::text, r.s);
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_shard d
                     JOIN pg_catalog.pg_dist_placement p USING (shardid)
                    WHERE d.logicalrelid = '{{schema}}.movement'::regclass
                      AND NOT snaps ? p.groupid::text) THEN
        RETURN snaps;
    END IF;
    FOR r IN SELECT n.groupid, c.success, c.result
               FROM run_command_on_all_nodes('SELECT pg_current_snapshot()') c
               JOIN pg_catalog.pg_dist_node n ON n.nodeid = c.nodeid LOOP
        IF NOT r.success THEN  -- a node's position must never fall back to its start
            RAISE EXCEPTION 'the change feed could not read the snapshot of node group %',
                r.groupid USING ERRCODE = '08006';
        END IF;
        snaps := snaps || jsonb_build_object(r.groupid::text, r.result);
    END LOOP;
    RETURN snaps;
END
$$;

DO $$
DECLARE
    def   text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    fixed text := replace(replace(def,
        'INSERT INTO {{schema}}.movement (sku,', 'INSERT INTO {{schema}}.movement (shard_key, sku,'),
        'VALUES (NEW.sku,', 'VALUES (NEW.shard_key, NEW.sku,');
BEGIN
    IF length(fixed) <> length(def) + length('shard_key, NEW.shard_key, ') THEN
        RAISE EXCEPTION 'journal_stock() is not the function of migration 007';
    END IF;
    EXECUTE fixed;
END
$$;

ALTER TABLE {{schema}}.movement ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.movement DROP CONSTRAINT movement_pkey;
ALTER TABLE {{schema}}.movement ADD PRIMARY KEY (shard_key, id);
CREATE INDEX movement_id ON {{schema}}.movement (id);
SELECT create_distributed_table('{{schema}}.movement', 'shard_key',
                                colocate_with => '{{schema}}.stock');

CREATE TABLE {{schema}}.feed_clock (shard_key integer PRIMARY KEY);
SELECT create_distributed_table('{{schema}}.feed_clock', 'shard_key',
                                colocate_with => '{{schema}}.stock');

ALTER TABLE {{schema}}.feed_consumer ALTER COLUMN snap_from TYPE jsonb USING '{}'::jsonb;
ALTER TABLE {{schema}}.feed_consumer ALTER COLUMN snap_to TYPE jsonb USING NULL;

-- Citus sends a trigger's DDL to the shards as the text of the query that held it, which
-- must be that one command: hence EXECUTE.
SET LOCAL citus.enable_unsafe_triggers = on;
DO $$
BEGIN
    EXECUTE 'CREATE TRIGGER stock_journal AFTER INSERT OR UPDATE ON {{schema}}.stock'
            ' FOR EACH ROW EXECUTE FUNCTION {{schema}}.journal_stock()';
END
$$;

-- One clock row per shard: the smallest shard key (0 to 65535) that each shard holds.
INSERT INTO {{schema}}.feed_clock (shard_key)
SELECT min(k) FROM generate_series(0, 65535) AS k
 GROUP BY get_shard_id_for_distribution_column('{{schema}}.stock', k);
