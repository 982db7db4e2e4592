"""The public API (docs/api.md) on both stores: every call, its value objects, and its
errors. Times are checked against the store's clock (`store_now`), and time moves
with `wait` (the manual clock on memory, the database clock on PostgreSQL)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import List

import pytest

import stockade
import stockade.testing
from stockade import ReservationState, Strategy
from support import ALL_STRATEGIES, START, Now, Wait


def close_to(when: datetime, now: datetime) -> bool:
    return abs(when - now) < timedelta(seconds=5)


def test_restock_returns_the_stock_level(engine: stockade.Engine, store_now: Now) -> None:
    lvl = engine.restock("sku-1", 100)
    assert (lvl.sku, lvl.location, lvl.on_hand, lvl.reserved, lvl.available) == (
        "sku-1",
        "default",
        100,
        0,
        100,
    )
    assert lvl.version == 1
    assert lvl.etag == '"1"'
    assert lvl.updated_at.tzinfo is timezone.utc and close_to(lvl.updated_at, store_now())
    assert engine.stock("sku-1") == lvl


def test_reserve_holds_units_with_a_ttl_from_the_store_clock(
    engine: stockade.Engine, store_now: Now
) -> None:
    engine.restock("sku-1", 100)
    r = engine.reserve("sku-1", 2, ttl=timedelta(minutes=10), idempotency_key="order-77")
    assert isinstance(r.id, uuid.UUID) and r.id.version == 7
    assert r.state is ReservationState.HELD and r.state == "held"
    assert (r.sku, r.location, r.qty, r.version) == ("sku-1", "default", 2, 1)
    assert r.expires_at == r.created_at + timedelta(minutes=10)
    assert r.expires_at.tzinfo is timezone.utc
    assert close_to(r.created_at, store_now()) and r.idempotency_key == "order-77"
    assert r.etag == '"1"'
    lvl = engine.stock("sku-1")
    assert (lvl.reserved, lvl.available) == (2, 98)


def test_ttl_may_be_given_in_seconds(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    r = engine.reserve("s", 1, ttl=90)
    assert r.expires_at == r.created_at + timedelta(seconds=90)
    r = engine.reserve("s", 1, ttl=0.5)
    assert r.expires_at == r.created_at + timedelta(milliseconds=500)


def test_confirm_release_and_extend_follow_the_lifecycle(
    engine: stockade.Engine, wait: Wait
) -> None:
    engine.restock("sku-1", 10)
    a = engine.reserve("sku-1", 3)
    b = engine.reserve("sku-1", 2)
    confirmed = engine.confirm(a.id, expected_version=a.version)
    assert confirmed.state is ReservationState.CONFIRMED and confirmed.version == 2
    assert engine.release(b.id).state is ReservationState.RELEASED
    lvl = engine.stock("sku-1")
    assert (lvl.on_hand, lvl.reserved, lvl.available) == (7, 0, 7)

    c = engine.reserve("sku-1", 1, ttl=timedelta(minutes=1))
    wait(0.05)
    extended = engine.extend(c.id, ttl=timedelta(minutes=5))
    assert extended.expires_at == extended.updated_at + timedelta(minutes=5)
    assert extended.updated_at > c.updated_at and extended.version == c.version + 1
    assert engine.reservation(str(c.id)) == extended


def test_confirm_after_expiry_raises_reservation_expired(
    engine: stockade.Engine, wait: Wait
) -> None:
    engine.restock("sku-1", 10)
    r = engine.reserve("sku-1", 4, ttl=timedelta(milliseconds=200))
    wait(0.25)
    with pytest.raises(stockade.ReservationExpired) as info:
        engine.confirm(r.id)
    assert info.value.reservation_id == r.id
    assert engine.reservation(r.id).state is ReservationState.EXPIRED
    assert engine.stock("sku-1").available == 10


@pytest.mark.sweeper_off
def test_expire_due_returns_the_number_expired(engine: stockade.Engine, wait: Wait) -> None:
    engine.restock("sku-1", 10)
    for _ in range(3):
        engine.reserve("sku-1", 1, ttl=0.5)
    keep = engine.reserve("sku-1", 1, ttl=3600)
    assert engine.expire_due() == 0
    wait(0.55)
    assert engine.expire_due(limit=2) == 2
    assert engine.expire_due(limit=1000) == 1
    assert engine.stock("sku-1").reserved == 1
    assert engine.reservation(keep.id).state is ReservationState.HELD


def test_version_conflict_carries_expected_and_actual(engine: stockade.Engine) -> None:
    lvl = engine.restock("sku-1", 10)
    engine.restock("sku-1", 1)
    with pytest.raises(stockade.VersionConflict) as info:
        engine.set_on_hand("sku-1", 50, expected_version=lvl.version)
    assert (info.value.expected_version, info.value.actual_version) == (1, 2)
    assert info.value.sku == "sku-1" and info.value.location == "default"
    assert engine.stock("sku-1").on_hand == 11
    fresh = engine.stock("sku-1")
    assert engine.set_on_hand("sku-1", 50, expected_version=fresh.version).on_hand == 50


def test_etag_round_trips_to_expected_version(engine: stockade.Engine) -> None:
    r = (engine.restock("s", 3), engine.reserve("s", 1))[1]
    assert stockade.version_from_etag(r.etag) == r.version
    assert stockade.version_from_etag('W/"12"') == 12
    with pytest.raises(stockade.InvalidArgument):
        stockade.version_from_etag("12")


def test_out_of_stock_names_the_sku(engine: stockade.Engine) -> None:
    engine.restock("sku-1", 1, location="lisbon")
    with pytest.raises(stockade.OutOfStock) as info:
        engine.reserve("sku-1", 2, location="lisbon")
    assert (info.value.sku, info.value.location, info.value.code) == (
        "sku-1",
        "lisbon",
        "out_of_stock",
    )
    assert isinstance(info.value, stockade.StockadeError)


def test_unknown_rows_and_reservations_raise_not_found(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.NotFound):
        engine.stock("nope")
    with pytest.raises(stockade.NotFound):
        engine.reserve("nope", 1)
    with pytest.raises(stockade.NotFound):
        engine.confirm(uuid.uuid4())


def test_final_states_raise_invalid_state_with_the_state(engine: stockade.Engine) -> None:
    engine.restock("s", 2)
    r = engine.reserve("s", 1)
    engine.release(r.id)
    with pytest.raises(stockade.InvalidState) as info:
        engine.confirm(r.id)
    assert info.value.state == "released"


def test_sell_is_a_direct_conditional_decrement(engine: stockade.Engine) -> None:
    engine.restock("s", 3)
    engine.reserve("s", 2)
    assert engine.sell("s", 1).on_hand == 2
    with pytest.raises(stockade.OutOfStock):
        engine.sell("s", 1)


def test_reserve_order_is_all_or_nothing_in_caller_order(engine: stockade.Engine) -> None:
    engine.restock("sku-1", 5)
    engine.restock("sku-2", 2)
    engine.restock("sku-2", 9, location="lisbon")
    with pytest.raises(stockade.OutOfStock):
        engine.reserve_order({"sku-1": 1, "sku-2": 3})
    assert engine.stock("sku-1").reserved == 0
    made = engine.reserve_order({"sku-2": 2, "sku-1": 1, ("sku-2", "lisbon"): 4})
    assert [(r.sku, r.location, r.qty) for r in made] == [
        ("sku-2", "default", 2),
        ("sku-1", "default", 1),
        ("sku-2", "lisbon", 4),
    ]


def test_an_order_replays_in_the_line_order_of_the_replay(engine: stockade.Engine) -> None:
    engine.restock("a", 5)
    engine.restock("b", 5)
    first = engine.reserve_order({"a": 1, "b": 2}, idempotency_key="o-1")
    again = engine.reserve_order({"b": 2, "a": 1}, idempotency_key="o-1")
    assert [r.sku for r in again] == ["b", "a"]
    assert {r.id for r in again} == {r.id for r in first}
    assert engine.stock("a").reserved == 1 and engine.stock("b").reserved == 2


def test_idempotency_key_replays_and_conflicts(engine: stockade.Engine) -> None:
    engine.restock("s", 10)
    first = engine.reserve("s", 2, idempotency_key="k", ttl=60)
    engine.confirm(first.id)
    again = engine.reserve("s", 2, idempotency_key="k", ttl=60)
    assert again.id == first.id and again.state is ReservationState.CONFIRMED
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("s", 3, idempotency_key="k", ttl=60)
    assert engine.stock("s").on_hand == 8


@pytest.mark.parametrize("strategy", ["atomic", "batched"])
def test_an_idempotency_conflict_names_what_differs(
    engine: stockade.Engine, backend: str, strategy: str
) -> None:
    engine.restock("s", 10)
    engine.restock("t", 10)
    engine.reserve("s", 2, idempotency_key="k", ttl=60, strategy=strategy)

    def conflict(**asked: object) -> str:
        with pytest.raises(stockade.IdempotencyConflict) as caught:
            engine.reserve(**{"sku": "s", "qty": 2, "ttl": 60, "strategy": strategy, **asked})
        return str(caught.value)

    assert "its qty differs (this request: 3)" in conflict(idempotency_key="k", qty=3)
    if backend != "citus":  # there a key is unique per shard key (docs/scaling-out.md)
        assert "its sku or location differs" in conflict(idempotency_key="k", sku="t")
    # The retry that forgot ttl= (the engine's default, 15 min): the message says so.
    message = conflict(idempotency_key="k", ttl=None)
    assert "its ttl differs (this request: 900 s" in message and "default_ttl" in message
    # Only this request's own values: the first request may be another caller's.
    engine.reserve("s", 1, idempotency_key="b", ttl=60, buyer="alice", strategy=strategy)
    message = conflict(idempotency_key="b", qty=1, buyer="bob")
    assert "its buyer differs" in message and "alice" not in message
    engine.reserve_order({"s": 1, "t": 2}, idempotency_key="o", ttl=60)
    with pytest.raises(stockade.IdempotencyConflict, match="its lines differ"):
        engine.reserve_order({"s": 1, "t": 3}, idempotency_key="o", ttl=60)
    with pytest.raises(stockade.IdempotencyConflict, match="used for an order"):
        engine.reserve("s", 1, idempotency_key="o", ttl=60)
    assert engine.stock("s").reserved == 4 and engine.stock("t").reserved == 2


def test_concurrent_duplicates_of_one_key_end_as_one_reservation(engine: stockade.Engine) -> None:
    engine.restock("s", 1000)
    out = stockade.testing.race(64, lambda i: engine.reserve("s", 5, idempotency_key="dup", ttl=60))
    ids = {r.id for r in out.succeeded()}
    assert len(ids) == 1 and len(out.succeeded()) == 64
    assert engine.stock("s").reserved == 5


@pytest.mark.parametrize("name", ALL_STRATEGIES)
def test_strategy_accepts_names_and_members(engine: stockade.Engine, name: str) -> None:
    engine.restock("s", 2)
    engine.reserve("s", 1, strategy=name)
    engine.reserve("s", 1, strategy=Strategy(name))
    assert engine.stats()["strategies"][name]["granted"] == 2


def test_default_strategy_is_auto(engine: stockade.Engine) -> None:
    assert engine.strategy is Strategy.AUTO
    engine.restock("s", 1)
    engine.reserve("s", 1)
    assert engine.stats()["strategies"]["auto"]["granted"] == 1


@pytest.mark.parametrize("kind", ["pessimistic", "advisory"])
def test_nowait_and_lock_timeout_while_the_lock_is_held(engine: stockade.Engine, kind: str) -> None:
    engine.restock("s", 5)
    with stockade.testing.hold_lock(engine, "s", kind=kind):
        # Another thread, as another session would be.
        out = stockade.testing.race(1, lambda i: engine.reserve("s", 1, strategy=kind, nowait=True))
        assert isinstance(out.errors[0], stockade.LockNotAvailable)
        out = stockade.testing.race(
            1, lambda i: engine.reserve("s", 1, strategy=kind, lock_timeout=0.02)
        )
        assert isinstance(out.errors[0], stockade.LockTimeout)
    assert engine.reserve("s", 1, strategy=kind, nowait=True).qty == 1
    counters = engine.stats()["strategies"][kind]
    assert (counters["lock_not_available"], counters["lock_timeouts"]) == (1, 1)


def test_stats_and_recommend_count_a_skus_requests_as_documented(
    engine: stockade.Engine,
) -> None:
    # docs/hot-row.md, "Two counts of a SKU's requests": hottest_skus counts reserves and
    # sells; recommend's odds count what takes the row's lock, confirms and releases too.
    engine.restock("tee", 10)
    held = [engine.reserve("tee", 1, strategy="atomic") for _ in range(3)]
    engine.sell("tee", 1, strategy="atomic")
    engine.confirm(held[0].id)
    engine.release(held[1].id)
    [tee] = [s for s in engine.stats()["hottest_skus"] if s["sku"] == "tee"]
    assert tee["requests"] == 4
    odds = [r for r in engine.recommend("tee").reasons if r.startswith("odds: ")]
    assert odds and odds[0].startswith("odds: 0 of 6 requests (0.0%) so far"), odds


def test_stats_report_strategies_and_hottest_skus(engine: stockade.Engine, backend: str) -> None:
    engine.restock("hot", 1)
    engine.restock("cold", 1)
    engine.reserve("hot", 1)
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("hot", 1)
    stats = engine.stats(sku_limit=1)
    assert stats["backend"] == ("postgres" if backend == "citus" else backend)
    assert stats["strategies"]["auto"]["requests"] == 2
    assert stats["hottest_skus"] == [
        {
            "sku": "hot",
            "location": "default",
            "requests": 2,
            "refused": 1,
            "conflicts": 0,
            "lock_waits": 0,
            "mode": "atomic",
            "in_flight": 0,
            "peak_in_flight": 1,
            "row_queue": 0,
            "slots": 1,
        }
    ]
    assert stats["batcher"]["started"] is False
    assert stats["slots"] == {
        "auto_slots_max": 4,
        "auto_splits": 0,
        "learned": 0,
        "kept": 0,
        "auto_merges": 0,
        "recent": [],
    }
    counts = engine.row_counts()
    assert (counts["sku_count"], counts["reservation_count"], counts["held_count"]) == (2, 1, 1)
    # stats() counts holds exactly (up to 10,000) and, on PostgreSQL, estimates the rest
    # from the statistics collector, which may lag a commit by about a second.
    assert stats["held_count"] == 1
    assert stats["counts_exact"] is (backend == "memory")
    if backend == "memory":
        assert (stats["sku_count"], stats["reservation_count"]) == (2, 1)


def test_reservation_ids_carry_the_shard_key_of_their_row(engine: stockade.Engine) -> None:
    from stockade import _core

    engine.restock("sku-1", 3, location="lisbon")
    r = engine.reserve("sku-1", 1, location="lisbon")
    assert _core.uuid_shard_key(r.id.bytes) == _core.shard_key_of("sku-1", "lisbon")


def test_migrate_on_memory_applies_nothing(memory_engine: stockade.Engine) -> None:
    assert memory_engine.migrate() == []
    assert memory_engine.backend == "memory" and memory_engine.strategy is Strategy.AUTO


async def _reserve_many(engine: stockade.Engine, n: int) -> list[stockade.Reservation]:
    import asyncio

    results = await asyncio.gather(
        *(engine.reserve_async("s", 1) for _ in range(n)), return_exceptions=True
    )
    return [r for r in results if isinstance(r, stockade.Reservation)]


def test_reserve_async_grants_exactly_what_exists(engine: stockade.Engine) -> None:
    import asyncio

    engine.restock("s", 50)
    granted = asyncio.run(_reserve_many(engine, 200))
    assert len(granted) == 50
    assert engine.stock("s").available == 0


def test_claim_test_follows_the_three_questions() -> None:
    unsafe = stockade.claim_test(fits_in_transaction=True, conflict_rate=0.3, retry="unsafe")
    assert unsafe.strategy is Strategy.PESSIMISTIC and len(unsafe.reasons) == 3
    assert (
        stockade.claim_test(fits_in_transaction=False, conflict_rate=0.3).strategy
        is Strategy.OPTIMISTIC
    )
    assert (
        stockade.claim_test(fits_in_transaction=True, conflict_rate=0.01).strategy
        is Strategy.OPTIMISTIC
    )
    assert (
        stockade.claim_test(fits_in_transaction=True, conflict_rate=0.9).strategy
        is Strategy.BATCHED
    )
    assert (
        stockade.claim_test(
            fits_in_transaction=True, conflict_rate=0.9, single_statement=True
        ).strategy
        is Strategy.ATOMIC
    )
    with pytest.raises(stockade.InvalidArgument):
        stockade.claim_test(fits_in_transaction=True, conflict_rate=1.5)
    with pytest.raises(stockade.InvalidArgument):
        stockade.claim_test(fits_in_transaction=True, conflict_rate=0.1, retry="maybe")


def test_blocking_calls_release_the_gil(engine: stockade.Engine) -> None:
    # Goal: a call blocked in C++ lets other Python threads run. Method: one thread waits
    # 300 ms for a held row lock inside the core while this thread counts; if the GIL
    # were held, the count would stall for the whole wait.
    import threading
    import time

    engine.restock("s", 1)
    done = threading.Event()
    outcome: List[object] = []
    ticks = 0
    with stockade.testing.hold_lock(engine, "s"):

        def blocked() -> None:
            try:
                outcome.append(engine.reserve("s", 1, strategy="pessimistic", lock_timeout=0.3))
            except BaseException as e:  # judged on the main thread: nothing is lost here
                outcome.append(e)
            done.set()

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.05)  # let it reach the lock wait
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline and not done.is_set():
            ticks += 1
        assert not done.is_set(), "the reserve returned before its lock_timeout"
    t.join(timeout=10)
    assert done.is_set(), "the reserve did not return after its lock was released"
    # The lock went before the timeout: the reserve got the unit, or (a slow machine) timed out.
    assert isinstance(outcome[0], (stockade.Reservation, stockade.LockTimeout)), outcome
    assert ticks > 1000


def test_every_awaitable_twin_does_what_its_blocking_call_does(engine: stockade.Engine) -> None:
    import asyncio

    engine.restock("a", 10)
    engine.restock("b", 10)

    async def lifecycle() -> None:
        r = await engine.reserve_async("a", 2, ttl=60)
        order = await engine.reserve_order_async({"a": 1, "b": 3})
        extended = await engine.extend_async(r.id, ttl=120)
        assert extended.expires_at == extended.updated_at + timedelta(seconds=120)
        assert (
            await engine.confirm_async(r.id, expected_version=extended.version)
        ).state == "confirmed"
        assert (await engine.release_async(order[1].id)).state == "released"
        assert (await engine.sell_async("b", 7)).on_hand == 3

    asyncio.run(lifecycle())
    assert (engine.stock("a").on_hand, engine.stock("a").reserved) == (8, 1)
    assert (engine.stock("b").on_hand, engine.stock("b").reserved) == (3, 0)
    assert engine.reserve_async.__name__ == "reserve_async"


def test_manual_clock_moves_only_when_told(clock: stockade.ManualClock) -> None:
    assert clock.now() == START
    assert clock.advance(timedelta(minutes=2)) == START + timedelta(minutes=2)
    clock.set(START + timedelta(days=1))
    assert clock.now() == START + timedelta(days=1)
    with pytest.raises(stockade.InvalidType):
        stockade.ManualClock(datetime(2027, 1, 1))  # naive datetimes are refused
