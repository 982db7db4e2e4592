"""pytest fixtures for code that uses stockade on PostgreSQL (a pytest11 entry point).

Installing stockade makes these fixtures available to every test suite:

``stockade_postgres`` (session)
    A throwaway PostgreSQL server (:class:`stockade.tools.pgserver.TemporaryPostgres`) with a
    template database that holds the migrated schema. Set ``STOCKADE_TEST_DSN`` to a
    superuser connection string (key=value or URI) to use a server of yours instead; the
    suite then creates and drops its databases there. The template's name is unique to
    the process, so that several runs (or pytest-xdist workers) can share one server.
``stockade_database`` (function)
    The DSN of a migrated database with empty tables, for this test alone. It is a clone
    of the template (much faster than migrating a new database), or one that an earlier
    test used and left in the same shape, emptied (:mod:`stockade.tools.reuse`: a clone
    costs about 0.3 s with fsync on, emptying one a statement); one whose shape the test
    changed is dropped after it.
``stockade_engine`` (function)
    ``Engine.postgres`` over such a database, closed after the test.
``stockade_engine_factory`` (function)
    A callable that makes engines with your options (``strategy``, ``pool_size``,
    ``schema``, ...) over a database each: such a database, or with ``schema=`` a new
    one migrated in that schema; all are closed after the test.
``stockade_memory_engine`` (function)
    ``Engine.memory()`` for tests that need no server.
``stockade_citus`` (session)
    A Citus coordinator and two workers on loopback
    (:class:`stockade.tools.citus.TemporaryCitus`); the test is skipped, with the reason,
    where no Citus build fits the machine.
``stockade_citus_dsn`` (function)
    The coordinator's DSN, with few shards per table (``citus.shard_count`` 4), which keeps
    ``create_distributed_table`` quick while the placements still span both workers.
``stockade_citus_engine_factory`` (function)
    A callable that makes engines with ``layout="citus"`` and your options, each over a
    migrated schema of the cluster whose tables are empty (or the one ``schema=`` names);
    all are closed after the test. Migrating a schema on a cluster takes about a second,
    so a schema the factory made goes to a later test, emptied, unless the test changed
    its shape (:class:`stockade.tools.citus.CitusSchemas`); ids from sequences go on
    where they were.
``stockade_citus_engine`` (function)
    One such engine.

Options (``pytest --help``, section "stockade"): ``--stockade-dsn`` (else
``$STOCKADE_TEST_DSN``, else the ini option ``stockade_dsn``) points the suite at a server
of yours; ``--stockade-fsync=off`` (ini ``stockade_fsync``) runs the throwaway server with
fsync and synchronous_commit off, faster where durability does not matter;
``--stockade-pooler=pgbouncer`` (ini ``stockade_pooler``, env ``STOCKADE_TEST_POOLER``)
puts a throwaway PgBouncer in transaction mode
(:class:`stockade.tools.pgbouncer.TemporaryPgBouncer`) between the engines and the server:
the DSNs the fixtures hand out then lead through it, while the suite's own administration
(templates, ``CREATE``/``DROP DATABASE``, ``PostgresForTests.sql``) goes to the server
directly.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest

from ..engine import Engine
from .citus import CitusSchemas, TemporaryCitus, citus_available, drop_citus_schema
from .pgbouncer import TemporaryPgBouncer
from .pgserver import TemporaryPostgres, conninfo_with, quote_ident, run_sql
from .reuse import USER_SCHEMAS, Handed, Shape

__all__ = [
    "PostgresForTests",
    "stockade_citus",
    "stockade_citus_dsn",
    "stockade_citus_engine",
    "stockade_citus_engine_factory",
    "stockade_database",
    "stockade_engine",
    "stockade_engine_factory",
    "stockade_memory_engine",
    "stockade_postgres",
]

TEMPLATE_PREFIX = "stockade_template_"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stockade", "stockade's PostgreSQL fixtures")
    group.addoption(
        "--stockade-dsn",
        default=None,
        help="a superuser DSN (key=value or URI) of a server for the stockade fixtures; "
        "default: $STOCKADE_TEST_DSN, else the stockade_dsn ini option, else a throwaway "
        "server",
    )
    group.addoption(
        "--stockade-fsync",
        choices=["on", "off"],
        default=None,
        help="fsync and synchronous_commit of the throwaway server (default: the "
        "stockade_fsync ini option, else on)",
    )
    group.addoption(
        "--stockade-pooler",
        choices=["none", "pgbouncer"],
        default=None,
        help="pgbouncer: run the engines of the fixtures through a throwaway PgBouncer in "
        "transaction mode (default: the stockade_pooler ini option, else "
        "$STOCKADE_TEST_POOLER, else none)",
    )
    parser.addini("stockade_dsn", "the server for the stockade fixtures (see --stockade-dsn)")
    parser.addini("stockade_pooler", "none or pgbouncer (see --stockade-pooler)", default="")
    parser.addini("stockade_fsync", "on or off: durability of the throwaway server", default="on")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "load: a load scenario (stockade.testing.flash_sale and the like)"
    )


class PostgresForTests:
    """A server with a migrated template database, handing out clones of it.

    ``dsn_of(dbname)`` gives the connection string of a database on the server; the
    server's ``postgres`` database is used for administration. With a pooler in front,
    ``dsn_of`` leads through it and ``admin_dsn_of`` straight to the server (templates and
    administration must not go through the pooler, whose idle server connections would
    keep a template busy); ``pooled`` then says so.
    """

    def __init__(
        self,
        dsn_of: Callable[[str], str],
        admin_dsn_of: Optional[Callable[[str], str]] = None,
    ) -> None:
        self.dsn = dsn_of
        self.admin_dsn = admin_dsn_of or dsn_of
        self.pooled = admin_dsn_of is not None
        self._names = itertools.count(1)
        self._lock = threading.Lock()
        self._prefix = f"stockade_t{os.getpid()}_{uuid.uuid4().hex[:6]}_"
        # One template per process and run: pytest-xdist workers and concurrent runs on a
        # shared server (STOCKADE_TEST_DSN) never collide on it.
        self.template = f"{TEMPLATE_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self.sql(f"CREATE DATABASE {self.template}")
        # No sweeper session: CREATE DATABASE ... TEMPLATE needs the template unused.
        with Engine.postgres(self.admin_dsn(self.template), pool_size=1, sweeper=False) as eng:
            eng.migrate()
        self._clones = _Clones(self, keep=4)  # handed on from test to test
        self._clone_shape = self._clones.shape_of(self.template)

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """Runs one SQL statement on ``dbname`` with psql (straight to the server)."""
        return run_sql(self.admin_dsn(dbname), statement)

    def new_database(self, *, migrated: bool = True) -> str:
        """A database cloned from the migrated template, or one that an earlier test
        handed back emptied (:meth:`drop_database`); an empty new one if ``migrated`` is
        False. Returns its name."""
        with self._lock:
            reused = self._clones.take() if migrated else None
            if reused is not None:
                return reused
            name = self.next_name()
        template = f" TEMPLATE {self.template}" if migrated else ""
        self.sql(f"CREATE DATABASE {quote_ident(name)}{template}")
        if migrated:
            with self._lock:
                self._clones.made(name, like=self._clone_shape)
        return name

    def drop_database(self, name: str) -> None:
        """Drops a database, disconnecting whoever is still on it; a clone of the template
        whose shape the test left alone goes to a later test instead, emptied (see
        :mod:`stockade.tools.reuse`)."""
        with self._lock:
            if self._clones.owns(name):
                self._clones.give_back(name)
                return
        self._drop(name)

    def next_name(self) -> str:
        """A new database name of this run."""
        return f"{self._prefix}{next(self._names)}"

    def close(self) -> None:
        with self._lock:
            self._clones.close()
        self._drop(self.template)

    def _drop(self, name: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")


class _Clones(Handed):
    """The template's clones that tests hand on to each other. One comes back with every
    other session on it ended (as ``DROP DATABASE ... WITH (FORCE)`` would end them), its
    tables emptied by ``TRUNCATE``, their planner statistics and the database's activity
    counters reset, its sequences at their start again, and under a new name."""

    def __init__(self, server: PostgresForTests, keep: int) -> None:
        super().__init__(keep)
        self._server = server

    def _run(self, name: str, sql: str) -> str:
        return self._server.sql(sql, name)

    def _where(self, name: str) -> str:
        return USER_SCHEMAS

    def _reset(self, name: str, shape: Shape) -> Optional[str]:
        tables = ", ".join(f"'{t}'::regclass" for t in shape.empty + shape.kept)
        statements = [
            "SET LOCAL lock_timeout = '10s'",
            # Ends the other sessions (not waiting in pg_terminate_backend, whose waits come
            # in steps of 100 ms), then waits for them to be gone, at most 5 s.
            "DO $$BEGIN PERFORM pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid();"
            " FOR i IN 1..500 LOOP PERFORM pg_stat_clear_snapshot();"
            " EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid());"
            " PERFORM pg_sleep(0.01); END LOOP; END$$",
            *([f"TRUNCATE {', '.join(shape.empty)}"] if shape.empty else []),
            "DO $$BEGIN PERFORM setval(format('%I.%I', schemaname, sequencename)::regclass,"
            " start_value, false) FROM pg_sequences"
            " WHERE schemaname NOT IN ('pg_catalog', 'information_schema'); END$$",
            # The planner's statistics and the activity counters, as in a new clone.
            f"DELETE FROM pg_statistic WHERE starelid IN ({tables})",
            "SELECT pg_stat_reset()",
            # Last: psql before 15 prints only the last statement's result.
            shape.check_sql(self._shape_sql(name)),
        ]
        if self._run(name, "; ".join(statements)).split("\n")[-1] != shape.expected:
            return None
        # A new name: an engine that a test left open, or a DSN it kept, cannot reach the
        # database that the next test gets. Renaming fails if a session is back.
        now = self._server.next_name()
        self._server.sql(f"ALTER DATABASE {quote_ident(name)} RENAME TO {quote_ident(now)}")
        return now

    def _drop(self, name: str) -> None:
        self._server._drop(name)


def _with_dbname(base: str, dbname: str) -> str:
    """The connection string ``base`` (key=value or URI) pointed at ``dbname``."""
    return conninfo_with(base, dbname=dbname)


def _option(config: pytest.Config, flag: str, ini: str, env: Optional[str] = None) -> str:
    value = config.getoption(flag)
    if value:
        return str(value)
    if env and os.environ.get(env):
        return os.environ[env]
    return str(config.getini(ini) or "")


@pytest.fixture(scope="session")
def stockade_postgres(pytestconfig: pytest.Config) -> Iterator[PostgresForTests]:
    """A PostgreSQL server for the session, with the stockade schema in a template."""
    external = _option(pytestconfig, "--stockade-dsn", "stockade_dsn", "STOCKADE_TEST_DSN")
    fsync = _option(pytestconfig, "--stockade-fsync", "stockade_fsync")
    if fsync not in ("on", "off"):
        raise pytest.UsageError(f"stockade_fsync must be on or off, got {fsync!r}")
    pooler = _option(pytestconfig, "--stockade-pooler", "stockade_pooler", "STOCKADE_TEST_POOLER")
    if pooler not in ("", "none", "pgbouncer"):
        raise pytest.UsageError(f"stockade_pooler must be none or pgbouncer, got {pooler!r}")
    if pooler == "pgbouncer" and external:
        raise pytest.UsageError(
            "--stockade-pooler=pgbouncer starts its PgBouncer in front of the throwaway "
            "server; it does not combine with --stockade-dsn (point that at your pooler)"
        )
    if external:
        pg = PostgresForTests(lambda dbname: _with_dbname(external, dbname))
        try:
            yield pg
        finally:
            pg.close()
        return
    settings = {} if fsync == "on" else {"fsync": "off", "synchronous_commit": "off"}
    with TemporaryPostgres(settings=settings) as server:
        if pooler == "pgbouncer":
            with TemporaryPgBouncer(server) as bouncer:
                pg = PostgresForTests(bouncer.dsn, server.dsn)
                try:
                    yield pg
                finally:
                    pg.close()
            return
        pg = PostgresForTests(server.dsn)
        try:
            yield pg
        finally:
            pg.close()


@pytest.fixture
def stockade_database(stockade_postgres: PostgresForTests) -> Iterator[str]:
    """The DSN of a migrated database with empty tables, handed back after the test
    (emptied for a later one, or dropped if the test changed its shape)."""
    name = stockade_postgres.new_database()
    try:
        yield stockade_postgres.dsn(name)
    finally:
        stockade_postgres.drop_database(name)


@pytest.fixture
def stockade_engine(stockade_database: str) -> Iterator[Engine]:
    """An engine over such a database (``stockade_database``), closed after the test."""
    with Engine.postgres(stockade_database) as eng:
        yield eng


@pytest.fixture
def stockade_engine_factory(
    stockade_postgres: PostgresForTests,
) -> Iterator[Callable[..., Engine]]:
    """Makes ``Engine.postgres`` engines with the options given, each over a database of
    its own: as ``stockade_database``, or with ``schema=`` a new one that the engine
    migrates in that schema. Closes them and hands the databases back after the test."""
    made: List[Tuple[Engine, str]] = []

    def make(**options: Any) -> Engine:
        # A schema of its own is migrated by the engine; the default one is the template's.
        name = stockade_postgres.new_database(migrated="schema" not in options)
        try:
            engine = Engine.postgres(stockade_postgres.dsn(name), **options)
        except BaseException:
            stockade_postgres.drop_database(name)
            raise
        made.append((engine, name))
        engine.migrate()
        return engine

    yield make
    for engine, name in made:
        engine.close()
        stockade_postgres.drop_database(name)


@pytest.fixture
def stockade_memory_engine() -> Iterator[Engine]:
    """An engine over the in-process memory store, closed after the test."""
    with Engine.memory() as eng:
        yield eng


@pytest.fixture(scope="session")
def stockade_citus() -> Iterator[TemporaryCitus]:
    """A coordinator and two workers on loopback for the session."""
    ok, why = citus_available()
    if not ok:
        pytest.skip(why)
    with TemporaryCitus() as cluster:
        yield cluster


# Few shards keep create_distributed_table quick; their placements still span both workers.
CITUS_SHARDS = "?options=-c%20citus.shard_count%3D4"
_citus_schemas = itertools.count(1)


@pytest.fixture
def stockade_citus_dsn(stockade_citus: TemporaryCitus) -> str:
    """The coordinator's DSN, with four shards per distributed table."""
    return stockade_citus.dsn() + CITUS_SHARDS


@pytest.fixture(scope="session")
def _stockade_citus_schemas(stockade_citus: TemporaryCitus) -> Iterator[CitusSchemas]:
    """The session's migrated Citus schemas that tests hand on to each other."""
    schemas = CitusSchemas(stockade_citus.dsn() + CITUS_SHARDS)
    yield schemas
    schemas.close()


@pytest.fixture
def stockade_citus_engine_factory(
    stockade_citus_dsn: str, _stockade_citus_schemas: CitusSchemas
) -> Iterator[Callable[..., Engine]]:
    """Makes engines with layout='citus' (with the given options), each over a migrated
    schema of the cluster with empty tables (or the one ``schema=`` names); closes them
    after the test. A schema made here goes to the next test emptied if the test left its
    shape alone (see :class:`stockade.tools.citus.CitusSchemas`), else it is dropped; a
    schema named by the test is dropped."""
    made: List[Tuple[Engine, str]] = []
    schemas = _stockade_citus_schemas

    def make(schema: Optional[str] = None, **options: Any) -> Engine:
        reused = schema is None and schemas.take()
        name = schema or reused or f"citus_t{os.getpid()}_{next(_citus_schemas)}"
        try:
            engine = Engine.postgres(stockade_citus_dsn, layout="citus", schema=name, **options)
        except BaseException:
            if reused:
                schemas.give_back(name)
            raise
        made.append((engine, name))
        engine.migrate()
        if schema is None and not reused:
            schemas.made(name)
        return engine

    yield make
    for engine, _ in made:
        engine.close()
    for name in dict.fromkeys(name for _, name in made):
        if schemas.owns(name):
            schemas.give_back(name)
        else:
            drop_citus_schema(stockade_citus_dsn, name)


@pytest.fixture
def stockade_citus_engine(stockade_citus_engine_factory: Callable[..., Engine]) -> Engine:
    """An engine with layout='citus' over a migrated schema of the cluster with empty
    tables, closed after the test (``stockade_citus_engine_factory``)."""
    return stockade_citus_engine_factory()
