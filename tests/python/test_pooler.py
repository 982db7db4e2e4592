"""PgBouncer in transaction mode between the engine and PostgreSQL.

Behind such a pooler consecutive transactions of one client connection run on different
server sessions, so the engine keeps no session state: unnamed statements, SET LOCAL
lock_timeout, a sweeper elected per transaction, migrations serialized by a
transaction-scoped lock. These tests start a PgBouncer of their own (with few server
connections, so that sessions are shared) in front of the suite's server; `make test`
also runs every PostgreSQL test through one (``--stockade-pooler pgbouncer``).
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Iterator

import pytest

import stockade
import stockade.testing
from stockade.tools.pgbouncer import TemporaryPgBouncer, find_pgbouncer
from stockade.tools.pgserver import run_sql
from stockade.tools.pytest_plugin import PostgresForTests
from support import ALL_STRATEGIES, MIGRATIONS, field, until_decided

pytestmark = pytest.mark.skipif(
    find_pgbouncer() is None, reason="pgbouncer is not installed (Debian package pgbouncer)"
)

SERVER_CONNECTIONS = 3


@pytest.fixture(scope="module")
def bouncer(stockade_postgres: PostgresForTests) -> Iterator[TemporaryPgBouncer]:
    server = stockade_postgres.admin_dsn("postgres")
    upstream = SimpleNamespace(
        host=field(server, "host"), port=int(field(server, "port")), user=field(server, "user")
    )
    with TemporaryPgBouncer(upstream, pool_size=SERVER_CONNECTIONS) as b:  # type: ignore[arg-type]
        yield b


@pytest.fixture
def pooled_dsn(stockade_postgres: PostgresForTests, bouncer: TemporaryPgBouncer) -> Iterator[str]:
    name = stockade_postgres.new_database()
    yield bouncer.dsn(name)
    stockade_postgres.drop_database(name)


def test_the_engine_detects_the_pooler_and_keeps_no_session_state(
    pooled_dsn: str, stockade_postgres: PostgresForTests
) -> None:
    direct = stockade_postgres.admin_dsn(field(pooled_dsn, "dbname"))
    with stockade.Engine.postgres(direct, pool_size=2) as eng:
        assert eng.stats()["pool"]["pooled"] is False
    with stockade.Engine.postgres(pooled_dsn, pool_size=8, lock_timeout=0.123) as eng:
        assert eng.stats()["pool"]["pooled"] is True  # pooler="auto" found it
        eng.restock("s", 10_000)
        for strategy in ALL_STRATEGIES:
            for _ in range(5):
                eng.release(eng.reserve("s", 1, strategy=strategy).id)
            eng.reserve("s", 1, strategy=strategy, idempotency_key=f"k-{strategy}")
        assert eng.stock("s").reserved == len(ALL_STRATEGIES)
    # Every server session PgBouncer keeps is as it was: no prepared statement, no
    # session setting left behind for the next client to inherit.
    for _ in range(2 * SERVER_CONNECTIONS):
        assert run_sql(pooled_dsn, "SELECT count(*) FROM pg_prepared_statements") == "0"
        assert run_sql(pooled_dsn, "SHOW lock_timeout") == "0"
        assert run_sql(pooled_dsn, "SHOW plan_cache_mode") == "auto"
    locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
    assert run_sql(direct, locks) == "0"


# pessimistic: a transaction (BEGIN and SET LOCAL in one round trip); atomic without a key:
# one statement, which runs in a transaction of its own behind a pooler for this bound.
@pytest.mark.parametrize("strategy", ["pessimistic", "atomic"])
def test_lock_timeout_bounds_a_wait_behind_the_pooler(pooled_dsn: str, strategy: str) -> None:
    with stockade.Engine.postgres(pooled_dsn, pool_size=4, lock_timeout=0.2) as eng:
        eng.restock("s", 10)
        with stockade.testing.hold_lock(eng, "s", kind="pessimistic"):
            started = time.monotonic()
            with pytest.raises(stockade.LockTimeout):
                eng.reserve("s", 1, strategy=strategy)
            assert time.monotonic() - started < 5
        assert eng.reserve("s", 1, strategy=strategy).qty == 1
        assert eng.stock("s").reserved == 1  # the timed-out one changed nothing


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_exact_sell_out_through_the_pooler(pooled_dsn: str, strategy: str) -> None:
    with stockade.Engine.postgres(pooled_dsn, pool_size=8) as eng:
        eng.restock("hot", 40)
        out = stockade.testing.race(
            64, lambda i: until_decided(lambda: eng.reserve("hot", 1, strategy=strategy))
        )
        assert out.errors == [None] * 64
        assert sum(bool(r) for r in out.results) == 40
        lvl = eng.stock("hot")
        assert (lvl.reserved, lvl.available) == (40, 0)


def test_sweepers_behind_the_pooler_take_turns_and_expire_each_hold_once(
    pooled_dsn: str,
) -> None:
    options = dict(sweeper=True, sweep_interval=0.02, pool_size=2, sweep_batch=5)
    with (
        stockade.Engine.postgres(pooled_dsn, **options) as a,
        stockade.Engine.postgres(pooled_dsn, **options) as b,
    ):
        a.restock("s", 100)
        held = [a.reserve("s", 1, ttl=0.1) for _ in range(30)]
        held += [b.reserve("s", 1, ttl=0.1) for _ in range(30)]
        deadline = time.monotonic() + 15
        while a.stock("s").reserved and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.stock("s").reserved == 0
        assert {a.reservation(r.id).state for r in held} == {stockade.ReservationState.EXPIRED}
        sweepers = [a.stats()["sweeper"], b.stats()["sweeper"]]
        assert sum(s["expired"] for s in sweepers) == 60
        assert [s["errors"] for s in sweepers] == [0, 0]


def test_migrations_through_the_pooler_run_once_when_raced(
    stockade_postgres: PostgresForTests, bouncer: TemporaryPgBouncer
) -> None:
    name = stockade_postgres.new_database(migrated=False)
    try:
        dsn = bouncer.dsn(name)

        def migrate(i: int) -> list[str]:
            with stockade.Engine.postgres(dsn, pool_size=1, schema="raced") as eng:
                return eng.migrate()

        out = stockade.testing.race(4, migrate)
        assert out.errors == [None] * 4
        assert sum(len(a or []) for a in out.results) == len(MIGRATIONS)  # each file once
        counted = run_sql(dsn, "SELECT count(*) FROM raced.schema_migrations")
        assert counted == str(len(MIGRATIONS))
    finally:
        stockade_postgres.drop_database(name)


def test_pooler_option_is_checked(pooled_dsn: str) -> None:
    with pytest.raises(stockade.InvalidArgument, match="pooler"):
        stockade.Engine.postgres(pooled_dsn, pooler="transaction")
    with stockade.Engine.postgres(pooled_dsn, pooler="pgbouncer-transaction") as eng:
        assert eng.stats()["pool"]["pooled"] is True
        eng.restock("s", 1)
        assert eng.reserve("s", 1).qty == 1


ROUTINES = (
    "SELECT count(*) FROM pg_proc WHERE pronamespace = 'stockade'::regnamespace"
    " AND proname LIKE 'stockade\\_%'"
)


def test_migrate_makes_statement_routines_that_pooled_connections_call(
    stockade_postgres: PostgresForTests, bouncer: TemporaryPgBouncer
) -> None:
    name = stockade_postgres.new_database(migrated=False)
    try:
        direct = stockade_postgres.admin_dsn(name)
        # Function statistics for the sessions PgBouncer opens to this database.
        run_sql(direct, f"ALTER DATABASE {name} SET track_functions = 'pl'")
        with stockade.Engine.postgres(bouncer.dsn(name), pool_size=2) as eng:
            eng.migrate()
            assert int(run_sql(direct, ROUTINES)) >= 20
            eng.restock("s", 100)
            eng.confirm(eng.reserve("s", 1, strategy="atomic").id)
            eng.reserve("s", 1, strategy="atomic", idempotency_key="k")
            pool = eng.stats()["pool"]
            assert (pool["pooled"], pool["routines"]) == (True, True)
            assert eng.stock("s").reserved == 1
        calls = (
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions"
            " WHERE funcname LIKE 'stockade\\_hold\\_atomic\\_%'"
        )
        deadline = time.monotonic() + 15  # a session reports its figures once idle a while
        while int(run_sql(direct, calls)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert int(run_sql(direct, calls)) == 2
    finally:
        stockade_postgres.drop_database(name)


def test_a_pooled_engine_without_all_its_routines_runs_its_statements_unnamed(
    pooled_dsn: str, stockade_postgres: PostgresForTests, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stockade")
    stockade.logs._sync_level()  # the core drops what is below the level it last read
    direct = stockade_postgres.admin_dsn(field(pooled_dsn, "dbname"))
    assert int(run_sql(direct, ROUTINES)) >= 20  # the template was migrated
    # As after an upgrade whose statement changed, before migrate(): one routine missing.
    one = run_sql(
        direct,
        "SELECT oid::regprocedure FROM pg_proc WHERE pronamespace = 'stockade'::regnamespace"
        " AND proname LIKE 'stockade\\_hold\\_atomic\\_%'",
    )
    run_sql(direct, f"DROP FUNCTION {one}")
    with stockade.Engine.postgres(pooled_dsn, pool_size=1) as eng:
        eng.restock("s", 10)
        eng.confirm(eng.reserve("s", 1, strategy="atomic").id)
        assert eng.stats()["pool"]["routines"] is False  # all or none
        deadline = time.monotonic() + 10  # (log records reach Python from a thread of their own)
        while time.monotonic() < deadline and not any(
            "lacks this release's statement routines" in r.getMessage() for r in caplog.records
        ):
            time.sleep(0.05)
        assert any("migrate() makes them" in r.getMessage() for r in caplog.records)
        assert eng.migrate() == []  # no migration: the routine is made again
        eng.release(eng.reserve("s", 1, strategy="atomic").id)
        assert eng.stats()["pool"]["routines"] is True  # a connection opened since
        assert eng.stock("s").reserved == 0 and eng.stock("s").on_hand == 9
    # Directly, prepared statements serve better than routines.
    with stockade.Engine.postgres(direct, pool_size=1) as eng:
        eng.reserve("s", 1, strategy="atomic")
        assert eng.stats()["pool"]["routines"] is False
