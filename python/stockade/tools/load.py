"""The C++ load driver, typed: many client threads reserving against one engine.

The benchmarks, ``stockade bench`` and the notebooks measure the engine through this one
function, so that their figures are the engine's and the database's, not a Python loop's.
With ``window == 1`` each client makes blocking calls one at a time (a request handler per
client); with ``window > 1`` each keeps that many async requests in flight through the
engine's submit path (a server multiplexing many buyers on one thread).

Not to be confused with :mod:`stockade.tools.loadgen`: this module measures throughput
from C++ threads (``drive_load``, a benchmark's tool); ``loadgen`` runs a flash sale from
Python threads and checks its outcome (``flash_sale``, a test's and the demo's tool).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence, Tuple, Union

from .. import _core
from ..engine import DEFAULT_LOCATION, Engine
from ..errors import InvalidArgument, InvalidType
from ..values import (
    StrategyLike,
    TtlLike,
    check_bool,
    check_int,
    check_optional_int,
    check_str,
    duration_ms,
    duration_us,
    strategy_name,
)

__all__ = ["LoadResult", "drive_load"]

SkuLike = Union[str, Tuple[str, str]]


@dataclass(frozen=True)
class LoadResult:
    """What one run of the load driver measured. Latencies are per request, in µs."""

    requests: int
    granted: int
    refused: int
    failed: int
    seconds: float
    p50_us: float
    p90_us: float
    p99_us: float
    p999_us: float
    max_us: float
    mean_us: float

    @property
    def per_second(self) -> float:
        """Granted reservations per second."""
        return self.granted / self.seconds if self.seconds > 0 else 0.0


def drive_load(
    engine: Engine,
    skus: Sequence[SkuLike],
    *,
    clients: int,
    seconds: TtlLike,
    window: int = 1,
    qty: int = 1,
    ttl: TtlLike = timedelta(minutes=15),
    strategy: Optional[StrategyLike] = None,
    keyed: bool = False,
    confirm: bool = False,
    buyers: int = 0,
    sell: bool = False,
    fencing_token: Optional[int] = None,
    confirm_qty: int = 0,
    release_rest: bool = False,
    pool: Optional[Sequence[str]] = None,
) -> LoadResult:
    """Drives ``clients`` C++ threads for ``seconds``; each request reserves ``qty`` of a
    SKU picked uniformly from ``skus`` (names, or ``(sku, location)`` pairs), with
    ``strategy`` (default: the engine's). ``keyed`` gives every reservation a fresh random
    idempotency key; ``confirm`` (blocking clients, ``window=1``) confirms every granted
    hold at once, and counts each confirmation as a request; with ``confirm_qty`` it
    confirms only that many units of each hold and releases the rest (a partial
    shipment), each a request of its own, or with ``release_rest`` in the confirm itself
    (one request). ``buyers`` makes each
    reservation for one of that many buyers, at random (purchase limits apply); ``sell``
    sells instead of reserving, with ``fencing_token`` if given (and with ``keyed``, a
    fresh key on every sell). ``pool`` (blocking clients) allocates each request's units of
    the picked SKU from those locations (``Engine.allocate``, priority) instead."""
    if not isinstance(engine, Engine):
        raise InvalidType(f"engine must be a stockade.Engine, not {type(engine).__name__}")
    if check_int("buyers", buyers) < 0:
        raise InvalidArgument(f"buyers must not be negative, got {buyers}")
    keys = [(s, DEFAULT_LOCATION) if isinstance(s, str) else (str(s[0]), str(s[1])) for s in skus]
    if not keys:
        raise InvalidArgument("drive_load needs at least one sku")
    out = _core.drive_load(
        engine._native(),
        keys,
        check_int("clients", clients),
        check_int("window", window),
        duration_ms("seconds", seconds),
        check_int("qty", qty),
        duration_us("ttl", ttl),
        strategy_name(strategy),
        check_bool("keyed", keyed),
        check_bool("confirm", confirm),
        check_int("buyers", buyers),
        check_bool("sell", sell),
        check_optional_int("fencing_token", fencing_token),
        check_int("confirm_qty", confirm_qty),
        check_bool("release_rest", release_rest),
        [] if pool is None else [check_str("location", p) for p in pool],
    )
    return LoadResult(
        requests=int(out["requests"]),
        granted=int(out["granted"]),
        refused=int(out["refused"]),
        failed=int(out["failed"]),
        seconds=float(out["seconds"]),
        p50_us=float(out["p50_us"]),
        p90_us=float(out["p90_us"]),
        p99_us=float(out["p99_us"]),
        p999_us=float(out["p999_us"]),
        max_us=float(out["max_us"]),
        mean_us=float(out["mean_us"]),
    )
