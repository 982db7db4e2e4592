-- stockade schema, version 10: the journal names the order lifecycle's new steps.
--
-- journal_stock() (007; on the Citus layout as citus/103 rewrote it) reads a change's
-- cause from its deltas, refined by the engine's note. The order lifecycle's steps did
-- not read as themselves:
-- - a return put back on hand (note 'return': on_hand up, reserved unchanged, or a row
--   the return made) read as 'restock'; it now reads 'return';
-- - a resize of a hold (note 'resize': reserved up or down) read as 'hold' or
--   'release'; it now reads 'resize';
-- - a confirm that releases the rest of its hold (note 'confirm': on_hand down, reserved
--   down by more) read as 'batch'; it now reads 'confirm'. (On the batched path no note
--   is set for the batch's write: a batch's net change still reads by its deltas.)
-- The function is rewritten in place from its own text, as citus/103 does, so that the
-- journal's rules keep one text on both layouts (cause_of() in cpp/src/store/journal.cpp
-- is their C++ twin, for the memory store). EXECUTE: Citus propagates the one statement.

DO $$
DECLARE
    def   text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    edits text[][] := ARRAY[
        ['WHEN said IN (''set_on_hand'', ''slot_move'') THEN said',
         'WHEN said IN (''set_on_hand'', ''slot_move'', ''return'') THEN said'],
        ['WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'') THEN said',
         'WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'', ''return'') THEN said'],
        ['ELSIF d_on = 0 AND d_rs > 0 THEN',
         'ELSIF d_on = 0 AND d_rs <> 0 AND said = ''resize'' THEN
        cause := ''resize'';
    ELSIF d_on = 0 AND d_rs > 0 THEN'],
        ['ELSE
        cause := ''batch'';',
         'ELSIF said = ''confirm'' AND d_on < 0 AND d_rs < d_on THEN
        cause := ''confirm'';
    ELSE
        cause := ''batch'';']];
    i     integer;
BEGIN
    FOR i IN 1 .. array_length(edits, 1) LOOP
        IF position(edits[i][1] IN def) = 0 THEN
            RAISE EXCEPTION 'journal_stock() is not the function of migration 007 (edit %)', i;
        END IF;
        def := replace(def, edits[i][1], edits[i][2]);
    END LOOP;
    EXECUTE def;
END
$$;
