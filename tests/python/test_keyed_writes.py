"""A key on every write: sell, restock, set_on_hand, confirm, release, extend, resize,
return_units and the order steps (confirm_order, release_order, extend_order) take
``idempotency_key=`` with the rules reserve follows.

The same key with the same request returns the first call's outcome without a second
effect (after later writes too, and after a COMMIT cut before or after it reached the
server); with another request, or another kind of write, it raises IdempotencyConflict;
a first call that failed leaves the key free. Both stores and the Citus layout
(``engine``); the cut proxy on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Callable, Dict, Tuple, TypeVar

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade import Reservation, ReservationState, StockLevel
from stockade.testing import race
from support import field

Outcome = object
T = TypeVar("T")
# A kind: (prepare the SKU "k" and return what the call needs, the keyed call, the state
# that shows its effect).
Prepare = Callable[[stockade.Engine], object]
Call = Callable[[stockade.Engine, object, str], Outcome]
Effect = Callable[[stockade.Engine, object], Tuple[int, ...]]


def through_the_cut(call: Callable[[], T], unchanged: Callable[[], bool], may_doubt: bool) -> T:
    """A keyed call whose COMMIT the proxy cuts: its answer. Only where the session cannot
    be ended (a pooler) and the COMMIT never arrived may it be InDoubt, whose hint is the
    retry with the key; the write then did not land, and the retry makes it once."""
    try:
        return call()
    except stockade.InDoubt as told:
        assert may_doubt, told
        assert "retry with the same idempotency key" in str(told)
        assert unchanged()  # it did not land
        return call()


def new_key() -> str:
    return f"key-{uuid.uuid4()}"


def stocked(eng: stockade.Engine) -> object:
    eng.restock("k", 10)
    return None


def held(eng: stockade.Engine) -> object:
    eng.restock("k", 10)
    return eng.reserve("k", 4, ttl=600)


def sold(eng: stockade.Engine) -> object:
    r = held(eng)
    return eng.confirm(r.id)  # type: ignore[attr-defined]


def ordered(eng: stockade.Engine) -> object:
    eng.restock("k", 10)
    eng.restock("k2", 10)
    return eng.reserve_order({"k": 3, "k2": 2}, ttl=600)


def order_and_rows(eng: stockade.Engine, o: object) -> Tuple[int, ...]:
    now = eng.order(o)  # type: ignore[arg-type]
    lines = [(r.held, r.confirmed, r.released, r.version) for r in now]
    ends = [int(r.expires_at.timestamp() * 1_000_000) for r in now]
    return (*sum(lines, ()), *ends, *row(eng, o))


def row(eng: stockade.Engine, _: object) -> Tuple[int, ...]:
    level = eng.stock("k")
    return (level.on_hand, level.reserved, level.version)


def hold_and_row(eng: stockade.Engine, r: object) -> Tuple[int, ...]:
    now = eng.reservation(r.id)  # type: ignore[attr-defined]
    return (now.held, now.confirmed, now.released, now.returned, now.version, *row(eng, r))


def extent(eng: stockade.Engine, r: object) -> Tuple[int, ...]:
    now = eng.reservation(r.id)  # type: ignore[attr-defined]
    return (now.version, int(now.expires_at.timestamp() * 1_000_000))


KINDS: Dict[str, Tuple[Prepare, Call, Effect]] = {
    "sell": (stocked, lambda e, _, k: e.sell("k", 2, idempotency_key=k), row),
    "restock": (stocked, lambda e, _, k: e.restock("k", 3, idempotency_key=k), row),
    "set_on_hand": (stocked, lambda e, _, k: e.set_on_hand("k", 7, idempotency_key=k), row),
    "confirm": (
        held,
        lambda e, r, k: e.confirm(r.id, qty=1, idempotency_key=k),  # type: ignore[attr-defined]
        hold_and_row,
    ),
    "release": (
        held,
        lambda e, r, k: e.release(r.id, qty=1, idempotency_key=k),  # type: ignore[attr-defined]
        hold_and_row,
    ),
    "extend": (
        held,
        lambda e, r, k: e.extend(r.id, ttl=900, idempotency_key=k),  # type: ignore[attr-defined]
        extent,
    ),
    "resize": (
        held,
        lambda e, r, k: e.resize(r.id, 6, idempotency_key=k),  # type: ignore[attr-defined]
        hold_and_row,
    ),
    "confirm_order": (
        ordered,
        lambda e, o, k: e.confirm_order(o, qty={"k": 2}, idempotency_key=k),  # type: ignore
        order_and_rows,
    ),
    "release_order": (
        ordered,
        lambda e, o, k: e.release_order(o, idempotency_key=k),  # type: ignore[arg-type]
        order_and_rows,
    ),
    "extend_order": (
        ordered,
        lambda e, o, k: e.extend_order(o, ttl=900, idempotency_key=k),  # type: ignore
        order_and_rows,
    ),
    "return_units": (
        sold,
        lambda e, r, k: e.return_units(r.id, 1, idempotency_key=k),  # type: ignore[attr-defined]
        hold_and_row,
    ),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_keyed_write_replays_its_first_outcome_without_a_second_effect(
    engine: stockade.Engine, kind: str
) -> None:
    prepare, call, effect = KINDS[kind]
    subject = prepare(engine)
    before = effect(engine, subject)
    key = new_key()
    first = call(engine, subject, key)
    after = effect(engine, subject)
    assert after != before  # the first call changed something
    again = call(engine, subject, key)
    assert again == first  # the first outcome, field for field
    assert effect(engine, subject) == after  # and no second effect
    assert engine.audit().ok


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_same_key_for_another_request_is_a_conflict_that_changes_nothing(
    engine: stockade.Engine, kind: str
) -> None:
    prepare, call, effect = KINDS[kind]
    subject = prepare(engine)
    key = new_key()
    call(engine, subject, key)
    after = effect(engine, subject)
    other = "restock" if kind != "restock" else "sell"
    with pytest.raises(stockade.IdempotencyConflict) as raised:
        KINDS[other][1](engine, subject, key)
    assert f"used for a {kind}, this is a {other}" in str(raised.value)
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("k", 1, idempotency_key=key)  # a reserve's rules: the same key table
    assert effect(engine, subject) == after


def test_other_arguments_with_the_same_key_are_a_conflict(engine: stockade.Engine) -> None:
    engine.restock("k", 10)
    key = new_key()
    engine.sell("k", 2, idempotency_key=key)
    with pytest.raises(stockade.IdempotencyConflict, match="used for a sell with other"):
        engine.sell("k", 3, idempotency_key=key)
    hold = engine.reserve("k", 1, idempotency_key=new_key())
    with pytest.raises(stockade.IdempotencyConflict, match="used for a reserve, this is a sell"):
        engine.sell("k", 2, idempotency_key=hold.idempotency_key)
    assert engine.stock("k").on_hand == 8


def test_a_replay_returns_the_first_outcome_after_later_writes(engine: stockade.Engine) -> None:
    engine.restock("k", 10)
    key = new_key()
    first = engine.sell("k", 2, idempotency_key=key)
    engine.sell("k", 1)
    engine.restock("k", 5)
    assert engine.sell("k", 2, idempotency_key=key) == first
    assert engine.stock("k").on_hand == 12

    hold = engine.reserve("k", 4, ttl=600)
    part = engine.confirm(hold.id, qty=1, idempotency_key="confirm-1")
    engine.release(hold.id, qty=1)
    replay = engine.confirm(hold.id, qty=1, idempotency_key="confirm-1")
    assert replay == part and replay.held == 3  # as the first call left it
    assert engine.reservation(hold.id).held == 2


def test_a_first_call_that_failed_leaves_the_key_free(engine: stockade.Engine) -> None:
    engine.restock("k", 1)
    key = new_key()
    with pytest.raises(stockade.OutOfStock):
        engine.sell("k", 2, idempotency_key=key)
    engine.restock("k", 1)
    assert engine.sell("k", 2, idempotency_key=key).on_hand == 0

    hold = engine.reserve("k", 0 + 1, ttl=600) if engine.stock("k").available else None
    assert hold is None  # nothing left to hold
    engine.restock("k", 2)
    hold = engine.reserve("k", 2, ttl=600)
    with pytest.raises(stockade.InvalidState):
        engine.confirm(hold.id, qty=3, idempotency_key="too-many")
    assert engine.confirm(hold.id, qty=2, idempotency_key="too-many").confirmed == 2


def test_concurrent_calls_with_one_key_have_one_effect(engine: stockade.Engine) -> None:
    engine.restock("k", 100)
    key = new_key()
    out = race(16, lambda _: engine.sell("k", 3, idempotency_key=key), timeout=60)
    assert not any(out.errors), out.errors
    assert len({(o.on_hand, o.version) for o in out.results}) == 1  # one outcome, told to all
    assert engine.stock("k").on_hand == 97


def test_the_async_twins_take_the_key(engine: stockade.Engine) -> None:
    engine.restock("k", 10)
    hold = engine.reserve("k", 3, ttl=600)

    async def main() -> Tuple[StockLevel, StockLevel, Reservation, Reservation]:
        a = await engine.sell_async("k", 1, idempotency_key="s-1")
        b = await engine.sell_async("k", 1, idempotency_key="s-1")
        c = await engine.confirm_async(hold.id, qty=1, idempotency_key="c-1")
        d = await engine.confirm_async(hold.id, qty=1, idempotency_key="c-1")
        return a, b, c, d

    a, b, c, d = asyncio.run(main())
    assert a == b and c == d
    assert engine.stock("k").on_hand == 10 - 1 - 1


def test_a_keyed_sell_batches_and_replays_its_first_level(batched_engine: stockade.Engine) -> None:
    # The batch claims the key and stores the sale's level with it: a replay, batched or per
    # request, returns that level with no second effect, after later writes too.
    eng = batched_engine
    eng.restock("k", 10)
    before = eng.stats()["batcher"]["requests"]
    first = eng.sell("k", 2, idempotency_key="b-1", strategy="batched")
    assert eng.stats()["batcher"]["requests"] == before + 1  # it went through the batcher
    assert (first.on_hand, first.reserved) == (8, 0)
    eng.sell("k", 1)
    assert eng.sell("k", 2, idempotency_key="b-1", strategy="batched") == first
    assert eng.sell("k", 2, idempotency_key="b-1", strategy="atomic") == first
    with pytest.raises(stockade.IdempotencyConflict, match="other arguments"):
        eng.sell("k", 3, idempotency_key="b-1", strategy="batched")
    # and a batched sell replays a key a per-request sell stored
    direct = eng.sell("k", 1, idempotency_key="b-2", strategy="atomic")
    assert eng.sell("k", 1, idempotency_key="b-2", strategy="batched") == direct
    hold = eng.reserve("k", 2, ttl=600)
    step = eng.confirm(hold.id, idempotency_key="b-3")
    assert eng.confirm(hold.id, idempotency_key="b-3") == step
    assert (eng.stock("k").on_hand, eng.stock("k").reserved) == (4, 0)
    assert eng.audit().ok


def test_keyed_confirms_and_releases_batch_and_replay(batched_engine: stockade.Engine) -> None:
    # A keyed step goes through the batcher too; its key stores the reservation as the step
    # left it, which a replay (batched or per request) returns without a second effect.
    eng = batched_engine
    eng.restock("k", 10)
    hold = eng.reserve("k", 5, ttl=600)
    before = eng.stats()["batcher"]["requests"]
    part = eng.confirm(hold.id, qty=2, idempotency_key="c-part")
    assert eng.stats()["batcher"]["requests"] == before + 1
    assert (part.held, part.confirmed) == (3, 2)
    rest = eng.release(hold.id, qty=1, idempotency_key="l-part")
    assert eng.confirm(hold.id, qty=2, idempotency_key="c-part") == part  # as it was then
    assert eng.release(hold.id, qty=1, idempotency_key="l-part") == rest
    with pytest.raises(stockade.IdempotencyConflict, match="used for a confirm, this is a rel"):
        eng.release(hold.id, qty=2, idempotency_key="c-part")
    with pytest.raises(stockade.IdempotencyConflict, match="other arguments"):
        eng.confirm(hold.id, qty=1, idempotency_key="c-part")
    now = eng.reservation(hold.id)
    assert (now.held, now.confirmed, now.released, now.version) == (2, 2, 1, rest.version)
    with pytest.raises(stockade.InvalidState):  # more than is held: refused, the key left free
        eng.confirm(hold.id, qty=3, idempotency_key="c-more")
    assert eng.confirm(hold.id, qty=2, idempotency_key="c-more").confirmed == 4
    assert (eng.stock("k").on_hand, eng.stock("k").reserved) == (6, 0)
    assert eng.audit().ok


def test_keyed_partial_confirms_racing_on_shared_keys_confirm_once_per_key(
    batched_engine: stockade.Engine,
) -> None:
    # 32 threads confirm one unit each of one hold of 8, with 8 keys shared by 4 threads
    # each: eight confirms in all, each key's callers told one outcome; never more than held.
    eng = batched_engine
    eng.restock("k", 20)
    hold = eng.reserve("k", 8, ttl=600)
    keys = [new_key() for _ in range(8)]
    out = race(32, lambda i: eng.confirm(hold.id, qty=1, idempotency_key=keys[i % 8]))
    assert not any(out.errors), out.errors
    for n in range(8):
        assert len({r.version for i, r in enumerate(out.results) if i % 8 == n}) == 1
    now = eng.reservation(hold.id)
    assert (now.held, now.confirmed, now.state) == (0, 8, ReservationState.CONFIRMED)
    assert eng.stock("k").on_hand == 12
    assert eng.audit().ok


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_batched_keyed_confirm_cut_at_its_commit_is_answered_once(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # A batch of steps runs the long path; its COMMIT cut, the step's key tells whether it
    # committed (a keyless step's batch could only answer InDoubt).
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False, strategy="batched") as eng:
        eng.restock("k", 10)
        hold = eng.reserve("k", 4, ttl=600)
        key = new_key()
        proxy.arm(cut)
        first = through_the_cut(
            lambda: eng.confirm(hold.id, qty=3, idempotency_key=key),
            lambda: eng.reservation(hold.id).confirmed == 0,
            pooled and cut == "before",
        )
        assert proxy.cuts == 1
        assert (first.confirmed, eng.reservation(hold.id).confirmed) == (3, 3)
        assert eng.confirm(hold.id, qty=3, idempotency_key=key) == first
        assert eng.stock("k").on_hand == 7
        assert eng.audit().ok


def test_a_stored_key_answers_each_request_in_a_batch_on_its_own(
    batched_engine: stockade.Engine,
) -> None:
    # A key stored by sell(1); then, at once (in one batch or several), requests with that
    # key that are the same sell, another sell, a confirm: the same sell replays whatever
    # comes first in its batch; the others conflict.
    eng = batched_engine
    eng.restock("k", 100)
    hold = eng.reserve("k", 2, ttl=600)
    first = eng.sell("k", 1, idempotency_key="shared")
    calls = [
        lambda: eng.sell("k", 2, idempotency_key="shared"),
        lambda: eng.sell("k", 1, idempotency_key="shared"),
        lambda: eng.confirm(hold.id, idempotency_key="shared"),
    ]
    out = race(24, lambda i: calls[i % 3]())
    for i, (result, error) in enumerate(zip(out.results, out.errors, strict=True)):
        if i % 3 == 1:
            assert error is None and result == first, error
        else:
            assert isinstance(error, stockade.IdempotencyConflict), error
    assert eng.stock("k").on_hand == 99 and eng.reservation(hold.id).held == 2
    assert eng.audit().ok


def test_a_refused_batched_keyed_sell_leaves_its_key_free(batched_engine: stockade.Engine) -> None:
    eng = batched_engine
    eng.restock("k", 1)
    with pytest.raises(stockade.OutOfStock):
        eng.sell("k", 2, idempotency_key="short", strategy="batched")
    eng.restock("k", 1)
    sold_ = eng.sell("k", 2, idempotency_key="short", strategy="batched")
    assert sold_.on_hand == 0
    assert eng.sell("k", 2, idempotency_key="short", strategy="batched") == sold_
    with pytest.raises(stockade.IdempotencyConflict, match="used for a sell, this is a reserve"):
        eng.reserve("k", 1, idempotency_key="short", strategy="batched")


def test_batched_keyed_sells_racing_on_shared_keys_sell_once_per_key(
    batched_engine: stockade.Engine,
) -> None:
    # 32 threads, 8 keys, each key used by 4 threads at once (in one batch or in several):
    # one sale per key, and every caller of a key is told the same level.
    eng = batched_engine
    eng.restock("k", 100)
    keys = [new_key() for _ in range(8)]
    out = race(32, lambda i: eng.sell("k", 1, idempotency_key=keys[i % 8], strategy="batched"))
    assert not any(out.errors), out.errors
    for n in range(8):
        told = {(r.on_hand, r.version) for i, r in enumerate(out.results) if i % 8 == n}
        assert len(told) == 1, told
    assert len({r.on_hand for r in out.results}) == 8  # eight sales, each at its own level
    assert eng.stock("k").on_hand == 92
    assert eng.audit().ok


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_batched_keyed_sell_cut_in_its_one_statement_is_answered_once(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # The one-row batch's statement moves the row and claims the key with the sale's level,
    # in autocommit. Cut before it reached the server, or after it ran: the engine ended the
    # session and read the key, which tells whether the batch landed and holds the level.
    if pooled:
        pytest.skip("the proxy cuts the prepared statement, which pooled connections do not use")
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False, strategy="batched") as eng:
        eng.restock("k", 10)
        key = new_key()
        proxy.arm(cut, statement="stockade_batch_fast_one_keyed")
        first = eng.sell("k", 2, idempotency_key=key)
        assert proxy.cuts == 1
        assert (first.on_hand, eng.stock("k").on_hand) == (8, 8)
        assert eng.sell("k", 2, idempotency_key=key) == first
        assert eng.stock("k").on_hand == 8
        assert eng.audit().ok


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_batched_keyed_sell_cut_at_its_commit_is_answered_once(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # The batch's long path, one transaction (a replay's miss sends the next batches there):
    # its COMMIT cut, the key it claimed tells whether the batch committed.
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False, strategy="batched") as eng:
        eng.restock("k", 10)
        eng.sell("k", 1, idempotency_key="warm")
        eng.sell("k", 1, idempotency_key="warm")  # a replay: the fast statement misses
        key = new_key()
        proxy.arm(cut)
        first = through_the_cut(
            lambda: eng.sell("k", 2, idempotency_key=key),
            lambda: eng.stock("k").on_hand == 9,
            pooled and cut == "before",
        )
        assert proxy.cuts == 1
        assert (first.on_hand, eng.stock("k").on_hand) == (7, 7)
        assert eng.sell("k", 2, idempotency_key=key) == first
        assert eng.audit().ok


def test_keyed_writes_on_a_slotted_sku_take_effect_once(engine: stockade.Engine) -> None:
    # A SKU that auto split into hot-row slots still takes keyed restocks and sells: the
    # units go to (or come from) one row with the key; the answer is the SKU's level.
    engine.restock("k", 100)
    engine.set_slots("k", 2)
    key = new_key()
    first = engine.restock("k", 5, idempotency_key=key)
    assert first.on_hand == 105
    assert engine.restock("k", 5, idempotency_key=key).on_hand == 105
    assert engine.sell("k", 1, idempotency_key="slotted").on_hand == 104
    assert engine.sell("k", 1, idempotency_key="slotted").on_hand == 104
    with pytest.raises(stockade.NotSupported, match="idempotency key"):
        engine.set_on_hand("k", 50, idempotency_key=new_key())
    with pytest.raises(stockade.NotSupported, match="idempotency key"):
        engine.restock("k", 1, idempotency_key=new_key(), expected_version=1)
    assert engine.stock("k").on_hand == 104
    assert engine.audit().ok


def test_bad_keys_are_refused_before_anything_changes(engine: stockade.Engine) -> None:
    engine.restock("k", 10)
    hold = engine.reserve("k", 2, ttl=600)
    for bad in ["", "x" * 1000]:
        with pytest.raises(stockade.InvalidArgument, match="idempotency_key"):
            engine.sell("k", 1, idempotency_key=bad)
        with pytest.raises(stockade.InvalidArgument, match="idempotency_key"):
            engine.confirm(hold.id, idempotency_key=bad)
    with pytest.raises(stockade.InvalidArgument):
        engine.restock("k", 1, idempotency_key=7)  # type: ignore[arg-type]
    assert engine.stock("k").on_hand == 10
    assert engine.reservation(hold.id).state is ReservationState.HELD


@pytest.mark.parametrize("cut", ["before", "after"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_keyed_write_cut_at_commit_is_answered_and_takes_effect_once(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, kind: str, cut: str
) -> None:
    # "before": COMMIT never reached the server, which rolled back; "after": it committed
    # and the answer was lost. Either way the engine ended the session, read the key, and
    # answered: the write ran again, or its stored outcome came back. A retry by the caller
    # with the same key then returns the same outcome, with no second effect. Behind a
    # pooler the session cannot be ended: a write that did not land stays InDoubt, whose
    # hint is the retry with the key, which then makes it once.
    prepare, call, effect = KINDS[kind]
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False) as eng:
        subject = prepare(eng)
        before = effect(eng, subject)
        key = new_key()
        proxy.arm(cut)
        first = through_the_cut(
            lambda: call(eng, subject, key),
            lambda: effect(eng, subject) == before,
            pooled and cut == "before",
        )
        assert proxy.cuts == 1
        after = effect(eng, subject)
        assert after != before
        assert call(eng, subject, key) == first
        assert effect(eng, subject) == after
        assert eng.audit().ok


def test_a_batched_reserve_meeting_another_kinds_key_is_a_conflict(
    batched_engine: stockade.Engine,
) -> None:
    # The batch's long path replays committed keys: one a sell made names no reservation.
    eng = batched_engine
    eng.restock("k", 10)
    eng.sell("k", 1, idempotency_key="shared")
    for _ in range(2):
        with pytest.raises(stockade.IdempotencyConflict, match="used for a sell, this is a"):
            eng.reserve("k", 1, idempotency_key="shared", strategy="batched")
    assert (eng.stock("k").on_hand, eng.stock("k").reserved) == (9, 0)


def test_a_keyed_sell_with_expected_version_on_a_slotted_sku_is_not_supported(
    engine: stockade.Engine,
) -> None:
    # On slots the version checked is a slot row's, so a replay could not be recognised.
    engine.restock("k", 100)
    engine.set_slots("k", 2)
    version = engine.stock("k").version
    with pytest.raises(stockade.NotSupported, match="expected_version"):
        engine.sell("k", 1, expected_version=version, idempotency_key=new_key())
    assert engine.stock("k").on_hand == 100
    assert engine.sell("k", 1, expected_version=engine.stock("k").version).on_hand == 99
