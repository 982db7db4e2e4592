"""The whole API from asyncio: every call's twin, the async constructor, aclose() and
``async with``; and the event loop keeps running while a call waits on the database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import stockade
from stockade.testing import hold_lock


def test_every_twin_answers_as_its_blocking_call(engine: stockade.Engine) -> None:
    async def main() -> None:
        assert (await engine.restock_async("s", 10)).on_hand == 10
        assert (await engine.set_on_hand_async("s", 12)).on_hand == 12
        assert await engine.stock_async("s") == engine.stock("s")
        r = await engine.reserve_async("s", 2, ttl=timedelta(seconds=60))
        assert await engine.reservation_async(r.id) == r
        assert await engine.get_reservation_async(r.id) == r
        assert await engine.expire_due_async(limit=10) == 0
        stats = await engine.stats_async(sku_limit=5)
        assert stats["held_count"] == 1
        assert (await engine.row_counts_async())["reservation_count"] == 1
        assert isinstance(await engine.migrate_async(), list)
        with pytest.raises(stockade.NotFound):
            await engine.stock_async("nope")
        with pytest.raises(stockade.InvalidArgument):
            await engine.restock_async("s", 0)

    asyncio.run(main())


def test_connect_aclose_and_async_with(stockade_database: str) -> None:
    async def main() -> None:
        async with await stockade.Engine.connect(stockade_database, pool_size=2) as eng:
            await eng.restock_async("s", 3)
            assert (await eng.reserve_async("s", 1)).qty == 1
        with pytest.raises(stockade.Unavailable, match="the engine is closed"):
            await eng.stock_async("s")
        with pytest.raises(stockade.Unavailable):
            await stockade.Engine.connect("host=127.0.0.1 port=1 connect_timeout=2")

    asyncio.run(main())


def test_the_event_loop_runs_while_a_call_waits_for_a_lock(stockade_database: str) -> None:
    # restock waits for the row lock another session holds; meanwhile a ticker on the
    # same loop must keep ticking (a blocking call on the loop would freeze it).
    with (
        stockade.Engine.postgres(stockade_database, pool_size=1) as holder,
        stockade.Engine.postgres(stockade_database, pool_size=2) as eng,
    ):
        eng.restock("s", 1)

        async def main() -> int:
            ticks = 0
            with hold_lock(holder, "s"):
                waiting = asyncio.ensure_future(eng.restock_async("s", 1))
                for _ in range(20):
                    await asyncio.sleep(0.01)
                    ticks += 1
                assert not waiting.done()
            assert (await waiting).on_hand == 2
            return ticks

        assert asyncio.run(main()) == 20
