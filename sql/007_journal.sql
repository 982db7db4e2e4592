-- stockade schema, version 7: the movement journal, the change feed's consumers, and
-- low-stock thresholds (docs/journal.md).
--
-- movement: one entry per change of a stock row, written by a row trigger in the
--   transaction of the change, so that no code path (and no manual SQL fix) changes a row
--   without its entry. `id` is drawn after the row is locked and changed, so per row the
--   ids follow the versions. `xid` is the writing transaction's id: the change feed reads
--   only what committed below a snapshot (see feed_consumer), never `WHERE id > last`,
--   which skips a transaction that took its id before another one and committed after it.
-- The cause is read from the change (the deltas and the columns that moved), refined by
--   the note the engine sets for the transaction (`stockade.note`: cause, reason, actor
--   and reservation id, separated by U+001F), as cause_of() in cpp/src/store/journal.cpp.
-- feed_consumer: each named consumer's committed position: every change that committed
--   in the snapshot `snap_from` was delivered; of the batch up to `snap_to`, the entries
--   up to `after_id`. Retention does not purge what a consumer has not passed, up to
--   feed_lag_max; a consumer it had to pass is marked `overrun_at`.
-- stock.low_stock: the row's threshold for the feed's low-stock alerts (NULL: none).
--
-- On the Citus layout the journal is not built yet: the trigger is made only where the
-- citus extension is absent, and the engine refuses the journal's calls there.

ALTER TABLE {{schema}}.stock ADD COLUMN low_stock bigint NULL;

CREATE TABLE {{schema}}.movement (
    id             bigserial   PRIMARY KEY,
    xid            xid8        NOT NULL DEFAULT pg_current_xact_id(),
    sku            text        NOT NULL,
    location       text        NOT NULL,
    slot           smallint    NOT NULL,
    version_before bigint      NOT NULL,
    version_after  bigint      NOT NULL,
    on_hand_delta  bigint      NOT NULL,
    reserved_delta bigint      NOT NULL,
    on_hand        bigint      NOT NULL,
    reserved       bigint      NOT NULL,
    available      bigint      NOT NULL,
    cause          text        NOT NULL,
    reason         text        NULL,
    actor          text        NULL,
    ref            text        NULL,
    requests       bigint      NOT NULL,
    alerts         integer     NOT NULL DEFAULT 0,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX movement_xid ON {{schema}}.movement (xid);
CREATE INDEX movement_sku ON {{schema}}.movement (sku, id);

CREATE TABLE {{schema}}.feed_consumer (
    name         text        PRIMARY KEY,
    snap_from    pg_snapshot NOT NULL,
    snap_to      pg_snapshot NULL,
    after_id     bigint      NOT NULL DEFAULT 0,
    overrun_at   timestamptz NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    committed_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION {{schema}}.journal_stock() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    note   text[] := string_to_array(coalesce(current_setting('stockade.note', true), ''),
                                     E'\x1f');
    said   text := coalesce(note[1], '');
    made   boolean := TG_OP = 'INSERT';
    v_was  bigint := 0;
    on_was bigint := 0;
    rs_was bigint := 0;
    was    bigint := 0;
    now_av bigint := NEW.on_hand + NEW.backorder_limit - NEW.reserved;
    d_on   bigint;
    d_rs   bigint;
    cause  text;
    flags  integer := 0;
BEGIN
    IF NOT made THEN
        v_was := OLD.version;
        on_was := OLD.on_hand;
        rs_was := OLD.reserved;
        was := OLD.on_hand + OLD.backorder_limit - OLD.reserved;
    END IF;
    d_on := NEW.on_hand - on_was;
    d_rs := NEW.reserved - rs_was;
    IF made THEN
        cause := CASE WHEN said IN ('set_on_hand', 'slot_move') THEN said
                      WHEN NEW.on_hand > 0 THEN 'restock' ELSE 'create' END;
    ELSIF NEW.discontinued_at IS DISTINCT FROM OLD.discontinued_at THEN
        cause := CASE WHEN NEW.discontinued_at IS NULL THEN 'reinstate' ELSE 'discontinue' END;
    ELSIF NEW.backorder_limit <> OLD.backorder_limit THEN
        cause := 'backorder_limit';
    ELSIF NEW.low_stock IS DISTINCT FROM OLD.low_stock THEN
        cause := 'low_stock';
    ELSIF NEW.lease_token <> OLD.lease_token
          OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at THEN
        cause := 'lease';
    ELSIF d_on = 0 AND d_rs = 0 THEN
        cause := CASE WHEN said = 'set_on_hand' THEN said ELSE 'touch' END;
    ELSIF d_on = 0 AND d_rs > 0 THEN
        cause := 'hold';
    ELSIF d_on = 0 THEN
        cause := CASE WHEN said IN ('expire', 'confirm') THEN 'expire' ELSE 'release' END;
    ELSIF d_rs = d_on THEN
        cause := 'confirm';
    ELSIF d_rs = 0 THEN
        cause := CASE WHEN said IN ('set_on_hand', 'slot_move', 'restock') THEN said
                      WHEN d_on > 0 THEN 'restock' ELSE 'sell' END;
    ELSE
        cause := 'batch';
    END IF;
    IF NOT made AND NEW.low_stock IS NOT NULL
       AND NEW.low_stock IS NOT DISTINCT FROM OLD.low_stock THEN
        IF was >= NEW.low_stock AND now_av < NEW.low_stock THEN flags := flags | 1; END IF;
        IF now_av >= NEW.low_stock AND was < NEW.low_stock THEN flags := flags | 8; END IF;
    END IF;
    IF NOT made AND was > 0 AND now_av <= 0 THEN flags := flags | 2; END IF;
    IF (made OR was <= 0) AND now_av > 0 THEN flags := flags | 4; END IF;
    INSERT INTO {{schema}}.movement (sku, location, slot, version_before, version_after,
        on_hand_delta, reserved_delta, on_hand, reserved, available, cause, reason, actor,
        ref, requests, alerts)
    VALUES (NEW.sku, NEW.location, NEW.slot, v_was, NEW.version, d_on, d_rs, NEW.on_hand,
        NEW.reserved, now_av, cause, nullif(note[2], ''), nullif(note[3], ''),
        nullif(note[4], ''), greatest(NEW.version - v_was, 1), flags);
    RETURN NULL;
END
$$;

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus') THEN
    CREATE TRIGGER stock_journal AFTER INSERT OR UPDATE ON {{schema}}.stock
        FOR EACH ROW EXECUTE FUNCTION {{schema}}.journal_stock();
  END IF;
END
$$;
