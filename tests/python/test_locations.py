"""Many locations: allocation from a pool, decided on the pool's rows as locked.

Both stores and the Citus layout (``engine``): each policy's split, ``split=False``, an
order that prefers one location, a refusal that names each location's free units and
changes nothing, keys, the order handle, purchase limits, hot-row slots, bad input; the
medusa shape as a race on every strategy; a COMMIT cut by the proxy on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Dict, List

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade import Order
from stockade.http import problem
from stockade.testing import race
from support import ALL_STRATEGIES, assert_audit_clean, field

POOL = ["north", "south", "east"]


def stock_pool(eng: stockade.Engine, sku: str, units: Dict[str, int]) -> None:
    for location, n in units.items():
        eng.restock(sku, n, location=location)


def split_of(order: Order) -> Dict[str, int]:
    return {r.location: r.qty for r in order}


def levels(eng: stockade.Engine, sku: str) -> Dict[str, tuple[int, int]]:
    out = {}
    for location in POOL:
        try:
            s = eng.stock(sku, location=location)
        except stockade.NotFound:
            continue
        out[location] = (s.on_hand, s.reserved)
    return out


def test_priority_takes_from_the_pool_in_order(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 10, "east": 10})
    order = engine.allocate("a", 5, locations=POOL, ttl=600)
    assert isinstance(order, Order) and split_of(order) == {"north": 2, "south": 3}
    assert [r.location for r in order] == ["north", "south"]
    assert {r.order_id for r in order} == {order.id} and order.held == 5
    assert levels(engine, "a") == {"north": (2, 2), "south": (10, 3), "east": (10, 0)}
    assert_audit_clean(engine)


def test_most_available_takes_from_the_fullest_first(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 4, "east": 10})
    order = engine.allocate("a", 12, locations=POOL, policy="most_available")
    assert split_of(order) == {"south": 2, "east": 10}
    assert [r.location for r in order] == ["south", "east"]  # the pool's order


def test_without_split_one_location_has_it_all_or_it_refuses(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 4, "south": 6, "east": 9})
    assert split_of(engine.allocate("a", 5, locations=POOL, split=False)) == {"south": 5}
    with pytest.raises(stockade.OutOfStock) as refused:
        engine.allocate("a", 10, locations=POOL, split=False)
    assert refused.value.pool == {"north": 4, "south": 1, "east": 9}
    assert "no one location of the pool has 10" in str(refused.value)


def test_a_refusal_names_each_locations_free_units_and_changes_nothing(
    engine: stockade.Engine,
) -> None:
    stock_pool(engine, "a", {"north": 2, "east": 3})  # no row at south
    engine.reserve("a", 1, location="east")
    before = levels(engine, "a")
    with pytest.raises(stockade.OutOfStock) as refused:
        engine.allocate("a", 5, locations=POOL, idempotency_key="k-refused", ref="refused")
    e = refused.value
    assert (e.sku, e.pool) == ("a", {"north": 2, "south": 0, "east": 2})
    status, _, body = problem(e)
    assert status == 409 and body["pool"] == {"north": 2, "south": 0, "east": 2}
    assert levels(engine, "a") == before
    assert engine.reservations(ref="refused") == []
    # The key was not spent: the same request runs once there is stock.
    engine.restock("a", 1, location="south")
    again = engine.allocate("a", 5, locations=POOL, idempotency_key="k-refused", ref="refused")
    assert split_of(again) == {
        "north": 2,
        "south": 1,
        "east": 2,
    }
    with pytest.raises(stockade.NotFound):
        engine.allocate("nowhere", 1, locations=POOL)


def test_an_order_prefers_one_location_that_fills_every_line(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 5, "south": 2, "east": 1})
    stock_pool(engine, "b", {"north": 1, "south": 3, "east": 9})
    order = engine.allocate_order({"b": 3, "a": 2}, locations=POOL)
    assert [(r.sku, r.location, r.qty) for r in order] == [("b", "south", 3), ("a", "south", 2)]
    # No one location has both now: split by priority, or refuse without split.
    with pytest.raises(stockade.OutOfStock):
        engine.allocate_order({"a": 2, "b": 2}, locations=POOL, split=False)
    order = engine.allocate_order({"a": 2, "b": 2}, locations=POOL)
    assert [(r.sku, r.location, r.qty) for r in order] == [
        ("a", "north", 2),
        ("b", "north", 1),
        ("b", "east", 1),
    ]
    assert_audit_clean(engine)


def test_an_allocation_is_one_order_handle(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 10})
    order = engine.allocate("a", 5, locations=POOL, ref="cart-9")
    assert engine.order(order.id) == engine.order(order)  # read back whole
    assert {r.ref for r in order} == {"cart-9"}
    done = engine.confirm_order(order, qty={("a", "south"): 1}, release_rest=True)
    assert done.held == 0 and sum(r.confirmed for r in done) == 1
    assert levels(engine, "a") == {"north": (2, 0), "south": (9, 0)}
    assert_audit_clean(engine)


def test_a_key_replays_the_allocation_and_another_pool_conflicts(
    engine: stockade.Engine, backend: str
) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 10})
    first = engine.allocate("a", 5, locations=POOL, idempotency_key="alloc-1")
    engine.restock("a", 10, location="north")  # would be split otherwise now
    again = engine.allocate("a", 5, locations=POOL, idempotency_key="alloc-1")
    assert list(again) == list(first) and again.id == first.id
    assert engine.stock("a", location="south").reserved == 3
    with pytest.raises(stockade.IdempotencyConflict) as e:
        engine.allocate("a", 5, locations=["south", "north"], idempotency_key="alloc-1")
    assert "its locations, policy, split, ref or metadata differ" in str(e.value)
    if backend != "citus":  # there a reserve's key lives on its row's shard (scaling-out.md)
        with pytest.raises(stockade.IdempotencyConflict):
            engine.reserve("a", 5, location="north", idempotency_key="alloc-1")
    assert engine.order(idempotency_key="alloc-1").id == first.id


def test_a_buyer_counts_the_whole_quantity(engine: stockade.Engine) -> None:
    stock_pool(engine, "lim", {"north": 3, "south": 3})
    engine.set_purchase_limit("drop", 4, ["lim"])
    engine.allocate("lim", 4, locations=POOL, buyer="ann")
    with pytest.raises(stockade.LimitExceeded):
        engine.allocate("lim", 1, locations=POOL, buyer="ann")
    assert engine.buyer_held("drop", "ann") == 4
    assert levels(engine, "lim") == {"north": (3, 3), "south": (3, 1)}


def test_a_slotted_location_gives_its_slots_units(engine: stockade.Engine) -> None:
    stock_pool(engine, "hot", {"north": 40, "south": 1})
    engine.set_slots("hot", 4, location="north")  # north's units spread over four rows
    order = engine.allocate("hot", 30, locations=POOL, split=False)
    assert split_of(order) == {"north": 30}
    assert engine.stock("hot", location="north").reserved == 30
    assert_audit_clean(engine)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"locations": []}, stockade.InvalidArgument),
        ({"locations": "north"}, stockade.InvalidType),
        ({"locations": ["north", "north"]}, stockade.InvalidArgument),
        ({"locations": [f"l{i}" for i in range(33)]}, stockade.InvalidArgument),
        ({"locations": ["north", 7]}, stockade.InvalidType),
        ({"locations": POOL, "policy": "nearest"}, stockade.InvalidArgument),
        ({"locations": POOL, "split": "yes"}, stockade.InvalidType),
        ({"locations": ["x" * 10_000]}, stockade.InvalidArgument),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(
    memory_engine: stockade.Engine, kwargs: dict, error: type
) -> None:
    stock_pool(memory_engine, "a", {"north": 5})
    with pytest.raises(error):
        memory_engine.allocate("a", 1, **kwargs)
    with pytest.raises(stockade.InvalidArgument):
        memory_engine.allocate("a", 0, locations=POOL)
    with pytest.raises(stockade.InvalidType):
        memory_engine.allocate_order([("a", 1)], locations=POOL)  # type: ignore[arg-type]
    assert memory_engine.stock("a", location="north").reserved == 0


def test_the_awaitable_twins(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 10})

    async def main() -> List[Order]:
        return [
            await engine.allocate_async("a", 3, locations=POOL),
            await engine.allocate_order_async({"a": 1}, locations=["south"]),
        ]

    first, second = asyncio.run(main())
    assert split_of(first) == {"north": 2, "south": 1} and split_of(second) == {"south": 1}


@pytest.mark.parametrize("strategy", [*ALL_STRATEGIES])
@pytest.mark.parametrize("policy", ["priority", "most_available"])
def test_the_pool_is_drained_exactly_while_its_locations_run_out(
    engine: stockade.Engine, strategy: str, policy: str
) -> None:
    # The medusa shape as a race: 24 buyers allocate 1 to 3 units from three locations
    # while the locations run out one by one. The units granted equal the pool exactly; no
    # location oversells; each refusal changes nothing (the audit); none is another error.
    stock_pool(engine, "hot", {"north": 17, "south": 9, "east": 5})
    granted: List[int] = []
    lock = threading.Lock()

    def buyer(i: int) -> None:
        for n in range(12):
            qty = 1 + (i + n) % 3
            try:
                order = engine.allocate(
                    "hot", qty, locations=POOL, policy=policy, strategy=strategy
                )
            except stockade.OutOfStock:
                continue
            assert sum(r.qty for r in order) == qty
            with lock:
                granted.append(qty)

    out = race(24, buyer, timeout=120)
    assert not any(out.errors), [e for e in out.errors if e][:3]
    rows = levels(engine, "hot")
    assert all(reserved <= on_hand for on_hand, reserved in rows.values()), rows
    assert sum(reserved for _, reserved in rows.values()) == sum(granted) == 31
    assert_audit_clean(engine)


@pytest.mark.parametrize("cut", ["before", "after"])
def test_an_allocation_cut_at_its_commit_is_answered_once(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # Its COMMIT cut: without a key, the reservations it made tell whether it landed; with
    # one, a retry with the key answers. Either way nothing lands twice.
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False) as eng:
        stock_pool(eng, "a", {"north": 2, "south": 10})
        for key in (None, f"alloc-{uuid.uuid4()}"):
            before = eng.stock("a", location="south").reserved
            proxy.arm(cut)
            try:
                told = eng.allocate("a", 4, locations=POOL, idempotency_key=key, ref="cut")
            except stockade.InDoubt as e:
                assert pooled and cut == "before", e
                assert eng.stock("a", location="south").reserved == before  # not landed
                if key is None:
                    continue
                told = eng.allocate("a", 4, locations=POOL, idempotency_key=key, ref="cut")
            assert proxy.cuts >= 1
            assert sum(r.qty for r in told) == 4
            for r in told:
                assert eng.reservation(r.id) == r
            if key is not None:
                replay = eng.allocate("a", 4, locations=POOL, idempotency_key=key, ref="cut")
                assert replay.id == told.id
        assert_audit_clean(eng)
        north, south = eng.stock("a", location="north"), eng.stock("a", location="south")
        assert north.reserved + south.reserved == sum(r.held for r in eng.reservations(ref="cut"))


def test_a_batched_allocation_walks_the_pool_through_the_batcher(
    batched_engine: stockade.Engine,
) -> None:
    # Priority, one SKU, no key: each location in turn, a batched hold of the whole
    # quantity on its row. An empty location is passed over; one with part of the
    # quantity ends the walk, and the locked path splits.
    eng = batched_engine
    stock_pool(eng, "a", {"north": 1, "south": 10, "east": 10})
    eng.sell("a", 1, location="north")  # north: a row with nothing free
    before = eng.stats()["batcher"]["requests"]
    order = eng.allocate("a", 3, locations=POOL, ref="walk")
    assert split_of(order) == {"south": 3} and eng.stats()["batcher"]["requests"] > before
    assert eng.order(order.id) == order and order[0].ref == "walk"
    eng.restock("a", 2, location="north")
    assert split_of(eng.allocate("a", 4, locations=POOL)) == {"north": 2, "south": 2}
    assert eng.stock("a", location="north").on_hand == 2
    eng.restock("a", 20, location="north")
    assert split_of(eng.allocate("a", 6, locations=POOL, split=False)) == {"north": 6}
    with pytest.raises(stockade.OutOfStock) as refused:  # every row short: the locked answer
        eng.allocate("a", 40, locations=POOL, split=False)
    assert refused.value.pool == {"north": 14, "south": 5, "east": 10}
    done = eng.confirm_order(order)
    assert done.held == 0 and eng.stock("a", location="south").on_hand == 7
    assert_audit_clean(eng)


def test_a_walk_that_meets_a_row_giving_nothing_leaves_it_to_the_locked_pool(
    batched_engine: stockade.Engine,
) -> None:
    # A discontinued or leased first location, or one without a row, gives nothing, as the
    # locked pool reads it: the allocation is made elsewhere, not refused.
    eng = batched_engine
    stock_pool(eng, "a", {"north": 5, "south": 5, "east": 5})
    eng.discontinue("a", location="north")
    eng.acquire_lease("a", 60, location="south")
    assert split_of(eng.allocate("a", 2, locations=POOL)) == {"east": 2}
    assert split_of(eng.allocate("a", 1, locations=["west", "east"])) == {"east": 1}
    with pytest.raises(stockade.OutOfStock) as refused:
        eng.allocate("a", 5, locations=POOL)
    assert refused.value.pool == {"north": 0, "south": 0, "east": 2}


def test_a_batched_allocation_is_recorded_once_as_an_allocation(
    batched_engine: stockade.Engine,
) -> None:
    eng = batched_engine
    stock_pool(eng, "a", {"north": 5})
    eng.allocate("a", 1, locations=POOL)
    calls = {c["op"]: c["outcomes"] for c in eng.metrics()["calls"]}
    assert calls["allocate"] == {"ok": 1}
    assert "reserve" not in calls


def test_stock_by_location_reads_every_location_in_pages(engine: stockade.Engine) -> None:
    stock_pool(engine, "a", {"north": 2, "south": 10, "east": 4})
    engine.restock("b", 1, location="north")  # another SKU's row is not a's
    engine.set_slots("a", 3, location="south")  # its units over three rows: summed
    engine.reserve("a", 1, location="east")
    levels = engine.stock_by_location("a")
    assert list(levels) == ["east", "north", "south"]  # bytewise
    assert {loc: (s.on_hand, s.reserved) for loc, s in levels.items()} == {
        "east": (4, 1),
        "north": (2, 0),
        "south": (10, 0),
    }
    assert sum(s.available for s in levels.values()) == 15  # the pool's total
    first = engine.stock_by_location("a", limit=2)
    assert list(first) == ["east", "north"]
    assert list(engine.stock_by_location("a", after="north")) == ["south"]
    assert engine.stock_by_location("nowhere") == {}
    with pytest.raises(stockade.InvalidArgument):
        engine.stock_by_location("a", limit=0)
    with pytest.raises(stockade.InvalidArgument):
        engine.stock_by_location("")
