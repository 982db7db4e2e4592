"""Load scenarios, as users write them: stockade.testing.flash_sale on every strategy and
both stores, with its invariants checked (no oversell, a ledger that matches the grants,
every acknowledged reservation present). Small by default so that CI runs them; set
STOCKADE_LOAD_SCALE=10 for ten times the buyers and units.

The canary proves the checks can fail: the same scenario with the naive read-modify-write
must raise LoadInvariantError.
"""

from __future__ import annotations

import os

import pytest

import stockade
from stockade.testing import LoadInvariantError, flash_sale
from support import ALL_STRATEGIES

SCALE = int(os.environ.get("STOCKADE_LOAD_SCALE", "1"))
BUYERS = 400 * SCALE
UNITS = 100 * SCALE

pytestmark = pytest.mark.load


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_flash_sale_keeps_every_invariant(engine: stockade.Engine, strategy: str) -> None:
    report = flash_sale(engine, buyers=BUYERS, units=UNITS, strategy=strategy, clients=16)
    assert report.granted == UNITS  # buyers outnumber units: everything sells
    assert report.granted + report.refused + report.failed == BUYERS
    assert len(report.reservation_ids) == UNITS
    assert report.violations(engine) == []


def test_flash_sale_catches_the_canary_overselling(engine: stockade.Engine) -> None:
    with pytest.raises(LoadInvariantError) as info:
        flash_sale(engine, buyers=BUYERS, units=UNITS, strategy="naive-unsafe", clients=16)
    assert any(v.startswith("oversold") for v in info.value.violations)
    assert any(v.startswith("ledger") for v in info.value.violations)


def test_violations_name_a_lost_reservation(memory_engine: stockade.Engine) -> None:
    report = flash_sale(memory_engine, buyers=20, units=10, strategy="atomic", clients=4)
    memory_engine.release(report.reservation_ids[0])  # the ledger and the record now disagree
    found = report.violations(memory_engine)
    assert any("ledger" in v for v in found)
    assert any(str(report.reservation_ids[0]) in v and "released" in v for v in found)
