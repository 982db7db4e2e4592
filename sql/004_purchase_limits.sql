-- stockade schema, version 4: purchase limits ("at most 2 per customer across these 5
-- SKUs").
--
-- The limit is a multi-row invariant: a buyer's holds on several SKUs together. Checking
-- it by summing the buyer's reservations and then inserting is write skew at READ
-- COMMITTED (two reservations on two SKUs each see a total under the limit; no row
-- conflicts). So each (group, buyer) has a parent row, buyer_allowance, whose `held` is
-- the units the buyer holds or bought in the group: a reserve increments it with a
-- conditional upsert (held + qty <= per_buyer) that takes the row's lock, so two
-- requests by one buyer serialize on it while different buyers never meet. It is locked
-- before any stock row, and released and expired holds give their units back in the
-- same transaction; confirmations keep counting.
--
-- No foreign key points at purchase_limit from buyer_allowance: it would take a KEY SHARE
-- lock on the group's one row for every buyer's upsert. remove_purchase_limit deletes a
-- group's allowances itself.

CREATE TABLE {{schema}}.purchase_limit (
    group_name text   PRIMARY KEY,
    per_buyer  bigint NOT NULL CONSTRAINT purchase_limit_positive CHECK (per_buyer > 0)
);

-- A SKU (at every location) belongs to at most one group.
CREATE TABLE {{schema}}.purchase_limit_sku (
    sku        text PRIMARY KEY,
    group_name text NOT NULL REFERENCES {{schema}}.purchase_limit ON DELETE CASCADE
);

CREATE TABLE {{schema}}.buyer_allowance (
    group_name text   NOT NULL,
    buyer      text   NOT NULL,
    held       bigint NOT NULL DEFAULT 0 CONSTRAINT buyer_allowance_nonnegative CHECK (held >= 0),
    PRIMARY KEY (group_name, buyer)
);

-- Which buyer a reservation counts against, and in which group (fixed when it is made,
-- so that a release gives the units back where they were taken).
ALTER TABLE {{schema}}.reservation
    ADD COLUMN buyer       text NULL,
    ADD COLUMN limit_group text NULL;

-- Aborts the statement it is called from, rolling back everything the statement did. A
-- one-statement write in autocommit that took a buyer's allowance and then could not
-- move the stock row (out of stock, or another buyer's row passed its limit) calls it:
-- the statement then changes nothing, and the engine decides the request the long way.
CREATE FUNCTION {{schema}}.abort_statement() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'stockade: a one-statement write could not apply in full; rolled back'
        USING ERRCODE = 'SK001';
END
$$;
