-- stockade schema, version 13: units on hand that are not for sale, and transfers of stock
-- between locations.
--
-- safety_stock: a floor kept back from sale on the row. available becomes
--   on_hand + backorder_limit - reserved - safety_stock - damaged - quality_control
--   (never below zero when shown), and every guarded write checks it (the engine's
--   sql::room). It is a threshold, not a bucket: it may exceed what is free, and a
--   stock count that finds fewer units is still recorded. So no CHECK holds it; the
--   guards do, each in the one statement that writes the row.
-- damaged, quality_control: units on hand in a state that is never sold, moved in and out
--   by move_units (or written off from there). They are real units, so the CHECK counts
--   them with the holds: reserved + damaged + quality_control <= on_hand + backorder_limit.
--   No write can sell or hold a unit that sits in either bucket.
--
-- incoming: units in transit to this location: not on hand, not available, shown so that
--   stock in transit is neither double-counted nor invisible.
--
-- transfer: a transfer takes units from its source's on_hand at once and shows them as
--   `incoming` at its destination until they are received (put on hand there, or
--   rejected: written off) or cancelled (back on hand at the source). Each step is one
--   transaction that locks the transfer, then its stock rows in key order
--   (docs/locations.md, "Transfers"). transfer_units: every count >= 0, no more received,
--   rejected and cancelled than sent, and the state those counts give: 'in_transit'
--   exactly while units are in transit, then 'received' if any unit was received or
--   rejected, else 'cancelled'. On the Citus layout, citus/104_transfers.sql distributes
--   the table with the source's rows.
--
-- The journal reads the new changes as causes of their own: 'safety_stock' (the floor
-- moved), 'move' (units between states, on_hand unchanged), 'write_off' (units that left
-- on_hand from a state, or from available with the engine's note), and a transfer's, from
-- the engine's note: 'transfer_out' (the source's on_hand down), 'transfer_in' (the
-- destination's incoming up; a destination without a row gets one first, at zero units:
-- 'create'), 'receive' (on hand at the
-- destination), 'reject' (written off there) and 'transfer_cancel' (either row, when the
-- units go back). Its `available` and alerts count the withheld units. The function is
-- edited in place from its own text, as 010 does (cause_of() in cpp/src/store/journal.cpp
-- is the memory store's twin).
--
-- The ADD COLUMNs have constant defaults (no table rewrite); replacing the CHECK validates
-- every row under an ACCESS EXCLUSIVE lock, a short pause on a large table. EXECUTE: on
-- the Citus layout, Citus propagates each statement alone (see 009).

CREATE TABLE {{schema}}.transfer (
    id          uuid        NOT NULL,
    sku         text        NOT NULL,
    source      text        NOT NULL,
    destination text        NOT NULL,
    qty         bigint      NOT NULL,
    received    bigint      NOT NULL DEFAULT 0,
    rejected    bigint      NOT NULL DEFAULT 0,
    cancelled   bigint      NOT NULL DEFAULT 0,
    state       text        NOT NULL,
    version     bigint      NOT NULL DEFAULT 1,
    reason      text        NULL,
    actor       text        NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT transfer_pkey PRIMARY KEY (id),
    CONSTRAINT transfer_units CHECK (
        qty > 0 AND received >= 0 AND rejected >= 0 AND cancelled >= 0
        AND received + rejected + cancelled <= qty
        AND state IN ('in_transit', 'received', 'cancelled')
        AND (state = 'in_transit') = (received + rejected + cancelled < qty)
        AND (state <> 'cancelled' OR received + rejected = 0)
        AND (state <> 'received' OR received + rejected > 0))
);
CREATE INDEX transfer_sku ON {{schema}}.transfer (sku, id);
-- Retention's pick of finished transfers, oldest first (transfers_finished).
CREATE INDEX transfer_finished ON {{schema}}.transfer (updated_at) WHERE state <> 'in_transit';

DO $$
DECLARE
    def   text := pg_get_functiondef('{{schema}}.journal_stock()'::regprocedure);
    edits text[][] := ARRAY[
        ['now_av bigint := NEW.on_hand + NEW.backorder_limit - NEW.reserved;',
         'now_av bigint := greatest(NEW.on_hand + NEW.backorder_limit - NEW.reserved
        - NEW.safety_stock - NEW.damaged - NEW.quality_control, 0);'],
        ['was := OLD.on_hand + OLD.backorder_limit - OLD.reserved;',
         'was := greatest(OLD.on_hand + OLD.backorder_limit - OLD.reserved
        - OLD.safety_stock - OLD.damaged - OLD.quality_control, 0);'],
        ['ELSIF NEW.backorder_limit <> OLD.backorder_limit THEN',
         'ELSIF NEW.safety_stock <> OLD.safety_stock THEN
        cause := ''safety_stock'';
    ELSIF NEW.damaged <> OLD.damaged OR NEW.quality_control <> OLD.quality_control THEN
        cause := CASE WHEN NEW.on_hand < OLD.on_hand THEN ''write_off'' ELSE ''move'' END;
    ELSIF NEW.backorder_limit <> OLD.backorder_limit THEN'],
        ['WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'', ''return'') THEN said',
         'WHEN said IN (''set_on_hand'', ''slot_move'', ''restock'', ''return'', ''write_off'')
                      THEN said'],
        ['ELSIF NEW.safety_stock <> OLD.safety_stock THEN',
         'ELSIF said IN (''transfer'', ''receive'', ''cancel_transfer'')
          AND (d_on <> 0 OR NEW.incoming <> OLD.incoming) THEN
        cause := CASE WHEN said = ''transfer'' AND d_on < 0 THEN ''transfer_out''
                      WHEN said = ''transfer'' THEN ''transfer_in''
                      WHEN said = ''receive'' AND d_on > 0 THEN ''receive''
                      WHEN said = ''receive'' THEN ''reject''
                      ELSE ''transfer_cancel'' END;
    ELSIF NEW.safety_stock <> OLD.safety_stock THEN']];
    i     integer;
BEGIN
    EXECUTE 'ALTER TABLE {{schema}}.stock'
            ' ADD COLUMN safety_stock bigint NOT NULL DEFAULT 0,'
            ' ADD COLUMN damaged bigint NOT NULL DEFAULT 0,'
            ' ADD COLUMN quality_control bigint NOT NULL DEFAULT 0,'
            ' ADD COLUMN incoming bigint NOT NULL DEFAULT 0';
    EXECUTE 'ALTER TABLE {{schema}}.stock DROP CONSTRAINT stock_reserved_within_limit';
    EXECUTE 'ALTER TABLE {{schema}}.stock ADD CONSTRAINT stock_claimed_within_limit CHECK ('
            'reserved >= 0 AND reserved + damaged + quality_control <= on_hand + backorder_limit)';
    EXECUTE 'ALTER TABLE {{schema}}.stock ADD CONSTRAINT stock_states_nonnegative CHECK ('
            'safety_stock >= 0 AND damaged >= 0 AND quality_control >= 0 AND incoming >= 0)';
    FOR i IN 1 .. array_length(edits, 1) LOOP
        IF position(edits[i][1] IN def) = 0 THEN
            RAISE EXCEPTION 'journal_stock() is not the function of migration 010 (edit %)', i;
        END IF;
        def := replace(def, edits[i][1], edits[i][2]);
    END LOOP;
    EXECUTE def;
END
$$;
