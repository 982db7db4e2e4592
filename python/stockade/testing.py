"""Helpers for tests and load scenarios, under their stable public name.

They live in :mod:`stockade.tools.testing` with the rest of the tooling; this module is
the name users' test suites import (``stockade.testing.flash_sale``, ``race``,
``naive_reserve``, ``hold_lock``).
"""

from __future__ import annotations

from .tools.testing import (
    FlashSaleReport,
    LoadInvariantError,
    RaceResult,
    flash_sale,
    hold_lock,
    limited_reserve_by_check,
    naive_reserve,
    race,
)

__all__ = [
    "FlashSaleReport",
    "LoadInvariantError",
    "RaceResult",
    "flash_sale",
    "hold_lock",
    "limited_reserve_by_check",
    "naive_reserve",
    "race",
]
