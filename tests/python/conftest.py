"""Shared fixtures: an engine over each backend, a manual clock for the memory store, and
the list of per-request strategies every race and API test runs over.

`engine` is parametrized over both stores: each API test runs once on the memory store,
once on a fresh, migrated database of the throwaway PostgreSQL server that the
stockade pytest plugin (stockade.tools.pytest_plugin) starts once per session, and once
on a fresh schema of a three-node Citus cluster (layout='citus'; the whole session shares
one cluster, skipped with install.sh's reason where its build does not fit). A test of a
feature the Citus layout does not run yet says so with `@pytest.mark.not_on_citus(why)`,
and is skipped there with that reason. Tests that move
time with a ManualClock use `memory_engine`; their PostgreSQL twins wait for the database
clock instead (test_postgres.py).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from typing import Iterator, List

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade.tools.pytest_plugin import PostgresForTests
from support import (
    BACKENDS,
    PER_REQUEST_STRATEGIES,
    START,
    Now,
    Wait,
    field,
)


class _EngineBugs(logging.Handler):
    """Collects every log line in which the engine calls an outcome its own bug."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        # stockade.errors logs each InvariantViolation on `stockade` itself, at once, as it
        # is raised. The core's own lines (stockade.batcher, ...) reach Python through the
        # log pump a little later, maybe during the next test, so they are not read here.
        message = record.getMessage()
        if record.name == "stockade" and "a bug in the engine" in message:
            self.lines.append(message[:500])


@pytest.fixture(autouse=True)
def no_engine_bug(request: pytest.FixtureRequest) -> Iterator[None]:
    """An answer the engine calls a bug is never an accepted outcome (issue 45): every test
    fails if the engine logged one (each InvariantViolation a caller gets is logged at
    ERROR, see stockade.errors), unless it provokes one on purpose
    (``@pytest.mark.engine_bug_expected``, the lost-update canary)."""
    handler = _EngineBugs()
    logger = logging.getLogger("stockade")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if request.node.get_closest_marker("engine_bug_expected") is None:
        assert not handler.lines, handler.lines[:3]


@pytest.fixture
def clock() -> stockade.ManualClock:
    return stockade.ManualClock(START)


@pytest.fixture
def memory_engine(clock: stockade.ManualClock) -> Iterator[stockade.Engine]:
    with stockade.Engine.memory(clock=clock) as eng:
        yield eng


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine(backend: str, request: pytest.FixtureRequest) -> Iterator[stockade.Engine]:
    # @pytest.mark.sweeper_off: a test that counts expiries itself (expire_due) gets an
    # engine that lets holds lapse only when asked, so no sweeper races its counts.
    off = request.node.get_closest_marker("sweeper_off") is not None
    if backend == "memory":
        if off:
            clock = request.getfixturevalue("clock")
            with stockade.Engine.memory(clock=clock, sweeper=False) as eng:
                yield eng
        else:
            yield request.getfixturevalue("memory_engine")
    elif backend == "citus":
        marker = request.node.get_closest_marker("not_on_citus")
        if marker is not None:
            pytest.skip(f"not built on the Citus layout yet: {marker.args[0]}")
        if off:
            yield request.getfixturevalue("stockade_citus_engine_factory")(sweeper=False)
        else:
            yield request.getfixturevalue("stockade_citus_engine")
    elif off:
        yield request.getfixturevalue("stockade_engine_factory")(sweeper=False)
    else:
        yield request.getfixturevalue("stockade_engine")


@pytest.fixture
def batched_engine(backend: str, request: pytest.FixtureRequest) -> Iterator[stockade.Engine]:
    """An engine over `backend` whose default strategy is batched, so that confirm and
    release batch too."""
    if backend == "memory":
        clock = request.getfixturevalue("clock")  # the one `wait` moves
        with stockade.Engine.memory(strategy="batched", clock=clock) as eng:
            yield eng
    elif backend == "citus":
        yield request.getfixturevalue("stockade_citus_engine_factory")(strategy="batched")
    else:
        yield request.getfixturevalue("stockade_engine_factory")(strategy="batched", pool_size=8)


@pytest.fixture
def store_now(backend: str, clock: stockade.ManualClock) -> Now:
    """The current time of the `engine`'s store: the manual clock, or the host clock for
    PostgreSQL (same host, so close to the database clock)."""
    if backend == "memory":
        return clock.now
    return lambda: datetime.now(timezone.utc)


@pytest.fixture
def wait(backend: str, clock: stockade.ManualClock) -> Wait:
    """Lets `seconds` of store time pass: moves the manual clock, or sleeps."""
    if backend != "memory":
        return time.sleep

    def advance(seconds: float) -> None:
        clock.advance(seconds)

    return advance


@pytest.fixture
def pooled(stockade_postgres: PostgresForTests) -> bool:
    """Whether the suite runs its engines through a transaction-mode PgBouncer."""
    return stockade_postgres.pooled


@pytest.fixture(params=PER_REQUEST_STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def proxy(stockade_postgres: PostgresForTests) -> Iterator[CommitCuttingProxy]:
    """A proxy in front of the test server that can cut a connection around a commit."""
    dsn = stockade_postgres.dsn()
    p = CommitCuttingProxy(field(dsn, "host"), int(field(dsn, "port")))
    yield p
    p.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks every test that runs on PostgreSQL `postgres` (select with -m postgres), and
    every one on the Citus cluster `citus`."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("backend") == "citus":
            item.add_marker(pytest.mark.citus)
        on_postgres = callspec is not None and callspec.params.get("backend") == "postgres"
        if on_postgres or "stockade_postgres" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
