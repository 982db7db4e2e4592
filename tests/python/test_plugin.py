"""The pytest plugin on a server of yours: a URI in STOCKADE_TEST_DSN works, and two
sessions sharing one server (as pytest-xdist workers do) do not collide on the template."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Callable

import pytest

import stockade
from stockade.tools.pgserver import conninfo_with
from stockade.tools.pytest_plugin import PostgresForTests, _with_dbname
from support import field

USER_TEST = """
import stockade

def test_uses_the_fixtures(stockade_engine):
    assert stockade_engine.restock("s", 2).on_hand == 2

def test_gets_a_fresh_database(stockade_database):
    with stockade.Engine.postgres(stockade_database) as eng:
        assert eng.row_counts()["sku_count"] == 0
"""


def test_with_dbname_accepts_key_value_and_uri_dsns() -> None:
    assert field(_with_dbname("host=h port=5 dbname=a", "b"), "dbname") == "b"
    uri = _with_dbname("postgresql://u@h:5/a?sslmode=disable", "b")
    assert field(uri, "dbname") == "b" and field(uri, "host") == "h"
    assert field(uri, "sslmode") == "disable"
    assert conninfo_with("host=h", application_name="x y") == "host=h application_name='x y'"


def test_a_uri_in_stockade_test_dsn_runs_a_users_suite(
    stockade_postgres: PostgresForTests, tmp_path: Path
) -> None:
    admin = stockade_postgres.admin_dsn("postgres")  # the server itself, pooler or not
    host, port, user = field(admin, "host"), field(admin, "port"), field(admin, "user")
    uri = f"postgresql://{user}@{host}:{port}/postgres?sslmode=disable"
    (tmp_path / "test_user.py").write_text(USER_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        env={**os.environ, "STOCKADE_TEST_DSN": uri},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


def test_two_sessions_on_one_server_use_their_own_templates(
    stockade_postgres: PostgresForTests,
) -> None:
    first = PostgresForTests(stockade_postgres.admin_dsn)
    second = PostgresForTests(stockade_postgres.admin_dsn)
    try:
        assert first.template != second.template
        a, b = first.new_database(), second.new_database()
        first.drop_database(a)
        second.drop_database(b)
    finally:
        first.close()
        second.close()


def test_the_engine_factory_makes_engines_with_options(
    stockade_engine_factory: Callable[..., stockade.Engine],
) -> None:
    batched = stockade_engine_factory(strategy="batched", pool_size=2, schema="shop")
    atomic = stockade_engine_factory(strategy="atomic")
    assert batched.strategy is stockade.Strategy.BATCHED
    assert atomic.strategy is stockade.Strategy.ATOMIC
    batched.restock("s", 2)
    with pytest.raises(stockade.NotFound):  # each has a database of its own
        atomic.stock("s")


def test_the_memory_engine_fixture(stockade_memory_engine: stockade.Engine) -> None:
    assert stockade_memory_engine.backend == "memory"


def test_the_options_show_in_pytest_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, timeout=120
    )
    assert "--stockade-dsn" in done.stdout and "--stockade-fsync" in done.stdout
    assert "stockade_dsn" in done.stdout and "stockade_fsync" in done.stdout


FSYNC_TEST = """
from stockade.tools.pgserver import run_sql

def test_fsync_is_off(stockade_database):
    assert run_sql(stockade_database, "SHOW fsync") == "off"
"""


def test_fsync_off_runs_the_throwaway_server_without_fsync(tmp_path: Path) -> None:
    (tmp_path / "test_fsync.py").write_text(FSYNC_TEST)
    env = {k: v for k, v in os.environ.items() if k != "STOCKADE_TEST_DSN"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--stockade-fsync=off"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_database_left_in_its_shape_goes_to_a_later_test_emptied(
    stockade_postgres: PostgresForTests,
) -> None:
    # It comes back under a new name (the same database: its oid), empty, with its
    # sequences at their start; an engine the test left open cannot reach it any more.
    pg = stockade_postgres
    name = pg.new_database()
    oid = f"SELECT oid FROM pg_database WHERE datname = '{name}'"
    was = pg.sql(oid)
    # call_timeout: behind PgBouncer the dropped database is a server that will not
    # answer, which the engine retries until the call's deadline
    left_open = stockade.Engine.postgres(
        pg.dsn(name), pool_size=1, sweeper=False, call_timeout=timedelta(seconds=3)
    )
    try:
        left_open.restock("s", 5)
        left_open.reserve("s", 2, idempotency_key="k")
        assert left_open.movements()[-1].position == 2
        pg.drop_database(name)
        with pytest.raises(stockade.StockadeError):
            left_open.restock("s", 1)
    finally:
        left_open.close()
    again = pg.new_database()
    try:
        assert again != name and pg.sql(oid) == ""
        assert pg.sql(f"SELECT oid FROM pg_database WHERE datname = '{again}'") == was
        with stockade.Engine.postgres(pg.dsn(again)) as eng:
            counts = eng.row_counts()
            assert (counts["sku_count"], counts["reservation_count"]) == (0, 0), counts
            eng.restock("t", 1)
            assert [m.position for m in eng.movements()] == [1]  # the sequence starts over
            assert eng.reserve("t", 1, idempotency_key="k").qty == 1  # the key is gone
    finally:
        pg.drop_database(again)


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE stockade.extra (x int)",
        "ALTER TABLE stockade.stock ADD COLUMN extra int",
        "GRANT SELECT ON stockade.stock TO PUBLIC",
        "UPDATE stockade.schema_migrations SET checksum = 'edited' WHERE version = 1",
        "ALTER DATABASE {db} SET work_mem = '8MB'",
        "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER SEQUENCE stockade.movement_id_seq INCREMENT BY 2",
        "ALTER TABLE stockade.stock DISABLE TRIGGER stock_journal",
    ],
)
def test_a_database_whose_shape_the_test_changed_is_dropped(
    stockade_postgres: PostgresForTests, change: str
) -> None:
    pg = stockade_postgres
    name = pg.new_database()
    pg.sql(change.format(db=name), name)
    pg.drop_database(name)
    assert pg.sql(f"SELECT count(*) FROM pg_database WHERE datname = '{name}'") == "0"
