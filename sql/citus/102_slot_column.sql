-- Hot-row slots in a column of their own on the Citus layout (see 005_slot_column.sql):
-- the stock table's key becomes (shard_key, sku, location, slot), then rows and
-- reservations written in the old form (U+001F and the slot in the location) move to the
-- new one. A slot's row already carried its SKU's shard key, so no row changes shard.

ALTER TABLE {{schema}}.stock DROP CONSTRAINT stock_pkey;
ALTER TABLE {{schema}}.stock ADD PRIMARY KEY (shard_key, sku, location, slot);
UPDATE {{schema}}.stock
   SET slot = substr(location, strpos(location, E'\x1f') + 1)::smallint,
       location = substr(location, 1, strpos(location, E'\x1f') - 1)
 WHERE strpos(location, E'\x1f') > 0;
UPDATE {{schema}}.reservation
   SET slot = substr(location, strpos(location, E'\x1f') + 1)::smallint,
       location = substr(location, 1, strpos(location, E'\x1f') - 1)
 WHERE strpos(location, E'\x1f') > 0;
