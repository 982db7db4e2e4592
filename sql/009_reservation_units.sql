-- stockade schema, version 9: where each unit of a reservation is now.
--
-- A reservation keeps what was asked (qty) and, since this version, how many of those
-- units were confirmed (sold), released, expired, and of the confirmed ones returned. The
-- units still held are the rest: qty - confirmed - released - expired, the reservation's
-- share of its stock row's `reserved`. A confirm or a release may take part of a hold;
-- the state stays 'held' while any unit is held, then says how the hold ended:
-- 'confirmed' if any unit was sold, else 'released' or 'expired' (docs/lifecycle.md).
-- Expiry takes the whole remainder at once, so a held reservation has expired = 0.
--
-- reservation_units: every count >= 0, held >= 0, returned <= confirmed, 'held' exactly
-- when units are held, and no expired unit on a hold (the sweeper's RETURNING relies on
-- it: the units it frees are the new `expired`). Rows written before this version are moved whole to the
-- column of their state, so they keep it.
--
-- Adding a NOT NULL column with a constant default rewrites nothing (PostgreSQL 11+); the
-- UPDATEs touch the terminal reservations once. The DDL runs through EXECUTE so that, on
-- the Citus layout's distributed tables, Citus propagates each statement alone and not
-- this file's text, which its workers refuse ("cannot insert multiple commands").

DO $$
BEGIN
  EXECUTE 'ALTER TABLE {{schema}}.reservation'
          ' ADD COLUMN confirmed bigint NOT NULL DEFAULT 0,'
          ' ADD COLUMN released bigint NOT NULL DEFAULT 0,'
          ' ADD COLUMN expired bigint NOT NULL DEFAULT 0,'
          ' ADD COLUMN returned bigint NOT NULL DEFAULT 0';
  UPDATE {{schema}}.reservation SET confirmed = qty WHERE state = 'confirmed';
  UPDATE {{schema}}.reservation SET released = qty WHERE state = 'released';
  UPDATE {{schema}}.reservation SET expired = qty WHERE state = 'expired';
  EXECUTE 'ALTER TABLE {{schema}}.reservation ADD CONSTRAINT reservation_units CHECK ('
          'confirmed >= 0 AND released >= 0 AND expired >= 0 AND returned >= 0'
          ' AND returned <= confirmed'
          ' AND confirmed + released + expired <= qty'
          ' AND (state = ''held'') = (confirmed + released + expired < qty)'
          ' AND (state <> ''held'' OR expired = 0))';
END
$$;
