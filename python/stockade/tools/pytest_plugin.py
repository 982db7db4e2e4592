"""pytest fixtures for code that uses stockade on PostgreSQL (a pytest11 entry point).

Installing stockade makes these fixtures available to every test suite:

``stockade_postgres`` (session)
    A throwaway PostgreSQL server (:class:`stockade.tools.pgserver.TemporaryPostgres`) with a
    template database that holds the migrated schema. Set ``STOCKADE_TEST_DSN`` to a
    superuser connection string (key=value or URI) to use a server of yours instead; the
    suite then creates and drops its databases there. The template's name is unique to
    the process, so that several runs (or pytest-xdist workers) can share one server.
``stockade_database`` (function)
    The DSN of a fresh database cloned from the template, dropped after the test.
    (Cloning a template is much faster than migrating a new database.)
``stockade_engine`` (function)
    ``Engine.postgres`` over such a database, closed after the test.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from typing import Callable, Iterator, Optional

import pytest

from ..engine import Engine
from .pgserver import TemporaryPostgres, conninfo_with, quote_ident, run_sql

__all__ = ["PostgresForTests", "stockade_database", "stockade_engine", "stockade_postgres"]

TEMPLATE_PREFIX = "stockade_template_"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "load: a load scenario (stockade.testing.flash_sale and the like)"
    )


class PostgresForTests:
    """A server with a migrated template database, handing out clones of it.

    ``dsn_of(dbname)`` gives the connection string of a database on the server; the
    server's ``postgres`` database is used for administration.
    """

    def __init__(self, dsn_of: Callable[[str], str]) -> None:
        self.dsn = dsn_of
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._prefix = f"stockade_t{os.getpid()}_{uuid.uuid4().hex[:6]}_"
        # One template per process and run: pytest-xdist workers and concurrent runs on a
        # shared server (STOCKADE_TEST_DSN) never collide on it.
        self.template = f"{TEMPLATE_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.sql(f"CREATE DATABASE {self.template}")
        with Engine.postgres(dsn_of(self.template), pool_size=1) as eng:
            eng.migrate()

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """Runs one SQL statement on ``dbname`` with psql."""
        return run_sql(self.dsn(dbname), statement)

    def new_database(self, *, migrated: bool = True) -> str:
        """Creates a database, cloned from the migrated template unless ``migrated`` is
        False (then it is empty); returns its name."""
        with self._lock:
            name = f"{self._prefix}{next(self._names)}"
        template = f" TEMPLATE {self.template}" if migrated else ""
        self.sql(f"CREATE DATABASE {quote_ident(name)}{template}")
        return name

    def drop_database(self, name: str) -> None:
        """Drops a database, disconnecting whoever is still on it."""
        self.sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    def close(self) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {self.template} WITH (FORCE)")


def _with_dbname(base: str, dbname: str) -> str:
    """The connection string ``base`` (key=value or URI) pointed at ``dbname``."""
    return conninfo_with(base, dbname=dbname)


@pytest.fixture(scope="session")
def stockade_postgres() -> Iterator[PostgresForTests]:
    """A PostgreSQL server for the session, with the stockade schema in a template."""
    external: Optional[str] = os.environ.get("STOCKADE_TEST_DSN")
    if external:
        pg = PostgresForTests(lambda dbname: _with_dbname(external, dbname))
        try:
            yield pg
        finally:
            pg.close()
        return
    with TemporaryPostgres() as server:
        pg = PostgresForTests(server.dsn)
        try:
            yield pg
        finally:
            pg.close()


@pytest.fixture
def stockade_database(stockade_postgres: PostgresForTests) -> Iterator[str]:
    """The DSN of a fresh, migrated database, dropped after the test."""
    name = stockade_postgres.new_database()
    try:
        yield stockade_postgres.dsn(name)
    finally:
        stockade_postgres.drop_database(name)


@pytest.fixture
def stockade_engine(stockade_database: str) -> Iterator[Engine]:
    """An engine over a fresh, migrated database, closed after the test."""
    with Engine.postgres(stockade_database) as eng:
        yield eng
