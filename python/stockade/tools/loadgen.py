"""Flash-sale load: many buyers, few units, one hot SKU.

``flash_sale`` drives an engine with ``clients`` threads that share ``buyers`` purchase
attempts, one unit each, and reports what happened: granted, refused, failed, oversold,
throughput, latency, retries and lock waits. It is the core of ``stockade demo`` and of
load scenarios in pytest. The strategy ``"naive-unsafe"`` runs the deliberately broken
read-modify-write canary instead of a real strategy, to show what an oversell looks like.

Not to be confused with :mod:`stockade.tools.load`, the C++ load driver that benchmarks
use for throughput (``drive_load``); this module checks outcomes from Python threads.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, Final, List, Literal, Optional, Union

from ..engine import Engine
from ..errors import NotFound, OutOfStock, RetriesExhausted, StockadeError
from ..values import Strategy, StrategyLike, check_int, strategy_name
from .hooks import naive_reserve

__all__ = ["NAIVE", "FlashSaleReport", "LoadInvariantError", "flash_sale"]

NAIVE: Final = "naive-unsafe"
RETRIES_MAX = 5  # a buyer retries after RetriesExhausted at most this often


@dataclass
class FlashSaleReport:
    strategy: str
    buyers: int
    units: int
    granted: int = 0
    refused: int = 0
    failed: int = 0
    retried: int = 0  # optimistic retries, by the engine and by buyers after RetriesExhausted
    lock_waits: int = 0  # lock acquisitions that found the lock taken (engine counters)
    elapsed_s: float = 0.0
    reserved_after: int = 0
    sku: str = ""
    latencies_us: List[float] = field(default_factory=list, repr=False)
    reservation_ids: List[uuid.UUID] = field(default_factory=list, repr=False)

    @property
    def oversold(self) -> int:
        """Grants beyond the units that existed: must be 0 for every real strategy."""
        return max(0, self.granted - self.units)

    @property
    def throughput(self) -> float:
        """Requests answered per second (granted or refused)."""
        return (
            (self.granted + self.refused + self.failed) / self.elapsed_s if self.elapsed_s else 0.0
        )

    def violations(self, engine: Engine) -> List[str]:
        """What the engine's committed state says against this report; empty when the
        sale kept every invariant: no oversell, a ledger that matches the grants (the row
        holds exactly the units granted, on_hand untouched), and every acknowledged
        reservation present, held, for one unit of this SKU."""
        found: List[str] = []
        if self.oversold:
            found.append(f"oversold: {self.granted} granted of {self.units} units")
        level = engine.stock(self.sku)
        if level.reserved != len(self.reservation_ids) or level.on_hand != self.units:
            found.append(
                f"ledger: the row holds {level.reserved} reserved of {level.on_hand} "
                f"on hand, but {len(self.reservation_ids)} of {self.units} were granted"
            )
        if len(set(self.reservation_ids)) != len(self.reservation_ids):
            found.append("an acknowledged reservation id was handed out twice")
        for rid in self.reservation_ids:
            try:
                r = engine.reservation(rid)
            except NotFound:
                found.append(f"acknowledged reservation {rid} is missing")
                continue
            if (r.sku, r.qty, r.state.value) != (self.sku, 1, "held"):
                found.append(
                    f"acknowledged reservation {rid} is {r.state.value}, {r.qty} of {r.sku}"
                )
        return found

    def percentile_us(self, q: float) -> float:
        if not self.latencies_us:
            return 0.0
        ordered = sorted(self.latencies_us)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LoadInvariantError(AssertionError):
    """A load scenario broke an invariant; ``violations`` lists what was found."""

    def __init__(self, report: FlashSaleReport, violations: List[str]) -> None:
        super().__init__(f"flash sale with {report.strategy}: " + "; ".join(violations))
        self.report = report
        self.violations = violations


def flash_sale(
    engine: Engine,
    *,
    buyers: int,
    units: int,
    strategy: Union[StrategyLike, Literal["naive-unsafe"]] = Strategy.AUTO,
    clients: int = 32,
    sku: Optional[str] = None,
    check: bool = True,
) -> FlashSaleReport:
    """Runs a flash sale: ``clients`` threads share ``buyers`` purchase attempts of one
    unit each, against ``units`` units of a fresh SKU (or ``sku``), with ``strategy``
    (or ``"naive-unsafe"``, the canary). Returns the report (granted, refused, failed,
    latencies, throughput, retries, lock waits, the reservation ids granted).

    With ``check`` (the default) it then reads the engine back and raises
    :class:`LoadInvariantError` if anything is off: more grants than units, a row whose
    reserved or on_hand disagree with the grants, or an acknowledged reservation that is
    missing or not held."""
    name = NAIVE if strategy == NAIVE else (strategy_name(strategy) or Strategy.AUTO.value)
    report = _run_sale(
        engine,
        check_int("buyers", buyers),
        check_int("units", units),
        name,
        check_int("clients", clients),
        sku,
    )
    if check:
        found = report.violations(engine)
        if found:
            raise LoadInvariantError(report, found)
    return report


def _run_sale(
    engine: Engine,
    buyers: int,
    units: int,
    strategy: str,
    clients: int,
    sku: Optional[str],
) -> FlashSaleReport:
    """Restocks a fresh SKU with ``units`` and lets ``buyers`` race for them."""
    if not (1 <= clients <= 1024 and buyers >= 1 and units >= 1):
        raise ValueError("need 1 <= clients <= 1024, buyers >= 1 and units >= 1")
    sku = sku or f"flash-{strategy}-{time.monotonic_ns()}"
    engine.restock(sku, units)
    report = FlashSaleReport(strategy, buyers, units, sku=sku)
    before = _counters(engine, strategy)
    lock = threading.Lock()
    next_buyer = iter(range(buyers))
    barrier = threading.Barrier(clients + 1)

    def buy_once(ids: List[uuid.UUID]) -> str:
        for _ in range(RETRIES_MAX + 1):
            try:
                if strategy == NAIVE:
                    ids.append(naive_reserve(engine, sku, 1).id)
                else:
                    ids.append(engine.reserve(sku, 1, strategy=Strategy(strategy)).id)
                return "granted"
            except OutOfStock:
                return "refused"
            except RetriesExhausted:
                with lock:
                    report.retried += 1
        return "failed"

    def client() -> None:
        local: List[float] = []
        ids: List[uuid.UUID] = []
        counts = {"granted": 0, "refused": 0, "failed": 0}
        barrier.wait()
        while True:
            with lock:
                if next(next_buyer, None) is None:
                    break
            start = time.perf_counter()
            try:
                outcome = buy_once(ids)
            except StockadeError:
                outcome = "failed"
            local.append((time.perf_counter() - start) * 1e6)
            counts[outcome] += 1
        with lock:
            report.latencies_us.extend(local)
            report.reservation_ids.extend(ids)
            report.granted += counts["granted"]
            report.refused += counts["refused"]
            report.failed += counts["failed"]

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    report.elapsed_s = time.perf_counter() - start
    report.reserved_after = engine.stock(sku).reserved
    after = _counters(engine, strategy)
    report.retried += after["retries"] - before["retries"]
    report.lock_waits = after["lock_waits"] - before["lock_waits"]
    return report


def _counters(engine: Engine, strategy: str) -> Dict[str, int]:
    """The engine's counters of one strategy (zeros for the canary, which has none)."""
    counters = engine.stats(sku_limit=0)["strategies"].get(strategy)
    if counters is None:
        return {"retries": 0, "lock_waits": 0}
    return {"retries": counters["retries"], "lock_waits": counters["lock_waits"]}
