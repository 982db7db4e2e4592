"""An order as one handle: reserve_order returns an Order; confirm_order, release_order and
extend_order step every line in one transaction, whole or in parts; order() reads it back.

Both stores and the Citus layout (``engine``): the lines, the parts, the rule for an
expired line (a confirm of the whole order is all or nothing), purchase limits, the
journal, and races of order steps with each other and with steps of single lines.
"""

from __future__ import annotations

import uuid
from typing import List

import pytest

import stockade
from stockade import Order, ReservationState
from stockade.testing import race
from support import Wait


def stocked(eng: stockade.Engine) -> Order:
    eng.restock("a", 10)
    eng.restock("b", 10)
    eng.restock("c", 10)
    return eng.reserve_order({"b": 2, "a": 3, "c": 1}, ttl=600, idempotency_key=f"o-{uuid.uuid4()}")


def audit_clean(eng: stockade.Engine) -> None:
    report = eng.audit()
    assert report.ok, report.violations[:3]


def test_reserve_order_returns_one_handle_with_its_lines(engine: stockade.Engine) -> None:
    order = stocked(engine)
    assert isinstance(order, Order) and isinstance(order.id, uuid.UUID)
    assert [r.sku for r in order] == ["b", "a", "c"]  # the caller's order
    assert len(order) == 3 and order[1].qty == 3 and order.held == 6 and order.live
    assert {r.order_id for r in order} == {order.id}
    assert order.line("a").qty == 3
    read = engine.order(order.id)
    assert [r.sku for r in read] == ["a", "b", "c"]  # sorted by (sku, location)
    assert read.id == order.id and read.idempotency_key == order.idempotency_key
    assert engine.order(str(order.id)) == read
    assert engine.order(idempotency_key=order.idempotency_key) == read
    assert engine.reservation(order[0].id).order_id == order.id
    assert engine.reserve("a", 1).order_id is None  # a reserve is no order's line
    with pytest.raises(stockade.NotFound):
        engine.order(uuid.uuid4())
    with pytest.raises(stockade.NotFound):
        engine.order(idempotency_key="no-such-key")
    with pytest.raises(stockade.InvalidArgument):
        engine.order()
    with pytest.raises(stockade.InvalidType):
        engine.order(42)  # type: ignore[arg-type]


def test_a_replayed_reserve_order_is_the_same_order(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    first = engine.reserve_order({"a": 2}, idempotency_key="same")
    again = engine.reserve_order({"a": 2}, idempotency_key="same")
    assert again.id == first.id and [r.id for r in again] == [r.id for r in first]


def test_confirm_order_sells_every_line_in_one_step(engine: stockade.Engine) -> None:
    order = stocked(engine)
    done = engine.confirm_order(order)
    assert [(r.sku, r.state, r.confirmed) for r in done] == [
        ("a", ReservationState.CONFIRMED, 3),
        ("b", ReservationState.CONFIRMED, 2),
        ("c", ReservationState.CONFIRMED, 1),
    ]
    assert all(r.version == 2 for r in done) and not done.live
    assert [(engine.stock(s).on_hand, engine.stock(s).reserved) for s in "abc"] == [
        (7, 0),
        (8, 0),
        (9, 0),
    ]
    with pytest.raises(stockade.InvalidState, match="no line of order"):
        engine.confirm_order(order)
    audit_clean(engine)


def test_parts_name_lines_every_way_and_release_rest_ends_the_order(
    engine: stockade.Engine,
) -> None:
    order = stocked(engine)
    part = engine.confirm_order(order, qty={"a": 1, order.line("b"): 1})
    assert [(r.held, r.confirmed) for r in part] == [(2, 1), (1, 1), (1, 0)]
    assert part.live and all(r.state is ReservationState.HELD for r in part)
    part = engine.release_order(order.id, qty={("a", "default"): 1, str(order.line("c").id): 1})
    assert [(r.held, r.released) for r in part] == [(1, 1), (1, 0), (0, 1)]
    assert part.line("c").state is ReservationState.RELEASED
    # Ship one more "a", cancel everything else: the lines not named are released too.
    done = engine.confirm_order(order, qty={"a": 1}, release_rest=True)
    assert [(r.sku, r.state, r.confirmed, r.released) for r in done] == [
        ("a", ReservationState.CONFIRMED, 2, 1),
        ("b", ReservationState.CONFIRMED, 1, 1),
        ("c", ReservationState.RELEASED, 0, 1),
    ]
    assert [engine.stock(s).available for s in "abc"] == [8, 9, 10]
    audit_clean(engine)


def test_a_refused_part_changes_nothing(engine: stockade.Engine) -> None:
    order = stocked(engine)
    before = engine.order(order)
    with pytest.raises(stockade.InvalidState, match="holds 2 units; cannot confirm 5"):
        engine.confirm_order(order, qty={"a": 1, "b": 5})
    with pytest.raises(stockade.InvalidArgument, match="is not a line of order"):
        engine.confirm_order(order, qty={uuid.uuid4(): 1})
    with pytest.raises(stockade.InvalidArgument, match="no line of sku"):
        engine.release_order(order, qty={"zz": 1})
    with pytest.raises(stockade.InvalidArgument):
        engine.confirm_order(order, qty={"a": 0})
    with pytest.raises(stockade.InvalidArgument, match="names no line"):
        engine.confirm_order(order, qty={}, release_rest=True)  # not "the whole order"
    with pytest.raises(stockade.InvalidType):
        engine.confirm_order(order, qty=[("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(stockade.InvalidType):
        engine.confirm_order(order, qty={3.5: 1})  # type: ignore[dict-item]
    other = engine.reserve("a", 1)
    with pytest.raises(stockade.InvalidArgument, match="is not a line of order"):
        engine.release_order(order, qty={other: 1})
    assert engine.order(order) == before
    assert engine.stock("a").reserved == 4
    audit_clean(engine)


def test_release_order_gives_every_unit_back_and_the_buyers_count_too(
    engine: stockade.Engine,
) -> None:
    engine.restock("a", 10)
    engine.restock("b", 10)
    engine.set_purchase_limit("g", 4, skus=["a", "b"])
    order = engine.reserve_order({"a": 2, "b": 2}, buyer="ann")
    assert engine.buyer_held("g", "ann") == 4
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("a", 1, buyer="ann")
    engine.confirm_order(order, qty={"a": 1})
    done = engine.release_order(order)
    assert [(r.confirmed, r.released, r.state) for r in done] == [
        (1, 1, ReservationState.CONFIRMED),
        (0, 2, ReservationState.RELEASED),
    ]
    assert engine.buyer_held("g", "ann") == 1  # the confirmed unit still counts
    assert engine.reserve("a", 3, buyer="ann").qty == 3
    audit_clean(engine)


def test_extend_order_moves_every_live_line(engine: stockade.Engine) -> None:
    order = stocked(engine)
    engine.confirm(order.line("c").id)
    later = engine.extend_order(order, ttl=3600)
    assert engine.order(order) == later
    old = {r.sku: r.expires_at for r in order}
    assert later.line("a").expires_at > old["a"] and later.line("b").expires_at > old["b"]
    assert later.line("c").expires_at == old["c"]  # it had ended: left alone
    with pytest.raises(TypeError):
        engine.extend_order(order, ttl=60, qty={"a": 1})  # type: ignore[call-arg]
    audit_clean(engine)


def lapsed_in_part(engine: stockade.Engine, wait: Wait) -> Order:
    """An order of 2 "a" and 3 "b" whose "a" line has lapsed (its "b" line lives)."""
    for sku in "ab":
        engine.restock(sku, 10)
    order = engine.reserve_order({"a": 2, "b": 3}, ttl=600)
    engine.extend(order.line("a").id, ttl=1)
    wait(1.5)
    return order


def test_a_confirm_of_an_order_with_an_expired_line_sells_nothing(
    engine: stockade.Engine, wait: Wait
) -> None:
    order = lapsed_in_part(engine, wait)
    with pytest.raises(stockade.ReservationExpired, match="has expired, so confirm_order"):
        engine.confirm_order(order)
    now = engine.order(order)
    assert now.line("a").state is ReservationState.EXPIRED  # the expiry stands
    assert now.line("b").held == 3 and now.line("b").confirmed == 0  # nothing sold
    assert engine.stock("a").reserved == 0 and engine.stock("b").on_hand == 10
    with pytest.raises(stockade.ReservationExpired):  # again: the same answer
        engine.confirm_order(order)
    with pytest.raises(stockade.ReservationExpired):
        engine.extend_order(order, ttl=60)
    # Naming the live line goes on with it.
    done = engine.confirm_order(order, qty={"b": 3})
    assert done.line("b").state is ReservationState.CONFIRMED
    assert engine.stock("b").on_hand == 7
    audit_clean(engine)


def test_a_release_of_an_order_with_a_lapsed_line_frees_the_rest(
    engine: stockade.Engine, wait: Wait
) -> None:
    order = lapsed_in_part(engine, wait)
    done = engine.release_order(order)
    assert done.line("a").state is ReservationState.EXPIRED
    assert done.line("b").state is ReservationState.RELEASED
    assert [engine.stock(s).available for s in "ab"] == [10, 10]
    audit_clean(engine)


def test_the_journal_records_each_line_with_its_own_cause(engine: stockade.Engine) -> None:
    order = stocked(engine)
    engine.confirm_order(order, qty={"a": 1, "b": 2})
    engine.release_order(order)
    moves = [m for m in engine.movements() if m.cause in ("confirm", "release")]
    seen = {(m.sku, m.cause, m.ref) for m in moves}
    line = {r.sku: str(r.id) for r in order}
    assert ("a", "confirm", line["a"]) in seen and ("b", "confirm", line["b"]) in seen
    assert ("a", "release", line["a"]) in seen and ("c", "release", line["c"]) in seen
    assert ("b", "release", line["b"]) not in seen  # b had nothing left to release
    audit_clean(engine)


def test_order_steps_race_single_steps_and_never_settle_a_unit_twice(
    engine: stockade.Engine,
) -> None:
    engine.restock("a", 100)
    engine.restock("b", 100)
    orders = [engine.reserve_order({"a": 4, "b": 4}, ttl=600) for _ in range(4)]
    lines = [r for o in orders for r in o]

    def step(i: int) -> None:
        o = orders[i % len(orders)]
        line = lines[i % len(lines)]
        try:
            if i % 3 == 0:
                engine.confirm_order(o, qty={"a": 1})
            elif i % 3 == 1:
                engine.release(line.id, qty=1)
            else:
                engine.confirm(line.id, qty=1)
        except (stockade.InvalidState, stockade.LockTimeout):
            pass

    race(32, step)
    done = [engine.order(o) for o in orders]
    confirmed = sum(r.confirmed for o in done for r in o)
    released = sum(r.released for o in done for r in o)
    held = sum(r.held for o in done for r in o)
    assert confirmed + released + held == 32
    assert all(r.held >= 0 and r.confirmed + r.released <= 4 for o in done for r in o)
    for sku in "ab":
        level = engine.stock(sku)
        sku_lines: List[stockade.Reservation] = [r for o in done for r in o if r.sku == sku]
        assert level.on_hand == 100 - sum(r.confirmed for r in sku_lines)
        assert level.reserved == sum(r.held for r in sku_lines)
    audit_clean(engine)


def test_racing_confirm_orders_of_one_order_confirm_each_unit_once(
    engine: stockade.Engine,
) -> None:
    engine.restock("a", 50)
    engine.restock("b", 50)
    order = engine.reserve_order({"a": 8, "b": 8}, ttl=600)
    told: List[str] = []

    def step(_: int) -> None:
        try:
            engine.confirm_order(order, qty={"a": 1, "b": 1})
            told.append("ok")
        except stockade.InvalidState:
            told.append("refused")
        except stockade.LockTimeout:
            told.append("busy")

    race(32, step)
    done = engine.order(order)
    assert [r.confirmed for r in done] == [told.count("ok")] * 2
    assert told.count("ok") == 8  # exactly what was held: no more, none lost
    assert [engine.stock(s).on_hand for s in "ab"] == [42, 42]
    audit_clean(engine)


def test_the_async_twins_step_orders(engine: stockade.Engine) -> None:
    import asyncio

    order = stocked(engine)

    async def go() -> Order:
        await engine.extend_order_async(order, ttl=900)
        await engine.release_order_async(order, qty={"a": 1})
        return await engine.confirm_order_async(order)

    done = asyncio.run(go())
    assert [(r.confirmed, r.released) for r in done] == [(2, 1), (2, 0), (1, 0)]
    assert asyncio.run(engine.order_async(order.id)) == done


def test_retention_purges_an_orders_lines_one_by_one(engine: stockade.Engine, wait: Wait) -> None:
    from datetime import timedelta

    engine.restock("a", 10)
    engine.restock("b", 10)
    order = engine.reserve_order({"a": 1, "b": 1})
    engine.confirm(order.line("a").id)
    wait(0.3)
    engine.purge(timedelta(milliseconds=100))
    left = engine.order(order.id)
    assert [r.sku for r in left] == ["b"]  # the ended line went, the held one stays
    assert engine.reservations(order=order) == list(left)
    engine.release_order(order)
    wait(0.3)
    engine.purge(timedelta(milliseconds=100))
    with pytest.raises(stockade.NotFound):
        engine.order(order.id)
    with pytest.raises(stockade.NotFound):
        engine.confirm_order(order)
