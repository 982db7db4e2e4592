"""Purchase limits: "at most N per buyer across these SKUs", without write skew.

The limit is a multi-row invariant. The canary (check the buyer's total, then insert, at
READ COMMITTED) lets one buyer past it under a race; stockade's parent row per (group,
buyer) must not, under every strategy, batched included.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import timedelta
from typing import List

import pytest

import stockade
from stockade.testing import limited_reserve_by_check, race
from support import ALL_STRATEGIES, Wait

DROP = ["drop-a", "drop-b", "drop-c", "drop-d", "drop-e"]
LONG = timedelta(minutes=10)


def stock_the_drop(engine: stockade.Engine, units: int = 1000, per_buyer: int = 2) -> None:
    for sku in [*DROP, "other"]:
        engine.restock(sku, units)
    engine.set_purchase_limit("drop", per_buyer, DROP)


def test_a_buyer_is_held_to_the_limit_across_the_group(engine: stockade.Engine) -> None:
    stock_the_drop(engine)
    first = engine.reserve("drop-a", 1, buyer="ann", ttl=LONG)
    assert first.buyer == "ann" and engine.reservation(first.id).buyer == "ann"
    engine.reserve("drop-b", 1, buyer="ann", ttl=LONG)
    before = [engine.stock(sku) for sku in DROP]
    with pytest.raises(stockade.LimitExceeded) as caught:
        engine.reserve("drop-c", 1, buyer="ann")
    assert caught.value.http_status == 409 and caught.value.sku == "drop-c"
    assert "holds 2 of the 2" in str(caught.value)
    assert [engine.stock(sku) for sku in DROP] == before  # nothing changed
    assert engine.buyer_held("drop", "ann") == 2
    # Others are not limited by ann; SKUs outside the group are not limited at all; a
    # call without a buyer is not limited.
    assert engine.reserve("drop-c", 2, buyer="bob").qty == 2
    assert engine.reserve("other", 5, buyer="ann").qty == 5
    assert engine.reserve("drop-c", 3).buyer is None
    assert engine.buyer_held("drop", "ann") == 2
    assert engine.buyer_held("drop", "nobody") == 0


@pytest.mark.sweeper_off
def test_release_and_expiry_give_back_and_confirm_keeps_counting(
    engine: stockade.Engine, wait: Wait
) -> None:
    stock_the_drop(engine, per_buyer=3)
    kept = engine.reserve("drop-a", 1, buyer="ann", ttl=LONG)
    dropped = engine.reserve("drop-b", 1, buyer="ann", ttl=LONG)
    lapsing = engine.reserve("drop-c", 1, buyer="ann", ttl=timedelta(seconds=0.3))
    engine.confirm(kept.id)
    engine.release(dropped.id)
    assert engine.buyer_held("drop", "ann") == 2
    wait(0.5)
    assert engine.expire_due() == 1
    assert engine.reservation(lapsing.id).state == stockade.ReservationState.EXPIRED
    assert engine.buyer_held("drop", "ann") == 1  # only the confirmed unit counts
    assert engine.reserve("drop-d", 2, buyer="ann").qty == 2
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("drop-e", 1, buyer="ann")


def test_a_lapsed_hold_expired_by_its_transition_gives_back(
    engine: stockade.Engine, wait: Wait
) -> None:
    stock_the_drop(engine, per_buyer=1)
    hold = engine.reserve("drop-a", 1, buyer="ann", ttl=timedelta(seconds=0.3))
    wait(0.5)
    with pytest.raises(stockade.ReservationExpired):
        engine.confirm(hold.id)
    assert engine.buyer_held("drop", "ann") == 0
    assert engine.reserve("drop-b", 1, buyer="ann").qty == 1


@pytest.mark.parametrize("how", ALL_STRATEGIES)
def test_every_strategy_keeps_the_limit(engine: stockade.Engine, how: str) -> None:
    stock_the_drop(engine, per_buyer=3)
    assert engine.reserve("drop-a", 2, buyer="ann", strategy=how).qty == 2
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("drop-b", 2, buyer="ann", strategy=how)
    held = engine.reserve("drop-b", 1, buyer="ann", strategy=how)
    engine.release(held.id)
    assert engine.reserve("drop-c", 1, buyer="ann", strategy=how).qty == 1
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("drop-d", 1, buyer="ann", strategy=how)
    assert engine.buyer_held("drop", "ann") == 3


def test_an_order_counts_every_line_all_or_nothing(engine: stockade.Engine) -> None:
    stock_the_drop(engine, per_buyer=3)
    made = engine.reserve_order({"drop-a": 1, "drop-b": 1, "other": 7}, buyer="ann")
    assert [r.buyer for r in made] == ["ann"] * 3
    assert engine.buyer_held("drop", "ann") == 2
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve_order({"drop-c": 1, "drop-d": 1}, buyer="ann")
    assert engine.buyer_held("drop", "ann") == 2
    assert engine.stock("drop-c").reserved == 0
    # Refused for stock, the order gives its allowance back (nothing was taken).
    with pytest.raises(stockade.OutOfStock):
        engine.reserve_order({"drop-c": 1, "other": 10_000}, buyer="ann")
    assert engine.buyer_held("drop", "ann") == 2
    assert engine.reserve_order({"drop-c": 1}, buyer="ann")[0].qty == 1


def test_keys_replay_per_buyer(engine: stockade.Engine) -> None:
    stock_the_drop(engine)
    first = engine.reserve("drop-a", 1, buyer="ann", idempotency_key="k1")
    assert engine.reserve("drop-a", 1, buyer="ann", idempotency_key="k1").id == first.id
    assert engine.buyer_held("drop", "ann") == 1  # a replay counts nothing
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("drop-a", 1, buyer="bob", idempotency_key="k1")
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("drop-a", 1, idempotency_key="k1")


def test_groups_are_replaced_removed_and_checked(engine: stockade.Engine) -> None:
    stock_the_drop(engine, per_buyer=1)
    engine.reserve("drop-a", 1, buyer="ann")
    engine.set_purchase_limit("drop", 2, ["drop-a", "drop-b"])  # a new limit and SKU set
    assert engine.reserve("drop-b", 1, buyer="ann").qty == 1
    assert engine.reserve("drop-c", 5, buyer="ann").qty == 5  # no longer in the group
    with pytest.raises(stockade.InvalidState, match="already in purchase-limit group"):
        engine.set_purchase_limit("other-drop", 1, ["drop-c", "drop-a"])
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("drop-a", 1, buyer="ann")  # the refused group changed nothing
    assert engine.remove_purchase_limit("drop") is True
    assert engine.remove_purchase_limit("drop") is False
    assert engine.buyer_held("drop", "ann") == 0
    assert engine.reserve("drop-a", 4, buyer="ann").qty == 4
    for bad in (
        lambda: engine.set_purchase_limit("", 1, ["x"]),
        lambda: engine.set_purchase_limit("g", 0, ["x"]),
        lambda: engine.set_purchase_limit("g", 1, []),
        lambda: engine.set_purchase_limit("g", 1, ["x", "x"]),
        lambda: engine.set_purchase_limit("g", 1, ["x" * 300]),
        lambda: engine.reserve("drop-a", 1, buyer=""),
        lambda: engine.reserve("drop-a", 1, buyer="b" * 257),
    ):
        with pytest.raises(stockade.InvalidArgument):
            bad()
    with pytest.raises(stockade.InvalidType):
        engine.set_purchase_limit("g", 1, "drop-a")  # a str is not a list of SKUs
    endless = (f"sku-{i}" for i in itertools.count())
    with pytest.raises(stockade.InvalidArgument, match="at most 10000 skus"):
        engine.set_purchase_limit("g", 1, endless)  # refused, not consumed
    assert engine.reserve("drop-a", 1, buyer="ann").qty == 1  # nothing changed: no limit


def _buyers_race(engine: stockade.Engine, reserve_one: object, buyers: int = 8) -> Counter[str]:
    """8 buyers x 8 threads, each thread one unit on a SKU of the group (spread over the
    five): returns the units granted per buyer."""
    call = reserve_one  # (engine, sku, buyer) -> object

    def racer(i: int) -> str:
        buyer = f"buyer-{i % buyers}"
        try:
            call(engine, DROP[i % len(DROP)], buyer)  # type: ignore[operator]
            return buyer
        except (stockade.LimitExceeded, stockade.RetriesExhausted, stockade.Overloaded):
            return ""

    out = race(buyers * 8, racer)
    assert out.errors == [None] * (buyers * 8)
    return Counter(b for b in out.results if b)


@pytest.mark.parametrize("how", ALL_STRATEGIES)
def test_race_one_buyer_on_many_skus_never_passes_the_limit(
    engine: stockade.Engine, how: str
) -> None:
    stock_the_drop(engine, per_buyer=2)

    def reserve(eng: stockade.Engine, sku: str, buyer: str) -> object:
        return eng.reserve(sku, 1, buyer=buyer, strategy=how)

    granted = _buyers_race(engine, reserve)
    assert granted == {f"buyer-{b}": 2 for b in range(8)}
    assert all(engine.buyer_held("drop", f"buyer-{b}") == 2 for b in range(8))
    assert sum(engine.stock(sku).reserved for sku in DROP) == 16


def test_buyers_counts_stay_exact_under_batches_orders_and_releases(
    batched_engine: stockade.Engine,
) -> None:
    # Many buyers at once (on Citus their counts lie on many shards), batched reserves on
    # every SKU of the group (several flushers, so batches overlap on the same buyers'
    # counts), orders that take two groups' counts of one buyer per request, and batched
    # releases that give units back: every count must end equal to what its buyer holds
    # or bought, and no call may fail but on the limit (or the pool's bound).
    engine = batched_engine
    stock_the_drop(engine, per_buyer=3)
    engine.restock("extra-a", 1000)
    engine.set_purchase_limit("extra", 3, ["extra-a"])
    buyers = [f"buyer-{b}" for b in range(24)]

    def racer(i: int) -> int:
        buyer = buyers[i % len(buyers)]
        refused = 0
        for k in range(6):
            try:
                if k % 3 == 2:
                    engine.reserve_order({DROP[(i + k) % 5]: 1, "extra-a": 1}, buyer=buyer)
                    continue
                r = engine.reserve(DROP[(i + k) % 5], 1, buyer=buyer)
                if k % 3 == 1:
                    engine.release(r.id)
            except stockade.LimitExceeded:
                refused += 1
            except stockade.Overloaded:
                pass
        return refused

    out = race(48, racer)
    assert out.errors == [None] * 48
    assert sum(r for r in out.results if r) > 0  # the limit was reached
    total = 0
    for buyer in buyers:
        held = {"drop": 0, "extra": 0}
        for r in engine.reservations(buyer=buyer, limit=1000):
            held["extra" if r.sku == "extra-a" else "drop"] += r.held + r.confirmed
        assert engine.buyer_held("drop", buyer) == held["drop"] <= 3, buyer
        assert engine.buyer_held("extra", buyer) == held["extra"] <= 3, buyer
        total += held["drop"] + held["extra"]
    assert total > 0
    assert engine.audit().ok


def test_canary_the_naive_check_then_insert_shows_write_skew(engine: stockade.Engine) -> None:
    stock_the_drop(engine, per_buyer=2)

    def naive(eng: stockade.Engine, sku: str, buyer: str) -> object:
        return limited_reserve_by_check(eng, sku, 1, buyer=buyer, window=timedelta(milliseconds=20))

    granted = _buyers_race(engine, naive)
    assert max(granted.values()) > 2, granted  # some buyer got past the limit


def test_serializable_check_then_insert_has_no_skew_either(
    stockade_engine: stockade.Engine,
) -> None:
    # The alternative the benchmark measures: correct, but it pays in aborts.
    stock_the_drop(stockade_engine, per_buyer=2)

    def serializable(eng: stockade.Engine, sku: str, buyer: str) -> object:
        return limited_reserve_by_check(
            eng, sku, 1, buyer=buyer, serializable=True, window=timedelta(milliseconds=5)
        )

    granted = _buyers_race(stockade_engine, serializable, buyers=4)
    assert max(granted.values()) <= 2, granted


def test_batched_counts_a_buyers_earlier_requests_in_the_same_batch(
    engine: stockade.Engine,
) -> None:
    stock_the_drop(engine, per_buyer=3)

    async def main() -> List[object]:
        calls = [
            engine.reserve_async(DROP[i % 5], 1, buyer="ann", strategy="batched") for i in range(40)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    out = asyncio.run(main())
    assert sum(isinstance(r, stockade.Reservation) for r in out) == 3
    assert all(isinstance(r, (stockade.Reservation, stockade.LimitExceeded)) for r in out), out
    assert engine.buyer_held("drop", "ann") == 3
    assert sum(engine.stock(sku).reserved for sku in DROP) == 3


def test_the_async_twins(engine: stockade.Engine) -> None:
    async def main() -> None:
        for sku in DROP:
            await engine.restock_async(sku, 10)
        await engine.set_purchase_limit_async("drop", 1, iter(DROP))
        await engine.reserve_order_async({"drop-a": 1}, buyer="ann")
        with pytest.raises(stockade.LimitExceeded):
            await engine.reserve_async("drop-b", 1, buyer="ann")
        assert await engine.buyer_held_async("drop", "ann") == 1
        assert await engine.remove_purchase_limit_async("drop")

    asyncio.run(main())


def test_the_error_is_in_the_taxonomy() -> None:
    assert stockade.LimitExceeded("x").http_status == 409
    assert not stockade.LimitExceeded("x").retryable
    assert "limit_exceeded" in stockade._core.ERROR_CODES
