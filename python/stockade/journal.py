"""The movement journal, the change feed, stock alerts and the audit (docs/journal.md).

Every change of a stock row is journaled in the transaction of the change (on PostgreSQL
a row trigger, migration 007), so :meth:`Engine.movements` answers *why* a row changed
and :meth:`Engine.feed` delivers *every* committed change to a named, durable consumer,
at least once and in version order per row. :meth:`Engine.audit` checks the invariants
from the data itself.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, FrozenSet, List, Optional, Tuple

from . import _core
from .aio import off_loop
from .errors import InvalidArgument
from .values import TtlLike, _datetime, check_count, duration_us

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = [
    "ALERTS",
    "AuditReport",
    "AuditUnchecked",
    "AuditViolation",
    "Feed",
    "Movement",
    "StockChange",
]

# The alert flags a change may carry, by name (bits of the journal's `alerts` column).
ALERTS: Dict[str, int] = {"low_stock": 1, "sold_out": 2, "back_in_stock": 4, "recovered": 8}

# poll(timeout=...) looks again at least this often (seconds), whatever woke it.
_RECHECK = 1.0
# Without LISTEN (a transaction-mode pooler) it looks again after waits that double from the
# first to the last.
_WAIT_FIRST = 0.005
_WAIT_MAX = 0.2
# poll(timeout=...) waits at most this long (seconds).
_POLL_TIMEOUT_MAX = 3600


@dataclass(frozen=True, slots=True)
class Movement:
    """One journal entry: one change of one stock row (a :class:`StockChange` in a feed).

    ``version`` is the row's version after the change and ``version_before`` before it (0
    when the change made the row); a batch moves a row's version by its count of requests
    (``requests``) in one entry, with its net deltas. ``on_hand``, ``reserved`` and
    ``available`` are the row's values after the change. ``cause`` names the operation
    (``restock``, ``set_on_hand``, ``sell``, ``hold``, ``confirm``, ``release``,
    ``expire``, ``resize``, ``return``, ``batch``, ``backorder_limit``, ``discontinue``,
    ``reinstate``, ``lease``, ``low_stock``, ``slot_move``, ``create``, ``touch``,
    ``safety_stock``, ``move`` between quantity states, ``write_off``); ``reason`` and
    ``actor`` are what the caller passed, ``ref`` the reservation id where there is one.
    ``alerts`` names the lines the change crossed (:data:`ALERTS`). ``slot`` is the
    hot-row slot of the row (0: the SKU's own row). ``position`` orders the journal.
    """

    position: int
    sku: str
    location: str
    slot: int
    version_before: int
    version: int
    on_hand_delta: int
    reserved_delta: int
    on_hand: int
    reserved: int
    available: int
    cause: str
    reason: Optional[str]
    actor: Optional[str]
    ref: Optional[str]
    requests: int
    alerts: FrozenSet[str]
    at: datetime

    @property
    def key(self) -> Tuple[str, str, int]:
        """``(sku, location, version)``: what a handler keeps to drop a repeated change."""
        return (self.sku, self.location, self.version)

    @classmethod
    def _from_core(cls, m: _core.Movement) -> Movement:
        return cls(
            m.position,
            m.sku,
            m.location,
            m.slot,
            m.version_before,
            m.version_after,
            m.on_hand_delta,
            m.reserved_delta,
            m.on_hand,
            m.reserved,
            m.available,
            m.cause,
            m.reason or None,
            m.actor or None,
            m.ref or None,
            m.requests,
            frozenset(name for name, bit in ALERTS.items() if m.alerts & bit),
            _datetime(m.at_us),
        )


StockChange = Movement


def _poll_timeout(timeout: object) -> float:
    """``Feed.poll(timeout=...)``: seconds (or a timedelta), 0 to 3600."""
    us = duration_us("timeout", timeout)
    if not 0 <= us <= _POLL_TIMEOUT_MAX * 1_000_000:
        raise InvalidArgument(
            f"timeout must be between 0 and {_POLL_TIMEOUT_MAX} seconds, got {timeout}"
        )
    return us / 1_000_000


class Feed:
    """A named, durable consumer of the change feed, from :meth:`Engine.feed`.

    :meth:`poll` returns the next committed changes, in position order (per row, version
    order), and moves this object's position past them; :meth:`commit` stores that
    position in the store, so a consumer opened again under the same name resumes after
    its last commit. Delivery is at least once: a change polled but not committed comes
    again after a restart; :attr:`Movement.key` lets a handler drop repeats.
    """

    def __init__(self, engine: Engine, name: str, position: _core.FeedPosition) -> None:
        self._engine = engine
        self.name = name
        self._position = position
        # How this feed's waits ended: "changed" (a NOTIFY, or a change in the memory
        # store), "timeout", or "unsupported" (no LISTEN: it polled with backoff).
        self.wakes: Dict[str, int] = {}

    def poll(self, limit: int = 1000, timeout: Optional[TtlLike] = None) -> List[Movement]:
        """The next changes, at most ``limit``. With ``timeout`` (seconds or a timedelta, up
        to an hour) and none there yet, waits up to that long for one: woken by
        ``LISTEN``/``NOTIFY`` on PostgreSQL (a writer's engine sends one NOTIFY per few
        milliseconds of commits), and looking again at least every second all the same (a
        change that came without a NOTIFY: a writer that died after its commit, a manual
        SQL fix). Behind a transaction-mode pooler, where ``LISTEN`` cannot work, it looks
        again after waits that double from 5 ms to 200 ms. Without ``timeout`` it returns
        at once."""
        count = check_count("limit", limit)
        deadline = None if timeout is None else time.monotonic() + _poll_timeout(timeout)
        backoff = _WAIT_FIRST
        while True:
            batch = self._engine._core.feed_poll(
                consumer=self.name, position=self._position, limit=count
            )
            self._position = batch.next
            if batch.changes or deadline is None:
                return [Movement._from_core(m) for m in batch.changes]
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            wake = self._engine._core.feed_wait(timeout_ms=math.ceil(min(left, _RECHECK) * 1000))
            self.wakes[wake] = self.wakes.get(wake, 0) + 1
            if wake == "unsupported":
                time.sleep(min(backoff, left))
                backoff = min(backoff * 2, _WAIT_MAX)

    def commit(self) -> None:
        """Stores the position after the last poll: a restart resumes there."""
        self._engine._core.feed_commit(consumer=self.name, position=self._position)

    def drop(self) -> bool:
        """Forgets the consumer in the store (its position goes); says whether it was there."""
        return bool(self._engine._core.feed_drop(consumer=self.name))

    async def poll_async(
        self, limit: int = 1000, timeout: Optional[TtlLike] = None
    ) -> List[Movement]:
        """:meth:`poll` as an awaitable (it runs on the loop's default executor)."""
        return await off_loop(lambda: self.poll(limit, timeout))

    async def commit_async(self) -> None:
        """:meth:`commit` as an awaitable."""
        await off_loop(self.commit)

    def __aiter__(self) -> AsyncIterator[Movement]:
        return self._changes()

    async def _changes(self) -> AsyncIterator[Movement]:
        while True:
            for change in await self.poll_async(timeout=1.0):
                yield change
            await asyncio.sleep(0)

    def __repr__(self) -> str:
        return f"Feed({self.name!r}, after={self._position.after})"


@dataclass(frozen=True, slots=True)
class AuditViolation:
    """One broken invariant: which ``check``, the row it concerns (``sku`` None when it
    concerns none), the ``subject`` (a reservation id, a key, a group/buyer, a journal
    position), and what was ``expected`` against what was ``found``."""

    check: str
    sku: Optional[str]
    location: Optional[str]
    slot: int
    subject: str
    expected: str
    found: str


@dataclass(frozen=True, slots=True)
class AuditUnchecked:
    """A part of the data that ``check`` did not cover, and why (``reason``): the check
    did not run at all (the journal is off; a check that spans every SKU, in an audit of
    one SKU), or it ran but not over everything (rows without a journal entry)."""

    check: str
    reason: str


@dataclass(frozen=True, slots=True)
class AuditReport:
    """What :meth:`Engine.audit` checked and found. ``ok`` when it found nothing;
    ``complete`` when nothing was left unchecked (``unchecked`` lists what was, and why).
    A clean audit proves the invariants only where both hold."""

    violations: List[AuditViolation]
    truncated: bool
    rows: int
    reservations: int
    movements: int
    journal_checked: bool
    checks: List[str]
    seconds: float = field(default=0.0)
    unchecked: List[AuditUnchecked] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation found (in what was checked: see :attr:`complete`)."""
        return not self.violations

    @property
    def complete(self) -> bool:
        """Every check ran over every row it covers: nothing in :attr:`unchecked`."""
        return not self.unchecked

    def to_dict(self) -> Dict[str, Any]:
        """The report as plain JSON-ready values (``stockade audit --json``)."""
        return {
            "ok": self.ok,
            "violations": [
                {
                    "check": v.check,
                    "sku": v.sku,
                    "location": v.location,
                    "slot": v.slot,
                    "subject": v.subject,
                    "expected": v.expected,
                    "found": v.found,
                }
                for v in self.violations
            ],
            "truncated": self.truncated,
            "rows": self.rows,
            "reservations": self.reservations,
            "movements": self.movements,
            "journal_checked": self.journal_checked,
            "checks": list(self.checks),
            "complete": self.complete,
            "unchecked": [{"check": u.check, "reason": u.reason} for u in self.unchecked],
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def _from_core(cls, r: _core.AuditReport, seconds: float) -> AuditReport:
        violations = [
            AuditViolation(
                v.check,
                v.sku or None,
                v.location or None if v.sku else None,
                v.slot,
                v.subject,
                v.expected,
                v.found,
            )
            for v in r.violations
        ]
        return cls(
            violations,
            r.truncated,
            r.rows,
            r.reservations,
            r.movements,
            r.journal_checked,
            list(r.checks),
            seconds,
            [AuditUnchecked(u.check, u.reason) for u in r.unchecked],
        )
