"""References: ``ref=`` and ``metadata=`` on reserve and reserve_order (kept with each
reservation), ``ref=`` on sell (on its journal entry), and ``reservations()`` to find them
by ref, order or buyer. Both stores and the Citus layout (``engine``)."""

from __future__ import annotations

import uuid

import pytest

import stockade
from stockade import ReservationState


def test_a_reservation_keeps_its_ref_and_metadata(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    meta = {"line": 3, "gift": True, "note": "wrap it", "tags": ["x", None, 1.5]}
    r = engine.reserve("a", 2, ref="order-9/line-3", metadata=meta)
    assert (r.ref, r.metadata) == ("order-9/line-3", meta)
    again = engine.reservation(r.id)
    assert (again.ref, again.metadata) == ("order-9/line-3", meta)
    assert hash(again) == hash(again)  # hashable, metadata aside
    plain = engine.reserve("a", 1)
    assert (plain.ref, plain.metadata) == (None, None)
    confirmed = engine.confirm(r.id)
    assert (confirmed.ref, confirmed.metadata) == ("order-9/line-3", meta)


def test_reservations_finds_by_ref_order_and_buyer(engine: stockade.Engine) -> None:
    for sku in "abc":
        engine.restock(sku, 50)
    first = engine.reserve("a", 1, ref="cart-1", buyer="ann")
    order = engine.reserve_order({"b": 2, "c": 1}, ref="cart-1", metadata={"channel": "web"})
    other = engine.reserve("a", 1, ref="cart-2", buyer="ann")
    engine.reserve("c", 1, buyer="bob")
    # In id order: UUIDv7s, made in that order to the millisecond.
    found = [r.id for r in engine.reservations(ref="cart-1")]
    assert found == sorted([first.id, *(r.id for r in order)])
    assert all(r.metadata == {"channel": "web"} for r in order)
    assert {r.id for r in engine.reservations(order=order)} == {r.id for r in order}
    assert [r.id for r in engine.reservations(order=order.id, sku="c")] == [order.line("c").id]
    assert [r.id for r in engine.reservations(buyer="ann")] == sorted([first.id, other.id])
    assert engine.reservations(ref="cart-1", sku="a", location="default") == [
        engine.reservation(first.id)
    ]
    engine.confirm(first.id)
    held = engine.reservations(buyer="ann", state=ReservationState.HELD)
    assert [r.id for r in held] == [other.id]
    assert [r.id for r in engine.reservations(buyer="ann", state="confirmed")] == [first.id]
    assert engine.reservations(ref="no-such-ref") == []
    assert engine.reservations(order=uuid.uuid4()) == []


def test_reservations_pages_in_the_order_they_were_made(engine: stockade.Engine) -> None:
    engine.restock("a", 100)
    made = [engine.reserve("a", 1, ref="bulk").id for _ in range(7)]
    pages, after = [], None
    while True:
        page = engine.reservations(ref="bulk", limit=3, after=after)
        if not page:
            break
        pages.append([r.id for r in page])
        after = page[-1].id
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [rid for page in pages for rid in page] == sorted(made)


def test_bad_references_are_refused_before_anything_changes(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    with pytest.raises(stockade.InvalidArgument, match="REF_BYTES_MAX"):
        engine.reserve("a", 1, ref="r" * (stockade.REF_BYTES_MAX + 1))
    with pytest.raises(stockade.InvalidArgument, match="must not be empty"):
        engine.reserve("a", 1, ref="")
    with pytest.raises(stockade.InvalidType):
        engine.reserve("a", 1, metadata=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(stockade.InvalidType):
        engine.reserve("a", 1, metadata={"when": object()})
    with pytest.raises(stockade.InvalidArgument, match="not JSON"):
        engine.reserve("a", 1, metadata={"x": float("nan")})
    with pytest.raises(stockade.InvalidArgument, match="METADATA_BYTES_MAX"):
        engine.reserve("a", 1, metadata={"x": "y" * stockade.METADATA_BYTES_MAX})
    with pytest.raises(stockade.InvalidArgument, match="one JSON object"):
        engine.reserve("a", 1, metadata={"nul": "a\x00b"})  # jsonb refuses \u0000
    with pytest.raises(stockade.InvalidType, match="keys must be str"):
        engine.reserve("a", 1, metadata={"nested": {1: "x"}})  # type: ignore[dict-item]
    with pytest.raises(stockade.InvalidArgument, match="lone surrogates"):
        engine.reserve("a", 1, metadata={"s": "\ud800"})
    with pytest.raises(stockade.InvalidArgument, match="ref, order or buyer"):
        engine.reservations(sku="a")
    for limit in (0, stockade.RESERVATIONS_LIMIT_MAX + 1):
        with pytest.raises(stockade.InvalidArgument, match="limit"):
            engine.reservations(ref="x", limit=limit)
    with pytest.raises(stockade.InvalidArgument, match="state"):
        engine.reservations(ref="x", state="lost")
    with pytest.raises(stockade.InvalidType):
        engine.reservations(ref="x", state=3)  # type: ignore[arg-type]
    assert engine.stock("a").reserved == 0


def test_a_keyed_reserve_with_references_replays_and_conflicts(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    first = engine.reserve("a", 1, idempotency_key="k-ref", ref="l-1", metadata={"n": 1})
    assert engine.reserve("a", 1, idempotency_key="k-ref", ref="l-1", metadata={"n": 1}) == first
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("a", 1, idempotency_key="k-ref", ref="l-2", metadata={"n": 1})
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("a", 1, idempotency_key="k-ref", ref="l-1", metadata={"n": 2})
    # A key made without references replays as before.
    plain = engine.reserve("a", 1, idempotency_key="k-plain")
    assert engine.reserve("a", 1, idempotency_key="k-plain") == plain
    assert engine.stock("a").reserved == 2


def test_a_sales_ref_is_on_its_journal_entry(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    engine.sell("a", 2, ref="invoice-42")
    engine.sell("a", 1)
    sells = [m for m in engine.movements("a") if m.on_hand_delta < 0]
    assert [m.ref for m in sells] == ["invoice-42", None]
    with pytest.raises(TypeError):
        engine.sell("a", 1, metadata={"x": 1})  # type: ignore[call-arg]


def test_the_batcher_carries_references(batched_engine: stockade.Engine) -> None:
    # A reserve with a ref or metadata batches (a sell with a ref does not: its ref goes on
    # its own journal entry).
    eng = batched_engine
    eng.restock("a", 100)
    before = eng.stats()["batcher"]["requests"]
    r = eng.reserve("a", 1, ref="hot-line", metadata={"hot": True})
    assert eng.stats()["batcher"]["requests"] == before + 1
    assert (r.ref, r.metadata) == ("hot-line", {"hot": True})
    assert eng.reservations(ref="hot-line") == [r]
    assert eng.reservation(r.id).metadata == {"hot": True}
    # with a key: the replay is the same reservation; other references are another request
    k = eng.reserve("a", 2, ref="keyed", metadata={"n": 1}, idempotency_key="ref-key")
    assert eng.reserve("a", 2, ref="keyed", metadata={"n": 1}, idempotency_key="ref-key") == k
    with pytest.raises(stockade.IdempotencyConflict):
        eng.reserve("a", 2, ref="other", metadata={"n": 1}, idempotency_key="ref-key")
    batched = eng.stats()["batcher"]["requests"]
    eng.sell("a", 1, ref="invoice-1")
    assert eng.stats()["batcher"]["requests"] == batched  # the sell ran per request
    assert [m.ref for m in eng.movements("a") if m.on_hand_delta < 0] == ["invoice-1"]
    assert eng.audit().ok


def test_batched_reserves_racing_keep_each_ones_references(
    batched_engine: stockade.Engine,
) -> None:
    # Many in one batch, some with references, some keyed, some with a buyer: each
    # reservation keeps its own, whichever statement wrote it.
    from stockade.testing import race

    eng = batched_engine
    eng.restock("a", 1000)
    eng.set_purchase_limit("g", per_buyer=100, skus=["a"])

    def one(i: int) -> stockade.Reservation:
        ref = f"line-{i}" if i % 3 else None
        meta = {"i": i} if i % 2 else None
        key = f"k-{uuid.uuid4()}" if i % 4 == 0 else None
        buyer = "bob" if i % 5 == 0 else None
        return eng.reserve("a", 1, ref=ref, metadata=meta, idempotency_key=key, buyer=buyer)

    out = race(32, one, timeout=60)
    assert not any(out.errors), out.errors
    for i, r in enumerate(out.results):
        assert r.ref == (f"line-{i}" if i % 3 else None)
        assert r.metadata == ({"i": i} if i % 2 else None)
        assert (eng.reservation(r.id).ref, eng.reservation(r.id).metadata) == (r.ref, r.metadata)
    assert eng.stock("a").reserved == 32
    assert eng.audit().ok


def test_the_async_twins_take_references(engine: stockade.Engine) -> None:
    import asyncio

    engine.restock("a", 10)

    async def go() -> stockade.Reservation:
        await engine.sell_async("a", 1, ref="s-1")
        return await engine.reserve_async("a", 1, ref="r-1", metadata={"k": "v"})

    r = asyncio.run(go())
    assert (r.ref, r.metadata) == ("r-1", {"k": "v"})
    assert asyncio.run(engine.reservations_async(ref="r-1")) == [r]
