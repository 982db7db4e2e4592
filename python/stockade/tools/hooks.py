"""The core's test hooks, typed: the oversell canary and holding a lock as another session.

``naive_reserve`` is a deliberately broken read-modify-write (the lost update) kept as a
canary: a race that cannot make it oversell cannot prove that the real strategies do not.
``hold_lock`` holds a row or advisory lock as another session would, to observe
``nowait`` and ``lock_timeout``. Neither is for production paths. ``prepared_statements``
lists the statements the PostgreSQL store prepares, for the plan audit of the tests.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, List

from .. import _core
from ..engine import DEFAULT_LOCATION, Engine
from ..values import (
    Reservation,
    Strategy,
    StrategyLike,
    TtlLike,
    check_bool,
    check_int,
    check_str,
    duration_ms,
    duration_us,
    strategy_name,
)

__all__ = [
    "PreparedStatement",
    "hold_lock",
    "limited_reserve_by_check",
    "naive_reserve",
    "prepared_statements",
]


def naive_reserve(
    engine: Engine,
    sku: str,
    qty: int,
    *,
    location: str = DEFAULT_LOCATION,
    ttl: TtlLike = timedelta(minutes=15),
    window: TtlLike = timedelta(microseconds=200),
) -> Reservation:
    """UNSAFE, for tests only: read the row, wait ``window``, write back a value computed
    from the stale read. Loses updates and oversells under concurrency, by design."""
    return Reservation._from_core(
        _core.naive_reserve_unsafe(
            engine._native(),
            sku=check_str("sku", sku),
            location=check_str("location", location),
            qty=check_int("qty", qty),
            ttl_us=duration_us("ttl", ttl),
            window_us=duration_us("window", window),
        )
    )


def limited_reserve_by_check(
    engine: Engine,
    sku: str,
    qty: int,
    *,
    buyer: str,
    location: str = DEFAULT_LOCATION,
    serializable: bool = False,
    window: TtlLike = timedelta(microseconds=200),
) -> Reservation:
    """A purchase limit checked the naive way, with no parent row: sum the buyer's held
    and confirmed reservations on the group's SKUs, raise ``LimitExceeded`` past the
    limit, wait ``window``, then reserve.

    UNSAFE at READ COMMITTED (``serializable=False``, the default): two requests by one
    buyer on two SKUs both pass the check (write skew). A canary for tests. With
    ``serializable=True`` (PostgreSQL only) it runs at SERIALIZABLE and retries
    serialization failures: the alternative to the parent row, for the benchmark."""
    return Reservation._from_core(
        _core.limited_reserve_by_check(
            engine._native(),
            sku=check_str("sku", sku),
            location=check_str("location", location),
            qty=check_int("qty", qty),
            buyer=check_str("buyer", buyer),
            serializable=check_bool("serializable", serializable),
            window_us=duration_us("window", window),
        )
    )


class HeldLock:
    """The lock ``hold_lock`` holds. ``release()`` lets it go before the ``with`` block
    ends (then the block's end does nothing more); call it on the thread that took it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def release(self) -> None:
        self._handle.release()

    def release_after(self, seconds: float) -> None:
        """Waits ``seconds``, then releases: a ``race(..., meanwhile=...)`` that keeps the
        racers behind the lock that long."""
        time.sleep(seconds)
        self.release()


@contextmanager
def hold_lock(
    engine: Engine,
    sku: str,
    *,
    kind: StrategyLike = Strategy.PESSIMISTIC,
    location: str = DEFAULT_LOCATION,
    timeout: TtlLike = timedelta(seconds=10),
) -> Iterator[HeldLock]:
    """Holds the lock that ``kind`` (pessimistic or advisory) takes on a row, as another
    session would, for the body of the ``with`` block, or until the ``HeldLock`` it gives
    is released. Enter and exit on one thread."""
    handle = _core.hold_lock(
        engine._native(),
        sku=check_str("sku", sku),
        location=check_str("location", location),
        kind=strategy_name(kind) or Strategy.PESSIMISTIC.value,
        timeout_ms=duration_ms("timeout", timeout),
    )
    try:
        yield HeldLock(handle)
    finally:
        handle.release()


@dataclass(frozen=True)
class PreparedStatement:
    """One statement the PostgreSQL store prepares on each connection."""

    name: str  #: the prepared statement's name (``stockade_...``)
    sql: str  #: its text as prepared, with the schema filled in
    parameters: int  #: it takes ``$1`` .. ``$n``
    routine: bool  #: behind a transaction pooler it runs inside a statement routine


def prepared_statements(schema: str = "stockade") -> List[PreparedStatement]:
    """Every statement the PostgreSQL store prepares on the plain layout (the Citus layout
    prepares none), with the schema ``schema`` filled in."""
    return [
        PreparedStatement(d["name"], d["sql"], d["parameters"], d["routine"])
        for d in _core.prepared_statements(check_str("schema", schema))
    ]
