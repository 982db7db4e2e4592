-- stockade schema, version 12: the order a reservation belongs to.
--
-- reserve_order gives its reservations one order id, so that an order is one handle:
-- order() reads its lines back and confirm_order, release_order and extend_order step every
-- line in one transaction (docs/lifecycle.md, "One handle for an order"). NULL for a
-- reservation made by reserve(), and for the lines of an order made before this version
-- (they keep working line by line, and an order made with a key is found by its key).
--
-- The index holds only the lines of orders. On a large database, CREATE INDEX here takes a
-- SHARE lock on the table while it builds (new holds wait). To avoid that, build it first
-- with CREATE INDEX CONCURRENTLY under this name; IF NOT EXISTS then skips it.
--
-- A nullable column without a default rewrites nothing. The DDL runs through EXECUTE for
-- the Citus layout, which propagates each statement alone (see 009).

DO $$
BEGIN
  EXECUTE 'ALTER TABLE {{schema}}.reservation ADD COLUMN order_id uuid NULL';
  EXECUTE 'CREATE INDEX IF NOT EXISTS reservation_order ON {{schema}}.reservation (order_id)'
          ' WHERE order_id IS NOT NULL';
END
$$;
