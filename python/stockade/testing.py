"""Helpers for tests and load scenarios that drive an engine.

``flash_sale`` is a load scenario for pytest: many buyers race for few units, and the
engine's committed state is checked against what the buyers were told (no oversell, a
consistent ledger, every acknowledged reservation present); a broken invariant raises
``LoadInvariantError``. ``race`` starts many threads at once against one engine.
``naive_reserve`` is a
deliberately broken read-modify-write (the lost update) kept as a canary: a race that
cannot make it oversell cannot prove that the real strategies do not. ``hold_lock`` holds
a row or advisory lock as another session would, to observe ``nowait`` and
``lock_timeout``.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Callable, Generic, Iterator, List, Optional, TypeVar, Union

from .engine import DEFAULT_LOCATION, Engine
from .values import (
    Reservation,
    Strategy,
    TtlLike,
    check_int,
    check_str,
    duration_ms,
    duration_us,
    strategy_name,
)

__all__ = ["LoadInvariantError", "RaceResult", "flash_sale", "hold_lock", "naive_reserve", "race"]

if TYPE_CHECKING:  # loadgen imports this module: import it lazily at run time
    from .loadgen import FlashSaleReport

T = TypeVar("T")


class LoadInvariantError(AssertionError):
    """A load scenario broke an invariant; ``violations`` lists what was found."""

    def __init__(self, report: FlashSaleReport, violations: List[str]) -> None:
        super().__init__(f"flash sale with {report.strategy}: " + "; ".join(violations))
        self.report = report
        self.violations = violations


def flash_sale(
    engine: Engine, *, buyers: int, units: int, strategy: Union[Strategy, str] = Strategy.AUTO,
    clients: int = 32, sku: Optional[str] = None, check: bool = True,
) -> FlashSaleReport:
    """Runs a flash sale: ``clients`` threads share ``buyers`` purchase attempts of one
    unit each, against ``units`` units of a fresh SKU (or ``sku``), with ``strategy``
    (or ``"naive-unsafe"``, the canary). Returns the report (granted, refused, failed,
    latencies, throughput, retries, lock waits, the reservation ids granted).

    With ``check`` (the default) it then reads the engine back and raises
    :class:`LoadInvariantError` if anything is off: more grants than units, a row whose
    reserved or on_hand disagree with the grants, or an acknowledged reservation that is
    missing or not held."""
    from .loadgen import NAIVE
    from .loadgen import flash_sale as run_sale

    name = NAIVE if strategy == NAIVE else strategy_name(strategy)
    report = run_sale(engine, buyers=check_int("buyers", buyers), units=check_int("units", units),
                      strategy=name or Strategy.AUTO.value, clients=check_int("clients", clients),
                      sku=sku)
    if check:
        found = report.violations(engine)
        if found:
            raise LoadInvariantError(report, found)
    return report


@dataclass
class RaceResult(Generic[T]):
    """What each racer returned or raised, in racer order."""

    results: List[Optional[T]] = field(default_factory=list)
    errors: List[Optional[BaseException]] = field(default_factory=list)

    def succeeded(self) -> List[T]:
        return [r for r, e in zip(self.results, self.errors) if e is None and r is not None]

    def failed_with(self, kind: type) -> int:
        return sum(1 for e in self.errors if isinstance(e, kind))


def race(racers: int, fn: Callable[[int], T], *, timeout: float = 120.0) -> RaceResult[T]:
    """Runs ``fn(i)`` for i in range(racers) on as many threads, released together by a
    barrier so that they really collide. Bounded: raises TimeoutError past ``timeout``."""
    racers = check_int("racers", racers)
    if not 1 <= racers <= 4096:
        raise ValueError("racers must be between 1 and 4096")
    out: RaceResult[T] = RaceResult([None] * racers, [None] * racers)
    barrier = threading.Barrier(racers)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout)
            out.results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            out.errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise TimeoutError(f"the racers did not all finish within {timeout} s")
    return out


def naive_reserve(
    engine: Engine, sku: str, qty: int, *, location: str = DEFAULT_LOCATION,
    ttl: TtlLike = timedelta(minutes=15), window: TtlLike = timedelta(microseconds=200),
) -> Reservation:
    """UNSAFE, for tests only: read the row, wait ``window``, write back a value computed
    from the stale read. Loses updates and oversells under concurrency, by design."""
    return Reservation._from_core(engine._core.naive_reserve_unsafe(
        sku=check_str("sku", sku), location=check_str("location", location),
        qty=check_int("qty", qty), ttl_us=duration_us("ttl", ttl),
        window_us=duration_us("window", window),
    ))


@contextmanager
def hold_lock(
    engine: Engine, sku: str, *, kind: Union[Strategy, str] = Strategy.PESSIMISTIC,
    location: str = DEFAULT_LOCATION, timeout: TtlLike = timedelta(seconds=10),
) -> Iterator[None]:
    """Holds the lock that ``kind`` (pessimistic or advisory) takes on a row, as another
    session would, for the body of the ``with`` block. Enter and exit on one thread."""
    handle = engine._core.hold_lock(
        sku=check_str("sku", sku), location=check_str("location", location),
        kind=strategy_name(kind) or Strategy.PESSIMISTIC.value,
        timeout_ms=duration_ms("timeout", timeout),
    )
    try:
        yield
    finally:
        handle.release()
