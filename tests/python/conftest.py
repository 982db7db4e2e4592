"""Shared fixtures: engines over each backend (the memory store for now), a manual clock,
and the list of per-request strategies every race and API test runs over."""

from __future__ import annotations

from typing import Iterator

import pytest

import stockade
from support import PER_REQUEST_STRATEGIES, START


@pytest.fixture
def clock() -> stockade.ManualClock:
    return stockade.ManualClock(START)


@pytest.fixture
def engine(clock: stockade.ManualClock) -> Iterator[stockade.Engine]:
    with stockade.Engine.memory(clock=clock) as eng:
        yield eng


@pytest.fixture(params=PER_REQUEST_STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return str(request.param)
