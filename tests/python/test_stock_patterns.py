"""Backorders, soft delete and leases with fencing tokens, on both stores.

Each pattern has its semantics tested call by call, and a race that fails without it:
backorders sell out exactly on_hand + backorder_limit; nothing is granted after a
discontinue returns; no write without the token lands after a lease is acquired; of many
acquirers exactly one wins; a paused holder's late write is refused.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Callable, List, Tuple

import pytest

import stockade
from stockade.testing import race
from support import ALL_STRATEGIES, PER_REQUEST_STRATEGIES, Wait, until_decided, wait_for

LONG = timedelta(minutes=10)
BUYERS = 128


def writes_until_refused(
    write: Callable[[int], object], refused: type, close: Callable[[], object]
) -> Tuple[int, int]:
    """16 threads write in a loop until `refused` is raised; once 50 writes landed, `close`
    runs. Returns (writes that landed, writes that landed though they started after
    `close` returned): the second must be 0."""
    closed = threading.Event()
    late: List[int] = []
    landed: List[int] = []
    stop = time.monotonic() + 20

    def writer(i: int) -> None:
        while time.monotonic() < stop:
            started_after = closed.is_set()
            try:
                write(i)
            except refused:
                return
            except stockade.RetriesExhausted:
                continue
            landed.append(i)
            if started_after:
                late.append(i)
        raise AssertionError(f"never saw {refused.__name__}")

    def close_after_50() -> None:
        assert wait_for(lambda: len(landed) >= 50)
        close()
        closed.set()

    out = race(16, writer, meanwhile=close_after_50)
    assert not any(out.errors), out.errors
    return len(landed), len(late)


# --- backorders ---


def test_backorder_limit_lets_holds_pass_on_hand_and_no_further(engine: stockade.Engine) -> None:
    engine.restock("pre", 5)
    assert engine.stock("pre").backorder_limit == 0
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("pre", 6)  # the default: nothing beyond on_hand
    level = engine.set_backorder_limit("pre", 3)
    assert (level.backorder_limit, level.available, level.backordered) == (3, 8, 0)
    holds = [engine.reserve("pre", 2, ttl=LONG) for _ in range(4)]
    level = engine.stock("pre")
    assert (level.on_hand, level.reserved, level.available, level.backordered) == (5, 8, 0, 3)
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("pre", 1)
    with pytest.raises(stockade.OutOfStock):
        engine.sell("pre", 1)
    assert engine.stock("pre") == level  # refusals change nothing
    # Confirming them takes on_hand below zero: three units sold and owed.
    for hold in holds:
        engine.confirm(hold.id)
    level = engine.stock("pre")
    assert (level.on_hand, level.reserved, level.available, level.backordered) == (-3, 0, 0, 3)
    level = engine.restock("pre", 10)
    assert (level.on_hand, level.available, level.backordered) == (7, 10, 0)


def test_backorders_sell_into_the_limit_and_release_gives_it_back(
    engine: stockade.Engine,
) -> None:
    engine.restock("pre", 1)
    engine.set_backorder_limit("pre", 2)
    assert engine.sell("pre", 2).on_hand == -1
    hold = engine.reserve("pre", 1, ttl=LONG)
    assert engine.stock("pre").available == 0
    engine.release(hold.id)
    assert engine.stock("pre").available == 1


def test_lowering_the_backorder_limit_below_what_is_promised_is_refused(
    engine: stockade.Engine,
) -> None:
    engine.restock("pre", 2)
    engine.set_backorder_limit("pre", 5)
    engine.reserve("pre", 6, ttl=LONG)
    before = engine.stock("pre")
    with pytest.raises(stockade.InvalidState, match="would not cover"):
        engine.set_backorder_limit("pre", 3)
    with pytest.raises(stockade.InvalidState, match="would not cover"):
        engine.set_on_hand("pre", 0)
    assert engine.stock("pre") == before
    assert engine.set_backorder_limit("pre", 4).available == 0
    assert engine.set_on_hand("pre", 3).available == 1
    with pytest.raises(stockade.InvalidArgument):
        engine.set_backorder_limit("pre", -1)
    with pytest.raises(stockade.InvalidArgument):
        engine.set_backorder_limit("pre", stockade.QUANTITY_MAX + 1)
    with pytest.raises(stockade.NotFound):
        engine.set_backorder_limit("never", 1)
    with pytest.raises(stockade.VersionConflict):
        engine.set_backorder_limit("pre", 9, expected_version=1)


@pytest.mark.parametrize("how", ALL_STRATEGIES)
def test_race_sells_out_exactly_on_hand_plus_backorder_limit(
    engine: stockade.Engine, how: str
) -> None:
    engine.restock("hot", 60)
    engine.set_backorder_limit("hot", 40)
    out = race(BUYERS, lambda i: until_decided(lambda: engine.reserve("hot", 1, strategy=how)))
    assert out.errors == [None] * BUYERS
    assert sum(out.results) == 100
    level = engine.stock("hot")
    assert (level.on_hand, level.reserved, level.available, level.backordered) == (60, 100, 0, 40)


def test_the_check_constraint_keeps_what_is_claimed_within_on_hand_plus_backorder_limit(
    stockade_engine: stockade.Engine, stockade_database: str
) -> None:
    from stockade.tools.pgserver import run_sql

    stockade_engine.restock("s", 2)
    stockade_engine.set_backorder_limit("s", 1)
    run_sql(stockade_database, "UPDATE stockade.stock SET reserved = 3")  # within: passes
    with pytest.raises(Exception, match="stock_claimed_within_limit"):
        run_sql(stockade_database, "UPDATE stockade.stock SET reserved = 4")
    # Damaged and quality-control units count with the holds (migration 013).
    run_sql(stockade_database, "UPDATE stockade.stock SET reserved = 1")
    with pytest.raises(Exception, match="stock_claimed_within_limit"):
        run_sql(stockade_database, "UPDATE stockade.stock SET damaged = 2, quality_control = 1")
    with pytest.raises(Exception, match="stock_states_nonnegative"):
        run_sql(stockade_database, "UPDATE stockade.stock SET safety_stock = -1")
    with pytest.raises(Exception, match="stock_backorder_limit_nonnegative"):
        run_sql(stockade_database, "UPDATE stockade.stock SET backorder_limit = -1")


# --- soft delete ---


def test_discontinue_refuses_new_writes_and_keeps_the_tombstone(
    engine: stockade.Engine, strategy: str
) -> None:
    engine.restock("old", 10)
    hold = engine.reserve("old", 2, ttl=LONG)
    confirmed_later = engine.reserve("old", 3, ttl=LONG)
    gone = engine.discontinue("old")
    assert gone.discontinued and (gone.on_hand, gone.reserved) == (10, 5)
    assert engine.stock("old") == gone
    for write in (
        lambda: engine.reserve("old", 1, strategy=strategy),
        lambda: engine.reserve_order({"old": 1}, strategy=strategy),
        lambda: engine.sell("old", 1, strategy=strategy),
        lambda: engine.restock("old", 1),
        lambda: engine.set_on_hand("old", 20),
        lambda: engine.set_backorder_limit("old", 1),
    ):
        with pytest.raises(stockade.Discontinued) as caught:
            write()
        assert caught.value.http_status == 410 and caught.value.sku == "old"
    assert engine.stock("old") == gone  # nothing changed
    # Holds that exist still end as they should.
    engine.release(hold.id)
    engine.confirm(confirmed_later.id)
    level = engine.stock("old")
    assert level.discontinued and (level.on_hand, level.reserved) == (7, 0)
    assert engine.discontinue("old") == level  # again: nothing changes
    back = engine.reinstate("old")
    assert not back.discontinued and back.version == level.version + 1
    assert engine.reserve("old", 1, strategy=strategy).qty == 1
    assert engine.reinstate("old").version == back.version + 1  # the reserve moved it


def test_conditional_writes_tell_changed_deleted_and_never_existed_apart(
    engine: stockade.Engine,
) -> None:
    level = engine.restock("s", 5)
    engine.restock("s", 1)
    with pytest.raises(stockade.VersionConflict) as changed:
        engine.reserve("s", 1, expected_version=level.version)
    engine.discontinue("s")
    with pytest.raises(stockade.Discontinued) as deleted:
        engine.reserve("s", 1, expected_version=level.version)
    with pytest.raises(stockade.NotFound) as never:
        engine.reserve("never", 1, expected_version=1)
    assert [e.value.http_status for e in (changed, deleted, never)] == [412, 410, 404]
    with pytest.raises(stockade.Discontinued):
        engine.sell("s", 1, expected_version=engine.stock("s").version)
    with pytest.raises(stockade.VersionConflict):
        engine.discontinue("s", expected_version=level.version)
    with pytest.raises(stockade.NotFound):
        engine.discontinue("never")
    with pytest.raises(stockade.VersionConflict):
        engine.reinstate("s", expected_version=level.version)
    assert not engine.reinstate("s", expected_version=engine.stock("s").version).discontinued


@pytest.mark.parametrize("how", ALL_STRATEGIES)
def test_race_nothing_is_granted_after_discontinue_returns(
    engine: stockade.Engine, how: str
) -> None:
    engine.restock("hot", 1_000_000)
    landed, late = writes_until_refused(
        lambda i: engine.reserve("hot", 1, strategy=how),
        stockade.Discontinued,
        lambda: engine.discontinue("hot"),
    )
    assert late == 0
    assert engine.stock("hot").reserved == landed


# --- leases with fencing tokens ---


def test_a_lease_fences_writes_until_released(engine: stockade.Engine, strategy: str) -> None:
    engine.restock("s", 10)
    hold = engine.reserve("s", 2, ttl=LONG)
    lease = engine.acquire_lease("s", LONG, owner="cycle-count")
    assert (lease.resource, lease.sku, lease.location, lease.owner) == (
        "s",
        "s",
        "default",
        "cycle-count",
    )
    level = engine.stock("s")
    assert level.leased and level.lease_expires_at == lease.expires_at
    for write in (
        lambda: engine.restock("s", 1),
        lambda: engine.set_on_hand("s", 3),
        lambda: engine.sell("s", 1, strategy=strategy),
        lambda: engine.reserve("s", 1, strategy=strategy),
        lambda: engine.reserve_order({"s": 1}, strategy=strategy),
        lambda: engine.discontinue("s"),
        lambda: engine.set_backorder_limit("s", 1),
    ):
        with pytest.raises(stockade.LeaseHeld) as caught:
            write()
        assert caught.value.http_status == 409 and caught.value.retryable
    assert engine.stock("s") == level
    with pytest.raises(stockade.LeaseHeld):
        engine.acquire_lease("s", LONG)
    # The holder writes with its token; holds that exist still end.
    assert engine.set_on_hand("s", 7, fencing_token=lease.token).on_hand == 7
    assert engine.sell("s", 1, strategy=strategy, fencing_token=lease.token).on_hand == 6
    assert engine.restock("s", 1, fencing_token=lease.token).on_hand == 7
    assert engine.confirm(hold.id).state == stockade.ReservationState.CONFIRMED
    assert engine.release_lease(lease) is True
    assert engine.release_lease(lease) is False
    assert not engine.stock("s").leased
    assert engine.reserve("s", 1, strategy=strategy).qty == 1
    # Released and not superseded: its token still fences (no newer lease exists) ...
    assert engine.restock("s", 1, fencing_token=lease.token).on_hand == 6
    # ... until someone acquires.
    second = engine.acquire_lease("s", LONG)
    assert second.token > lease.token
    with pytest.raises(stockade.FencingTokenStale):
        engine.restock("s", 1, fencing_token=lease.token)


def test_a_holder_paused_past_its_ttl_is_fenced_off(engine: stockade.Engine, wait: Wait) -> None:
    engine.restock("s", 10)
    first = engine.acquire_lease("s", timedelta(seconds=0.5), owner="first")
    wait(0.7)  # the first holder pauses (GC, network) past its lease
    assert not engine.stock("s").leased
    with pytest.raises(stockade.FencingTokenStale, match="lapsed"):
        engine.renew_lease(first, LONG)
    second = engine.acquire_lease("s", LONG, owner="second")
    assert second.token > first.token
    before = engine.stock("s")
    with pytest.raises(stockade.FencingTokenStale) as late:
        engine.set_on_hand("s", 99, fencing_token=first.token)  # the late write
    assert late.value.http_status == 409 and not late.value.retryable
    with pytest.raises(stockade.FencingTokenStale):
        engine.sell("s", 1, fencing_token=first.token)
    assert engine.stock("s") == before
    assert engine.set_on_hand("s", 4, fencing_token=second.token).on_hand == 4
    assert engine.release_lease(first) is False  # not the first's to release any more
    assert engine.stock("s").leased
    with pytest.raises(stockade.FencingTokenStale, match="not issued"):
        engine.restock("s", 1, fencing_token=second.token + 1000)


def test_renew_extends_a_live_lease(engine: stockade.Engine, wait: Wait) -> None:
    lease = engine.acquire_lease("new", timedelta(seconds=0.5))
    assert engine.stock("new").on_hand == 0  # a lease makes its row
    renewed = engine.renew_lease(lease, timedelta(minutes=5))
    assert renewed.token == lease.token and renewed.expires_at > lease.expires_at
    assert renewed.owner == lease.owner
    wait(0.7)
    assert engine.stock("new").leased  # the renewal holds
    with pytest.raises(stockade.LeaseHeld):
        engine.acquire_lease("new", LONG)


def test_race_of_acquirers_has_exactly_one_winner(engine: stockade.Engine) -> None:
    engine.restock("s", 1)
    out = race(32, lambda i: engine.acquire_lease("s", LONG, owner=f"worker-{i}"))
    winners = [r for r in out.results if r is not None]
    assert len(winners) == 1
    assert all(isinstance(e, stockade.LeaseHeld) for e in out.errors if e is not None)
    assert sum(e is not None for e in out.errors) == 31


def test_tokens_strictly_increase_across_holders_and_rows(engine: stockade.Engine) -> None:
    tokens = []
    for i in range(5):
        for sku in ("a", "b"):
            lease = engine.acquire_lease(sku, LONG, owner=f"h{i}")
            tokens.append(lease.token)
            engine.release_lease(lease)
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


@pytest.mark.parametrize("how", ALL_STRATEGIES)
def test_race_no_write_without_the_token_lands_after_acquire_returns(
    engine: stockade.Engine, how: str
) -> None:
    engine.restock("hot", 1_000_000)
    leases: List[stockade.Lease] = []

    def write(i: int) -> object:
        if i % 2:
            return engine.reserve("hot", 1, strategy=how)
        return engine.sell("hot", 1, strategy=how)

    landed, late = writes_until_refused(
        write, stockade.LeaseHeld, lambda: leases.append(engine.acquire_lease("hot", LONG))
    )
    assert late == 0
    level = engine.stock("hot")
    assert level.reserved + (1_000_000 - level.on_hand) == landed
    assert engine.release_lease(leases[0])


def test_a_sigkilled_holder_lease_lapses(stockade_database: str) -> None:
    script = (
        "import sys, time, datetime, stockade\n"
        "eng = stockade.Engine.postgres(sys.argv[1], pool_size=1)\n"
        "lease = eng.acquire_lease('s', datetime.timedelta(seconds=3), owner='doomed')\n"
        "print(lease.token, flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, stockade_database], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        token = int(holder.stdout.readline())
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()
    with stockade.Engine.postgres(stockade_database, pool_size=1) as eng:
        with pytest.raises(stockade.LeaseHeld):
            eng.acquire_lease("s", LONG)  # live until its TTL runs out
        with pytest.raises(stockade.LeaseHeld):
            eng.restock("s", 1)
        won: List[stockade.Lease] = []

        def acquire() -> bool:
            try:
                won.append(eng.acquire_lease("s", LONG, owner="next"))
                return True
            except stockade.LeaseHeld:
                return False

        assert wait_for(acquire, seconds=10)
        assert won[0].token > token
        with pytest.raises(stockade.FencingTokenStale):
            eng.restock("s", 1, fencing_token=token)


def test_lease_arguments_are_checked(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.InvalidArgument):
        engine.acquire_lease("s", timedelta(0))
    with pytest.raises(stockade.InvalidArgument):
        engine.acquire_lease("s", LONG, owner="")
    with pytest.raises(stockade.InvalidArgument):
        engine.acquire_lease("s", LONG, owner="x" * 257)
    with pytest.raises(stockade.InvalidType):
        engine.renew_lease("not a lease", LONG)  # type: ignore[arg-type]
    with pytest.raises(stockade.InvalidArgument):
        engine.restock("s", 1, fencing_token=0)
    with pytest.raises(stockade.InvalidType):
        engine.restock("s", 1, fencing_token="1")  # type: ignore[arg-type]
    with pytest.raises(stockade.NotFound):
        engine.restock("nothing", 1, fencing_token=1)  # a token implies a leased row
    with pytest.raises(stockade.NotFound):
        engine.discontinue("nothing")


def test_the_async_twins(engine: stockade.Engine) -> None:
    import asyncio

    async def main() -> None:
        await engine.restock_async("s", 3)
        assert (await engine.set_backorder_limit_async("s", 2)).available == 5
        lease = await engine.acquire_lease_async("s", LONG, owner="async")
        assert (await engine.renew_lease_async(lease, LONG)).token == lease.token
        level = await engine.sell_async("s", 4, fencing_token=lease.token)
        assert (level.on_hand, level.backordered) == (-1, 1)
        assert (await engine.discontinue_async("s", fencing_token=lease.token)).discontinued
        assert await engine.release_lease_async(lease)
        assert not (await engine.reinstate_async("s")).discontinued
        lease2 = await engine.acquire_lease_async("s", LONG)
        with pytest.raises(stockade.LeaseHeld):
            await engine.set_on_hand_async("s", 5)
        assert (await engine.set_on_hand_async("s", 5, fencing_token=lease2.token)).on_hand == 5
        assert (await engine.restock_async("s", 1, fencing_token=lease2.token)).on_hand == 6

    asyncio.run(main())


def test_every_new_error_is_in_the_taxonomy() -> None:
    assert stockade.Discontinued("x").http_status == 410
    assert stockade.LeaseHeld("x").retry_after == 1.0
    assert not stockade.FencingTokenStale("x").retryable
    assert {"discontinued", "lease_held", "fencing_token_stale"} <= set(stockade._core.ERROR_CODES)


@pytest.mark.parametrize("strategy_name", PER_REQUEST_STRATEGIES)
def test_fenced_sells_race_with_the_holder_and_never_oversell(
    engine: stockade.Engine, strategy_name: str
) -> None:
    engine.restock("s", 50)
    lease = engine.acquire_lease("s", LONG)
    out = race(
        64,
        lambda i: until_decided(
            lambda: engine.sell("s", 1, strategy=strategy_name, fencing_token=lease.token)
        ),
    )
    assert out.errors == [None] * 64
    assert sum(out.results) == 50
    assert engine.stock("s").on_hand == 0
