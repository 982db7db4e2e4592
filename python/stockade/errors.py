"""The stockade exception hierarchy.

Every error the engine raises is a :class:`StockadeError`. Each carries a stable ``code``
and, where they apply, the ``sku``/``location`` or ``reservation_id`` it is about, the
PostgreSQL ``sqlstate``, the ``expected_version``/``actual_version`` of a version
conflict, and the reservation ``state`` of an invalid transition.

Bad input raises :class:`InvalidArgument` (also a ``ValueError``); input of the wrong
Python type raises :class:`InvalidType` (an ``InvalidArgument`` that is also a
``TypeError``). Neither changes anything.
"""

from __future__ import annotations

import uuid
from typing import Optional

__all__ = [
    "DatabaseError",
    "IdempotencyConflict",
    "InDoubt",
    "InvalidArgument",
    "InvalidState",
    "InvalidType",
    "InvariantViolation",
    "LockNotAvailable",
    "LockTimeout",
    "NotFound",
    "NotSupported",
    "OutOfStock",
    "Overloaded",
    "ReservationExpired",
    "StockadeError",
    "Unavailable",
    "VersionConflict",
]


class StockadeError(Exception):
    """Base class of every stockade error."""

    code: str = "stockade_error"

    def __init__(
        self,
        message: str,
        *,
        sku: Optional[str] = None,
        location: Optional[str] = None,
        reservation_id: Optional[uuid.UUID] = None,
        sqlstate: Optional[str] = None,
        expected_version: Optional[int] = None,
        actual_version: Optional[int] = None,
        state: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.sku = sku
        self.location = location
        self.reservation_id = reservation_id
        self.sqlstate = sqlstate
        self.expected_version = expected_version
        self.actual_version = actual_version
        self.state = state


class OutOfStock(StockadeError):
    """Not enough stock available for the request; nothing was reserved or sold."""

    code = "out_of_stock"


class NotFound(StockadeError):
    """No such stock row or reservation."""

    code = "not_found"


class VersionConflict(StockadeError):
    """The row changed since the version the caller expected, or optimistic retries ran out."""

    code = "version_conflict"


class ReservationExpired(StockadeError):
    """The hold passed its ``expires_at``; it can no longer be confirmed, released or extended."""

    code = "reservation_expired"


class InvalidState(StockadeError):
    """The transition is not allowed from the current state (e.g. confirm a released hold)."""

    code = "invalid_state"


class LockNotAvailable(StockadeError):
    """``nowait=True`` and the lock was held by someone else (SQLSTATE 55P03)."""

    code = "lock_not_available"


class LockTimeout(StockadeError):
    """The lock was not granted within ``lock_timeout``."""

    code = "lock_timeout"


class IdempotencyConflict(StockadeError):
    """The idempotency key was already used for a different request."""

    code = "idempotency_conflict"


class InDoubt(StockadeError):
    """The commit's outcome is unknown (connection lost during COMMIT). Retry with the
    same idempotency key to learn it; never assume success or failure."""

    code = "in_doubt"


class Overloaded(StockadeError):
    """A bounded queue, pool or retry budget is exhausted; back off and retry."""

    code = "overloaded"


class InvalidArgument(StockadeError, ValueError):
    """Bad input; nothing was changed."""

    code = "invalid_argument"


class InvalidType(InvalidArgument, TypeError):
    """Input of the wrong Python type; nothing was changed."""

    code = "invalid_argument"


class NotSupported(StockadeError, NotImplementedError):
    """The feature exists in the API but is not built for this backend or release."""

    code = "not_supported"


class InvariantViolation(StockadeError):
    """A write would have broken ``0 <= reserved <= on_hand`` and was refused (the schema's
    CHECK constraint, SQLSTATE 23514). This is a bug, never a normal outcome: report it."""

    code = "invariant_violation"


class Unavailable(StockadeError, ConnectionError):
    """The database could not be reached, or the connection broke before COMMIT was sent;
    nothing was changed. Safe to retry."""

    code = "unavailable"


class DatabaseError(StockadeError):
    """Any other error the database raised; ``sqlstate`` says which."""

    code = "database_error"


_BY_CODE: dict[str, type[StockadeError]] = {
    cls.code: cls
    for cls in (
        OutOfStock,
        NotFound,
        VersionConflict,
        ReservationExpired,
        InvalidState,
        LockNotAvailable,
        LockTimeout,
        IdempotencyConflict,
        InDoubt,
        Overloaded,
        InvalidArgument,
        NotSupported,
        InvariantViolation,
        Unavailable,
        DatabaseError,
    )
}


def _from_core(
    code: str,
    message: str,
    sku: str,
    location: str,
    reservation_id: Optional[bytes],
    sqlstate: str,
    expected_version: Optional[int],
    actual_version: Optional[int],
    state: str,
) -> StockadeError:
    """Builds the exception for an error raised by the C++ core (called from _core)."""
    cls = _BY_CODE.get(code, StockadeError)
    return cls(
        message,
        sku=sku or None,
        location=location or None,
        reservation_id=uuid.UUID(bytes=reservation_id) if reservation_id else None,
        sqlstate=sqlstate or None,
        expected_version=expected_version,
        actual_version=actual_version,
        state=state or None,
    )
