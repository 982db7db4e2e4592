-- The journal entry of a delegated write (reserve_one, batch_one) on the journal's shard
-- table itself. The journal trigger (citus/103) fires on the stock shard, and its INSERT
-- names the distributed table `movement`: Citus plans it on every call (deferred pruning
-- on the row's shard key), deparses the shard query and plans that again for local
-- execution. Under delegated reserves over many SKUs on the direct route that was 23% of
-- the machine's CPU (a perf profile of the cluster, docs/scaling-out.md).
--
-- shard_tables (citus/109) now also notes, for the rest of the transaction, which stock
-- shard it found here and the name of the co-located journal shard
-- (stockade.local_journal: "<stock shard oid> <journal shard>"). The trigger writes that
-- journal shard directly when it fires on that very stock shard: the shard is here and
-- stays here (shard_tables holds the co-located shards' metadata lock in share mode until
-- the transaction ends, so a move waits), and co-located shards move together. Everywhere
-- else (the coordinator route, a statement through Citus, a call that found the shard
-- elsewhere, another shard in the same transaction) the oid does not match and the
-- trigger's INSERT is the one it was. A shard table has no sequence defaults (Citus
-- evaluates them where it plans), so the direct INSERT takes `id` from the distributed
-- table's default, evaluated on this node (each node has its own range of the sequence, as
-- citus/103 says); its other defaults are on the shard.
--
-- Both are edits of the functions as migrated (the journal's rules keep one text): the
-- trigger's INSERT is wrapped, its column and value lists unchanged.

DO $$
DECLARE
    def    text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    head   text := 'INSERT INTO {{schema}}.movement (';
    tail   text := E');\n    RETURN NULL;';
    at     integer := position(head IN def);
    stmt   text;
    parts  text[];
    params text;
    id_default text := (SELECT pg_get_expr(d.adbin, d.adrelid)
                          FROM pg_catalog.pg_attrdef d
                          JOIN pg_catalog.pg_attribute a
                            ON a.attrelid = d.adrelid AND a.attnum = d.adnum
                         WHERE d.adrelid = '{{schema}}.movement'::regclass
                           AND a.attname = 'id');
BEGIN
    -- Already wrapped where this runs again on a schema whose functions of citus/105 to 109
    -- were dropped and made anew (the trigger is not among them).
    IF position('stockade.local_journal' IN def) = 0 THEN
        IF at = 0 OR position(head IN substr(def, at + 1)) <> 0
           OR position(tail IN substr(def, at)) = 0 OR id_default IS NULL THEN
            RAISE EXCEPTION 'journal_stock() is not the function of migration 013';
        END IF;
        stmt := substr(def, at, position(tail IN substr(def, at)) + 1);  -- through ');'
        parts := regexp_match(stmt, '^INSERT INTO \S+ \(([^()]*)\)\s+VALUES \((.*)\);$', 's');
        IF parts IS NULL THEN
            RAISE EXCEPTION 'journal_stock() is not the function of migration 013 (its INSERT)';
        END IF;
        SELECT string_agg('$' || n, ', ') INTO params
          FROM generate_series(1, array_length(regexp_split_to_array(parts[1], ','), 1)) AS n;
        def := replace(def, stmt,
            E'IF split_part(current_setting(''stockade.local_journal'', true), '' '', 1)\n'
            || E'       = TG_RELID::text THEN\n'
            || E'        EXECUTE ''INSERT INTO '' || split_part(current_setting('
            || E'''stockade.local_journal''), '' '', 2)\n'
            || '            || ' || quote_literal(' (id, ' || parts[1] || ') VALUES ('
                                                  || id_default || ', ' || params || ')')
            || E'\n          USING ' || parts[2] || E';\n'
            || E'    ELSE\n'
            || '        ' || replace(stmt, E'\n', E'\n    ') || E'\n'
            || '    END IF;');
        EXECUTE def;
    END IF;

    def := pg_get_functiondef('{{schema}}.shard_tables(integer)'::regprocedure);
    head := E'      RETURN QUERY SELECT\n'
            || E'        v_public || shard_name(''{{schema}}.stock''::regclass, v_stock),';
    IF position(head IN def) = 0 THEN
        RAISE EXCEPTION 'shard_tables() is not the function of migration citus/109';
    END IF;
    def := replace(def, head,
        E'      PERFORM set_config(''stockade.local_journal'',\n'
        || E'        (v_public || shard_name(''{{schema}}.stock''::regclass, v_stock))'
        || E'::regclass::oid::text\n'
        || E'        || '' '' || v_public || shard_name(''{{schema}}.movement''::regclass,\n'
        || E'             get_shard_id_for_distribution_column(''{{schema}}.movement'','
        || E' p_shard)), true);\n'
        || head);
    EXECUTE def;
END
$$;
