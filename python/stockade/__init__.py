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

from . import errors as _errors
from . import limits as _limits
from .claim import ClaimAdvice, claim_test
from .engine import Engine, ManualClock
from .errors import *  # noqa: F403 - the error classes, each named in stockade.errors
from .journal import (
    ALERTS,
    AuditReport,
    AuditUnchecked,
    AuditViolation,
    Feed,
    Movement,
    StockChange,
)
from .limits import *  # noqa: F403 - the input limits, each named in stockade.limits
from .stats import EngineStats, Metrics, RowCounts
from .values import (
    Lease,
    Order,
    Reservation,
    ReservationState,
    StockLevel,
    Strategy,
    StrategyLike,
    StrategyName,
    Transfer,
    TransferState,
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

__all__ = [  # and stockade.errors' classes and stockade.limits' constants, added below
    "ALERTS",
    "AuditReport",
    "AuditUnchecked",
    "AuditViolation",
    "ClaimAdvice",
    "Engine",
    "EngineStats",
    "Feed",
    "Lease",
    "ManualClock",
    "Metrics",
    "Movement",
    "Order",
    "Reservation",
    "ReservationState",
    "RowCounts",
    "StockChange",
    "StockLevel",
    "Strategy",
    "StrategyLike",
    "StrategyName",
    "Transfer",
    "TransferState",
    "__version__",
    "claim_test",
    "version_from_etag",
]
__all__ += _errors.__all__
__all__ += _limits.__all__
