"""The stockade exception hierarchy.

Every error the engine raises is a :class:`StockadeError`. Each carries a stable ``code``
and, where they apply, the ``sku``/``location`` or ``reservation_id`` it is about, the
PostgreSQL ``sqlstate``, the ``expected_version``/``actual_version`` of a version
conflict, the reservation ``state`` of an invalid transition, and the ``pool`` (each
location's free units) of an allocation's refusal.

Bad input raises :class:`InvalidArgument` (also a ``ValueError``); input of the wrong
Python type raises :class:`InvalidType` (an ``InvalidArgument`` that is also a
``TypeError``). Neither changes anything.

HTTP: every error carries ``http_status`` (the status a service should answer with),
``retryable`` (whether sending the same request again may succeed) and ``retry_after``
(seconds to wait first, or None). ``stockade.http.problem`` turns one into an RFC 9457
problem+json response. The table:

=======================  ======  =========  ===========  =================================
error                    status  retryable  retry_after  why
=======================  ======  =========  ===========  =================================
OutOfStock               409     no         -            the stock says no
NotFound                 404     no         -
VersionConflict          412     no         -            If-Match / expected_version stale
RetriesExhausted         503     yes        1            optimistic retries ran out
ReservationExpired       410     no         -            the hold is gone for good
InvalidState             409     no         -            e.g. confirm a released hold
OverReturn               409     no         -            more back than sold (InvalidState)
LockNotAvailable         409     yes        1            NOWAIT found the lock taken
LockTimeout              503     yes        1
IdempotencyConflict      422     no         -            the key names another request
Discontinued             410     no         -            the row was soft-deleted
LeaseHeld                409     yes        1            another holder's lease is live
FencingTokenStale        409     no         -            a newer lease superseded yours
LimitExceeded            409     no         -            the buyer's purchase limit
InDoubt                  503     yes        1            retry with the same key
Overloaded               503     yes        1
InvalidArgument          400     no         -
NotSupported             501     no         -
InvariantViolation       500     no         -            a bug: report it
Unavailable              503     yes        1            no database, or a closed engine
SchemaNotMigrated        500     no         -            the service's set-up: migrate()
Misconfigured            500     no         -            DSN, role, GRANTs; used after fork
DeadlineExceeded         503     yes        1            call_timeout passed before COMMIT
FeedOverrun              410     no         -            retention passed a feed consumer
DatabaseError            500     no         -
=======================  ======  =========  ===========  =================================
"""

from __future__ import annotations

import logging
import uuid
from typing import Dict, List, Optional, Tuple

__all__ = [
    "DatabaseError",
    "DeadlineExceeded",
    "Discontinued",
    "FeedOverrun",
    "FencingTokenStale",
    "IdempotencyConflict",
    "InDoubt",
    "InvalidArgument",
    "InvalidState",
    "InvalidType",
    "InvariantViolation",
    "LeaseHeld",
    "LimitExceeded",
    "LockNotAvailable",
    "LockTimeout",
    "Misconfigured",
    "NotFound",
    "NotSupported",
    "OutOfStock",
    "OverReturn",
    "Overloaded",
    "ReservationExpired",
    "RetriesExhausted",
    "SchemaNotMigrated",
    "StockadeError",
    "Unavailable",
    "VersionConflict",
]


class StockadeError(Exception):
    """Base class of every stockade error."""

    code: str = "stockade_error"
    http_status: int = 500
    retryable: bool = False
    retry_after_default: Optional[float] = None

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
        pool: Optional[Dict[str, int]] = None,
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
        # An allocation's refusal (OutOfStock): each location of the pool, in the pool's
        # order, with the free units of the SKU named by ``sku`` there.
        self.pool = pool
        # Seconds a client should wait before it sends the request again (HTTP
        # Retry-After), when retrying can help; None otherwise.
        self.retry_after: Optional[float] = self.retry_after_default


class OutOfStock(StockadeError):
    """Not enough stock available for the request; nothing was reserved or sold."""

    code = "out_of_stock"
    http_status = 409


class NotFound(StockadeError):
    """No such stock row or reservation."""

    code = "not_found"
    http_status = 404


class VersionConflict(StockadeError):
    """The row or reservation changed since the version the caller expected
    (``expected_version``, an HTTP ``If-Match``): HTTP 412. Re-read, then decide again."""

    code = "version_conflict"
    http_status = 412


class RetriesExhausted(StockadeError):
    """The ``optimistic`` strategy lost the compare-and-set ``retries_max`` times in a row
    to concurrent writers; nothing changed. Not a stale ``If-Match``: the caller sent no
    version. HTTP 503 with Retry-After, since the row is contended right now; a retry
    later (or the ``batched`` strategy) may well succeed."""

    code = "retries_exhausted"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class ReservationExpired(StockadeError):
    """The hold passed its ``expires_at``; it can no longer be confirmed, released or extended."""

    code = "reservation_expired"
    http_status = 410


class InvalidState(StockadeError):
    """The transition is not allowed from the current state (e.g. confirm a released hold)."""

    code = "invalid_state"
    http_status = 409


class OverReturn(InvalidState):
    """A return of more units than the reservation sold and has not had back yet
    (:meth:`Engine.return_units`); nothing changed. The message says how many can still be
    returned. An :class:`InvalidState`, as it was before it had a class of its own."""

    code = "over_return"
    http_status = 409


class LockNotAvailable(StockadeError):
    """``nowait=True`` and the lock was held by someone else (SQLSTATE 55P03)."""

    code = "lock_not_available"
    http_status = 409
    retryable = True
    retry_after_default = 1.0


class LockTimeout(StockadeError):
    """The lock was not granted within ``lock_timeout``."""

    code = "lock_timeout"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class IdempotencyConflict(StockadeError):
    """The idempotency key was already used for a different request."""

    code = "idempotency_conflict"
    http_status = 422


class Discontinued(StockadeError):
    """The stock row was discontinued (soft-deleted with ``discontinue``): it is kept as a
    tombstone, and new holds, sells and restocks are refused. HTTP 410 Gone: it existed,
    unlike ``NotFound`` (404), and it was deleted rather than changed, unlike
    ``VersionConflict`` (412). ``reinstate`` undoes it."""

    code = "discontinued"
    http_status = 410


class LeaseHeld(StockadeError):
    """Another holder's lease on the stock row is live (``acquire_lease``): writes need
    its ``fencing_token`` until it is released or lapses. HTTP 409; retrying later may
    succeed."""

    code = "lease_held"
    http_status = 409
    retryable = True
    retry_after_default = 1.0


class FencingTokenStale(StockadeError):
    """The ``fencing_token`` is not the row's latest lease's: a newer lease superseded it
    (its holder paused past the TTL and someone else acquired), or, from ``renew_lease``,
    the lease lapsed. Nothing was written. HTTP 409; acquire a new lease."""

    code = "fencing_token_stale"
    http_status = 409


class LimitExceeded(StockadeError):
    """The reservation would take the buyer past the purchase limit of the SKU's group
    (``set_purchase_limit``); nothing was reserved. HTTP 409. Releases and expiries of
    the buyer's holds give units back; confirmations keep counting."""

    code = "limit_exceeded"
    http_status = 409


class InDoubt(StockadeError):
    """The commit's outcome is unknown (connection lost during COMMIT). Retry with the
    same idempotency key to learn it; never assume success or failure."""

    code = "in_doubt"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class Overloaded(StockadeError):
    """A bounded queue, pool or retry budget is exhausted; back off and retry."""

    code = "overloaded"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class InvalidArgument(StockadeError, ValueError):
    """Bad input; nothing was changed."""

    code = "invalid_argument"
    http_status = 400


class InvalidType(InvalidArgument, TypeError):
    """Input of the wrong Python type; nothing was changed."""

    code = "invalid_argument"


class NotSupported(StockadeError, NotImplementedError):
    """The feature exists in the API but is not built for this backend or release."""

    code = "not_supported"
    http_status = 501


class InvariantViolation(StockadeError):
    """A write would have broken the row's invariant (``0 <= reserved`` and ``reserved +
    damaged + quality_control <= on_hand + backorder_limit``) and was refused (the schema's
    CHECK constraint, SQLSTATE 23514). This is a bug, never a normal
    outcome: report it."""

    code = "invariant_violation"
    http_status = 500


class Unavailable(StockadeError, ConnectionError):
    """The database could not be reached, or the connection broke before COMMIT was sent,
    or the engine was closed (:meth:`Engine.close`: "the engine is closed"); nothing was
    changed. Safe to retry (on an engine that is open)."""

    code = "unavailable"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class SchemaNotMigrated(InvalidState):
    """The engine's schema is missing, or older than this version of stockade (a table or
    a column it needs is not there: SQLSTATE 42P01, 3F000 or 42703): run
    :meth:`Engine.migrate`. A fault of the service's own set-up, not of the request, so a
    500 that a retry does not fix. An :class:`InvalidState`, as it was before it had a
    class of its own."""

    code = "schema_not_migrated"
    http_status = 500


class Misconfigured(StockadeError):
    """PostgreSQL refused the service's own configuration: a wrong password, a role that
    does not exist or may not log in, no ``pg_hba.conf`` entry, a DSN naming a database
    that does not exist (SQLSTATE class 28, 3D000), or a role without a privilege stockade
    needs (42501). A 500 that a retry does not fix: an operator must act.

    A failed connection attempt carries no SQLSTATE (libpq gives none), so there the
    server's English wording decides; on a server with a non-English ``lc_messages`` such
    a refusal stays :class:`Unavailable`.

    Also an engine called in a process forked after it was made (a pre-fork server's
    worker: gunicorn ``--preload``, uWSGI, Celery's prefork pool), on either store: its
    threads and connections belong to the parent, and the service must make the engine
    after the fork."""

    code = "misconfigured"
    http_status = 500


class DeadlineExceeded(StockadeError, TimeoutError):
    """The call's deadline (``call_timeout``) passed before its COMMIT was sent: the
    server did not answer in time (a lock or a statement that ran long, a server that
    stopped answering). The engine cancelled the server's work and, if it still did not
    answer, cut the connection; nothing was changed. Safe to retry.

    Past the deadline with COMMIT already sent, the answer is :class:`InDoubt` instead (a
    COMMIT waiting for a synchronous standby has committed locally when it is cancelled).
    Also a ``TimeoutError``."""

    code = "deadline_exceeded"
    http_status = 503
    retryable = True
    retry_after_default = 1.0


class FeedOverrun(StockadeError):
    """A change feed consumer fell behind what the journal keeps: retention dropped
    changes it had not read (older than ``feed_lag_max``, or pushed out of the memory
    store's ``journal_max``). Polling again cannot give them back, so the consumer stops
    here instead of skipping them silently: drop it (:meth:`Feed.drop`) and open it again
    to go on from the oldest change the journal still holds, after reconciling from
    :meth:`Engine.stock`."""

    code = "feed_overrun"
    http_status = 410


class DatabaseError(StockadeError):
    """Any other error the database raised; ``sqlstate`` says which."""

    code = "database_error"
    http_status = 500


_BY_CODE: dict[str, type[StockadeError]] = {
    cls.code: cls
    for cls in (
        OutOfStock,
        NotFound,
        VersionConflict,
        RetriesExhausted,
        ReservationExpired,
        InvalidState,
        LockNotAvailable,
        LockTimeout,
        IdempotencyConflict,
        Discontinued,
        LeaseHeld,
        FencingTokenStale,
        LimitExceeded,
        InDoubt,
        Overloaded,
        InvalidArgument,
        NotSupported,
        InvariantViolation,
        Unavailable,
        SchemaNotMigrated,
        Misconfigured,
        DeadlineExceeded,
        FeedOverrun,
        DatabaseError,
        OverReturn,
    )
}


_LOGGER = logging.getLogger("stockade")


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
    pool: Optional[List[Tuple[str, int]]] = None,
) -> StockadeError:
    """Builds the exception for an error raised by the C++ core (called from _core).
    A broken invariant is a bug whatever the caller does with it, so it is also logged,
    at ERROR on ``stockade``: an operator sees it even when a caller swallows it."""
    cls = _BY_CODE.get(code, StockadeError)
    if cls is InvariantViolation:
        _LOGGER.error("a bug in the engine (please report it): %s", message)
    return cls(
        message,
        sku=sku or None,
        location=location or None,
        reservation_id=uuid.UUID(bytes=reservation_id) if reservation_id else None,
        sqlstate=sqlstate or None,
        expected_version=expected_version,
        actual_version=actual_version,
        state=state or None,
        pool=dict(pool) if pool else None,
    )
