-- The Citus layout of transfers (migration 013): the table gains a shard_key, the source
-- row's (which every transfer id carries, as a reservation id does), leads its primary
-- key with it, and is distributed co-located with stock. A transfer and its source row
-- lie on one shard; its destination may lie on another, so a transfer and its steps are
-- transactions over two shards (two-phase, as an allocation over a pool is).

ALTER TABLE {{schema}}.transfer ADD COLUMN shard_key integer NOT NULL;
ALTER TABLE {{schema}}.transfer DROP CONSTRAINT transfer_pkey;
ALTER TABLE {{schema}}.transfer ADD PRIMARY KEY (shard_key, id);

SELECT create_distributed_table('{{schema}}.transfer', 'shard_key',
                                colocate_with => '{{schema}}.stock');
