-- The Citus layout (layout='citus'), applied after the plain migrations to a schema that
-- holds no rows yet: stock, reservation and idempotency gain a shard_key column (a 16-bit
-- stable hash of the SKU and location, which every reservation id carries too; an
-- idempotency key lives with the rows of its request), every PRIMARY KEY and conflict
-- target leads with it, and Citus distributes the three tables on it, co-located, so
-- that the rows of one SKU, its reservations and their keys lie on one shard and every
-- statement that names the shard key runs on that shard alone, with a plain COMMIT.
--
-- A key is therefore unique per shard key, not in the whole database: a retry of a
-- request finds its key (same SKU, same shard key), but a key reused for a SKU of
-- another shard key is not reported as a conflict. Purchase-limit tables stay local to
-- the coordinator; purchase limits and purge are not built on this layout yet
-- (NotSupported).

ALTER TABLE {{schema}}.stock ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.stock DROP CONSTRAINT stock_pkey;
ALTER TABLE {{schema}}.stock ADD PRIMARY KEY (shard_key, sku, location);

ALTER TABLE {{schema}}.reservation ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.reservation DROP CONSTRAINT reservation_pkey;
ALTER TABLE {{schema}}.reservation ADD PRIMARY KEY (shard_key, id);

ALTER TABLE {{schema}}.idempotency ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.idempotency DROP CONSTRAINT idempotency_pkey;
ALTER TABLE {{schema}}.idempotency ADD PRIMARY KEY (shard_key, key);

SELECT create_distributed_table('{{schema}}.stock', 'shard_key');
SELECT create_distributed_table('{{schema}}.reservation', 'shard_key',
                                colocate_with => '{{schema}}.stock');
SELECT create_distributed_table('{{schema}}.idempotency', 'shard_key',
                                colocate_with => '{{schema}}.stock');
