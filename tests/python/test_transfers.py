"""Transfers between locations: stock in transit, neither double-counted nor invisible.

Both stores and the Citus layout (``engine``): a transfer's units leave the source at once
and show as ``incoming`` at the destination; receives in parts, rejections written off,
cancels back to the source; refusals that change nothing; keys; the journal; listing;
transfers racing reserves and sells at the source, and receives racing cancels; a COMMIT
cut by the proxy on each step, settled by a keyed retry.
"""

from __future__ import annotations

import threading
import uuid
from typing import List

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade.testing import race
from support import assert_audit_clean, field


def units(engine: stockade.Engine, sku: str, location: str) -> tuple[int, int, int]:
    s = engine.stock(sku, location=location)
    return s.on_hand, s.reserved, s.incoming


def test_a_transfer_is_in_transit_until_received(engine: stockade.Engine) -> None:
    engine.restock("mug", 10, location="north")
    t = engine.transfer("mug", 6, source="north", destination="south", reason="rebalance")
    assert (t.qty, t.in_transit, t.state) == (6, 6, stockade.TransferState.IN_TRANSIT)
    assert (t.source, t.destination, t.reason) == ("north", "south", "rebalance")
    # Gone from the source at once; incoming at the destination, whose row it made.
    assert units(engine, "mug", "north") == (4, 0, 0)
    assert units(engine, "mug", "south") == (0, 0, 6)
    assert engine.stock("mug", location="south").available == 0
    t = engine.receive(t, accepted=2)
    assert (t.received, t.in_transit, t.state, t.version) == (2, 4, "in_transit", 2)
    assert units(engine, "mug", "south") == (2, 0, 4)
    t = engine.receive(t.id, accepted=3, rejected=1)
    assert (t.received, t.rejected, t.in_transit, t.state) == (5, 1, 0, "received")
    assert units(engine, "mug", "south") == (5, 0, 0)
    assert engine.get_transfer(t.id) == t
    with pytest.raises(stockade.InvalidState, match="0 units in transit"):
        engine.receive(t, accepted=1)
    with pytest.raises(stockade.InvalidState, match="no units in transit"):
        engine.cancel_transfer(t)
    assert_audit_clean(engine)


def test_a_cancel_sends_what_is_in_transit_back(engine: stockade.Engine) -> None:
    engine.restock("mug", 10, location="north")
    engine.restock("mug", 1, location="south")
    t = engine.transfer("mug", 7, source="north", destination="south")
    engine.receive(t, accepted=3)
    t = engine.cancel_transfer(t)
    assert (t.received, t.cancelled, t.in_transit, t.state) == (3, 4, 0, "received")
    assert units(engine, "mug", "north") == (7, 0, 0)
    assert units(engine, "mug", "south") == (4, 0, 0)
    whole = engine.cancel_transfer(engine.transfer("mug", 2, source="north", destination="south"))
    assert (whole.cancelled, whole.state) == (2, stockade.TransferState.CANCELLED)
    assert units(engine, "mug", "north") == (7, 0, 0)


def test_a_transfer_takes_only_free_units_and_a_refusal_changes_nothing(
    engine: stockade.Engine,
) -> None:
    engine.restock("mug", 10, location="north")
    engine.reserve("mug", 3, location="north")
    engine.set_safety_stock("mug", 2, location="north")
    engine.move_units("mug", 1, location="north", to_state="damaged")
    engine.set_backorder_limit("mug", 50, location="north")  # never ships backorders
    before = engine.stock("mug", location="north")
    with pytest.raises(stockade.OutOfStock, match="4 units free to transfer"):
        engine.transfer("mug", 5, source="north", destination="south")
    assert engine.stock("mug", location="north") == before
    with pytest.raises(stockade.NotFound):
        engine.stock("mug", location="south")  # no row made for a refusal
    assert engine.transfer("mug", 4, source="north", destination="south").qty == 4
    # 6 on hand + 50 backorders - 3 held - 2 safety - 1 damaged: sellable, not shippable.
    assert engine.stock("mug", location="north").available == 50


def test_leases_and_tombstones(engine: stockade.Engine) -> None:
    engine.restock("mug", 10, location="north")
    engine.set_on_hand("mug", 0, location="south")
    lease = engine.acquire_lease("mug", 60, location="south")
    with pytest.raises(stockade.LeaseHeld):
        engine.transfer("mug", 1, source="north", destination="south")
    engine.release_lease(lease)
    t = engine.transfer("mug", 4, source="north", destination="south")
    lease = engine.acquire_lease("mug", 60, location="south")
    with pytest.raises(stockade.LeaseHeld):
        engine.receive(t, accepted=1)
    engine.release_lease(lease)
    engine.discontinue("mug", location="south")  # units still arrive at a tombstone
    assert engine.receive(t, accepted=4).state == "received"
    engine.discontinue("mug", location="north")
    with pytest.raises(stockade.Discontinued):
        engine.transfer("mug", 1, source="north", destination="east")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"qty": 0},
        {"qty": -2},
        {"qty": True},
        {"destination": "north"},
        {"source": ""},
        {"reason": "r" * 201},
        {"idempotency_key": ""},
    ],
)
def test_bad_transfers_are_refused_and_change_nothing(
    engine: stockade.Engine, kwargs: dict
) -> None:
    engine.restock("mug", 5, location="north")
    before = engine.stock("mug", location="north")
    args = {"qty": 1, "source": "north", "destination": "south", **kwargs}
    qty = args.pop("qty")
    with pytest.raises((stockade.InvalidArgument, stockade.InvalidType)):
        engine.transfer("mug", qty, **args)
    assert engine.stock("mug", location="north") == before
    assert engine.transfers(sku="mug") == []


def test_bad_steps_are_refused(engine: stockade.Engine) -> None:
    engine.restock("mug", 5, location="north")
    t = engine.transfer("mug", 3, source="north", destination="south")
    for accepted, rejected in [(0, 0), (-1, 2), (1, -1)]:
        with pytest.raises(stockade.InvalidArgument):
            engine.receive(t, accepted=accepted, rejected=rejected)
    with pytest.raises(stockade.InvalidState, match="3 units in transit, fewer than the 4"):
        engine.receive(t, accepted=2, rejected=2)
    with pytest.raises(stockade.NotFound):
        engine.receive(uuid.uuid4(), accepted=1)
    with pytest.raises(stockade.NotFound):
        engine.get_transfer(str(uuid.uuid4()))
    with pytest.raises(stockade.InvalidType):
        engine.cancel_transfer(42)  # type: ignore[arg-type]
    assert engine.get_transfer(t) == t


def test_keys_replay_each_step_and_conflict(engine: stockade.Engine) -> None:
    engine.restock("mug", 10, location="north")
    key = f"t-{uuid.uuid4()}"
    t = engine.transfer("mug", 5, source="north", destination="south", idempotency_key=key)
    again = engine.transfer("mug", 5, source="north", destination="south", idempotency_key=key)
    assert again == t and units(engine, "mug", "north") == (5, 0, 0)
    with pytest.raises(stockade.IdempotencyConflict, match="transfer"):
        engine.transfer("mug", 4, source="north", destination="south", idempotency_key=key)
    got = engine.receive(t, accepted=2, idempotency_key=key + "-r")
    assert engine.receive(t, accepted=2, idempotency_key=key + "-r") == got
    assert units(engine, "mug", "south") == (2, 0, 3)
    back = engine.cancel_transfer(t, idempotency_key=key + "-c")
    assert engine.cancel_transfer(t, idempotency_key=key + "-c") == back
    with pytest.raises(stockade.IdempotencyConflict, match="cancel_transfer"):
        engine.receive(t, accepted=1, idempotency_key=key + "-c")
    assert units(engine, "mug", "north") == (8, 0, 0)


def test_the_journal_names_each_step(engine: stockade.Engine) -> None:
    engine.restock("mug", 10, location="north")
    t = engine.transfer("mug", 5, source="north", destination="south", actor="ops-1")
    engine.receive(t, accepted=2, rejected=1)
    engine.cancel_transfer(t)
    tid = str(t.id)

    def seen(location: str) -> list:
        moves = engine.movements("mug", location=location)
        return [(m.cause, m.on_hand_delta, m.ref) for m in moves if m.cause != "restock"]

    # Each row's entries in order (the journal orders one row's changes, not two rows').
    assert seen("north") == [("transfer_out", -5, tid), ("transfer_cancel", 2, tid)]
    assert seen("south") == [
        ("create", 0, tid),  # south had no row: the transfer made it, at zero units
        ("transfer_in", 0, tid),
        ("receive", 2, tid),
        ("reject", 0, tid),
        ("transfer_cancel", 0, tid),
    ]
    assert [m.actor for m in engine.movements("mug", location="north")][1:2] == ["ops-1"]
    assert_audit_clean(engine)


def test_transfers_list_by_sku_and_state_in_pages(engine: stockade.Engine) -> None:
    engine.restock("mug", 20, location="north")
    engine.restock("cup", 20, location="north")
    made = [engine.transfer("mug", 1, source="north", destination="south") for _ in range(5)]
    engine.transfer("cup", 1, source="north", destination="south")
    engine.cancel_transfer(made[1])
    ids = sorted(t.id for t in made)  # ids order transfers by time, to the millisecond
    assert [t.id for t in engine.transfers(sku="mug")] == ids
    first = engine.transfers(sku="mug", limit=2)
    rest = engine.transfers(sku="mug", after=first[-1], limit=10)
    assert [t.id for t in first + rest] == ids
    cancelled = engine.transfers(state="cancelled")
    assert [t.id for t in cancelled] == [made[1].id]
    assert len(engine.transfers(state=stockade.TransferState.IN_TRANSIT)) == 5
    with pytest.raises(stockade.InvalidArgument):
        engine.transfers(state="lost")
    with pytest.raises(stockade.InvalidArgument):
        engine.transfers(limit=0)


# A transfer locks its rows whatever the sales' strategy: one strategy of each kind races it.
@pytest.mark.parametrize("strategy", ["atomic", "pessimistic", "optimistic", "batched"])
def test_transfers_racing_sales_at_the_source_never_double_count(
    engine: stockade.Engine, strategy: str
) -> None:
    # 24 threads: half sell or hold one unit at the source, half transfer two units out of
    # it, while the source runs dry. Every unit is sold, held, or in transit, exactly once.
    engine.restock("hot", 60, location="north")
    sold: List[int] = []
    sent: List[stockade.Transfer] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        for n in range(8):
            try:
                if i % 2:
                    t = engine.transfer("hot", 2, source="north", destination="south")
                    with lock:
                        sent.append(t)
                elif n % 2:
                    engine.sell("hot", 1, location="north", strategy=strategy)
                    with lock:
                        sold.append(1)
                else:
                    engine.reserve("hot", 1, location="north", strategy=strategy)
                    with lock:
                        sold.append(1)
            except (stockade.OutOfStock, stockade.RetriesExhausted):
                continue

    out = race(24, worker, timeout=120)
    assert not any(out.errors), [e for e in out.errors if e][:3]
    north = engine.stock("hot", location="north")
    south = engine.stock("hot", location="south")
    in_transit = sum(t.qty for t in sent)
    assert south.incoming == in_transit
    assert north.on_hand + in_transit + (len(sold) - north.reserved) == 60
    assert north.on_hand >= north.reserved
    assert_audit_clean(engine)


def test_receives_racing_cancels_move_each_unit_once(engine: stockade.Engine) -> None:
    engine.restock("hot", 100, location="north")
    transfers = [engine.transfer("hot", 10, source="north", destination="south") for _ in range(5)]

    def worker(i: int) -> None:
        t = transfers[i % 5]
        for _ in range(6):
            try:
                if i % 3 == 0:
                    engine.cancel_transfer(t)
                else:
                    engine.receive(t, accepted=1, rejected=1 if i % 3 == 2 else 0)
            except stockade.InvalidState:
                continue

    out = race(15, worker, timeout=120)
    assert not any(out.errors), [e for e in out.errors if e][:3]
    done = [engine.get_transfer(t) for t in transfers]
    assert all(t.in_transit == 0 for t in done)
    north = engine.stock("hot", location="north")
    south = engine.stock("hot", location="south")
    assert south.incoming == 0
    assert south.on_hand == sum(t.received for t in done)
    assert north.on_hand == 50 + sum(t.cancelled for t in done)
    assert north.on_hand + south.on_hand + sum(t.rejected for t in done) == 100
    assert_audit_clean(engine)


@pytest.mark.parametrize("cut", ["before", "after"])
def test_each_step_cut_at_its_commit_settles_with_its_key(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    key = f"cut-{uuid.uuid4()}"
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False) as eng:
        eng.restock("cut", 30, location="north")

        def keyed(call, suffix):  # type: ignore[no-untyped-def]
            proxy.arm(cut)
            try:
                return call(key + suffix)
            except stockade.InDoubt:
                return call(key + suffix)  # the retry with the key settles it

        t = keyed(
            lambda k: eng.transfer(
                "cut", 9, source="north", destination="south", idempotency_key=k
            ),
            "-t",
        )
        t = keyed(lambda k: eng.receive(t, accepted=3, rejected=1, idempotency_key=k), "-r")
        t = keyed(lambda k: eng.cancel_transfer(t, idempotency_key=k), "-c")
        assert proxy.cuts >= 1
        assert (t.received, t.rejected, t.cancelled) == (3, 1, 5)
        assert units(eng, "cut", "north") == (26, 0, 0)
        assert units(eng, "cut", "south") == (3, 0, 0)
        assert eng.transfers(sku="cut") == [t]
        assert_audit_clean(eng)


def test_retention_purges_finished_transfers_only(
    engine: stockade.Engine, clock: stockade.ManualClock
) -> None:
    engine.restock("mug", 10, location="north")
    done = engine.cancel_transfer(engine.transfer("mug", 2, source="north", destination="south"))
    moving = engine.transfer("mug", 3, source="north", destination="south")
    clock.advance(1)  # the memory store's clock; PostgreSQL's has moved on by itself
    engine.purge(0)
    with pytest.raises(stockade.NotFound):
        engine.get_transfer(done)
    assert engine.get_transfer(moving).in_transit == 3
    assert [t.id for t in engine.transfers(sku="mug")] == [moving.id]


def test_the_audit_finds_incoming_that_no_transfer_explains(
    stockade_engine: stockade.Engine, stockade_database: str
) -> None:
    from stockade.tools.pgserver import run_sql

    eng = stockade_engine
    eng.restock("mug", 10, location="north")
    eng.transfer("mug", 4, source="north", destination="south")
    assert "incoming_matches_transfers" in eng.audit().checks and eng.audit().ok
    run_sql(stockade_database, "UPDATE stockade.stock SET incoming = 5 WHERE location = 'south'")
    [bad] = eng.audit().violations
    assert (bad.check, bad.location, bad.expected, bad.found) == (
        "incoming_matches_transfers",
        "south",
        "incoming = 4 (its transfers in transit)",
        "incoming = 5",
    )


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_keyless_transfer_cut_at_its_commit_settles_by_its_id(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # Its COMMIT cut: the engine made the transfer's id, so finding it tells whether it
    # landed (once the cut session is known to be gone; behind a pooler it may not be).
    dsn = proxy.dsn(field(stockade_database, "dbname"))
    with stockade.Engine.postgres(dsn, pool_size=2, sweeper=False) as eng:
        eng.restock("cut", 30, location="north")
        proxy.arm(cut)
        try:
            t = eng.transfer("cut", 9, source="north", destination="south")
        except stockade.InDoubt as e:
            assert pooled and cut == "before", e
            assert eng.transfers(sku="cut") == []  # not landed
            return
        assert proxy.cuts >= 1
        assert eng.transfers(sku="cut") == [t]  # once
        assert units(eng, "cut", "north") == (21, 0, 0)
        assert units(eng, "cut", "south") == (0, 0, 9)
        assert_audit_clean(eng)
