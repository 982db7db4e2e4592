-- The journal entry of a delegated write (reserve_one, batch_one) on the journal's shard
-- table itself. The journal trigger (citus/103) fires on the stock shard, and its INSERT
-- names the distributed table `movement`: Citus plans it on every call (deferred pruning
-- on the row's shard key), deparses the shard query and plans that again for local
-- execution. Under delegated reserves over many SKUs on the direct route, Citus's
-- execution of that INSERT was 13% of the machine's CPU, the trigger 23% (a perf profile
-- of the cluster, docs/scaling-out.md).
--
-- shard_tables (citus/109) now also notes, for the rest of the transaction, the oid of the
-- stock shard it found here (stockade.local_journal). The trigger writes the co-located
-- journal shard (of the row's shard key, on this node) directly when it fires on that
-- very stock shard: the shard is here and stays here (shard_tables holds the co-located
-- shards' metadata lock in share mode until the transaction ends, so a move waits), and
-- co-located shards move together. Everywhere else (the coordinator route, a statement
-- through Citus, a call that found the shard elsewhere, another shard in the same
-- transaction) the oid does not match and the trigger's INSERT is the one it was. The
-- setting names no table: set by hand, it can only send an entry to the journal shard
-- beside the stock shard the trigger fires on, which is where Citus would put it. A shard
-- table has no sequence defaults (Citus evaluates them where it plans), so the direct
-- INSERT takes `id` from the distributed table's sequence, by its qualified name, on this
-- node (each node has its own range of it, as citus/103 says); its other defaults are on
-- the shard.
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
    id_seq text := pg_get_serial_sequence('{{schema}}.movement', 'id');  -- qualified
BEGIN
    -- Already wrapped where this runs again on a schema whose functions of citus/105 to 109
    -- were dropped and made anew (the trigger is not among them).
    IF position('stockade.local_journal' IN def) = 0 THEN
        IF at = 0 OR position(head IN substr(def, at + 1)) <> 0
           OR position(tail IN substr(def, at)) = 0 OR id_seq IS NULL THEN
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
            E'IF current_setting(''stockade.local_journal'', true) = TG_RELID::text THEN\n'
            || E'        EXECUTE ''INSERT INTO '' || CASE WHEN ''{{schema}}'' = ''public'''
            || E' THEN ''public.'' ELSE '''' END\n'
            || E'            || shard_name(''{{schema}}.movement''::regclass,\n'
            || E'                          get_shard_id_for_distribution_column('
            || E'''{{schema}}.movement'', NEW.shard_key))\n'
            || '            || ' || quote_literal(' (id, ' || parts[1] || ') VALUES ('
                                                  || format('nextval(%L::regclass)', id_seq)
                                                  || ', ' || params || ')')
            || E'\n          USING ' || parts[2] || E';\n'
            || E'    ELSE\n'
            || '        ' || replace(stmt, E'\n', E'\n    ') || E'\n'
            || '    END IF;');
        EXECUTE def;
    END IF;

    def := pg_get_functiondef('{{schema}}.shard_tables(integer)'::regprocedure);
    IF position('stockade.local_journal' IN def) = 0 THEN  -- as above
        head := E'      RETURN QUERY SELECT\n'
                || E'        v_public || shard_name(''{{schema}}.stock''::regclass, v_stock),';
        IF position(head IN def) = 0 THEN
            RAISE EXCEPTION 'shard_tables() is not the function of migration citus/109';
        END IF;
        def := replace(def, head,
            E'      PERFORM set_config(''stockade.local_journal'',\n'
            || E'        (v_public || shard_name(''{{schema}}.stock''::regclass, v_stock))'
            || E'::regclass::oid::text, true);\n'
            || head);
        EXECUTE def;
    END IF;
END
$$;
