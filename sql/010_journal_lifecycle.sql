-- stockade schema, version 10: the journal names the order lifecycle's new steps.
--
-- journal_stock() (007; on the Citus layout as citus/103 rewrote it) reads a change's
-- cause from its deltas, refined by the engine's note. Two steps of the order lifecycle
-- did not read as themselves:
-- - a return put back on hand (note 'return': on_hand up, reserved unchanged) read as
--   'restock'; it now reads 'return';
-- - a confirm that releases the rest of its hold (confirm with release_rest: on_hand down,
--   reserved down by more) read as 'batch'; it now reads 'confirm'.
-- The function is rewritten in place from its own text, as citus/103 does, so that the
-- journal's rules keep one text on both layouts (cause_of() in cpp/src/store/journal.cpp
-- is their C++ twin, for the memory store). EXECUTE: Citus propagates the one statement.

DO $$
DECLARE
    def   text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    fixed text := replace(replace(def,
        'WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'') THEN said',
        'WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'', ''return'') THEN said'),
        'ELSE
        cause := ''batch'';',
        'ELSIF said = ''confirm'' AND d_on < 0 AND d_rs < d_on THEN
        cause := ''confirm'';
    ELSE
        cause := ''batch'';');
BEGIN
    IF fixed = def OR length(fixed) - length(def) <> length(', ''return''')
           + length('ELSIF said = ''confirm'' AND d_on < 0 AND d_rs < d_on THEN
        cause := ''confirm'';
    ') THEN
        RAISE EXCEPTION 'journal_stock() is not the function of migration 007';
    END IF;
    EXECUTE fixed;
END
$$;
