"""stockade: inventory reservations that never oversell.

Every classic answer to the lost update, named and measured: conditional atomic updates,
pessimistic row locks, advisory locks and optimistic versions, over a C++17 core.

    >>> import stockade
    >>> eng = stockade.Engine.memory()
    >>> eng.restock("sku-1", 100).available
    100
"""

from __future__ import annotations

try:
    from . import _core
except ImportError as exc:  # pragma: no cover - only without a built extension
    raise ImportError(
        "stockade's compiled core (stockade._core) is missing or does not load: "
        f"{exc}. Build and install it from the source tree with `make demo` (or "
        "`pip install .`), which compiles the C++ engine with CMake."
    ) from exc

from . import limits as _limits
from .claim import ClaimAdvice, claim_test
from .engine import Engine, ManualClock
from .errors import (
    DatabaseError,
    DeadlineExceeded,
    Discontinued,
    FeedOverrun,
    FencingTokenStale,
    IdempotencyConflict,
    InDoubt,
    InvalidArgument,
    InvalidState,
    InvalidType,
    InvariantViolation,
    LeaseHeld,
    LimitExceeded,
    LockNotAvailable,
    LockTimeout,
    Misconfigured,
    NotFound,
    NotSupported,
    OutOfStock,
    Overloaded,
    ReservationExpired,
    RetriesExhausted,
    SchemaNotMigrated,
    StockadeError,
    Unavailable,
    VersionConflict,
)
from .journal import ALERTS, AuditReport, AuditViolation, Feed, Movement, StockChange
from .limits import *  # noqa: F403 - the input limits, each named in stockade.limits
from .stats import EngineStats, Metrics, RowCounts
from .values import (
    Lease,
    Reservation,
    ReservationState,
    StockLevel,
    Strategy,
    StrategyLike,
    StrategyName,
    version_from_etag,
)


def _version() -> str:
    # One source: pyproject.toml, read from the installed metadata; the core was built
    # from the same file, and a test checks that the two agree.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stockade")
    except PackageNotFoundError:  # pragma: no cover - imported from a source tree
        return str(_core.__version__)


__version__ = _version()

__all__ = [  # and stockade.limits' constants, added below
    "ALERTS",
    "AuditReport",
    "AuditViolation",
    "ClaimAdvice",
    "DatabaseError",
    "DeadlineExceeded",
    "Discontinued",
    "Engine",
    "EngineStats",
    "Feed",
    "FeedOverrun",
    "FencingTokenStale",
    "IdempotencyConflict",
    "InDoubt",
    "InvalidArgument",
    "InvalidState",
    "InvalidType",
    "InvariantViolation",
    "Lease",
    "LeaseHeld",
    "LimitExceeded",
    "LockNotAvailable",
    "LockTimeout",
    "ManualClock",
    "Metrics",
    "Misconfigured",
    "Movement",
    "NotFound",
    "NotSupported",
    "OutOfStock",
    "Overloaded",
    "Reservation",
    "ReservationExpired",
    "ReservationState",
    "RetriesExhausted",
    "RowCounts",
    "SchemaNotMigrated",
    "StockChange",
    "StockLevel",
    "StockadeError",
    "Strategy",
    "StrategyLike",
    "StrategyName",
    "Unavailable",
    "VersionConflict",
    "__version__",
    "claim_test",
    "version_from_etag",
]
__all__ += _limits.__all__
