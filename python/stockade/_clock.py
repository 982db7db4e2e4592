"""The clock a memory store can be given for tests: :class:`ManualClock`."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Optional

from . import _core
from .errors import InvalidType
from .values import TtlLike, duration_us

__all__ = ["ManualClock"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_us(when: datetime) -> int:
    """Microseconds since the Unix epoch of a timezone-aware datetime, exactly (a float's
    ``timestamp() * 1e6`` can be a microsecond off)."""
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class ManualClock:
    """A clock for the memory store that moves only when told to.

    Pass it to :meth:`Engine.memory` to test TTLs and expiry without sleeping.
    """

    def __init__(self, start: Optional[datetime] = None) -> None:
        start = start or datetime.now(timezone.utc)
        self._core = _core.ManualClock(self._us(start))

    @staticmethod
    def _us(when: datetime) -> int:
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidType("the clock needs a timezone-aware datetime")
        return epoch_us(when)

    def now(self) -> datetime:
        """The clock's current time (UTC)."""
        return _EPOCH + timedelta(microseconds=self._core.now_us())

    def set(self, when: datetime) -> None:
        """Sets the clock to ``when``."""
        self._core.set_us(self._us(when))

    def advance(self, delta: TtlLike) -> datetime:
        """Moves the clock by ``delta`` (timedelta or seconds); returns the new time."""
        self._core.advance_us(duration_us("delta", delta))
        return self.now()
