"""Units on hand that are not for sale: safety stock, damaged and quality-control units.

Both stores and the Citus layout (``engine``): what each state withholds, moves between
states and their refusals, write-offs, counts that must cover them, keys, the journal's
causes and alerts, allocation, hot-row slots, bad input; and a 64-thread race on every
strategy, batched too, in which no withheld unit is ever held or sold.
"""

from __future__ import annotations

import threading
import uuid
from typing import List

import pytest

import stockade
from stockade.testing import race
from support import ALL_STRATEGIES, assert_audit_clean


def states(level: stockade.StockLevel) -> tuple[int, int, int, int, int, int]:
    return (
        level.on_hand,
        level.reserved,
        level.available,
        level.safety_stock,
        level.damaged,
        level.quality_control,
    )


def test_each_state_withholds_its_units_from_sale(engine: stockade.Engine) -> None:
    engine.restock("a", 20)
    assert states(engine.set_safety_stock("a", 3)) == (20, 0, 17, 3, 0, 0)
    assert states(engine.move_units("a", 4)) == (20, 0, 13, 3, 4, 0)  # to damaged
    level = engine.move_units("a", 2, to_state="quality_control", reason="inspect")
    assert states(level) == (20, 0, 11, 3, 4, 2)
    engine.reserve("a", 6)
    engine.sell("a", 5)
    assert states(engine.stock("a")) == (15, 6, 0, 3, 4, 2)
    for call in (lambda: engine.reserve("a", 1), lambda: engine.sell("a", 1)):
        with pytest.raises(stockade.OutOfStock, match="has 0 available"):
            call()
    assert states(engine.stock("a")) == (15, 6, 0, 3, 4, 2)  # the refusals changed nothing
    # Back from quality control: sellable again.
    back = engine.move_units("a", 2, from_state="quality_control", to_state="available")
    assert back.available == 2
    assert engine.sell("a", 2).available == 0
    assert_audit_clean(engine)


def test_safety_stock_is_a_floor_not_a_bucket(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    held = engine.reserve("a", 8, ttl=600)
    # Above what is free: available shows 0, never less; the hold keeps its units.
    level = engine.set_safety_stock("a", 5)
    assert (level.available, level.safety_stock, level.reserved) == (0, 5, 8)
    assert engine.confirm(held.id).state == "confirmed"
    assert states(engine.stock("a")) == (2, 0, 0, 5, 0, 0)
    # A count that finds fewer units is still recorded; a restock lifts available again.
    assert engine.set_on_hand("a", 1).available == 0
    assert engine.restock("a", 6).available == 2
    # Units the floor keeps back are free units: they can be written off.
    level = engine.move_units("a", 7, to_state="written_off", reason="shrinkage")
    assert states(level) == (0, 0, 0, 5, 0, 0)
    assert engine.set_safety_stock("a", 0).available == 0
    assert_audit_clean(engine)


def test_moves_between_states_and_their_refusals(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    engine.reserve("a", 4)
    engine.set_safety_stock("a", 2)
    before = engine.stock("a")
    # From available: only units neither held nor in another state (6), the floor aside.
    with pytest.raises(stockade.OutOfStock, match="6 units neither held nor in another state"):
        engine.move_units("a", 7)
    assert engine.stock("a") == before
    level = engine.move_units("a", 6, to_state="damaged")
    assert (level.on_hand, level.damaged, level.available) == (10, 6, 0)
    with pytest.raises(stockade.InvalidState, match="6 units damaged, fewer than the 7"):
        engine.move_units("a", 7, from_state="damaged", to_state="quality_control")
    level = engine.move_units("a", 5, from_state="damaged", to_state="quality_control")
    assert (level.damaged, level.quality_control) == (1, 5)
    level = engine.move_units("a", 3, from_state="quality_control", to_state="written_off")
    assert (level.on_hand, level.damaged, level.quality_control, level.reserved) == (7, 1, 2, 4)
    # What is held and what sits in a state must stay covered by a count.
    with pytest.raises(stockade.InvalidState, match="damaged or in quality control"):
        engine.set_on_hand("a", 6)
    assert engine.set_on_hand("a", 7).on_hand == 7
    assert_audit_clean(engine)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"from_state": "lost"},
        {"to_state": "sold"},
        {"from_state": "written_off", "to_state": "available"},
        {"from_state": "damaged", "to_state": "damaged"},
        {"qty": 0},
        {"qty": -1},
        {"qty": True},
        {"reason": "x" * 201},
    ],
)
def test_bad_moves_are_refused_and_change_nothing(engine: stockade.Engine, kwargs: dict) -> None:
    engine.restock("a", 5)
    before = engine.stock("a")
    kwargs = dict(kwargs)  # the parameter's dict is shared by every backend's run
    qty = kwargs.pop("qty", 1)
    with pytest.raises(stockade.InvalidArgument):
        engine.move_units("a", qty, **kwargs)
    with pytest.raises(stockade.InvalidArgument):
        engine.set_safety_stock("a", -1)
    assert engine.stock("a") == before
    with pytest.raises(stockade.NotFound):
        engine.move_units("missing", 1)


def test_a_keyed_move_replays_and_conflicts(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    key = f"move-{uuid.uuid4()}"
    first = engine.move_units("a", 3, idempotency_key=key)
    again = engine.move_units("a", 3, idempotency_key=key)
    assert again == first and engine.stock("a").damaged == 3  # once
    with pytest.raises(stockade.IdempotencyConflict, match="move_units"):
        engine.move_units("a", 3, to_state="quality_control", idempotency_key=key)
    with pytest.raises(stockade.IdempotencyConflict, match="move_units"):
        engine.restock("a", 3, idempotency_key=key)


def test_the_journal_names_each_change_and_counts_withheld_units(engine: stockade.Engine) -> None:
    engine.restock("a", 4)
    engine.set_safety_stock("a", 1)
    engine.move_units("a", 2, reason="dropped", actor="picker-3")
    engine.move_units("a", 1, from_state="damaged", to_state="written_off")
    engine.move_units("a", 1, from_state="available", to_state="written_off")
    engine.move_units("a", 1, from_state="damaged", to_state="available")
    seen = [(m.cause, m.on_hand_delta, m.available, m.alerts) for m in engine.movements("a")]
    assert seen == [
        ("restock", 4, 4, {"back_in_stock"}),
        ("safety_stock", 0, 3, set()),
        ("move", 0, 1, set()),
        ("write_off", -1, 1, set()),
        ("write_off", -1, 0, {"sold_out"}),
        ("move", 0, 1, {"back_in_stock"}),
    ]
    moved = engine.movements("a")[2]
    assert (moved.reason, moved.actor) == ("dropped", "picker-3")
    assert_audit_clean(engine)


def test_an_allocation_takes_only_what_is_for_sale(engine: stockade.Engine) -> None:
    pool = ["north", "south"]
    engine.restock("a", 5, location="north")
    engine.restock("a", 5, location="south")
    engine.set_safety_stock("a", 3, location="north")
    engine.move_units("a", 4, location="south", to_state="quality_control")
    with pytest.raises(stockade.OutOfStock) as refused:
        engine.allocate("a", 4, locations=pool)
    assert refused.value.pool == {"north": 2, "south": 1}
    order = engine.allocate("a", 3, locations=pool)
    assert {r.location: r.qty for r in order} == {"north": 2, "south": 1}


def test_hot_row_slots_are_not_built_for_withheld_units(engine: stockade.Engine) -> None:
    engine.restock("kept", 50)
    engine.set_safety_stock("kept", 5)
    with pytest.raises(stockade.InvalidState, match="withholds units"):
        engine.set_slots("kept", 4)
    engine.restock("spread", 50)
    engine.set_slots("spread", 4)
    for call in (
        lambda: engine.set_safety_stock("spread", 5),
        lambda: engine.move_units("spread", 1),
    ):
        with pytest.raises(stockade.NotSupported, match="not built for a SKU with hot-row slots"):
            call()
    assert engine.stock("spread").damaged == 0 and engine.stock("spread").available == 50


@pytest.mark.parametrize("strategy", [*ALL_STRATEGIES])
def test_no_withheld_unit_is_ever_held_or_sold_under_a_race(
    engine: stockade.Engine, strategy: str
) -> None:
    # 64 buyers hold and sell one unit at a time on a row that keeps 6 units back as
    # safety stock, 5 damaged and 4 in quality control: exactly the 45 free units go,
    # however the strategy decides (batched ones on the batch's checks).
    engine.restock("hot", 60)
    engine.set_safety_stock("hot", 6)
    engine.move_units("hot", 5, to_state="damaged")
    engine.move_units("hot", 4, to_state="quality_control")
    granted: List[int] = []
    lock = threading.Lock()

    def buyer(i: int) -> None:
        for n in range(2):
            for _ in range(50):  # optimistic may lose its retries_max: it changed nothing
                try:
                    if (i + n) % 2:
                        engine.reserve("hot", 1, strategy=strategy)
                    else:
                        engine.sell("hot", 1, strategy=strategy)
                except stockade.OutOfStock:
                    break
                except stockade.RetriesExhausted:
                    continue
                with lock:
                    granted.append(1)
                break

    out = race(64, buyer, timeout=120)
    assert not any(out.errors), [e for e in out.errors if e][:3]
    level = engine.stock("hot")
    assert len(granted) == 45
    assert states(level)[2:] == (0, 6, 5, 4)
    assert level.on_hand - level.reserved == 60 - 45 == 6 + 5 + 4
    assert_audit_clean(engine)


def test_a_sku_that_had_slots_withholds_on_its_own_row(engine: stockade.Engine) -> None:
    # Its slot rows are retired, not gone: a refusal must still be OutOfStock (the units a
    # slot could move never include withheld ones), and a count must cover every claim.
    engine.restock("once", 20)
    engine.set_slots("once", 4)
    engine.set_slots("once", 1)
    engine.set_safety_stock("once", 5)
    engine.move_units("once", 3, to_state="damaged")
    assert engine.stock("once").available == 12
    assert engine.sell("once", 12).available == 0
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("once", 1)
    with pytest.raises(stockade.InvalidState, match="damaged or in quality control"):
        engine.set_on_hand("once", 2)
    level = engine.set_on_hand("once", 10)
    assert (level.on_hand, level.damaged, level.available) == (10, 3, 2)
    assert_audit_clean(engine)
