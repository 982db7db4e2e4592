"""Retention: purge() and retention=..., on both stores, and migration 002 over a
version-1 database with data.

The rules under test (Engine.purge): holds are never purged; a key goes once it is older
than the horizon and none of its reservations is held; a terminal reservation goes once it
last changed before the horizon and its key is gone. So a key replays for the whole
window, and a replay never finds its reservations missing.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Callable, Iterator

import pytest

import stockade
from stockade.testing import race
from stockade.tools.pgserver import run_sql
from stockade.tools.pytest_plugin import PostgresForTests
from support import MIGRATIONS, wait_for

LONG = timedelta(hours=1)


def settle(backend: str, wait: Callable[[float], None]) -> None:
    """Lets the store's clock move past what was just written, so that a horizon of
    "now" (older_than=0) lies after it."""
    wait(0.001 if backend == "memory" else 0.002)


@pytest.mark.sweeper_off
def test_purge_takes_terminal_reservations_and_never_a_hold(
    engine: stockade.Engine, backend: str, wait: Callable[[float], None]
) -> None:
    engine.restock("s", 10)
    hold = engine.reserve("s", 1, ttl=LONG)
    confirmed = engine.confirm(engine.reserve("s", 1, ttl=LONG).id)
    released = engine.release(engine.reserve("s", 1, ttl=LONG).id)
    lapsing = engine.reserve("s", 1, ttl=timedelta(milliseconds=1))
    wait(0.01)
    assert engine.expire_due() == 1
    settle(backend, wait)
    assert engine.row_counts()["reservation_count"] == 4

    assert engine.purge(LONG) == 0  # nothing is an hour old yet
    assert engine.purge(timedelta(0)) == 3

    assert engine.row_counts() == {"sku_count": 1, "reservation_count": 1, "held_count": 1}
    assert engine.reservation(hold.id) == hold
    for gone in (confirmed, released, lapsing):
        with pytest.raises(stockade.NotFound):
            engine.reservation(gone.id)
    level = engine.stock("s")  # purging never touches stock
    assert (level.on_hand, level.reserved) == (9, 1)
    swept = engine.stats()["sweeper"]
    assert (swept["purged_reservations"], swept["purged_keys"]) == (3, 0)


def test_a_key_replays_until_it_is_purged_then_runs_afresh(
    engine: stockade.Engine, backend: str, wait: Callable[[float], None]
) -> None:
    engine.restock("s", 10)
    first = engine.reserve("s", 2, ttl=LONG, idempotency_key="order-1")
    engine.confirm(first.id)
    settle(backend, wait)

    assert engine.purge(LONG) == 0
    replay = engine.reserve("s", 2, ttl=LONG, idempotency_key="order-1")
    assert replay.id == first.id

    assert engine.purge(timedelta(0)) == 2  # the key, then its reservation
    assert engine.row_counts()["reservation_count"] == 0
    fresh = engine.reserve("s", 2, ttl=LONG, idempotency_key="order-1")
    assert fresh.id != first.id and fresh.state is stockade.ReservationState.HELD
    assert engine.stock("s").reserved == 2


def test_a_key_stays_while_its_reservation_changed_within_the_window(
    engine: stockade.Engine, wait: Callable[[float], None]
) -> None:
    engine.restock("s", 10)
    r = engine.reserve("s", 1, ttl=LONG, idempotency_key="slow-checkout")
    wait(0.4)
    engine.confirm(r.id)  # the key is 0.4 s old, its reservation changed just now
    assert engine.purge(timedelta(seconds=0.2)) == 0
    assert engine.reserve("s", 1, ttl=LONG, idempotency_key="slow-checkout").id == r.id
    wait(0.4)
    assert engine.purge(timedelta(seconds=0.2)) == 2


def test_a_key_with_a_hold_keeps_the_whole_order(
    engine: stockade.Engine, backend: str, wait: Callable[[float], None]
) -> None:
    engine.restock("a", 5)
    engine.restock("b", 5)
    order = engine.reserve_order({"a": 1, "b": 1}, ttl=LONG, idempotency_key="cart-7")
    engine.confirm(order[0].id)
    settle(backend, wait)

    # The key stays (one of its reservations is held), so its confirmed one stays too.
    assert engine.purge(timedelta(0)) == 0
    again = engine.reserve_order({"a": 1, "b": 1}, ttl=LONG, idempotency_key="cart-7")
    assert [r.id for r in again] == [r.id for r in order]

    engine.release(order[1].id)
    settle(backend, wait)
    assert engine.purge(timedelta(0)) == 3
    assert engine.row_counts()["reservation_count"] == 0


def test_purge_stops_at_its_limit(
    engine: stockade.Engine, backend: str, wait: Callable[[float], None]
) -> None:
    engine.restock("s", 100)
    for _ in range(10):
        engine.confirm(engine.reserve("s", 1, ttl=LONG).id)
    settle(backend, wait)
    assert engine.purge(timedelta(0), limit=3) == 3
    assert engine.row_counts()["reservation_count"] == 7
    assert engine.purge(timedelta(0), limit=100) == 7
    assert engine.purge(timedelta(0)) == 0


def test_purge_racing_replays_never_strands_a_key(
    engine: stockade.Engine, backend: str, wait: Callable[[float], None]
) -> None:
    # Threads reserve, confirm and replay keyed requests while another purges everything
    # older than now, over and over. A replay finds its key with its reservation, or no
    # key at all (then it runs afresh); never a key whose reservation is gone. Stock adds
    # up: every confirmed unit is sold, every fresh hold released.
    engine.restock("s", 10**6)
    stop = threading.Event()
    confirmed = [0] * 3
    replays = {"same": 0, "fresh": 0}
    lock = threading.Lock()

    def buyer(n: int) -> None:
        for i in range(10**6):
            if stop.is_set():
                return
            key = f"k-{n}-{i}"
            first = engine.reserve("s", 1, ttl=LONG, idempotency_key=key)
            engine.confirm(first.id)
            confirmed[n] += 1
            again = engine.reserve("s", 1, ttl=LONG, idempotency_key=key)
            if again.id == first.id:
                assert again.state is stockade.ReservationState.CONFIRMED
                outcome = "same"
            else:  # purged in between: a fresh hold, given back
                assert again.state is stockade.ReservationState.HELD
                engine.release(again.id)
                outcome = "fresh"
            with lock:
                replays[outcome] += 1

    def purger() -> None:
        while not stop.is_set():
            settle(backend, wait)
            engine.purge(timedelta(0))

    def stop_later() -> None:
        time.sleep(1.5)
        stop.set()

    # Three buyers and, as the fourth racer, the purger.
    out = race(4, lambda n: buyer(n) if n < 3 else purger(), timeout=60, meanwhile=stop_later)
    assert out.errors == [None] * 4
    assert sum(confirmed) > 0 and replays["same"] + replays["fresh"] > 0
    assert engine.stats()["sweeper"]["purged_keys"] > 0  # the purge did race the replays
    level = engine.stock("s")
    assert (level.on_hand, level.reserved) == (10**6 - sum(confirmed), 0)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda e: e.purge(timedelta(seconds=-1)), stockade.InvalidArgument),
        (lambda e: e.purge(-5), stockade.InvalidArgument),
        (lambda e: e.purge(timedelta(0), limit=0), stockade.InvalidArgument),
        (lambda e: e.purge(timedelta(0), limit=-3), stockade.InvalidArgument),
        (lambda e: e.purge_movements(timedelta(seconds=-1)), stockade.InvalidArgument),
        (lambda e: e.purge_movements(timedelta(0), limit=-3), stockade.InvalidArgument),
        (lambda e: e.purge(timedelta(0), limit=2**64), stockade.InvalidArgument),
        (lambda e: e.purge("a day"), stockade.InvalidType),
        (lambda e: e.purge(timedelta(0), limit="10"), stockade.InvalidType),
    ],
)
def test_bad_purge_arguments_are_refused_and_change_nothing(
    engine: stockade.Engine, call: Callable[[stockade.Engine], object], error: type
) -> None:
    engine.restock("s", 5)
    engine.confirm(engine.reserve("s", 1, ttl=LONG).id)
    with pytest.raises(error):
        call(engine)
    assert engine.row_counts()["reservation_count"] == 1


def test_retention_options_are_checked(stockade_database: str) -> None:
    with pytest.raises(stockade.InvalidArgument, match="retention must be positive"):
        stockade.Engine.memory(retention=timedelta(0))
    with pytest.raises(stockade.InvalidType):
        stockade.Engine.memory(retention="7d")
    with pytest.raises(stockade.InvalidArgument, match="needs sweeper=True"):
        stockade.Engine.postgres(stockade_database, retention=timedelta(days=7), sweeper=False)
    with pytest.raises(stockade.InvalidArgument, match="purge_batch"):
        stockade.Engine.postgres(stockade_database, purge_batch=0)


def test_memory_store_with_retention_purges_as_it_goes(clock: stockade.ManualClock) -> None:
    with stockade.Engine.memory(clock=clock, retention=timedelta(minutes=1)) as eng:
        eng.restock("s", 10**6)
        for n in range(100):
            eng.confirm(eng.reserve("s", 1, ttl=LONG, idempotency_key=f"old-{n}").id)
        old_hold = eng.reserve("s", 1, ttl=timedelta(days=30))
        clock.advance(120)
        for _ in range(256):
            eng.reserve("s", 1, ttl=LONG)
        counts = eng.row_counts()
        # Every old confirmed reservation and key went; the holds, old and new, stayed.
        assert counts["reservation_count"] == counts["held_count"] == 257
        assert eng.reservation(old_hold.id) == old_hold
        swept = eng.stats()["sweeper"]
        assert (swept["purged_reservations"], swept["purged_keys"]) == (100, 100)


def test_memory_store_never_purges_a_hold_however_old(clock: stockade.ManualClock) -> None:
    with stockade.Engine.memory(clock=clock) as eng:
        eng.restock("s", 3)
        hold = eng.reserve("s", 1, ttl=timedelta(days=366), idempotency_key="k")
        clock.advance(365 * 86400)
        assert eng.purge(timedelta(0)) == 0
        again = eng.reserve("s", 1, ttl=timedelta(days=366), idempotency_key="k")
        assert again.id == hold.id


def test_postgres_sweeper_purges_with_retention(stockade_database: str) -> None:
    with stockade.Engine.postgres(
        stockade_database,
        sweeper=True,
        sweep_interval=timedelta(milliseconds=50),
        retention=timedelta(milliseconds=300),
        purge_batch=7,
    ) as eng:
        eng.restock("s", 1000)
        hold = eng.reserve("s", 1, ttl=LONG, idempotency_key="held")
        for n in range(30):
            eng.confirm(eng.reserve("s", 1, ttl=LONG, idempotency_key=f"k{n}").id)
        assert eng.row_counts()["reservation_count"] == 31
        assert wait_for(lambda: eng.row_counts()["reservation_count"] == 1)
        assert eng.reservation(hold.id) == hold
        keys = run_sql(stockade_database, "SELECT key FROM stockade.idempotency")
        assert keys == "held"
        assert wait_for(lambda: eng.stats()["sweeper"]["purged_keys"] == 30)
        swept = eng.stats()["sweeper"]
        assert swept["purged_reservations"] == 30
        # The rounds are timed: the purge took time in some round, and no round more than all.
        assert 0 < swept["last_round_seconds"] <= swept["round_seconds"]


@pytest.fixture
def version_one_database(stockade_postgres: PostgresForTests) -> Iterator[str]:
    name = stockade_postgres.new_database(migrated=False)
    yield stockade_postgres.dsn(name)
    stockade_postgres.drop_database(name)


# What migrations 002 onwards add, taken out again: what is left is the version-1 schema,
# with data that the engine wrote.
BACK_TO_VERSION_ONE = """
DROP TABLE stockade.transfer;
ALTER TABLE stockade.stock DROP CONSTRAINT stock_claimed_within_limit,
    DROP CONSTRAINT stock_states_nonnegative, DROP COLUMN safety_stock, DROP COLUMN damaged,
    DROP COLUMN quality_control, DROP COLUMN incoming,
    ADD CONSTRAINT stock_reserved_within_limit
        CHECK (reserved >= 0 AND reserved <= on_hand + backorder_limit);
ALTER TABLE stockade.idempotency DROP COLUMN outcome;
ALTER TABLE stockade.reservation DROP COLUMN order_id, DROP COLUMN ref, DROP COLUMN metadata;
ALTER TABLE stockade.reservation DROP CONSTRAINT reservation_units, DROP COLUMN confirmed,
    DROP COLUMN released, DROP COLUMN expired, DROP COLUMN returned;
DROP TABLE stockade.movement, stockade.feed_consumer;
DROP TRIGGER stock_journal ON stockade.stock;
DROP FUNCTION stockade.journal_stock();
ALTER TABLE stockade.stock DROP COLUMN low_stock, DROP COLUMN slots;
DROP INDEX stockade.reservation_terminal_updated, stockade.idempotency_created;
ALTER TABLE stockade.stock DROP COLUMN slot, ADD PRIMARY KEY (sku, location);
ALTER TABLE stockade.reservation DROP COLUMN slot;
ALTER TABLE stockade.stock
    DROP CONSTRAINT stock_reserved_within_limit,
    DROP CONSTRAINT stock_backorder_limit_nonnegative,
    DROP COLUMN backorder_limit, DROP COLUMN discontinued_at, DROP COLUMN lease_token,
    DROP COLUMN lease_owner, DROP COLUMN lease_expires_at,
    ADD CONSTRAINT stock_reserved_within_on_hand CHECK (reserved >= 0 AND reserved <= on_hand);
DROP SEQUENCE stockade.lease_token;
DROP TABLE stockade.buyer_allowance, stockade.purchase_limit_sku, stockade.purchase_limit;
ALTER TABLE stockade.reservation DROP COLUMN buyer, DROP COLUMN limit_group;
DROP FUNCTION stockade.abort_statement();
DELETE FROM stockade.schema_migrations WHERE version > 1;
"""


def test_migrations_upgrade_a_version_one_database_with_its_data(
    version_one_database: str,
) -> None:
    dsn = version_one_database
    with stockade.Engine.postgres(dsn) as eng:
        assert eng.migrate(to=1) == ["001_schema.sql"]
        assert eng.migrate(to=1) == []
        assert eng.migrate() == MIGRATIONS[1:]
        # A service's data in every table; then the schema goes back to version 1.
        eng.restock("s", 50)
        hold = eng.reserve("s", 2, ttl=LONG, idempotency_key="k-hold")
        done = eng.confirm(eng.reserve("s", 3, ttl=LONG, idempotency_key="k-done").id)
        gone = eng.release(eng.reserve("s", 4, ttl=LONG).id)
        before = eng.stock("s")
    run_sql(dsn, BACK_TO_VERSION_ONE)

    indexes = "SELECT string_agg(indexname, ',' ORDER BY indexname) FROM pg_indexes"
    where = " WHERE schemaname = 'stockade' AND indexname IN "
    names = "('reservation_terminal_updated', 'idempotency_created')"
    assert run_sql(dsn, indexes + where + names) == ""
    columns = (
        "SELECT count(*) FROM information_schema.columns"
        " WHERE table_schema = 'stockade' AND table_name = 'stock'"
    )
    assert run_sql(dsn, columns) == "6"

    with stockade.Engine.postgres(dsn) as eng:
        assert eng.migrate() == MIGRATIONS[1:]
        assert eng.migrate() == []
        made = run_sql(dsn, indexes + where + names)
        assert made == "idempotency_created,reservation_terminal_updated"
        versions = "SELECT string_agg(version::text, ',') FROM stockade.schema_migrations"
        assert run_sql(dsn, versions) == ",".join(str(n) for n in range(1, len(MIGRATIONS) + 1))
        # Every row came through, and behaves as before.
        assert eng.stock("s") == before
        assert eng.reservation(hold.id) == hold
        assert eng.reservation(done.id) == done
        assert eng.reserve("s", 3, ttl=LONG, idempotency_key="k-done").id == done.id
        assert eng.row_counts() == {"sku_count": 1, "reservation_count": 3, "held_count": 1}
        # ... the new columns have their defaults, and the new CHECK holds.
        assert eng.set_backorder_limit("s", 5).available == 50 - 2 - 3 + 5
        time.sleep(0.002)
        # ... and retention works on them.
        assert eng.purge(timedelta(0)) == 3  # k-done, its reservation, and the released one
        with pytest.raises(stockade.NotFound):
            eng.reservation(gone.id)
        assert eng.reserve("s", 2, ttl=LONG, idempotency_key="k-hold").id == hold.id


def test_migrate_to_is_checked(stockade_engine: stockade.Engine) -> None:
    with pytest.raises(stockade.InvalidArgument):
        stockade_engine.migrate(to=0)
    with pytest.raises(stockade.InvalidType):
        stockade_engine.migrate(to="2")
    assert stockade_engine.migrate(to=1) == []


def test_a_sweeper_before_migrate_waits_without_errors(
    stockade_postgres: PostgresForTests,
) -> None:
    name = stockade_postgres.new_database(migrated=False)
    try:
        dsn = stockade_postgres.dsn(name)
        with stockade.Engine.postgres(
            dsn, sweeper=True, sweep_interval=timedelta(milliseconds=20)
        ) as eng:
            assert wait_for(lambda: eng.stats()["sweeper"]["leader"])
            time.sleep(0.2)  # several rounds on a schema with no tables
            assert eng.stats()["sweeper"]["errors"] == 0
            eng.migrate()
            eng.restock("s", 2)
            eng.reserve("s", 1, ttl=timedelta(milliseconds=1))
            assert wait_for(lambda: eng.stats()["sweeper"]["expired"] == 1)
            assert eng.stats()["sweeper"]["errors"] == 0
    finally:
        stockade_postgres.drop_database(name)


def test_memory_purge_is_not_held_up_by_keys_it_must_keep(clock: stockade.ManualClock) -> None:
    # Old keys whose holds are still live come first in time; they must not stop the purge
    # of the old keys behind them, whatever the limit.
    with stockade.Engine.memory(clock=clock) as eng:
        eng.restock("s", 1000)
        for n in range(20):
            eng.reserve("s", 1, ttl=timedelta(days=30), idempotency_key=f"held-{n}")
        for n in range(20):
            eng.confirm(eng.reserve("s", 1, ttl=LONG, idempotency_key=f"done-{n}").id)
        clock.advance(7200)
        purged = sum(eng.purge(timedelta(hours=1), limit=5) for _ in range(10))
        assert purged == 40  # the 20 done keys and their reservations
        assert eng.row_counts()["reservation_count"] == eng.row_counts()["held_count"] == 20
