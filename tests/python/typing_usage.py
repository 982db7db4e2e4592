"""A user's program, type-checked with mypy --strict by test_typing.py (never run).

It exercises the public API the way docs/api.md shows it, so that the stubs and
annotations are checked against real use, and that misuse is reported.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import List, Optional

import stockade
from stockade import Order, Reservation, ReservationState, StockLevel, Strategy


def tour(eng: stockade.Engine) -> None:
    eng.migrate()
    lvl: StockLevel = eng.restock("sku-1", 100)
    available: int = lvl.available
    etag: str = lvl.etag
    r: Reservation = eng.reserve("sku-1", 2, ttl=timedelta(minutes=10), idempotency_key="order-77")
    rid: uuid.UUID = r.id
    state: ReservationState = r.state
    expires: datetime = r.expires_at
    key: Optional[str] = r.idempotency_key
    eng.confirm(r.id, expected_version=r.version)
    eng.release(str(rid))
    eng.extend(r.id, ttl=timedelta(minutes=5))
    order: Order = eng.reserve_order({"sku-1": 1, ("sku-2", "lisbon"): 3})
    first: Reservation = order[0]
    lines: List[Reservation] = list(order)
    assert len(lines) == len(order)
    eng.confirm_order(order, qty={first: 1, ("sku-2", "lisbon"): 1}, release_rest=True)
    eng.release_order(order)
    eng.extend_order(str(order.id), ttl=timedelta(minutes=5))
    again: Order = eng.order(idempotency_key="k")
    lined: Reservation = eng.reserve("sku-1", 1, ref="line-1", metadata={"gift": True})
    found: List[Reservation] = eng.reservations(ref="line-1", state="held", limit=10)
    assert lined.ref == "line-1" and found
    assert again.id is None or isinstance(again.id, uuid.UUID)
    eng.sell("sku-1", 1, strategy=Strategy.PESSIMISTIC, nowait=True)
    eng.sell("sku-1", 1, strategy="optimistic")
    expired: int = eng.expire_due(limit=1000)
    eng.set_on_hand("sku-1", 50, expected_version=lvl.version, location="default")
    stats = eng.stats()
    advice = stockade.claim_test(fits_in_transaction=True, conflict_rate=0.3, retry="unsafe")
    chosen: Strategy = advice.strategy
    print(available, etag, state, expires, key, order, expired, stats, chosen)


async def tour_async(eng: stockade.Engine) -> Reservation:
    lvl: StockLevel = await eng.sell_async("sku-1", 1, strategy="atomic")
    print(lvl)
    return await eng.reserve_async("sku-1", 1, ttl=timedelta(seconds=30), location="default")


def main() -> None:
    clock = stockade.ManualClock()
    clock.advance(timedelta(seconds=5))
    with stockade.Engine.memory(clock=clock, strategy="atomic") as eng:
        tour(eng)
    try:
        stockade.Engine.postgres("postgresql://localhost/db", pool_size=8, strategy="auto")
    except stockade.NotSupported as exc:
        code: str = exc.code
        print(code)
