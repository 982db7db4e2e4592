-- stockade schema, version 2: retention.
--
-- purge() and the sweeper (retention=...) delete terminal reservations and idempotency
-- keys older than a horizon, oldest first, in bounded batches. These two indexes find them
-- without scanning the tables: terminal reservations by the time they last changed (holds
-- are not in it, and are never purged), keys by the time they were made.
--
-- On a large version-1 database, CREATE INDEX here takes a SHARE lock on each table while
-- it builds (writes wait). To upgrade without that pause, build both indexes first with
-- CREATE INDEX CONCURRENTLY under these same names; IF NOT EXISTS then skips them.

CREATE INDEX IF NOT EXISTS reservation_terminal_updated ON {{schema}}.reservation (updated_at)
    WHERE state <> 'held';

CREATE INDEX IF NOT EXISTS idempotency_created ON {{schema}}.idempotency (created_at);
