-- stockade schema, version 5: a hot-row slot's row keeps its slot number in a column of
-- its own.
--
-- Until version 4 a slot's row was the SKU's row with U+001F and two digits appended to
-- its location ('default' + E'\x1f' + '01'), so a caller's location could not contain
-- U+001F. Now every stock row is (sku, location, slot), slot 0 being the SKU's own row,
-- and a reservation records the slot of the row it holds units on. Rows and reservations
-- written in the old form are moved to the new one here, in place.
--
-- On the Citus layout the tables are distributed and their primary key leads with the
-- shard key: citus/102_slot_column.sql changes the key and moves the rows there (this
-- file only adds the columns), since a distributed table's key must name its shard key.
-- The key is rebuilt under an exclusive lock: a table of millions of rows takes seconds.

-- (No CHECK on the slot's range: Citus propagates an ADD CONSTRAINT ... CHECK in a
-- multi-statement migration as its raw text, which its workers refuse. The engine writes
-- slots 0 to 63 only.)
ALTER TABLE {{schema}}.stock ADD COLUMN slot smallint NOT NULL DEFAULT 0;
ALTER TABLE {{schema}}.reservation ADD COLUMN slot smallint NOT NULL DEFAULT 0;

DO $$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM information_schema.columns
                 WHERE table_schema = '{{schema}}' AND table_name = 'stock'
                   AND column_name = 'shard_key') THEN
    ALTER TABLE {{schema}}.stock DROP CONSTRAINT stock_pkey;
    ALTER TABLE {{schema}}.stock ADD PRIMARY KEY (sku, location, slot);
    UPDATE {{schema}}.stock
       SET slot = substr(location, strpos(location, E'\x1f') + 1)::smallint,
           location = substr(location, 1, strpos(location, E'\x1f') - 1)
     WHERE strpos(location, E'\x1f') > 0;
    UPDATE {{schema}}.reservation
       SET slot = substr(location, strpos(location, E'\x1f') + 1)::smallint,
           location = substr(location, 1, strpos(location, E'\x1f') - 1)
     WHERE strpos(location, E'\x1f') > 0;
  END IF;
END
$$;
