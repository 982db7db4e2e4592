-- stockade schema, version 1.
--
-- {{schema}} is replaced by the engine's (validated) schema name when the migration is
-- applied: Engine.postgres(dsn, schema=...). The CHECK constraints are the last line of
-- defense: no code path, whatever its strategy or bug, can commit an oversold row.

CREATE TABLE {{schema}}.stock (
    sku        text        NOT NULL,
    location   text        NOT NULL DEFAULT 'default',
    on_hand    bigint      NOT NULL,
    reserved   bigint      NOT NULL DEFAULT 0,
    version    bigint      NOT NULL DEFAULT 1,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sku, location),
    CONSTRAINT stock_reserved_within_on_hand CHECK (reserved >= 0 AND reserved <= on_hand),
    CONSTRAINT stock_version_positive CHECK (version > 0)
);

-- Ids are UUIDv7 made by the engine: time-ordered for index locality, with the row's
-- shard key in 16 of their random bits (DESIGN.md section 7). No foreign key points at
-- reservation.id alone, so a sharded layout can key reservations by (shard key, id).
CREATE TABLE {{schema}}.reservation (
    id              uuid        PRIMARY KEY,
    sku             text        NOT NULL,
    location        text        NOT NULL,
    qty             bigint      NOT NULL CONSTRAINT reservation_qty_positive CHECK (qty > 0),
    state           text        NOT NULL CONSTRAINT reservation_state_known
                        CHECK (state IN ('held', 'confirmed', 'released', 'expired')),
    version         bigint      NOT NULL DEFAULT 1
                        CONSTRAINT reservation_version_positive CHECK (version > 0),
    expires_at      timestamptz NOT NULL,
    idempotency_key text        NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- The sweeper's index: only holds are in it, in expiry order.
CREATE INDEX reservation_held_expiry ON {{schema}}.reservation (expires_at)
    WHERE state = 'held';

-- Idempotency keys in a table of their own: one key can cover a whole order (several
-- reservations), and a sharded layout keeps this table keyed by the key alone.
CREATE TABLE {{schema}}.idempotency (
    key                 text        PRIMARY KEY,
    request_fingerprint text        NOT NULL,
    reservation_ids     uuid[]      NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);
