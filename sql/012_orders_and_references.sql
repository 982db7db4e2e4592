-- stockade schema, version 12: the order a reservation belongs to, and the caller's
-- references on it.
--
-- order_id: reserve_order gives its reservations one order id, so that an order is one
-- handle: order() reads its lines back and confirm_order, release_order and extend_order
-- step every line in one transaction (docs/lifecycle.md, "One handle for an order"). NULL
-- for a reservation made by reserve(), and for the lines of an order made before this
-- version (they keep working line by line, and an order made with a key is found by it).
--
-- ref and metadata: what the caller tells of a reservation (an order line's id, a small
-- JSON object), bounded by the engine (docs/lifecycle.md, "References"); NULL when not
-- given. reservations() finds reservations by ref, by order or by buyer.
--
-- The three indexes hold only the rows that have the column: a reservation without an
-- order, a ref or a buyer costs no index entry. On a large database, CREATE INDEX here
-- takes a SHARE lock on the table while it builds (new holds wait). To avoid that, build
-- them first with CREATE INDEX CONCURRENTLY under these names; IF NOT EXISTS then skips
-- them.
--
-- Nullable columns without a default rewrite nothing. The DDL runs through EXECUTE for the
-- Citus layout, which propagates each statement alone (see 009).

DO $$
BEGIN
  EXECUTE 'ALTER TABLE {{schema}}.reservation ADD COLUMN order_id uuid NULL,'
          ' ADD COLUMN ref text NULL, ADD COLUMN metadata jsonb NULL';
  EXECUTE 'CREATE INDEX IF NOT EXISTS reservation_order ON {{schema}}.reservation (order_id)'
          ' WHERE order_id IS NOT NULL';
  EXECUTE 'CREATE INDEX IF NOT EXISTS reservation_ref ON {{schema}}.reservation (ref, id)'
          ' WHERE ref IS NOT NULL';
  EXECUTE 'CREATE INDEX IF NOT EXISTS reservation_buyer ON {{schema}}.reservation (buyer, id)'
          ' WHERE buyer IS NOT NULL';
END
$$;
