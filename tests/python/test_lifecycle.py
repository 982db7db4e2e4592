"""The order lifecycle inside the engine, part one: a reservation's units step by step.

A confirm or a release may take part of a hold; the rest stays held with its expiry, and
``held + confirmed + released + expired == qty`` always. Both stores and the Citus layout
(``engine``), the batched path (``batched_engine``), the sweeper's expiry of what is left,
purchase limits, and races of partial confirms for the same holds.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Callable, List

import pytest

import stockade
from stockade import Reservation, ReservationState
from stockade.testing import race
from stockade.tools.pgserver import run_sql
from stockade.tools.pytest_plugin import PostgresForTests


def units(r: Reservation) -> tuple[int, int, int, int, int]:
    return (r.held, r.confirmed, r.released, r.expired, r.returned)


def assert_clean(eng: stockade.Engine) -> None:
    report = eng.audit()
    assert report.ok, report.violations[:3]
    assert "reservation_units" in report.checks


@pytest.fixture(params=["per_request", "batched"])
def any_engine(request: pytest.FixtureRequest, engine: stockade.Engine) -> stockade.Engine:
    if request.param == "per_request":
        return engine
    return request.getfixturevalue("batched_engine")


def test_a_hold_is_confirmed_in_parts_and_the_rest_stays_held(any_engine: stockade.Engine) -> None:
    eng = any_engine
    eng.restock("s", 10)
    hold = eng.reserve("s", 5, ttl=600)
    assert units(hold) == (5, 0, 0, 0, 0)

    part = eng.confirm(hold.id, qty=2)
    assert part.state is ReservationState.HELD
    assert units(part) == (3, 2, 0, 0, 0)
    assert part.version == hold.version + 1
    assert part.expires_at == hold.expires_at  # the rest keeps its expiry
    lvl = eng.stock("s")
    assert (lvl.on_hand, lvl.reserved) == (8, 3)

    part = eng.release(hold.id, qty=1)
    assert units(part) == (2, 2, 1, 0, 0) and part.state is ReservationState.HELD
    assert eng.stock("s").reserved == 2

    done = eng.confirm(hold.id)  # the rest
    assert units(done) == (0, 4, 1, 0, 0)
    assert done.state is ReservationState.CONFIRMED
    assert done.version == hold.version + 3
    again = eng.reservation(hold.id)
    assert (units(again), again.version, again.state) == (units(done), done.version, done.state)
    lvl = eng.stock("s")
    assert (lvl.on_hand, lvl.reserved, lvl.available) == (6, 0, 6)
    with pytest.raises(stockade.InvalidState):
        eng.release(hold.id, qty=1)
    assert_clean(eng)


def test_released_in_parts_a_hold_ends_released(any_engine: stockade.Engine) -> None:
    eng = any_engine
    eng.restock("s", 4)
    hold = eng.reserve("s", 4)
    assert eng.release(hold.id, qty=3).state is ReservationState.HELD
    done = eng.release(hold.id, qty=1)
    assert done.state is ReservationState.RELEASED and units(done) == (0, 0, 4, 0, 0)
    assert eng.stock("s").available == 4
    assert_clean(eng)


def test_a_confirm_may_release_the_rest_in_the_same_step(any_engine: stockade.Engine) -> None:
    eng = any_engine
    eng.set_purchase_limit("g", per_buyer=3, skus=["s"])
    eng.restock("s", 10)
    hold = eng.reserve("s", 3, buyer="ann")
    done = eng.confirm(hold.id, qty=2, release_rest=True)
    assert units(done) == (0, 2, 1, 0, 0) and done.state is ReservationState.CONFIRMED
    assert done.version == hold.version + 1  # one step
    lvl = eng.stock("s")
    assert (lvl.on_hand, lvl.reserved, lvl.available) == (8, 0, 8)
    assert eng.buyer_held("g", "ann") == 2  # the released unit went back to her count
    everything = eng.reserve("s", 1, buyer="ann")
    assert eng.confirm(everything.id, release_rest=True).confirmed == 1  # nothing left over
    assert_clean(eng)


def test_more_than_is_held_is_refused_and_changes_nothing(any_engine: stockade.Engine) -> None:
    eng = any_engine
    eng.restock("s", 10)
    hold = eng.reserve("s", 3)
    eng.confirm(hold.id, qty=2)
    before = eng.stock("s")
    for call in (eng.confirm, eng.release):
        with pytest.raises(stockade.InvalidState, match="holds 1 units; cannot"):
            call(hold.id, qty=2)
    after = eng.reservation(hold.id)
    assert units(after) == (1, 2, 0, 0, 0) and after.version == hold.version + 1
    assert eng.stock("s") == before
    assert_clean(eng)


@pytest.mark.parametrize("bad", [0, -1, stockade.QUANTITY_MAX + 1])
def test_a_quantity_out_of_range_is_invalid(engine: stockade.Engine, bad: int) -> None:
    engine.restock("s", 2)
    hold = engine.reserve("s", 2)
    for call in (engine.confirm, engine.release):
        with pytest.raises(stockade.InvalidArgument, match="qty"):
            call(hold.id, qty=bad)
    with pytest.raises(stockade.InvalidType):
        engine.confirm(hold.id, qty="1")  # type: ignore[arg-type]
    assert engine.reservation(hold.id).version == hold.version


def test_the_expected_version_guards_each_step(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    hold = engine.reserve("s", 5)
    step = engine.confirm(hold.id, qty=1, expected_version=hold.version)
    with pytest.raises(stockade.VersionConflict):
        engine.confirm(hold.id, qty=1, expected_version=hold.version)
    assert engine.release(hold.id, qty=1, expected_version=step.version).held == 3


@pytest.mark.sweeper_off
def test_what_is_left_expires_and_a_partly_sold_hold_ends_confirmed(
    engine: stockade.Engine, wait: Callable[[float], None]
) -> None:
    engine.restock("s", 10)
    hold = engine.reserve("s", 5, ttl=1)
    engine.confirm(hold.id, qty=2)
    engine.release(hold.id, qty=1)
    wait(1.5)
    assert engine.expire_due() == 1
    done = engine.reservation(hold.id)
    assert units(done) == (0, 2, 1, 2, 0)
    assert done.state is ReservationState.CONFIRMED
    lvl = engine.stock("s")
    assert (lvl.on_hand, lvl.reserved) == (8, 0)
    # It did expire: a late confirm says so, with what was sold before.
    with pytest.raises(stockade.ReservationExpired, match="2 of its 5 units were confirmed"):
        engine.confirm(hold.id)
    assert_clean(engine)


def test_a_lapsed_part_expires_on_the_next_step(
    any_engine: stockade.Engine, wait: Callable[[float], None]
) -> None:
    eng = any_engine
    eng.restock("s", 10)
    hold = eng.reserve("s", 4, ttl=1)
    eng.confirm(hold.id, qty=1)
    wait(1.5)
    with pytest.raises(stockade.ReservationExpired):
        eng.confirm(hold.id, qty=1)
    done = eng.reservation(hold.id)
    assert units(done) == (0, 1, 0, 3, 0) and done.state is ReservationState.CONFIRMED
    assert eng.stock("s").reserved == 0
    assert_clean(eng)


def test_a_partial_release_gives_the_buyer_back_that_many(engine: stockade.Engine) -> None:
    engine.set_purchase_limit("g", per_buyer=4, skus=["s"])
    engine.restock("s", 20)
    hold = engine.reserve("s", 4, buyer="ann")
    with pytest.raises(stockade.LimitExceeded):
        engine.reserve("s", 1, buyer="ann")
    engine.release(hold.id, qty=3)
    assert engine.buyer_held("g", "ann") == 1
    engine.confirm(hold.id)
    assert engine.buyer_held("g", "ann") == 1  # sold units stay counted
    assert engine.reserve("s", 3, buyer="ann").qty == 3
    assert_clean(engine)


def test_partial_steps_as_awaitables(engine: stockade.Engine) -> None:
    engine.restock("s", 6)

    async def steps() -> Reservation:
        hold = await engine.reserve_async("s", 6)
        await engine.confirm_async(hold.id, qty=2)
        await engine.release_async(hold.id, qty=1)
        return await engine.confirm_async(hold.id, qty=3)

    done = asyncio.run(steps())
    assert units(done) == (0, 5, 1, 0, 0) and done.state is ReservationState.CONFIRMED
    assert engine.stock("s").on_hand == 1


def test_racing_partial_confirms_never_confirm_more_than_was_held(
    any_engine: stockade.Engine,
) -> None:
    """32 threads confirm one unit at a time of the same four holds of 5: exactly 20
    confirms succeed, the rest are refused, and the stock moved by exactly 20."""
    eng = any_engine
    eng.restock("hot", 25)
    holds: List[Reservation] = [eng.reserve("hot", 5) for _ in range(4)]

    def confirm_some(i: int) -> int:
        done = 0
        for n in range(8):
            try:
                eng.confirm(holds[(i + n) % 4].id, qty=1)
                done += 1
            except stockade.InvalidState:
                pass
        return done

    out = race(32, confirm_some)
    assert out.errors == [None] * 32
    assert sum(r for r in out.results if r is not None) == 20
    for h in holds:
        r = eng.reservation(h.id)
        assert units(r) == (0, 5, 0, 0, 0) and r.state is ReservationState.CONFIRMED
    lvl = eng.stock("hot")
    assert (lvl.on_hand, lvl.reserved) == (5, 0)
    assert_clean(eng)


def test_racing_partial_releases_and_confirms_of_one_hold_add_up(
    any_engine: stockade.Engine,
) -> None:
    eng = any_engine
    eng.restock("hot", 40)
    hold = eng.reserve("hot", 40)
    out = race(
        48,
        lambda i: (eng.confirm if i % 2 else eng.release)(hold.id, qty=1 + i % 3),
    )
    done = eng.reservation(hold.id)
    moved = done.confirmed + done.released
    assert done.held + moved == 40 and done.held >= 0
    assert all(isinstance(e, stockade.InvalidState) for e in out.errors if e is not None)
    lvl = eng.stock("hot")
    assert (lvl.on_hand, lvl.reserved) == (40 - done.confirmed, done.held)
    assert_clean(eng)


def test_orders_shipped_in_parts_on_one_hot_row_add_up(any_engine: stockade.Engine) -> None:
    """32 threads run 4 orders each on one row: reserve 3, confirm 2, release the last. On
    the batched path the reserves, confirms and releases of many orders share batches (on
    PostgreSQL the one-row statement with steps, decided on holds read without a lock).
    Every order ends confirmed with 2 sold and 1 released, and the row moved by exactly
    that."""
    eng = any_engine
    eng.restock("hot", 400)

    def orders(i: int) -> List[Reservation]:
        done = []
        for _ in range(4):
            hold = eng.reserve("hot", 3)
            assert eng.confirm(hold.id, qty=2).held == 1
            done.append(eng.release(hold.id))
        return done

    out = race(32, orders)
    assert out.errors == [None] * 32
    ended = [r for rs in out.results if rs is not None for r in rs]
    assert len(ended) == 128
    assert all(units(r) == (0, 2, 1, 0, 0) for r in ended)
    assert all(r.state is ReservationState.CONFIRMED for r in ended)
    lvl = eng.stock("hot")
    assert (lvl.on_hand, lvl.reserved) == (400 - 2 * 128, 0)
    assert_clean(eng)


# --- migration 009 on reservations made before it ---

# Migration 009 taken out again from a migrated schema, one statement at a time (so that
# Citus propagates each), so that migrate() applies it to reservations made before it.
BEFORE_UNITS = [
    "ALTER TABLE {s}.reservation DROP CONSTRAINT reservation_units",
    "ALTER TABLE {s}.reservation DROP COLUMN confirmed, DROP COLUMN released,"
    " DROP COLUMN expired, DROP COLUMN returned",
    "DELETE FROM {s}.schema_migrations WHERE version = 9",
]


def migration_9_moves_each_reservation_whole(dsn: str, **options: object) -> None:
    """Reservations in each state, 009 taken out, then applied again: each one's units
    are in the column of its state, the audit is clean, and a partial confirm works."""
    with stockade.Engine.postgres(dsn, sweeper=False, **options) as eng:  # type: ignore[arg-type]
        eng.restock("s", 20)
        holds = [eng.reserve("s", 2) for _ in range(3)]
        eng.confirm(holds[0].id)
        eng.release(holds[1].id)
    schema = str(options.get("schema", "stockade"))
    for statement in BEFORE_UNITS:
        run_sql(dsn, statement.format(s=schema))
    with stockade.Engine.postgres(dsn, sweeper=False, **options) as eng:  # type: ignore[arg-type]
        assert eng.migrate() == ["009_reservation_units.sql"]
        got = [units(eng.reservation(h.id)) for h in holds]
        assert got == [(0, 2, 0, 0, 0), (0, 0, 2, 0, 0), (2, 0, 0, 0, 0)]
        assert eng.confirm(holds[2].id, qty=1).held == 1
        assert_clean(eng)


@pytest.mark.postgres
def test_migration_9_on_reservations_made_before_it(stockade_postgres: PostgresForTests) -> None:
    name = stockade_postgres.new_database(migrated=True)
    try:
        migration_9_moves_each_reservation_whole(stockade_postgres.dsn(name))
    finally:
        stockade_postgres.drop_database(name)


@pytest.mark.citus
def test_citus_migration_9_on_distributed_reservations(
    stockade_citus_engine_factory: Callable[..., stockade.Engine], stockade_citus_dsn: str
) -> None:
    schema = stockade_citus_engine_factory(sweeper=False)._schema
    migration_9_moves_each_reservation_whole(stockade_citus_dsn, layout="citus", schema=schema)


# --- returns ---


def test_a_return_puts_sold_units_back_on_hand(engine: stockade.Engine) -> None:
    engine.set_purchase_limit("g", per_buyer=4, skus=["s"])
    engine.restock("s", 10)
    hold = engine.reserve("s", 4, buyer="ann")
    engine.confirm(hold.id, qty=3)  # one unit is still held
    back = engine.return_units(hold.id, 2, reason="too small", actor="desk-2")
    assert units(back) == (1, 3, 0, 0, 2) and back.state is ReservationState.HELD
    assert back.version == hold.version + 2
    lvl = engine.stock("s")
    assert (lvl.on_hand, lvl.reserved, lvl.available) == (9, 1, 8)
    assert engine.buyer_held("g", "ann") == 2  # the returned units went back to her count
    with pytest.raises(stockade.OverReturn, match="1 confirmed units not returned") as told:
        engine.return_units(hold.id, 2)
    assert isinstance(told.value, stockade.InvalidState)  # as it was before it had a class
    assert (told.value.http_status, told.value.code) == (409, "over_return")
    assert engine.reservation(hold.id).version == back.version  # the refusal changed nothing
    assert engine.stock("s") == lvl
    assert_clean(engine)


def test_a_damaged_return_is_recorded_without_going_on_sale(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    sold = engine.confirm(engine.reserve("s", 2).id)
    back = engine.return_units(sold.id, 1, restock=False)
    assert back.returned == 1 and back.state is ReservationState.CONFIRMED
    assert engine.stock("s").on_hand == 3
    assert_clean(engine)


def test_a_return_may_go_to_another_location(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    sold = engine.confirm(engine.reserve("s", 2).id)
    engine.return_units(sold.id, 2, location="store-9")  # a row made by the return
    assert engine.stock("s", location="store-9").on_hand == 2
    assert engine.stock("s").on_hand == 3
    assert_clean(engine)


def test_returns_are_journaled_as_returns(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    hold = engine.reserve("s", 3)
    engine.confirm(hold.id, qty=2, release_rest=True)
    engine.return_units(hold.id, 1, reason="changed mind", actor="desk-2")
    steps = [(m.cause, m.on_hand_delta, m.reserved_delta) for m in engine.movements("s")]
    assert steps[-3:] == [("hold", 0, 3), ("confirm", -2, -3), ("return", 1, 0)]
    last = engine.movements("s")[-1]
    assert (last.reason, last.actor, last.ref) == ("changed mind", "desk-2", str(hold.id))


def test_a_return_of_units_not_sold_is_refused(engine: stockade.Engine) -> None:
    engine.restock("s", 5)
    hold = engine.reserve("s", 2)
    with pytest.raises(stockade.OverReturn, match="0 confirmed units"):
        engine.return_units(hold.id, 1)
    with pytest.raises(stockade.NotFound):
        engine.return_units(uuid.UUID(bytes=bytes(16)), 1)
    with pytest.raises(stockade.InvalidArgument, match="qty"):
        engine.return_units(hold.id, 0)
    with pytest.raises(stockade.VersionConflict):
        engine.return_units(hold.id, 1, expected_version=hold.version + 5)
    engine.discontinue("s")
    sold = engine.reservation(hold.id)
    assert sold.returned == 0 and engine.stock("s").on_hand == 5


def test_racing_returns_never_return_more_than_was_sold(engine: stockade.Engine) -> None:
    engine.restock("s", 10)
    sold = engine.confirm(engine.reserve("s", 6).id)
    out = race(24, lambda i: engine.return_units(sold.id, 1 + i % 2))
    back = engine.reservation(sold.id)
    granted = [r for r in out.results if r is not None]
    assert back.returned == sum(1 + i % 2 for i, r in enumerate(out.results) if r is not None)
    assert back.returned <= 6 and len(granted) >= 3
    assert all(isinstance(e, stockade.InvalidState) for e in out.errors if e is not None)
    assert engine.stock("s").on_hand == 4 + back.returned
    assert_clean(engine)


# --- resize ---


def test_a_hold_grows_and_shrinks(engine: stockade.Engine) -> None:
    engine.restock("s", 10)
    hold = engine.reserve("s", 2, ttl=600)
    grown = engine.resize(hold.id, 5)
    assert (grown.qty, grown.held, grown.state) == (5, 5, ReservationState.HELD)
    assert grown.version == hold.version + 1 and grown.expires_at == hold.expires_at
    assert engine.stock("s").reserved == 5
    shrunk = engine.resize(hold.id, 1, expected_version=grown.version)
    assert units(shrunk) == (1, 0, 4, 0, 0) and shrunk.qty == 5
    assert engine.stock("s").available == 9
    same = engine.resize(hold.id, 1)
    assert same.version == shrunk.version  # nothing to change: nothing written
    steps = [m.cause for m in engine.movements("s")]
    assert steps[-3:] == ["hold", "resize", "resize"]
    assert_clean(engine)


def test_a_growth_past_the_free_units_is_refused_and_changes_nothing(
    engine: stockade.Engine,
) -> None:
    engine.restock("s", 4)
    hold = engine.reserve("s", 2)
    other = engine.reserve("s", 1)
    before = engine.stock("s")
    with pytest.raises(stockade.OutOfStock):
        engine.resize(hold.id, 4)  # 1 free, 2 more asked
    assert engine.reservation(hold.id).version == hold.version
    assert engine.stock("s") == before
    assert engine.resize(hold.id, 3).held == 3  # the free unit
    with pytest.raises(stockade.VersionConflict):
        engine.resize(other.id, 1, expected_version=other.version + 1)
    engine.confirm(other.id)
    with pytest.raises(stockade.InvalidState):
        engine.resize(other.id, 2)
    with pytest.raises(stockade.InvalidArgument, match="qty"):
        engine.resize(hold.id, 0)
    assert_clean(engine)


def test_a_growth_counts_against_the_buyers_limit(engine: stockade.Engine) -> None:
    engine.set_purchase_limit("g", per_buyer=4, skus=["s"])
    engine.restock("s", 20)
    hold = engine.reserve("s", 2, buyer="ann")
    with pytest.raises(stockade.LimitExceeded):
        engine.resize(hold.id, 5)
    assert engine.buyer_held("g", "ann") == 2  # the refusal counted nothing
    engine.resize(hold.id, 4)
    assert engine.buyer_held("g", "ann") == 4
    engine.resize(hold.id, 1)
    assert engine.buyer_held("g", "ann") == 1
    engine.remove_purchase_limit("g")
    with pytest.raises(stockade.InvalidState, match="purchase-limit group"):
        engine.resize(hold.id, 2)
    engine.release(hold.id)  # a hold counted in a group that is gone: the audit says so
    assert_clean(engine)


def test_a_growth_on_a_slotted_sku_takes_units_from_its_other_rows(
    engine: stockade.Engine,
) -> None:
    engine.restock("hot", 40)
    engine.set_slots("hot", 4)  # 10 units a row
    hold = engine.reserve("hot", 8)
    grown = engine.resize(hold.id, 30)  # more than its row has: the others fill it
    assert grown.held == 30 and engine.stock("hot").reserved == 30
    with pytest.raises(stockade.OutOfStock):
        engine.resize(hold.id, 41)
    assert engine.stock("hot").reserved == 30
    assert_clean(engine)


def test_cycles_of_shrinking_and_growing_never_take_qty_past_the_bound(
    engine: stockade.Engine,
) -> None:
    # Shrinks count as released, so each growth adds to qty: a hold grown and shrunk by
    # half the bound twice would pass it. The second growth is refused, nothing changed.
    half = stockade.QUANTITY_MAX // 2 + 1
    engine.restock("s", half + 1)
    hold = engine.reserve("s", 1)
    assert engine.resize(hold.id, half).qty == half
    shrunk = engine.resize(hold.id, 1)
    assert (shrunk.qty, shrunk.held) == (half, 1)
    with pytest.raises(stockade.InvalidState, match="QUANTITY_MAX"):
        engine.resize(hold.id, half)
    assert engine.reservation(hold.id) == shrunk
    assert engine.stock("s").reserved == 1
    assert_clean(engine)


def test_resizes_racing_reserves_for_the_last_units_never_oversell(
    engine: stockade.Engine,
) -> None:
    engine.restock("s", 30)
    holds = [engine.reserve("s", 1) for _ in range(10)]

    def grab(i: int) -> int:
        if i % 2:
            return engine.resize(holds[i // 2].id, 4).held - 1
        return engine.reserve("s", 3).qty

    out = race(20, grab)
    taken = sum(r for r in out.results if r is not None)
    assert all(isinstance(e, stockade.OutOfStock) for e in out.errors if e is not None)
    lvl = engine.stock("s")
    assert lvl.reserved == 10 + taken <= 30 and lvl.available == 30 - lvl.reserved
    assert_clean(engine)


@pytest.mark.sweeper_off
@pytest.mark.parametrize("step", ["resize", "release", "confirm"])
def test_a_lapsed_hold_found_by_a_step_is_journaled_as_an_expiry(
    engine: stockade.Engine, wait: Callable[[float], None], step: str
) -> None:
    engine.restock("s", 5)
    hold = engine.reserve("s", 2, ttl=1)
    wait(1.5)
    call = {
        "resize": lambda: engine.resize(hold.id, 3),
        "release": lambda: engine.release(hold.id, qty=1),
        "confirm": lambda: engine.confirm(hold.id),
    }[step]
    with pytest.raises(stockade.ReservationExpired):
        call()
    last = engine.movements("s")[-1]
    assert (last.cause, last.reserved_delta, last.ref) == ("expire", -2, str(hold.id))
