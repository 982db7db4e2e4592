-- stockade schema, version 11: an idempotency key on every write.
--
-- Keys of sells, restocks, set_on_hand, confirms, releases, extends, resizes and returns
-- live in the same table as reserves' keys, under the same retention rules. A reserve's
-- key keeps the ids of its reservations (read back on a replay); any other write's keeps
-- its outcome here instead (a stock level or a reservation, encoded by the engine), with
-- an empty reservation_ids, so that a replay returns exactly what the first call returned.
-- NULL for a reserve's key and for keys made before this version.
--
-- A nullable column without a default rewrites nothing.

ALTER TABLE {{schema}}.idempotency ADD COLUMN outcome text NULL;
