"""Holds lapse at their expiry by themselves (the default): a lapsed hold keeps no units,
a refused request frees lapsed holds before its refusal stands, and ``reservation(id)``
stops saying ``held``. With ``sweeper=False`` they lapse only when asked, which is what
these tests show it costs."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Callable

import pytest

import stockade
from support import ALL_STRATEGIES, wait_for

SLOW_SWEEP = timedelta(minutes=10)  # the longest sweep_interval: it never comes in a test


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_a_lapsed_hold_gives_its_units_back_on_the_memory_store(strategy: str) -> None:
    clock = stockade.ManualClock()
    with stockade.Engine.memory(clock=clock) as eng:
        eng.restock("s", 5)
        held = eng.reserve("s", 4, ttl=1)
        clock.advance(2)
        assert eng.stock("s").reserved == 0
        assert eng.reservation(held.id).state == "expired"
        assert eng.reserve("s", 5, strategy=strategy).qty == 5


def test_a_lapsed_hold_reads_as_expired_before_anything_else_runs() -> None:
    clock = stockade.ManualClock()
    with stockade.Engine.memory(clock=clock) as eng:
        eng.restock("s", 5)
        held = eng.reserve("s", 2, ttl=1)
        clock.advance(1)  # exactly at expires_at: lapsed
        assert eng.reservation(held.id).state == "expired"
        assert eng.stock("s").reserved == 0


def keeps_its_units_until_asked(eng: stockade.Engine, lapse: Callable[[], None]) -> None:
    """What sweeper=False costs: a lapsed hold keeps its units, and reads as held, until
    expire_due() runs."""
    eng.restock("s", 5)
    held = eng.reserve("s", 4, ttl=1)
    lapse()
    assert eng.reservation(held.id).state == "held"
    with pytest.raises(stockade.OutOfStock):
        eng.reserve("s", 2)
    assert eng.expire_due() == 1
    assert eng.reserve("s", 5).qty == 5


def test_without_the_sweeper_a_lapsed_hold_keeps_its_units_on_the_memory_store() -> None:
    clock = stockade.ManualClock()
    with stockade.Engine.memory(clock=clock, sweeper=False) as eng:
        keeps_its_units_until_asked(eng, lambda: clock.advance(2))


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_a_refused_request_frees_lapsed_holds_first_on_postgres(
    stockade_database: str, strategy: str
) -> None:
    # The sweeper's next round comes in 10 minutes (its first ran as the engine opened):
    # the refusal itself frees the lapsed hold.
    with stockade.Engine.postgres(stockade_database, sweep_interval=SLOW_SWEEP) as eng:
        assert wait_for(lambda: eng.stats()["sweeper"]["runs"] >= 1)
        eng.restock("s", 5)
        held = eng.reserve("s", 4, ttl=0.2)
        time.sleep(0.4)
        assert eng.reserve("s", 5, strategy=strategy).qty == 5
        assert eng.reservation(held.id).state == "expired"
        assert eng.stock("s").reserved == 5
        sweeper = eng.stats()["sweeper"]
        assert (sweeper["expired"], sweeper["freed_on_refusal"]) == (0, 1)


def test_an_order_refused_for_a_lapsed_hold_runs_again_on_postgres(stockade_database: str) -> None:
    with stockade.Engine.postgres(stockade_database, sweep_interval=SLOW_SWEEP) as eng:
        assert wait_for(lambda: eng.stats()["sweeper"]["runs"] >= 1)
        eng.restock("a", 3)
        eng.restock("b", 3)
        eng.reserve("b", 3, ttl=0.2)
        time.sleep(0.4)
        assert [r.qty for r in eng.reserve_order({"a": 1, "b": 3})] == [1, 3]
        assert eng.stats()["sweeper"]["freed_on_refusal"] == 1


def test_the_default_sweeper_expires_a_lapsed_hold_within_its_interval(
    stockade_database: str,
) -> None:
    with stockade.Engine.postgres(stockade_database) as eng:
        eng.restock("s", 5)
        held = eng.reserve("s", 4, ttl=1)
        # sweep_interval is 1 s: expired within about 2 s of expires_at, nobody asking.
        assert wait_for(lambda: eng.stock("s").reserved == 0, seconds=4)
        assert eng.reservation(held.id).state == "expired"
        assert eng.stats()["sweeper"]["enabled"]


def test_without_the_sweeper_a_lapsed_hold_keeps_its_units_on_postgres(
    stockade_database: str,
) -> None:
    with stockade.Engine.postgres(stockade_database, sweeper=False) as eng:
        keeps_its_units_until_asked(eng, lambda: time.sleep(1.2))
