-- stockade schema, version 3: backorders, soft delete and leases on the stock row.
--
-- Each is a property of the row it governs, so the one conditional UPDATE that guards
-- every write sees it under the row lock: no second table to probe on the hot path, and
-- no window between a check and the write (a lease taken just before a write is seen by
-- the write's re-check of the locked row, as the room is).
--
-- backorder_limit: how many units may be promised beyond on_hand (preorders). The
--   invariant becomes 0 <= reserved <= on_hand + backorder_limit; on_hand itself may go
--   below zero (units sold or confirmed but owed), down to -backorder_limit. Default 0:
--   nothing changes for rows that do not set it.
-- discontinued_at: a soft delete. The row stays as a tombstone; new holds, sells and
--   restocks are refused (HTTP 410), while holds that exist may still be confirmed or
--   released.
-- lease_*: the offline lock. lease_token is the latest lease's fencing token (from the
--   lease_token sequence, so tokens strictly increase across every holder), kept after
--   the lease ends: it is the highest token the row has seen, and writes that carry an
--   older one are refused. lease_expires_at is compared with the database's now().
--
-- The ADD COLUMNs have constant defaults (no table rewrite). Replacing the CHECK
-- constraint validates every row under an ACCESS EXCLUSIVE lock: a short pause on a
-- large table.

CREATE SEQUENCE IF NOT EXISTS {{schema}}.lease_token;

ALTER TABLE {{schema}}.stock
    ADD COLUMN backorder_limit  bigint      NOT NULL DEFAULT 0,
    ADD COLUMN discontinued_at  timestamptz NULL,
    ADD COLUMN lease_token      bigint      NOT NULL DEFAULT 0,
    ADD COLUMN lease_owner      text        NULL,
    ADD COLUMN lease_expires_at timestamptz NULL,
    DROP CONSTRAINT stock_reserved_within_on_hand,
    ADD CONSTRAINT stock_reserved_within_limit
        CHECK (reserved >= 0 AND reserved <= on_hand + backorder_limit),
    ADD CONSTRAINT stock_backorder_limit_nonnegative CHECK (backorder_limit >= 0);
