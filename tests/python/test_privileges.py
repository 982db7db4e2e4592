"""Least privilege: the schema's owner migrates, and an engine serves as a runtime role
that has only stockade.grants.runtime_grants() (no DDL rights)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import timedelta
from typing import Iterator

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade.grants import runtime_grants
from stockade.tools.pgserver import conninfo_with, run_sql
from stockade.tools.pytest_plugin import PostgresForTests
from support import ALL_STRATEGIES, field, in_doubt_after_cut, wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def runtime_role(stockade_postgres: PostgresForTests, stockade_database: str) -> Iterator[str]:
    """A LOGIN role with the runtime grants on the test database's schema; its name."""
    if stockade_postgres.pooled:
        pytest.skip("the suite's PgBouncer authenticates one user, the server's owner")
    role = f"stockade_rt_{uuid.uuid4().hex[:8]}"
    stockade_postgres.sql(f"CREATE ROLE {role} LOGIN")
    dbname = field(stockade_database, "dbname")
    for statement in runtime_grants(role):
        stockade_postgres.sql(statement, dbname)
    try:
        yield role
    finally:
        stockade_postgres.sql(f"DROP OWNED BY {role}", dbname)
        stockade_postgres.sql(f"DROP ROLE IF EXISTS {role}")


def test_everything_runs_as_the_runtime_role(
    stockade_database: str, runtime_role: str, pooled: bool
) -> None:
    dsn = conninfo_with(stockade_database, user=runtime_role)
    with stockade.Engine.postgres(
        dsn, sweeper=True, sweep_interval=timedelta(milliseconds=50), pool_size=4
    ) as eng:
        eng.restock("s", 1_000)
        held = {
            s: eng.reserve("s", 1, strategy=s, idempotency_key=f"k-{s}") for s in ALL_STRATEGIES
        }
        again = eng.reserve("s", 1, strategy="batched", idempotency_key="k-batched")
        assert again == held["batched"]  # a replay
        eng.confirm(held["atomic"].id)
        eng.release(held["pessimistic"].id)
        eng.extend(held["optimistic"].id, ttl=timedelta(minutes=5))
        eng.reserve_order({"s": 2}, idempotency_key="order")
        eng.set_on_hand("s", 900)
        eng.sell("s", 3)
        eng.set_slots("hot", 4)
        eng.restock("hot", 40)
        assert eng.reserve("hot", 2, strategy="batched").qty == 2
        assert eng.slot_count("hot") == 4
        lease = eng.acquire_lease("s", timedelta(seconds=30), owner="worker-1")
        lease = eng.renew_lease(lease, timedelta(seconds=30))
        assert eng.release_lease(lease)
        eng.set_purchase_limit("drop", 2, ["s"])
        eng.reserve("s", 2, buyer="ann")
        with pytest.raises(stockade.LimitExceeded):
            eng.reserve("s", 1, buyer="ann")
        assert eng.remove_purchase_limit("drop")
        eng.reserve("s", 1, ttl=timedelta(milliseconds=1))
        assert wait_for(lambda: eng.stats()["sweeper"]["expired"] >= 1)
        assert eng.stats()["sweeper"]["leader"] or pooled
        assert eng.purge(timedelta(0)) >= 1  # the released hold, and its key
        assert eng.row_counts()["reservation_count"] >= 1
        with pytest.raises(stockade.Misconfigured):  # no DDL rights: it cannot migrate
            eng.drop_schema(confirm="stockade")


@pytest.mark.parametrize("cut", ["after", "before"])
def test_the_fence_ends_the_runtime_roles_own_lost_session(
    proxy: CommitCuttingProxy, stockade_database: str, runtime_role: str, pooled: bool, cut: str
) -> None:
    # After a cut COMMIT the engine ends its lost server session (pg_terminate_backend,
    # which a role may call on its own sessions) before it looks: no superuser needed.
    with stockade.Engine.postgres(
        proxy.dsn(field(stockade_database, "dbname"), user=runtime_role), pool_size=1, sweeper=False
    ) as eng:
        eng.restock("s", 10)
        proxy.arm(cut)
        if in_doubt_after_cut(pooled, cut):
            with pytest.raises(stockade.InDoubt):
                eng.reserve("s", 3, idempotency_key="order-1", strategy="atomic")
        r = eng.reserve("s", 3, idempotency_key="order-1", strategy="atomic")
        assert proxy.cuts == 1 and eng.stock("s").reserved == 3
        assert eng.reservation(r.id) == r


@pytest.mark.parametrize(
    "statement",
    [
        "DROP TABLE stockade.stock",
        "ALTER TABLE stockade.stock ADD COLUMN x int",
        "TRUNCATE stockade.reservation",
        "CREATE TABLE stockade.mine (x int)",
        "CREATE FUNCTION stockade.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "DELETE FROM stockade.schema_migrations",
    ],
)
def test_the_runtime_role_has_no_ddl_rights(
    stockade_database: str, runtime_role: str, statement: str
) -> None:
    with pytest.raises(stockade.StockadeError) as refused:
        run_sql(conninfo_with(stockade_database, user=runtime_role), statement)
    assert "permission denied" in str(refused.value) or "must be owner" in str(refused.value)


def test_role_and_schema_names_cannot_inject(
    stockade_postgres: PostgresForTests, stockade_database: str
) -> None:
    hostile = 'rt"; DROP TABLE stockade.stock; --'
    statements = runtime_grants(hostile)
    assert all('"rt""; DROP TABLE stockade.stock; --"' in s for s in statements)
    quoted = '"' + hostile.replace('"', '""') + '"'
    dbname = field(stockade_database, "dbname")
    stockade_postgres.sql(f"CREATE ROLE {quoted}")
    try:
        for statement in statements:
            stockade_postgres.sql(statement, dbname)
        kept = stockade_postgres.sql("SELECT to_regclass('stockade.stock') IS NOT NULL", dbname)
        assert kept == "t"
    finally:
        stockade_postgres.sql(f"DROP OWNED BY {quoted}", dbname)
        stockade_postgres.sql(f"DROP ROLE {quoted}")
    for bad in ["", "x" * 64, "a\x00b"]:
        with pytest.raises(stockade.InvalidArgument):
            runtime_grants(bad)
    with pytest.raises(stockade.InvalidType):
        runtime_grants(None)  # type: ignore[arg-type]


def test_the_cli_prints_the_grants_without_connecting() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "stockade", "migrate", "--schema", "shop", "--print-grants", "rt"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},  # no STOCKADE_DSN, no PG* variables
    )
    assert out.stdout.splitlines()[1:] == runtime_grants("rt", schema="shop")
