"""The hot-row layer, on both stores: batched and auto under races of threads and of
asyncio tasks, arrival-order decisions, idempotency keys inside batches, async
completions and close, and (on PostgreSQL) batches whose connection breaks.

Goal of the races: no oversell, no undersell, every granted reservation stored once.
Method: threads released together by a barrier (stockade.testing.race), or thousands of
asyncio tasks gathered at once, against fewer units than buyers.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import threading
import uuid
from datetime import timedelta
from typing import Callable, List, Union

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade import Reservation
from stockade.testing import race
from stockade.tools.pgserver import run_sql
from support import assert_audit_clean, field, in_doubt_after_cut, wait_for, wait_for_session

HOT = ["batched", "auto"]


def granted_of(results: List[object]) -> List[Reservation]:
    return [r for r in results if isinstance(r, Reservation)]


def assert_stored_once(engine: stockade.Engine, made: List[Reservation], units: int) -> None:
    assert len({r.id for r in made}) == len(made) == units
    lvl = engine.stock("hot")
    assert (lvl.reserved, lvl.available) == (units, lvl.on_hand - units)
    assert engine.row_counts()["reservation_count"] == units
    for r in random.Random(7).sample(made, min(len(made), 25)):
        assert engine.reservation(r.id) == r


@pytest.mark.parametrize("strategy", HOT)
def test_race_of_512_threads_grants_exactly_the_units(
    engine: stockade.Engine, strategy: str
) -> None:
    engine.restock("hot", 200)

    def buy(i: int) -> Union[Reservation, str]:
        try:
            return engine.reserve("hot", 1, strategy=strategy)
        except stockade.OutOfStock:
            return "refused"

    out = race(512, buy)
    assert out.errors == [None] * 512
    assert out.results.count("refused") == 312
    assert_stored_once(engine, granted_of(out.results), 200)


@pytest.mark.parametrize("strategy", HOT)
def test_race_of_5000_asyncio_tasks_grants_exactly_the_units(
    engine: stockade.Engine, strategy: str
) -> None:
    engine.restock("hot", 1000)

    async def buyers() -> List[object]:
        return await asyncio.gather(
            *(engine.reserve_async("hot", 1, strategy=strategy) for _ in range(5000)),
            return_exceptions=True,
        )

    results = asyncio.run(buyers())
    refused = [r for r in results if isinstance(r, stockade.OutOfStock)]
    assert len(refused) == 4000, [r for r in results if isinstance(r, Exception)][:3]
    assert_stored_once(engine, granted_of(results), 1000)


def test_batches_over_many_skus_grant_exactly_each_skus_units(stockade_database: str) -> None:
    # One shard, so that requests for eight SKUs share batches: the batch statements that
    # lock and write several rows at once, sorted, decide each row on its own.
    with stockade.Engine.postgres(stockade_database, batch_shards=1, pool_size=4) as eng:
        skus = [f"sku-{i}" for i in range(8)]
        for sku in skus:
            eng.restock(sku, 20)

        def buy(i: int) -> str:
            try:
                return eng.reserve(skus[i % 8], 1, strategy="batched").sku
            except stockade.OutOfStock:
                return "refused"

        out = race(256, buy)
        assert out.errors == [None] * 256
        assert out.results.count("refused") == 256 - 160
        for sku in skus:
            assert out.results.count(sku) == 20
            assert eng.stock(sku).reserved == 20
        assert eng.stats()["batcher"]["batch_size_max"] > 1


def test_refusals_follow_arrival_order(engine: stockade.Engine) -> None:
    # Arrival-order allocation grants while units last: stock only shrinks during the race,
    # so a refused request cannot be one that would still fit in what is left.
    engine.restock("hot", 300)
    sizes = [random.Random(i).randint(1, 6) for i in range(256)]

    def buy(i: int) -> int:
        try:
            engine.reserve("hot", sizes[i], strategy="batched")
            return sizes[i]
        except stockade.OutOfStock:
            return -sizes[i]

    out = race(256, buy)
    assert out.errors == [None] * 256
    granted = sum(q for q in out.results if q > 0)
    left = engine.stock("hot").available
    assert granted + left == 300 and granted <= 300
    assert all(-q > left for q in out.results if q < 0), (left, sorted(out.results)[:5])


def test_duplicate_keys_inside_batches_get_one_reservation(engine: stockade.Engine) -> None:
    engine.restock("hot", 10)
    out = race(64, lambda i: engine.reserve("hot", 2, idempotency_key="cart-1", strategy="batched"))
    assert out.errors == [None] * 64
    assert len({r.id for r in out.results}) == 1
    assert engine.stock("hot").reserved == 2
    # The same key for a different request, in a later batch: a conflict.
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("hot", 3, idempotency_key="cart-1", strategy="batched")
    # A replay from a later batch returns the original.
    again = engine.reserve("hot", 2, idempotency_key="cart-1", strategy="batched")
    assert again == out.results[0]


def test_replays_mixed_into_batches_of_fresh_keys_move_the_row_once_per_key(
    engine: stockade.Engine,
) -> None:
    # Batches of distinct keys on one row take the keyed fast statement; a key in it that
    # was committed before fails that statement as a whole (PostgreSQL), and the full path
    # replays that key and grants the fresh ones: nothing is granted twice or lost.
    engine.restock("hot", 1000)
    first = {
        n: engine.reserve("hot", 1, idempotency_key=f"k-{n}", strategy="batched")
        for n in range(0, 64, 4)
    }
    version = engine.stock("hot").version
    out = race(64, lambda n: engine.reserve("hot", 1, idempotency_key=f"k-{n}", strategy="batched"))
    assert out.errors == [None] * 64
    for n, made in first.items():
        assert out.results[n] == made
    fresh = [r for n, r in enumerate(out.results) if n not in first]
    assert len({r.id for r in fresh}) == 48
    assert not {r.id for r in fresh} & {r.id for r in first.values()}
    after = engine.stock("hot")
    assert after.reserved == 64
    assert after.version == version + 48
    assert engine.row_counts()["reservation_count"] == 64


def test_a_key_used_for_two_requests_in_one_race_grants_one(engine: stockade.Engine) -> None:
    engine.restock("hot", 100)

    def buy(i: int) -> Reservation:
        return engine.reserve("hot", 1 + i % 2, idempotency_key="k", strategy="batched")

    out = race(64, buy)
    made = {r.id for r in out.results if isinstance(r, Reservation)}
    conflicts = [e for e in out.errors if isinstance(e, stockade.IdempotencyConflict)]
    assert len(made) == 1 and len(conflicts) == 32
    assert all(e is None or isinstance(e, stockade.IdempotencyConflict) for e in out.errors)
    assert engine.row_counts()["reservation_count"] == 1


def test_a_refused_key_is_free_to_retry(engine: stockade.Engine) -> None:
    engine.restock("hot", 3)
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("hot", 5, idempotency_key="k", strategy="batched")
    engine.restock("hot", 2)
    assert engine.reserve("hot", 5, idempotency_key="k", strategy="batched").qty == 5


def test_sells_and_holds_in_shared_batches_move_the_version_once_per_change(
    engine: stockade.Engine,
) -> None:
    start = engine.restock("hot", 1000).version

    def act(i: int) -> object:
        if i % 2:
            return engine.sell("hot", 1, strategy="batched")
        return engine.reserve("hot", 1, strategy="batched")

    out = race(128, act)
    assert out.errors == [None] * 128
    lvl = engine.stock("hot")
    assert (lvl.on_hand, lvl.reserved, lvl.version) == (936, 64, start + 128)
    levels = [r for r in out.results if isinstance(r, stockade.StockLevel)]
    # Each sell reports the row right after it: distinct versions, consistent figures.
    assert len({lv.version for lv in levels}) == 64
    assert all(start < lv.version <= start + 128 and lv.on_hand >= 936 for lv in levels)


def test_auto_batches_a_hot_sku_and_leaves_a_cold_one_atomic(
    stockade_engine: stockade.Engine,
) -> None:
    # On PostgreSQL, where a request stays in flight for a round trip, 64 threads at once
    # make the row hot; three calls one after another leave another row cold.
    engine = stockade_engine
    engine.restock("hot", 10_000)
    engine.restock("cold", 10)
    out = race(64, lambda i: engine.reserve("hot", 1))
    assert out.errors == [None] * 64
    for _ in range(3):
        engine.reserve("cold", 1)
    skus = {s["sku"]: s for s in engine.stats(sku_limit=10)["hottest_skus"]}
    assert skus["hot"]["mode"] == "batched" and skus["cold"]["mode"] == "atomic"
    assert engine.stats()["batcher"]["requests"] > 0
    hot, cold = engine.recommend("hot"), engine.recommend("cold")
    assert hot.strategy is stockade.Strategy.BATCHED and "in flight" in str(hot)
    assert "set_slots(k)" in str(hot)  # when slots would pay, for a SKU several batch
    assert cold.strategy is stockade.Strategy.ATOMIC
    assert "slots" not in str(cold)
    assert engine.stats()["strategies"]["auto"]["granted"] == 67


def test_async_calls_raise_their_errors_when_awaited(engine: stockade.Engine) -> None:
    engine.restock("hot", 1)

    async def calls() -> None:
        with pytest.raises(stockade.NotFound):
            await engine.reserve_async("missing", 1, strategy="batched")
        with pytest.raises(stockade.InvalidArgument):
            await engine.reserve_async("hot", 0, strategy="batched")
        with pytest.raises(stockade.InvalidType):
            await engine.sell_async("hot", "1", strategy="batched")  # type: ignore[arg-type]
        r = await engine.reserve_async("hot", 1, strategy="batched")
        with pytest.raises(stockade.OutOfStock):
            await engine.sell_async("hot", 1, strategy="batched")
        assert (await engine.release_async(r.id)).state == "released"

    asyncio.run(calls())
    assert engine.stock("hot").reserved == 0


def test_a_cancelled_await_does_not_cancel_the_reservation(engine: stockade.Engine) -> None:
    engine.restock("hot", 5)

    async def cancel_one() -> None:
        task = asyncio.ensure_future(
            engine.reserve_async("hot", 2, idempotency_key="c", strategy="batched")
        )
        await asyncio.sleep(0)  # the call is queued
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The idempotency key finds out what happened to it.
        r = await engine.reserve_async("hot", 2, idempotency_key="c", strategy="batched")
        assert r.qty == 2

    asyncio.run(cancel_one())
    assert engine.stock("hot").reserved == 2


def test_close_completes_queued_async_calls_and_refuses_new_ones(
    engine: stockade.Engine,
) -> None:
    engine.restock("hot", 500)

    async def queue_then_close() -> List[object]:
        tasks = [
            asyncio.ensure_future(engine.reserve_async("hot", 1, strategy="batched"))
            for _ in range(1000)
        ]
        await asyncio.sleep(0)  # every task has queued its call
        engine.close()  # drains: every queued call completes first
        done = await asyncio.gather(*tasks, return_exceptions=True)
        with pytest.raises(stockade.Unavailable, match="the engine is closed"):
            await engine.reserve_async("hot", 1, strategy="batched")
        return done

    done = asyncio.run(queue_then_close())
    assert len(granted_of(done)) == 500
    assert sum(isinstance(d, stockade.OutOfStock) for d in done) == 500


# --- quantities near the limit ---


def test_quantities_past_quantity_max_are_refused_so_no_batch_sum_can_overflow(
    engine: stockade.Engine,
) -> None:
    # Sixteen requests of 2**60 units sum past 2**63. The bound refuses each one before it
    # is queued; requests at the bound are decided exactly on a row near the int64 range.
    engine.restock("hot", 1)
    engine.set_on_hand("hot", stockade.ON_HAND_MAX)
    huge = race(16, lambda i: engine.reserve("hot", 2**60, strategy="batched"))
    assert huge.failed_with(stockade.InvalidArgument) == 16
    assert engine.stock("hot").reserved == 0 and engine.row_counts()["reservation_count"] == 0
    made = race(64, lambda i: engine.reserve("hot", stockade.QUANTITY_MAX, strategy="batched"))
    assert made.errors == [None] * 64
    level = engine.stock("hot")
    assert (level.on_hand, level.reserved) == (stockade.ON_HAND_MAX, 64 * stockade.QUANTITY_MAX)
    assert engine.row_counts()["reservation_count"] == 64
    for r in made.succeeded():
        assert engine.reservation(r.id) == r
    assert engine.expire_due() == 0  # expiry still works on the row


def test_on_hand_stops_at_on_hand_max_so_a_rows_room_stays_in_64_bits(
    engine: stockade.Engine,
) -> None:
    # A row's room is on_hand plus its backorder limit: set_on_hand past ON_HAND_MAX, and a
    # restock that would pass it, are refused and change nothing; at the bound, the largest
    # backorder limit still leaves the room in range, and a hold takes all of it.
    engine.restock("top", 1)
    with pytest.raises(stockade.InvalidArgument, match="ON_HAND_MAX"):
        engine.set_on_hand("top", stockade.ON_HAND_MAX + 1)
    engine.set_on_hand("top", stockade.ON_HAND_MAX - 1)
    with pytest.raises(stockade.InvalidArgument, match="ON_HAND_MAX"):
        engine.restock("top", 2)
    assert engine.stock("top").on_hand == stockade.ON_HAND_MAX - 1
    engine.restock("top", 1)
    engine.set_backorder_limit("top", stockade.QUANTITY_MAX)
    made = engine.reserve("top", stockade.QUANTITY_MAX, strategy="batched")
    level = engine.stock("top")
    assert (level.on_hand, level.reserved) == (stockade.ON_HAND_MAX, stockade.QUANTITY_MAX)
    assert level.available == 2**63 - 1 - stockade.QUANTITY_MAX
    engine.release(made.id)


def test_a_slotted_sku_and_a_transfer_stop_at_on_hand_max_too(engine: stockade.Engine) -> None:
    # A slotted SKU's rows merge into one, so ON_HAND_MAX bounds them together: a restock,
    # keyed or not, that would pass it is refused and changes nothing. A transfer's units
    # arriving at a row are bounded as a restock's are.
    engine.restock("wide", 1)
    engine.set_slots("wide", 2)
    engine.set_on_hand("wide", stockade.ON_HAND_MAX)
    for key in (None, "k"):
        with pytest.raises(stockade.InvalidArgument, match="ON_HAND_MAX"):
            engine.restock("wide", 1, idempotency_key=key)
    assert engine.stock("wide").on_hand == stockade.ON_HAND_MAX
    engine.set_slots("wide", 1)  # the rows merge back into one
    engine.set_backorder_limit("wide", stockade.QUANTITY_MAX)
    assert engine.stock("wide").available == 2**63 - 1
    engine.restock("moved", 5, location="a")
    engine.set_on_hand("moved", stockade.ON_HAND_MAX - 2, location="b")
    sent = engine.transfer("moved", 5, source="a", destination="b")
    with pytest.raises(stockade.InvalidArgument, match="ON_HAND_MAX"):
        engine.receive(sent, accepted=5)
    assert engine.stock("moved", location="b").on_hand == stockade.ON_HAND_MAX - 2
    engine.receive(sent, accepted=2, rejected=3)
    assert engine.stock("moved", location="b").on_hand == stockade.ON_HAND_MAX


# --- PostgreSQL: batches whose connection breaks ---


@pytest.mark.parametrize("cut", ["after", "before"])
@pytest.mark.parametrize(
    "strategy, statement",
    [
        ("batched", "stockade_batch_fast_one"),  # a batch's one-statement fast path
        ("atomic", "stockade_hold_atomic"),  # atomic without a key: one statement too
    ],
)
def test_a_one_statement_write_cut_around_its_statement_still_answers_exactly_once(
    proxy: CommitCuttingProxy,
    stockade_database: str,
    pooled: bool,
    cut: str,
    strategy: str,
    statement: str,
) -> None:
    # A statement in autocommit commits at its Sync; the proxy cuts the connection just
    # before the statement reaches the server, or just after the server committed it. The
    # engine learns which from the reservation the statement would have written: it
    # answers with the reservation either way, and never writes it twice. (Behind a
    # transaction-mode pooler the statement runs in a transaction of its own: its COMMIT
    # is cut, and a write that did not land stays InDoubt.)
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(proxy.dsn(dbname), pool_size=2, sweeper=False) as eng:
        eng.restock("hot", 10)
        proxy.arm(cut, statement=None if pooled else statement)
        if in_doubt_after_cut(pooled, cut):
            with pytest.raises(stockade.InDoubt, match="pooler"):
                eng.reserve("hot", 3, strategy=strategy)
            assert proxy.cuts == 1
            assert eng.stock("hot").reserved == 0  # it did not land: COMMIT never arrived
            assert eng.row_counts()["reservation_count"] == 0
            return
        r = eng.reserve("hot", 3, strategy=strategy)
        assert proxy.cuts == 1
        assert eng.reservation(r.id) == r
        assert eng.stock("hot").reserved == 3
        assert eng.row_counts()["reservation_count"] == 1


def test_a_sell_only_fast_batch_cut_after_commit_is_in_doubt(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool
) -> None:
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(proxy.dsn(dbname), pool_size=2, sweeper=False) as eng:
        eng.restock("hot", 10)
        proxy.arm("after", statement=None if pooled else "stockade_batch_fast_one")
        with pytest.raises(stockade.InDoubt):
            eng.sell("hot", 4, strategy="batched")
        assert eng.stock("hot").on_hand == 6  # it did commit; nothing said it had


@pytest.mark.parametrize("cut", ["after", "before"])
@pytest.mark.parametrize("path", ["fast", "full"])
def test_a_keyed_batch_cut_at_commit_is_resolved_by_the_engine(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str, path: str
) -> None:
    # A keyed batch on one row runs the keyed fast statement (autocommit); after a miss of
    # the fast path it runs the full path, a transaction. Its statement or its COMMIT is
    # cut; the engine ends the lost session and looks for the reservation the batch made:
    # there (after), the batch's decisions stand; absent (before), the batch runs again.
    # Either way one.
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(proxy.dsn(dbname), pool_size=2, sweeper=False) as eng:
        eng.restock("hot", 10)
        if path == "full":
            with pytest.raises(stockade.OutOfStock):  # a miss: the next batches skip fast
                eng.reserve("hot", 11, strategy="batched")
        fast_statement = path == "fast" and not pooled  # pooled: in a transaction, cut COMMIT
        proxy.arm(cut, statement="stockade_batch_fast_one_keyed" if fast_statement else None)
        if in_doubt_after_cut(pooled, cut):
            with pytest.raises(stockade.InDoubt, match="pooler"):
                eng.reserve("hot", 3, idempotency_key="order-1", strategy="batched")
            assert proxy.cuts == 1 and eng.stock("hot").reserved == 0
            # The retry with the key, as InDoubt advises, makes it once.
            r = eng.reserve("hot", 3, idempotency_key="order-1", strategy="batched")
            assert eng.stock("hot").reserved == 3 and eng.reservation(r.id) == r
            assert eng.row_counts()["reservation_count"] == 1
            return
        r = eng.reserve("hot", 3, idempotency_key="order-1", strategy="batched")
        assert proxy.cuts == 1
        assert eng.stock("hot").reserved == 3 and eng.reservation(r.id) == r
        assert eng.row_counts()["reservation_count"] == 1
        assert eng.reserve("hot", 3, idempotency_key="order-1", strategy="batched") == r


@pytest.mark.parametrize("cut", ["after", "before"])
def test_a_batched_step_cut_around_its_fast_statement_is_told_the_truth(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # A batch of steps alone runs the one-row statement with steps (autocommit) and makes no
    # row to look for after a cut: its hold's version tells. Still as read (before): nothing
    # landed, and the batch runs again the long way, once. Moved (after): by this statement
    # or by another writer, the engine cannot tell, so InDoubt. (Behind a pooler the
    # statement runs in a transaction of its own, whose COMMIT is cut.)
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(
        proxy.dsn(dbname), pool_size=2, sweeper=False, strategy="batched"
    ) as eng:
        eng.restock("hot", 10)
        r = eng.reserve("hot", 3)
        proxy.arm(cut, statement=None if pooled else "stockade_batch_fast_one_steps")
        if cut == "after" or in_doubt_after_cut(pooled, cut):
            with pytest.raises(stockade.InDoubt):
                eng.confirm(r.id, qty=2)
            assert proxy.cuts == 1
            landed = eng.reservation(r.id)
            assert (landed.confirmed, landed.held) == ((2, 1) if cut == "after" else (0, 3))
        else:
            c = eng.confirm(r.id, qty=2)
            assert proxy.cuts == 1
            assert c.state is stockade.ReservationState.HELD
            assert (c.confirmed, c.held, c.version) == (2, 1, r.version + 1)
            assert eng.reservation(r.id) == c
        level = eng.stock("hot")
        landed = eng.reservation(r.id).confirmed == 2
        assert (level.on_hand, level.reserved) == ((8, 1) if landed else (10, 3))


def test_a_batched_step_whose_hold_changed_after_the_read_is_decided_under_the_lock(
    stockade_database: str, pooled: bool
) -> None:
    # The fast path reads the hold without a lock and writes its step only if the hold is
    # still at the version it read. Here another session changes the hold (a later expiry,
    # a new version) after that read, and commits while the step's statement waits for the
    # hold's lock: the statement finds a newer version, changes nothing, and the full path
    # confirms on the hold as it now is. Nothing of the other session's change is lost.
    with stockade.Engine.postgres(
        stockade_database, pool_size=2, sweeper=False, strategy="batched"
    ) as eng:
        eng.restock("hot", 10)
        r = eng.reserve("hot", 3)
        holder = subprocess.Popen(
            ["psql", "-X", "-q", "-d", stockade_database, "-c",
             f"BEGIN; UPDATE stockade.reservation SET version = version + 1, expires_at ="
             f" expires_at + interval '1 hour' WHERE id = '{r.id}'; SELECT pg_sleep(1.5);"
             " COMMIT;"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def meanwhile() -> None:
            # The step's own statement (its text, or behind a pooler its routine's call)
            # waits for the hold, which the other session has changed and not committed.
            wait_for_session(stockade_database, "wait_event_type = 'Lock' AND query LIKE '%steps%'")
            assert holder.wait(10) == 0

        try:
            wait_for_session(stockade_database, "query LIKE '%pg_sleep%' AND state = 'active'")
            out = race(1, lambda i: eng.confirm(r.id, qty=2), meanwhile=meanwhile)
        finally:
            holder.wait(10)
        assert out.errors == [None]
        c = out.results[0]
        assert (c.confirmed, c.held, c.version) == (2, 1, r.version + 2)
        assert c.expires_at - r.expires_at >= timedelta(minutes=59)
        assert eng.reservation(r.id) == c
        level = eng.stock("hot")
        assert (level.on_hand, level.reserved) == (8, 1)


@pytest.mark.parametrize("change", ["version", "lapse"])
def test_a_batch_of_steps_whose_hold_changed_before_its_statement_writes_none_of_them(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, change: str
) -> None:
    # Two confirms in one batch (queued while an earlier batch's statement is held at the
    # proxy). After the engine has read their holds, and before their statement runs, the
    # second hold changes: another write moves its version, or its time runs out. The
    # statement writes the first hold, finds the second no longer as read, and must undo the
    # first (it aborts itself): the full path then confirms the first once and answers the
    # second by the hold as it now is. A statement that kept the first hold's write would
    # leave it confirmed without its row moved, and its caller refused.
    if pooled:
        pytest.skip("behind the pooler the statement is a routine's call, with no name to hold")
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(
        proxy.dsn(dbname), pool_size=2, sweeper=False, strategy="batched"
    ) as eng:
        eng.restock("hot", 10)
        first, second, earlier = (eng.reserve("hot", 2) for _ in range(3))
        told: dict = {}

        def confirm(r: Reservation) -> threading.Thread:
            def call() -> None:
                try:
                    told[r.id] = eng.confirm(r.id)
                except stockade.StockadeError as e:
                    told[r.id] = e

            t = threading.Thread(target=call, daemon=True)
            t.start()
            return t

        steps = "stockade_batch_fast_one_steps"
        proxy.arm("held", statement=steps)
        threads = [confirm(earlier)]
        assert wait_for(lambda: proxy.cuts == 1)  # the earlier batch's statement, held
        threads += [confirm(first), confirm(second)]
        assert wait_for(lambda: eng.stats()["batcher"]["queued"] == 2)  # behind it
        proxy.arm("held", statement=steps)
        proxy.release()
        assert wait_for(lambda: proxy.cuts == 2)  # the two holds read, their statement held
        run_sql(
            stockade_database,
            f"UPDATE stockade.reservation SET version = version + 1 WHERE id = '{second.id}'"
            if change == "version"
            else "UPDATE stockade.reservation SET expires_at = now() - interval '1 second'"
            f" WHERE id = '{second.id}'",
        )
        proxy.release()
        for t in threads:
            t.join(30)
        done = told[first.id]
        assert isinstance(done, Reservation), done
        assert (done.confirmed, done.version) == (2, first.version + 1)
        if change == "version":
            assert isinstance(told[second.id], Reservation)
            assert told[second.id].version == second.version + 2
            on_hand = 10 - 6
        else:
            assert isinstance(told[second.id], stockade.ReservationExpired), told[second.id]
            on_hand = 10 - 4
        level = eng.stock("hot")
        assert (level.on_hand, level.reserved) == (on_hand, 0)
        assert_audit_clean(eng)


# --- confirm and release through the batcher ---


def test_batched_confirms_and_releases_move_stock_once_each(
    batched_engine: stockade.Engine,
) -> None:
    eng = batched_engine
    eng.restock("hot", 300)
    holds = race(256, lambda i: eng.reserve("hot", 1)).results
    assert all(isinstance(h, Reservation) for h in holds)

    def settle(i: int) -> str:
        h = holds[i]
        assert isinstance(h, Reservation)
        return (eng.confirm(h.id) if i % 2 else eng.release(h.id)).state.value

    out = race(256, settle)
    assert out.errors == [None] * 256
    assert out.results.count("confirmed") == 128 and out.results.count("released") == 128
    lvl = eng.stock("hot")
    assert (lvl.on_hand, lvl.reserved, lvl.available) == (172, 0, 172)
    assert eng.stats()["batcher"]["requests"] >= 512
    for i in (0, 1):
        h = holds[i]
        assert isinstance(h, Reservation)
        assert eng.reservation(h.id).version == h.version + 1


def test_a_hold_confirmed_by_many_at_once_is_confirmed_once(
    batched_engine: stockade.Engine,
) -> None:
    eng = batched_engine
    eng.restock("hot", 10)
    hold = eng.reserve("hot", 4)
    out = race(32, lambda i: eng.confirm(hold.id))
    assert sum(e is None for e in out.errors) == 1
    assert all(isinstance(e, stockade.InvalidState) for e in out.errors if e is not None)
    lvl = eng.stock("hot")
    assert (lvl.on_hand, lvl.reserved) == (6, 0)


def test_batched_transitions_keep_the_per_request_errors(
    batched_engine: stockade.Engine,
    wait: Callable[[float], None],
) -> None:
    eng = batched_engine
    eng.restock("hot", 10)
    hold = eng.reserve("hot", 2, ttl=60)
    with pytest.raises(stockade.VersionConflict):
        eng.confirm(hold.id, expected_version=hold.version + 1)
    with pytest.raises(stockade.NotFound):
        eng.release(uuid.UUID(bytes=bytes(16)))
    lapsing = eng.reserve("hot", 3, ttl=1)
    wait(1.5)
    with pytest.raises(stockade.ReservationExpired):
        eng.confirm(lapsing.id)
    # The lapsed hold was expired, and that committed: its units are back.
    assert eng.reservation(lapsing.id).state is stockade.ReservationState.EXPIRED
    assert eng.stock("hot").reserved == 2
    assert eng.release(hold.id).state is stockade.ReservationState.RELEASED

    async def confirm_async() -> None:
        again = await eng.reserve_async("hot", 1)
        assert (await eng.confirm_async(again.id)).state is stockade.ReservationState.CONFIRMED
        with pytest.raises(stockade.InvalidState):
            await eng.release_async(again.id)

    asyncio.run(confirm_async())
    assert eng.stock("hot").on_hand == 9


def test_two_engines_racing_the_same_keys_make_one_reservation_per_key(
    stockade_database: str,
) -> None:
    # Two engines batch the same keys on one row at once. A batch whose fast statement
    # finds a key claimed by the other engine's batch in the meantime rolls back (23505)
    # and takes the full path, which replays that key: one reservation per key, whoever
    # asked first.
    keys = [f"key-{n}" for n in range(200)]
    with (
        stockade.Engine.postgres(stockade_database, pool_size=8) as a,
        stockade.Engine.postgres(stockade_database, pool_size=8) as b,
    ):
        a.restock("hot", 10_000)

        def buy(i: int) -> Reservation:
            eng = a if i % 2 == 0 else b
            return eng.reserve("hot", 1, idempotency_key=keys[(i // 2) % 200], strategy="batched")

        out = race(800, buy)
        assert out.errors == [None] * 800
        by_key: dict[str, set[uuid.UUID]] = {}
        for r in out.results:
            by_key.setdefault(r.idempotency_key, set()).add(r.id)
        assert len(by_key) == 200 and all(len(ids) == 1 for ids in by_key.values())
        assert a.stock("hot").reserved == 200
        assert a.row_counts()["reservation_count"] == 200


def test_a_batched_row_another_engine_writes_too_makes_the_flusher_linger(
    stockade_database: str,
) -> None:
    # Two engines (replicas) batch one row. Each batch learns the row's version before and
    # after it; when the row moved between two of an engine's batches, someone else wrote
    # it, and that engine's flusher waits batch_linger before its next batches on the row
    # that carry several requests, so that each turn at the row lock carries more of them.
    with (
        stockade.Engine.postgres(stockade_database, pool_size=4) as a,
        stockade.Engine.postgres(stockade_database, pool_size=4) as b,
    ):
        a.restock("shared", 100_000)
        a.restock("alone", 1000)
        for _ in range(10):
            a.reserve("alone", 1, strategy="batched")
        assert a.stats()["batcher"]["shared_row_batches"] == 0
        # One request per batch: the gap is seen, but nobody waits for company.
        for _ in range(5):
            b.reserve("shared", 1, strategy="batched")
            a.reserve("shared", 1, strategy="batched")
        stats = a.stats()["batcher"]
        assert stats["shared_row_batches"] >= 4  # its first batch there has no predecessor
        assert stats["lingered_batches"] == 0
        made = 10
        # Races of both engines: a's batches carry several requests and find b's writes.
        # (The row counts as shared for 100 ms after a gap: the rounds allow for a slow
        # machine.)
        for _ in range(20):
            out = race(
                64,
                lambda i: (b if i % 4 == 0 else a).reserve("shared", 1, strategy="batched"),
            )
            assert out.errors == [None] * 64
            made += 64
            if a.stats()["batcher"]["lingered_batches"] > 0:
                break
        assert a.stats()["batcher"]["lingered_batches"] >= 1
        assert a.stock("shared").reserved == made
        assert a.row_counts()["reservation_count"] == made + 10
        assert a.stock("alone").reserved == 10


def test_one_engine_racing_alone_on_a_batched_row_never_lingers(
    stockade_database: str,
) -> None:
    # Its own confirms and releases, batched too, move the row as well: the batcher counts
    # them as its own, so it never takes the row for shared.
    with stockade.Engine.postgres(stockade_database, pool_size=4, strategy="batched") as eng:
        eng.restock("hot", 10_000)
        made = race(256, lambda i: eng.reserve("hot", 1))
        assert made.errors == [None] * 256
        settled = race(256, lambda i: (eng.confirm if i % 2 else eng.release)(made.results[i].id))
        assert settled.errors == [None] * 256
        again = race(256, lambda i: eng.reserve("hot", 1))
        assert again.errors == [None] * 256
        stats = eng.stats()["batcher"]
        assert stats["batches"] < 3 * 256  # the races did batch
        assert stats["shared_row_batches"] == 0 and stats["lingered_batches"] == 0
        level = eng.stock("hot")
        assert (level.on_hand, level.reserved) == (10_000 - 128, 256)


def test_an_engines_own_restocks_do_not_look_like_another_writer_to_auto(
    stockade_database: str,
) -> None:
    # Two threads alone on a row: each reserve comes with two restocks and a release. Had
    # the restocks gone unreported, the row would move twice per reported write, which
    # reads as a queue of about 4 across processes, and auto would batch for nothing.
    with stockade.Engine.postgres(stockade_database, pool_size=2) as eng:
        eng.restock("alone", 1_000)

        def alone(i: int) -> None:
            for _ in range(60):
                r = eng.reserve("alone", 1)
                eng.restock("alone", 1)
                eng.set_on_hand("alone", eng.stock("alone").on_hand + 1)
                eng.release(r.id)

        out = race(2, alone)
        assert out.errors == [None] * 2
        skus = {s["sku"]: s for s in eng.stats(sku_limit=10)["hottest_skus"]}
        assert skus["alone"]["mode"] == "atomic"
        assert skus["alone"]["row_queue"] <= 3  # about 2: its own
        assert eng.stats()["batcher"]["requests"] == 0
        assert eng.stock("alone").reserved == 0


def test_auto_learns_a_row_that_other_engines_write_from_its_version(
    stockade_database: str,
) -> None:
    # Replicas: no one process sees the row's whole queue. Engine b has only 2 requests in
    # flight, never the 4 that make a row hot on its own; but between two of its writes the
    # row moved by several versions (engine a's 8 threads), so its 2 stand for a queue of
    # about 10, and auto batches them. An engine alone on a row with 2 threads sees its
    # own versions only (its confirms and releases move the row too, and count as its
    # own), and stays atomic.
    with (
        stockade.Engine.postgres(stockade_database, pool_size=8) as a,
        stockade.Engine.postgres(stockade_database, pool_size=2) as b,
    ):
        a.restock("shared", 1_000_000)
        a.restock("alone", 100_000)

        def alone(i: int) -> None:
            for n in range(50):
                r = b.reserve("alone", 1)
                (b.confirm if n % 2 else b.release)(r.id)

        out = race(2, alone)
        assert out.errors == [None] * 2
        skus = {s["sku"]: s for s in b.stats(sku_limit=10)["hottest_skus"]}
        assert skus["alone"]["mode"] == "atomic"
        assert skus["alone"]["row_queue"] <= 3  # about 2: its own
        assert b.stats()["batcher"]["requests"] == 0

        made = 100
        # The estimate follows the present load, so it is read while the race runs (by
        # one of b's threads, between its reserves).
        queues: List[int] = []
        named: List[bool] = []

        def shared(i: int) -> int:
            n = 0
            for k in range(40):
                if i < 8:
                    a.reserve("shared", 1, strategy="atomic")
                else:
                    b.reserve("shared", 1)
                n += 1
                if i == 9 and k % 8 == 7:
                    hot = [s for s in b.stats(sku_limit=10)["hottest_skus"] if s["sku"] == "shared"]
                    queues.append(hot[0]["row_queue"] if hot else 0)
                    reasons = b.recommend("shared").reasons
                    named.append(any("across every process" in r for r in reasons))
            return n

        for _ in range(10):
            out = race(10, shared)
            assert out.errors == [None] * 10
            made += sum(out.results)
            if b.stats()["batcher"]["requests"] > 0 and any(named):
                break
        assert b.stats()["batcher"]["requests"] > 0, queues
        assert max(queues) >= 4, queues
        assert any(named), queues
        assert a.stock("shared").reserved == made - 100
        assert a.row_counts()["reservation_count"] == made
        assert (a.stock("alone").on_hand, a.stock("alone").reserved) == (100_000 - 50, 0)
