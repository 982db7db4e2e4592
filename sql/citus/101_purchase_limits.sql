-- Purchase limits on the Citus layout (layout='citus' only; see 100_distribute.sql).
--
-- A buyer's count in a group (buyer_allowance, the parent row a limited reserve locks
-- before any stock row) is distributed on a shard key of its own, the stable hash of
-- (group, buyer), co-located with the stock: a limited reserve is one transaction over
-- the buyer's shard and the SKU's, which Citus commits in two phases when they lie on
-- different workers, so the count and the reservation commit together or not at all.
-- The groups and their SKUs are reference tables: every node has them, so a statement on
-- one shard can read them. (Left local to the coordinator they would commit apart from
-- the workers: Citus commits a one-worker transaction on the worker first.)

ALTER TABLE {{schema}}.buyer_allowance ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.buyer_allowance DROP CONSTRAINT buyer_allowance_pkey;
ALTER TABLE {{schema}}.buyer_allowance ADD PRIMARY KEY (shard_key, group_name, buyer);

SELECT create_reference_table('{{schema}}.purchase_limit');
SELECT create_reference_table('{{schema}}.purchase_limit_sku');
SELECT create_distributed_table('{{schema}}.buyer_allowance', 'shard_key',
                                colocate_with => '{{schema}}.stock');
