"""Hot-row slots (Engine.set_slots): a SKU's units spread over several stock rows, each
with its own lock, on every backend (memory, PostgreSQL, Citus).

What must hold: no row ever oversells and the SKU sells out exactly, whichever engine
(home slot) takes the units; nobody is told OutOfStock while the SKU's rows together have
the units; callers see the SKU, never a slot's row; If-Match names the SKU's summed
version; what slots do not support is refused, typed, before anything changes.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta
from typing import Callable, Iterator, List

import pytest

import stockade
from stockade import _core
from stockade.testing import race
from stockade.tools.pgserver import run_sql
from stockade.tools.pytest_plugin import PostgresForTests
from support import MIGRATIONS, assert_audit_clean

Sibling = Callable[..., stockade.Engine]


@pytest.fixture
def sibling(
    backend: str, engine: stockade.Engine, request: pytest.FixtureRequest
) -> Iterator[Sibling]:
    """More engines over the `engine`'s own store, each with its own home slot: replicas.
    The memory store lives in one engine, so there the `engine` itself stands in."""
    made: List[stockade.Engine] = []

    def make(home_slot: int, **options: object) -> stockade.Engine:
        if backend == "memory":
            return engine
        if backend == "postgres":
            dsn = request.getfixturevalue("stockade_database")
            eng = stockade.Engine.postgres(dsn, home_slot=home_slot, **options)  # type: ignore[arg-type]
        else:
            eng = stockade.Engine.postgres(
                request.getfixturevalue("stockade_citus_dsn"),
                layout="citus",
                schema=engine._schema or "stockade",
                home_slot=home_slot,
                **options,  # type: ignore[arg-type]
            )
        made.append(eng)
        return eng

    yield make
    for eng in made:
        eng.close()


def test_set_slots_spreads_units_and_stock_sums_them(engine: stockade.Engine) -> None:
    engine.restock("hot", 103)
    level = engine.set_slots("hot", 4)
    assert (level.sku, level.location) == ("hot", "default")
    assert (level.on_hand, level.reserved, level.available) == (103, 0, 103)
    assert engine.slot_count("hot") == 4
    assert engine.slot_count("absent") == 0
    assert engine.slot_count(engine.restock("plain", 1).sku) == 1
    stock = engine.stock("hot")
    assert (stock.on_hand, stock.available, stock.version) == (103, 103, level.version)
    # The rows are real rows: row_counts sees them.
    assert engine.row_counts()["sku_count"] == 1 + 4


def test_reservations_of_a_slot_name_the_sku(engine: stockade.Engine) -> None:
    engine.restock("hot", 40, location="eu")
    engine.set_slots("hot", 4, location="eu")
    held = engine.reserve("hot", 3, location="eu", idempotency_key="k-1")
    assert (held.sku, held.location) == ("hot", "eu")
    assert engine.reservation(held.id).location == "eu"
    assert engine.confirm(held.id).location == "eu"
    other = engine.reserve("hot", 2, location="eu")
    assert engine.release(other.id).location == "eu"
    assert engine.reserve("hot", 3, location="eu", idempotency_key="k-1").id == held.id
    sold = engine.sell("hot", 5, location="eu")
    assert (sold.location, sold.on_hand, sold.reserved) == ("eu", 32, 0)  # 3 confirmed, 5 sold
    stock = engine.stock("hot", location="eu")
    assert (stock.on_hand, stock.reserved, stock.available) == (32, 0, 32)
    assert "spread over 4 rows" in str(engine.recommend("hot", location="eu"))
    hottest = engine.stats()["hottest_skus"]
    assert [(h["sku"], h["location"]) for h in hottest] == [("hot", "eu")]


def test_no_out_of_stock_while_the_rows_together_have_the_units(engine: stockade.Engine) -> None:
    engine.restock("hot", 10)
    engine.set_slots("hot", 4)  # 3, 3, 2, 2: no row alone has 10
    whole = engine.reserve("hot", 10, strategy="atomic")
    assert whole.qty == 10
    with pytest.raises(stockade.OutOfStock) as refused:
        engine.reserve("hot", 1)
    assert "'hot'" in str(refused.value) and "\x1f" not in str(refused.value)
    assert refused.value.location == "default"
    engine.release(whole.id)
    # Every strategy, and sells, take from the other rows too.
    for strategy in ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]:
        r = engine.reserve("hot", 7, strategy=strategy)
        engine.release(r.id)
    assert engine.sell("hot", 9).on_hand == 1
    with pytest.raises(stockade.OutOfStock):
        engine.sell("hot", 2)
    assert engine.stock("hot").on_hand == 1


@pytest.mark.parametrize("strategy", ["batched", "auto", "atomic"])
def test_four_replicas_sell_out_exactly(
    engine: stockade.Engine, sibling: Sibling, strategy: str
) -> None:
    units, buyers = 300, 16
    engine.restock("drop", units)
    engine.set_slots("drop", 4)
    replicas = [sibling(home_slot=i, strategy=strategy) for i in range(4)]
    granted = [0] * buyers

    def buy(i: int) -> None:
        eng = replicas[i % 4]
        while True:
            try:
                eng.reserve("drop", 1)
            except stockade.OutOfStock:
                return
            except stockade.Overloaded:
                continue  # units moved into this slot were taken first: try again
            granted[i] += 1

    out = race(buyers, buy)
    assert out.errors == [None] * buyers
    assert sum(granted) == units
    level = engine.stock("drop")
    assert (level.reserved, level.available) == (units, 0)
    assert engine.row_counts()["reservation_count"] == units
    assert_audit_clean(engine)


def test_auto_splits_a_row_replicas_batch_and_they_learn_it(
    backend: str, engine: stockade.Engine, sibling: Sibling
) -> None:
    """Two engines batching one row take turns at its lock: `auto` splits the SKU into
    auto_slots_max slots by itself, and the other engine learns the split from the database
    (it never refused anything). On the memory store, which reports no row versions, and
    with one engine, nothing is split."""
    engine.restock("surge", 1_000_000)
    replicas = [sibling(home_slot=0), sibling(home_slot=1)]
    stop = threading.Event()
    granted = [0] * 16

    def buy(i: int) -> None:
        eng = replicas[i % 2]
        while not stop.is_set():
            eng.reserve("surge", 1)
            granted[i] += 1

    def known(eng: stockade.Engine) -> int:
        rows = [h for h in eng.stats()["hottest_skus"] if h["sku"] == "surge"]
        return rows[0]["slots"] if rows else 1

    def until_both_know_then_stop() -> None:
        deadline = time.monotonic() + (30 if backend != "memory" else 2)
        while time.monotonic() < deadline and not all(known(e) == 4 for e in replicas):
            time.sleep(0.05)
        stop.set()

    out = race(16, buy, meanwhile=until_both_know_then_stop)
    assert not any(out.errors), out.errors
    level = engine.stock("surge")
    assert (level.on_hand, level.reserved) == (1_000_000, sum(granted))
    if backend == "memory":
        assert engine.slot_count("surge") == 1
        assert engine.stats()["slots"]["auto_splits"] == 0
        return
    assert [known(e) for e in replicas] == [4, 4]
    assert engine.slot_count("surge") == 4
    slots = [e.stats()["slots"] for e in replicas]
    assert sum(s["auto_splits"] + s["learned"] for s in slots) == 2
    splitter = replicas[0] if slots[0]["auto_splits"] else replicas[1]
    decided = splitter.stats()["slots"]["recent"][-1]
    assert (decided["sku"], decided["slots"], decided["split"]) == ("surge", 4, True)
    assert "shared with another writer" in decided["why"]
    assert any(r.startswith("slots: auto split it") for r in splitter.recommend("surge").reasons)


def test_replicas_learn_slots_from_their_first_refusal(
    engine: stockade.Engine, sibling: Sibling
) -> None:
    first = sibling(home_slot=1)
    first.restock("hot", 8)
    # Another replica slots the SKU; `late` has never seen it, so it starts on the own row.
    engine.set_slots("hot", 4)
    late = sibling(home_slot=3, strategy="batched")
    got = [late.reserve("hot", 1) for _ in range(8)]
    assert len(got) == 8
    with pytest.raises(stockade.OutOfStock):
        late.reserve("hot", 1)
    assert engine.stock("hot").available == 0


def test_async_reserve_on_slots_is_exact(engine: stockade.Engine, sibling: Sibling) -> None:
    engine.restock("hot", 50)
    engine.set_slots("hot", 4)
    late = sibling(home_slot=2, strategy="batched")

    async def main() -> List[object]:
        # A call answered Overloaded ("units moved into this slot were taken first", which
        # a loaded machine makes possible) changed nothing, and a client retries it.
        async def one() -> object:
            for _ in range(20):
                try:
                    return await late.reserve_async("hot", 1)
                except stockade.Overloaded:
                    continue
            raise AssertionError("Overloaded 20 times in a row")

        return list(await asyncio.gather(*(one() for _ in range(60)), return_exceptions=True))

    outcomes = asyncio.run(main())
    made = [o for o in outcomes if isinstance(o, stockade.Reservation)]
    refused = [o for o in outcomes if isinstance(o, stockade.OutOfStock)]
    assert len(made) == 50 and len(refused) == 10, outcomes
    assert all(r.location == "default" for r in made)
    assert engine.stock("hot").available == 0


def test_keyed_replay_on_another_replica_finds_the_first(
    engine: stockade.Engine, sibling: Sibling
) -> None:
    engine.restock("hot", 20)
    engine.set_slots("hot", 4)
    a, b = sibling(home_slot=0), sibling(home_slot=3)
    first = a.reserve("hot", 2, idempotency_key="order-7")
    again = b.reserve("hot", 2, idempotency_key="order-7")
    assert again.id == first.id
    with pytest.raises(stockade.IdempotencyConflict):
        b.reserve("hot", 3, idempotency_key="order-7")
    assert engine.stock("hot").reserved == 2


def test_if_match_names_the_summed_version(engine: stockade.Engine) -> None:
    engine.restock("hot", 12)
    level = engine.set_slots("hot", 3)
    r = engine.reserve("hot", 9, expected_version=level.version)
    assert r.qty == 9
    with pytest.raises(stockade.VersionConflict):
        engine.reserve("hot", 1, expected_version=level.version)
    now = engine.stock("hot")
    assert engine.restock("hot", 3, expected_version=now.version).on_hand == 15
    with pytest.raises(stockade.VersionConflict):
        engine.set_on_hand("hot", 20, expected_version=now.version)
    assert engine.stock("hot").on_hand == 15


def test_set_on_hand_and_restock_keep_their_meaning(engine: stockade.Engine) -> None:
    engine.restock("hot", 10)
    engine.set_slots("hot", 4)
    held = engine.reserve("hot", 6, strategy="atomic")
    with pytest.raises(stockade.InvalidState):
        engine.set_on_hand("hot", 5)  # 6 are held
    assert engine.stock("hot").on_hand == 10
    level = engine.set_on_hand("hot", 30)
    assert (level.on_hand, level.reserved, level.available) == (30, 6, 24)
    assert engine.restock("hot", 4).on_hand == 34
    engine.confirm(held.id)
    assert (engine.stock("hot").on_hand, engine.stock("hot").reserved) == (28, 0)


def test_an_order_with_a_slotted_line_takes_units_from_its_slots(engine: stockade.Engine) -> None:
    engine.restock("hot", 12)
    engine.set_slots("hot", 4)
    engine.restock("cold", 5)
    lines = engine.reserve_order({"hot": 11, "cold": 5})
    assert sorted((r.sku, r.location, r.qty) for r in lines) == [
        ("cold", "default", 5),
        ("hot", "default", 11),
    ]
    with pytest.raises(stockade.OutOfStock):
        engine.reserve_order({"hot": 2})
    assert engine.stock("hot").available == 1


@pytest.mark.parametrize("strategy", ["atomic", "batched", "pessimistic"])
def test_a_call_on_slots_is_counted_once_however_many_rows_it_tries(
    engine: stockade.Engine, strategy: str
) -> None:
    # A short slot refuses, units move in from the other rows, and the call runs again:
    # the metrics count the call once, with the outcome the caller got (before, each
    # attempt counted as a request, and a refusal that units then cured as a refusal).
    engine.restock("hot", 8)
    engine.set_slots("hot", 4)  # 2 units per row: each first call below needs a refill
    assert engine.reserve("hot", 3, strategy=strategy).qty == 3
    assert engine.sell("hot", 2, strategy=strategy).available == 3
    assert engine.reserve_order({"hot": 2}, strategy=strategy)[0].qty == 2

    async def reserve_one() -> stockade.Reservation:
        return await engine.reserve_async("hot", 1, strategy=strategy)

    assert asyncio.run(reserve_one()).qty == 1
    assert engine.stock("hot").available == 0
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("hot", 10, strategy=strategy)
    with pytest.raises(stockade.OutOfStock):
        engine.sell("hot", 1, strategy=strategy)
    with pytest.raises(stockade.OutOfStock):
        engine.reserve_order({"hot": 5}, strategy=strategy)
    with pytest.raises(stockade.OutOfStock):
        asyncio.run(reserve_one())

    hot = [s for s in engine.stats()["hottest_skus"] if s["sku"] == "hot"]
    assert [(s["location"], s["requests"], s["refused"]) for s in hot] == [("default", 8, 4)]
    counters = engine.stats()["strategies"][strategy]  # type: ignore[literal-required]
    assert (counters["requests"], counters["granted"], counters["refused"]) == (8, 4, 4)
    calls = {c["op"]: c["outcomes"] for c in engine.metrics()["calls"] if c["strategy"] == strategy}
    assert calls == {
        "reserve": {"ok": 2, "out_of_stock": 2},
        "sell": {"ok": 1, "out_of_stock": 1},
        "reserve_order": {"ok": 1, "out_of_stock": 1},
    }


def test_what_slots_do_not_support_is_refused(engine: stockade.Engine) -> None:
    engine.restock("hot", 10)
    engine.set_slots("hot", 2)
    for call in [
        lambda: engine.set_backorder_limit("hot", 5),
        lambda: engine.acquire_lease("hot", ttl=60, owner="ops"),
        lambda: engine.discontinue("hot", fencing_token=1),
    ]:
        with pytest.raises(stockade.NotSupported, match="hot-row slots"):
            call()
    for bad in [0, 65]:
        with pytest.raises(stockade.InvalidArgument):
            engine.set_slots("hot", bad)
    # A slot is a column of its own: any valid text is a location, U+001F included, and
    # such a location is a row of its own, not one of another SKU's slots.
    assert engine.restock("hot", 3, location="default\x1f01").location == "default\x1f01"
    assert engine.reserve("hot", 1, location="default\x1f01").location == "default\x1f01"
    assert engine.stock("hot", location="default\x1f01").available == 2
    assert engine.slot_count("hot", location="default\x1f01") == 1
    level = engine.stock("hot")
    assert (level.on_hand, level.reserved, level.discontinued, level.leased) == (
        10,
        0,
        False,
        False,
    )

    engine.restock("leased", 5)
    engine.acquire_lease("leased", ttl=60, owner="ops")
    with pytest.raises(stockade.InvalidState, match="leased"):
        engine.set_slots("leased", 2)
    engine.restock("owed", 5)
    engine.set_backorder_limit("owed", 3)
    with pytest.raises(stockade.InvalidState, match="backorder"):
        engine.set_slots("owed", 2)
    engine.restock("gone", 5)
    engine.discontinue("gone")
    with pytest.raises(stockade.Discontinued):
        engine.set_slots("gone", 2)
    for sku in ["leased", "owed", "gone"]:
        assert engine.slot_count(sku) == 1
    # Slots taken away, with nothing held on the retired rows: the SKU is a one-row SKU
    # again, and what slots refused works.
    assert engine.set_slots("hot", 1).available == 10
    assert engine.slot_count("hot") == 1
    assert engine.set_backorder_limit("hot", 2).backorder_limit == 2
    with pytest.raises(stockade.InvalidState, match="backorder"):
        engine.set_slots("hot", 2)


def test_taking_slots_away_keeps_every_hold_and_the_units_go_home(
    engine: stockade.Engine, sibling: Sibling, wait: Callable[[float], None]
) -> None:
    # Holds on every slot row; then set_slots(1) from one replica. The retired rows keep
    # their holds, which confirm, release and expire there; every replica, including
    # those whose home slot retired, learns the merge; the units freed on retired rows
    # reach buyers, and the SKU sells out exactly.
    engine.restock("merge", 40)
    engine.set_slots("merge", 4)
    replicas = [sibling(home_slot=i, strategy="atomic") for i in range(4)]
    holds = [r.reserve("merge", 5, ttl=600) for r in replicas]
    short = replicas[3].reserve("merge", 2, ttl=1)
    before = engine.stock("merge")
    merged = replicas[1].set_slots("merge", 1)
    assert (merged.on_hand, merged.reserved) == (before.on_hand, before.reserved)
    assert merged.version > before.version
    assert [r.slot_count("merge") for r in replicas] == [1, 1, 1, 1]

    replicas[0].confirm(holds[0].id)
    replicas[2].release(holds[2].id)
    wait(2.5)
    engine.expire_due()  # unless the sweeper (on by default) came first
    assert engine.reservation(short.id).state == stockade.ReservationState.EXPIRED
    level = engine.stock("merge")
    assert (level.on_hand, level.reserved) == (35, 10)

    granted = [0] * 8

    def buy(i: int) -> None:
        eng = replicas[i % 4]
        while True:
            try:
                eng.reserve("merge", 1)
            except stockade.OutOfStock:
                return
            except stockade.Overloaded:
                continue
            granted[i] += 1

    out = race(8, buy)
    assert out.errors == [None] * 8
    assert sum(granted) == level.available == 25
    replicas[3].confirm(holds[3].id)
    replicas[1].release(holds[1].id)
    final = engine.stock("merge")
    assert (final.on_hand, final.reserved, final.available) == (30, 25, 5)
    assert_audit_clean(engine)


def test_auto_merges_a_slotted_sku_back_once_it_cooled(
    backend: str, engine: stockade.Engine, sibling: Sibling
) -> None:
    # Requests one at a time never run batched: after auto_slots_cool the engine that
    # routes them merges the SKU back into one row, says so, and the others learn it.
    def cooling(eng: stockade.Engine) -> stockade.Engine:
        eng.restock("cooling", 100)
        eng.set_slots("cooling", 4)
        return eng

    if backend == "memory":  # the memory store lives in its engine: one of its own
        cooler = cooling(stockade.Engine.memory(auto_slots_cool=0.2))
        others = [cooler]
    else:
        cooling(engine)
        cooler = sibling(home_slot=3, auto_slots_cool=0.2)
        others = [engine, sibling(home_slot=1, auto_slots_cool=None)]
    deadline, held = time.monotonic() + 10, 0
    while cooler.stats()["slots"]["auto_merges"] == 0 and time.monotonic() < deadline:
        cooler.reserve("cooling", 1)
        held += 1
        time.sleep(0.02)
    slots = cooler.stats()["slots"]
    assert slots["auto_merges"] == 1, "no merge within 10 s of one request at a time"
    assert slots["recent"][-1]["merged"] and "ran batched" in slots["recent"][-1]["why"]
    assert any(r.startswith("slots: auto merged") for r in cooler.recommend("cooling").reasons)
    assert [e.slot_count("cooling") for e in [cooler, *others]] == [1] * (1 + len(others))
    level = cooler.stock("cooling")
    assert (level.on_hand, level.reserved) == (100, held)
    assert cooler.reserve("cooling", 100 - held).qty == 100 - held
    if backend == "memory":
        cooler.close()
    for bad in [0, -1, timedelta(0)]:
        with pytest.raises(stockade.InvalidArgument, match="auto_slots_cool"):
            stockade.Engine.memory(auto_slots_cool=bad)


def test_splits_and_merges_racing_writes_lose_nothing(
    engine: stockade.Engine, sibling: Sibling, wait: Callable[[float], None]
) -> None:
    # One replica splits and merges the SKU over and over (4, 1, 3, 1 slots) while
    # others restock it, reserve with If-Match (expected_version), hold it briefly and
    # expire those holds as the sweeper does, then set its on_hand with If-Match. Every
    # acknowledged write is there, and the rows agree with the reservations.
    engine.restock("flux", 1000)
    shaper = sibling(home_slot=1)
    writer = sibling(home_slot=2, strategy="atomic")
    counts = {"restocked": 0, "if_match": 0, "conflicts": 0, "short": 0}
    last_set: List[int] = []
    reshaping = threading.Event()

    def reshape(_: int) -> None:
        shapes = [4, 1, 3, 1]
        deadline, i = time.monotonic() + 2.0, 0
        while time.monotonic() < deadline and i < 200:
            shaper.set_slots("flux", shapes[i % 4])
            reshaping.set()
            i += 1
            time.sleep(0.002)  # room for a read and an If-Match write in between, at times

    def restock(_: int) -> None:
        reshaping.wait(5)
        for _ in range(60):
            writer.restock("flux", 1)
            counts["restocked"] += 1

    def if_match(_: int) -> None:
        reshaping.wait(5)
        for _ in range(600):  # until 10 got through: most meet another write in between
            if counts["if_match"] >= 10:
                return
            version = writer.stock("flux").version
            try:
                writer.reserve("flux", 1, ttl=600, expected_version=version)
                counts["if_match"] += 1
            except stockade.VersionConflict:
                counts["conflicts"] += 1

    def hold_and_sweep(_: int) -> None:
        reshaping.wait(5)
        for _ in range(30):
            writer.reserve("flux", 1, ttl=0.2)
            counts["short"] += 1
            engine.expire_due()

    workers = [reshape, restock, if_match, hold_and_sweep]
    out = race(len(workers), lambda i: workers[i](i))
    assert out.errors == [None] * len(workers)
    assert counts["if_match"] > 0
    wait(1.0)
    engine.expire_due()
    level = engine.stock("flux")
    assert level.on_hand == 1000 + counts["restocked"]
    assert level.reserved == counts["if_match"]
    assert_audit_clean(engine)

    # set_on_hand with If-Match against the same reshaping: the last one acknowledged holds.
    reshaping.clear()

    def set_on_hand(_: int) -> None:
        reshaping.wait(5)
        for n in range(400):  # until 5 got through
            if len(last_set) >= 5:
                return
            try:
                version = writer.stock("flux").version
                writer.set_on_hand("flux", 500 + n, expected_version=version)
                last_set.append(500 + n)
            except stockade.VersionConflict:
                pass

    out = race(2, lambda i: [reshape, set_on_hand][i](i))
    assert out.errors == [None, None]
    assert last_set, "no set_on_hand got through"
    level = engine.stock("flux")
    assert level.on_hand == last_set[-1]
    assert level.reserved == counts["if_match"]
    assert_audit_clean(engine)


def test_discontinuing_a_slotted_sku_closes_every_slot_at_once(
    engine: stockade.Engine, sibling: Sibling
) -> None:
    engine.restock("hot", 40)
    engine.set_slots("hot", 4)
    replicas = [sibling(home_slot=slot) for slot in range(1, 4)]
    held = [eng.reserve("hot", 1) for eng in replicas]
    before = engine.stock("hot")
    with pytest.raises(stockade.VersionConflict):
        engine.discontinue("hot", expected_version=before.version - 1)
    assert engine.stock("hot") == before
    gone = engine.discontinue("hot", expected_version=before.version)
    assert gone.discontinued and (gone.on_hand, gone.reserved) == (40, 3)
    assert gone.version == before.version + 4  # every row moved once
    for eng in [engine, *replicas]:
        for strategy in ["atomic", "batched", "pessimistic"]:
            with pytest.raises(stockade.Discontinued):
                eng.reserve("hot", 1, strategy=strategy)
        with pytest.raises(stockade.Discontinued):
            eng.sell("hot", 1)
    # Holds made before still settle; discontinuing again changes nothing.
    assert engine.confirm(held[0].id).state is stockade.ReservationState.CONFIRMED
    engine.release(held[1].id)
    again = engine.discontinue("hot")
    assert again == engine.stock("hot") and again.discontinued
    back = engine.reinstate("hot", expected_version=again.version)
    assert not back.discontinued and (back.on_hand, back.reserved) == (39, 1)
    assert [eng.reserve("hot", 2).qty for eng in replicas] == [2, 2, 2]
    assert engine.stock("hot").available == 39 - 1 - 6
    assert engine.slot_count("hot") == 4


def test_a_discontinue_racing_reserves_on_every_slot_stops_them_all(
    engine: stockade.Engine, sibling: Sibling
) -> None:
    # Once discontinue() returns, no slot grants another unit: the stock it returned is
    # the stock after every racer has stopped.
    engine.restock("hot", 100_000)
    engine.set_slots("hot", 4)
    replicas = [sibling(home_slot=slot) for slot in range(4)]
    granted = [0] * 4
    gone: List[stockade.StockLevel] = []

    def buy(i: int) -> None:
        for _ in range(100_000):
            try:
                replicas[i].reserve("hot", 1, strategy="batched" if i % 2 else "atomic")
            except stockade.Discontinued:
                return
            granted[i] += 1

    def discontinue_after_200() -> None:
        deadline = time.monotonic() + 60  # bounded even if the buyers died
        while sum(granted) < 200 and time.monotonic() < deadline:
            threading.Event().wait(0.005)
        gone.append(engine.discontinue("hot"))

    out = race(4, buy, timeout=60, meanwhile=discontinue_after_200)
    assert not any(out.errors), out.errors
    assert gone[0].reserved == sum(granted)
    assert engine.stock("hot") == gone[0]


def test_slotting_a_sku_while_another_replica_leases_it_never_gives_both(
    engine: stockade.Engine, sibling: Sibling
) -> None:
    # set_slots and acquire_lease race for each SKU from two replicas. Each refuses the
    # other's result, checked under the SKU's own row lock: a SKU ends slotted or leased,
    # never both (a lease on the own row alone would not bind its slots).
    other = sibling(home_slot=1)
    skus = [f"contended-{i}" for i in range(40)]
    for sku in skus:
        engine.restock(sku, 8)
    expected = (stockade.InvalidState, stockade.NotSupported)

    def go(i: int) -> None:
        sku = skus[i // 2]
        try:
            if i % 2:
                other.acquire_lease(sku, ttl=60, owner="ops")
            else:
                engine.set_slots(sku, 2)
        except expected:
            pass

    for start in range(0, 2 * len(skus), 16):
        out = race(16, lambda i, first=start: go(first + i))
        assert out.errors == [None] * 16
    for sku in skus:
        level = engine.stock(sku)
        slotted = engine.slot_count(sku) > 1
        assert not (slotted and level.leased), sku
        assert slotted or level.leased, sku  # one of the two won


def test_holds_on_a_slot_expire_back_into_it(
    memory_engine: stockade.Engine, clock: stockade.ManualClock
) -> None:
    memory_engine.restock("hot", 8)
    memory_engine.set_slots("hot", 4)
    held = memory_engine.reserve("hot", 8, ttl=timedelta(seconds=30))
    clock.advance(timedelta(seconds=31))
    assert memory_engine.expire_due() == 1
    assert memory_engine.reservation(held.id).state == stockade.ReservationState.EXPIRED
    assert memory_engine.stock("hot").available == 8
    assert memory_engine.reserve("hot", 8).qty == 8


def test_threads_on_one_engine_sell_out_exactly_across_slots(engine: stockade.Engine) -> None:
    engine.restock("hot", 200)
    engine.set_slots("hot", 8)
    sold = []
    lock = threading.Lock()

    def buy(i: int) -> None:
        while True:
            try:
                engine.reserve("hot", 1 + i % 3)
            except stockade.OutOfStock:
                return
            except stockade.Overloaded:
                continue
            with lock:
                sold.append(1 + i % 3)

    out = race(32, buy)
    assert out.errors == [None] * 32
    level = engine.stock("hot")
    assert level.reserved == sum(sold) and level.reserved <= 200
    assert level.available < 3  # nobody left while 3 units were free
    assert_audit_clean(engine)


# A slotted SKU as version 4 of the schema wrote it: its slot rows' locations carried
# U+001F and the slot's two digits, and a hold on slot 2 named that location.
OLD_FORM_ROWS = """
INSERT INTO {schema}.stock (sku, location, on_hand, reserved, version{sk_col}) VALUES
  ('hot', 'eu', 4, 0, 3{sk}), ('hot', E'eu\\x1f01', 3, 0, 2{sk}),
  ('hot', E'eu\\x1f02', 3, 2, 4{sk});
INSERT INTO {schema}.reservation (id, sku, location, qty, state, expires_at{sk_col}) VALUES
  ('{hold}', 'hot', E'eu\\x1f02', 2, 'held', now() + interval '1 hour'{sk});
"""


def check_slot_rows_moved(eng: stockade.Engine, dsn: str, schema: str, hold: str) -> None:
    """After the migration: the slot is a column, the rows and the hold work as slots."""
    rows = run_sql(
        dsn,
        f"SELECT string_agg(location || ':' || slot, ',' ORDER BY slot) FROM {schema}.stock",
    )
    assert rows == "eu:0,eu:1,eu:2"
    marked = f"SELECT count(*) FROM {schema}.reservation WHERE strpos(location, E'\\x1f') > 0"
    assert run_sql(dsn, marked) == "0"
    level = eng.stock("hot", location="eu")
    assert (level.on_hand, level.reserved, level.version) == (10, 2, 9)
    assert eng.slot_count("hot", location="eu") == 3
    # The hold made on slot 2 settles on slot 2's row, and names its SKU.
    done = eng.confirm(uuid.UUID(hold))
    assert (done.sku, done.location, done.state) == (
        "hot",
        "eu",
        stockade.ReservationState.CONFIRMED,
    )
    slot_two = f"SELECT on_hand || ',' || reserved FROM {schema}.stock WHERE slot = 2"
    assert run_sql(dsn, slot_two) == "1,0"
    # Every unit left is reachable, whichever slot holds it.
    assert sum(eng.reserve("hot", 1, location="eu").qty for _ in range(8)) == 8
    with pytest.raises(stockade.OutOfStock):
        eng.reserve("hot", 1, location="eu")


@pytest.mark.postgres
def test_migration_5_moves_slot_rows_to_their_column_in_place(
    stockade_postgres: PostgresForTests,
) -> None:
    name = stockade_postgres.new_database(migrated=False)
    dsn = stockade_postgres.dsn(name)
    hold = str(
        uuid.UUID(bytes=_core.make_uuid_v7(1_700_000_000_000, _core.shard_key_of("hot", "eu")))
    )
    try:
        with stockade.Engine.postgres(dsn) as eng:
            assert eng.migrate(to=4) == MIGRATIONS[:4]
            run_sql(dsn, OLD_FORM_ROWS.format(schema="stockade", sk_col="", sk="", hold=hold))
            assert eng.migrate() == MIGRATIONS[4:]
        with stockade.Engine.postgres(dsn) as eng:  # fresh connections, fresh statements
            check_slot_rows_moved(eng, dsn, "stockade", hold)
    finally:
        stockade_postgres.drop_database(name)


# Migration 005 and citus/102 taken out again from a migrated Citus schema. The journal's
# trigger (007, citus/103) names the slot column: it is off until the slot is back.
CITUS_BACK_TO_VERSION_FOUR = """
ALTER TABLE {schema}.stock DISABLE TRIGGER stock_journal;
ALTER TABLE {schema}.stock DROP COLUMN slot;
ALTER TABLE {schema}.stock ADD PRIMARY KEY (shard_key, sku, location);
ALTER TABLE {schema}.reservation DROP COLUMN slot;
DELETE FROM {schema}.schema_migrations WHERE version IN (5, 102);
"""


@pytest.mark.citus
def test_citus_migration_102_moves_slot_rows_to_their_column_in_place(
    stockade_citus_engine: stockade.Engine, stockade_citus_dsn: str
) -> None:
    schema = stockade_citus_engine._schema
    assert schema is not None
    key = _core.shard_key_of("hot", "eu")
    hold = str(uuid.UUID(bytes=_core.make_uuid_v7(1_700_000_000_000, key)))
    # Citus changes a distributed table's triggers only under this setting.
    unsafe = stockade_citus_dsn + "%20-c%20citus.enable_unsafe_triggers%3Don"
    for statement in CITUS_BACK_TO_VERSION_FOUR.format(schema=schema).strip().split(";\n"):
        run_sql(unsafe, statement)
    run_sql(
        stockade_citus_dsn,
        OLD_FORM_ROWS.format(schema=schema, sk_col=", shard_key", sk=f", {key}", hold=hold),
    )
    with stockade.Engine.postgres(stockade_citus_dsn, layout="citus", schema=schema) as eng:
        assert eng.migrate() == ["005_slot_column.sql", "citus/102_slot_column.sql"]
    run_sql(unsafe, f"ALTER TABLE {schema}.stock ENABLE TRIGGER stock_journal")
    with stockade.Engine.postgres(stockade_citus_dsn, layout="citus", schema=schema) as eng:
        check_slot_rows_moved(eng, stockade_citus_dsn, schema, hold)
