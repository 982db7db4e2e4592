"""Helpers for tests and load scenarios that drive an engine: the one home of
``stockade.testing`` (its parts live beside the rest of the tooling, in
:mod:`stockade.tools.hooks` and :mod:`stockade.tools.loadgen`).

``flash_sale`` is a load scenario for pytest: many buyers race for few units, and the
engine's committed state is checked against what the buyers were told (no oversell, a
consistent ledger, every acknowledged reservation present); a broken invariant raises
``LoadInvariantError``. ``race`` starts many threads at once against one engine (and, with
``meanwhile``, lets the calling thread act while they run). ``naive_reserve`` is a
deliberately broken read-modify-write (the lost update) kept as a canary: a race that
cannot make it oversell cannot prove that the real strategies do not. ``hold_lock`` holds
a row or advisory lock as another session would, to observe ``nowait`` and
``lock_timeout``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Generic, List, Optional, TypeVar

from .tools.hooks import HeldLock, hold_lock, limited_reserve_by_check, naive_reserve
from .tools.loadgen import FlashSaleReport, LoadInvariantError, flash_sale
from .values import check_int

__all__ = [
    "FlashSaleReport",
    "HeldLock",
    "LoadInvariantError",
    "RaceResult",
    "flash_sale",
    "hold_lock",
    "limited_reserve_by_check",
    "naive_reserve",
    "race",
]

T = TypeVar("T")


@dataclass
class RaceResult(Generic[T]):
    """What each racer returned or raised, in racer order."""

    results: List[Optional[T]] = field(default_factory=list)
    errors: List[Optional[BaseException]] = field(default_factory=list)

    def succeeded(self) -> List[T]:
        return [
            r
            for r, e in zip(self.results, self.errors, strict=False)
            if e is None and r is not None
        ]

    def failed_with(self, kind: type) -> int:
        return sum(1 for e in self.errors if isinstance(e, kind))


def race(
    racers: int,
    fn: Callable[[int], T],
    *,
    timeout: float = 120.0,
    meanwhile: Optional[Callable[[], object]] = None,
) -> RaceResult[T]:
    """Runs ``fn(i)`` for i in range(racers) on as many threads, released together by a
    barrier so that they really collide. Bounded: raises TimeoutError past ``timeout``.

    ``meanwhile``, if given, runs on the calling thread while the racers run: the calling
    thread waits at the barrier with them, runs it once they are released, and joins them
    after it returns (``timeout`` then counts from its return). Use it to act during the
    race: close the engine, kill backends, release a lock held since before the call. What
    it raises is raised at once, without waiting for the racers (daemon threads)."""
    racers = check_int("racers", racers)
    if not 1 <= racers <= 4096:
        raise ValueError("racers must be between 1 and 4096")
    out: RaceResult[T] = RaceResult([None] * racers, [None] * racers)
    barrier = threading.Barrier(racers if meanwhile is None else racers + 1)

    def run(i: int) -> None:
        try:
            barrier.wait(timeout)
            out.results[i] = fn(i)
        except BaseException as exc:
            out.errors[i] = exc

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(racers)]
    for t in threads:
        t.start()
    if meanwhile is not None:
        barrier.wait(timeout)
        meanwhile()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise TimeoutError(f"the racers did not all finish within {timeout} s")
    return out
