"""Both stores against a model: random operation sequences, one reference.

Goal: the engine follows the lifecycle of docs/design.md, section 2 (held -> confirmed | released |
expired, in parts too, returns of what was sold, expiry from the store clock, versions
growing on every change, refusals changing nothing) in any order of calls, not only in
the orders the example tests chose. Method: a Hypothesis state machine applies the same
operations to the engine and to a few lines of plain Python bookkeeping, and compares
them after every step.

On the memory store a ManualClock moves time, so holds lapse and expire. On PostgreSQL
time is the database's own, so there the machine gives every hold an hour and never
moves time: it checks the rest of the lifecycle on the real server, across strategies.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Dict, Optional

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import stockade
from support import START

SKUS = ["a", "b"]
STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic"]


@dataclass
class Hold:
    sku: str
    qty: int
    state: str
    version: int
    expires_us: int
    confirmed: int = 0
    released: int = 0
    expired: int = 0
    returned: int = 0

    @property
    def held(self) -> int:
        return self.qty - self.confirmed - self.released - self.expired

    def settle(self, how: str, units: int) -> None:
        """settle_units' rule: the units leave `held`; the state says how it ended."""
        setattr(self, how, getattr(self, how) + units)
        if self.held > 0:
            self.state = "held"
        elif self.confirmed > 0:
            self.state = "confirmed"
        else:
            self.state = how


class EngineModel(RuleBasedStateMachine):
    def __init__(self, engine: Optional[stockade.Engine] = None) -> None:
        super().__init__()
        self.clock: Optional[stockade.ManualClock] = None
        if engine is None:
            self.clock = stockade.ManualClock(START)
            engine = stockade.Engine.memory(clock=self.clock)
        self.engine = engine
        # Rows of one run are its own: PostgreSQL runs share one database.
        self.prefix = f"{uuid.uuid4().hex[:8]}-"
        self.ttl_floor_s = 0 if self.clock is not None else 3600
        # On PostgreSQL time is the database's and cannot be moved, and expire_due acts on
        # the whole schema: every TTL, extensions included, reaches past the run, so that
        # no hold lapses behind the model's back however slow the machine is.
        self.extend_s = 30 + self.ttl_floor_s
        self.now_us = 0
        self.on_hand: Dict[str, int] = {}
        self.reserved: Dict[str, int] = {}
        self.version: Dict[str, int] = {}
        self.holds: Dict[uuid.UUID, Hold] = {}

    # --- helpers ---

    def _expire_lazily(self, hold: Hold) -> None:
        self.reserved[hold.sku] -= hold.held
        self.version[hold.sku] += 1
        hold.settle("expired", hold.held)
        hold.version += 1

    def _pick(self, index: int) -> Optional[uuid.UUID]:
        ids = sorted(self.holds)
        return ids[index % len(ids)] if ids else None

    # --- rules ---

    @rule(sku=st.sampled_from(SKUS), qty=st.integers(1, 20))
    def restock(self, sku: str, qty: int) -> None:
        lvl = self.engine.restock(self.prefix + sku, qty)
        self.on_hand[sku] = self.on_hand.get(sku, 0) + qty
        self.reserved.setdefault(sku, 0)
        self.version[sku] = self.version.get(sku, 0) + 1
        assert lvl.version == self.version[sku]

    @rule(
        sku=st.sampled_from(SKUS),
        qty=st.integers(1, 8),
        ttl_s=st.integers(1, 120),
        strategy=st.sampled_from(STRATEGIES),
    )
    def reserve(self, sku: str, qty: int, ttl_s: int, strategy: str) -> None:
        ttl_s += self.ttl_floor_s
        if sku not in self.on_hand:
            try:
                self.engine.reserve(self.prefix + sku, qty, ttl=ttl_s, strategy=strategy)
            except stockade.NotFound:
                return
            raise AssertionError("reserve on a missing row succeeded")
        available = self.on_hand[sku] - self.reserved[sku]
        try:
            r = self.engine.reserve(self.prefix + sku, qty, ttl=ttl_s, strategy=strategy)
        except stockade.OutOfStock:
            assert qty > available
            return
        assert qty <= available
        self.reserved[sku] += qty
        self.version[sku] += 1
        self.holds[r.id] = Hold(sku, qty, "held", 1, self.now_us + ttl_s * 1_000_000)

    @rule(sku=st.sampled_from(SKUS), qty=st.integers(1, 8))
    def sell(self, sku: str, qty: int) -> None:
        if sku not in self.on_hand:
            return
        available = self.on_hand[sku] - self.reserved[sku]
        try:
            self.engine.sell(self.prefix + sku, qty)
        except stockade.OutOfStock:
            assert qty > available
            return
        self.on_hand[sku] -= qty
        self.version[sku] += 1

    @precondition(lambda self: bool(self.holds))
    @rule(
        index=st.integers(0, 1000),
        action=st.sampled_from(["confirm", "release", "extend", "ship"]),
        part=st.one_of(st.none(), st.integers(1, 8)),
    )
    def transition(self, index: int, action: str, part: Optional[int]) -> None:
        """confirm or release (all, or `part` units), ship (confirm `part`, release the
        rest), or extend."""
        rid = self._pick(index)
        assert rid is not None
        hold = self.holds[rid]
        call = {
            "confirm": lambda: self.engine.confirm(rid, qty=part),
            "release": lambda: self.engine.release(rid, qty=part),
            "ship": lambda: self.engine.confirm(rid, qty=part, release_rest=True),
            "extend": lambda: self.engine.extend(rid, ttl=timedelta(seconds=self.extend_s)),
        }[action]
        if hold.state != "held":
            expected = stockade.ReservationExpired if hold.expired > 0 else stockade.InvalidState
            try:
                call()
            except expected:
                return
            raise AssertionError(f"{action} of a {hold.state} hold succeeded")
        if self.now_us >= hold.expires_us:
            try:
                call()
            except stockade.ReservationExpired:
                self._expire_lazily(hold)
                return
            raise AssertionError(f"{action} of a lapsed hold succeeded")
        if action != "extend" and part is not None and part > hold.held:
            try:
                call()
            except stockade.InvalidState:
                return  # more than is held: refused, nothing changed (the invariants say)
            raise AssertionError(f"{action} of {part} from a hold of {hold.held} succeeded")
        r = call()
        hold.version += 1
        assert r.version == hold.version
        if action == "extend":
            hold.expires_us = self.now_us + self.extend_s * 1_000_000
            return
        units = hold.held if part is None else part
        sold = units if action in ("confirm", "ship") else 0
        freed = units - sold
        hold.settle("confirmed" if sold else "released", units)
        if action == "ship" and hold.held > 0:
            freed += hold.held
            hold.settle("released", hold.held)
        self.reserved[hold.sku] -= sold + freed
        self.on_hand[hold.sku] -= sold
        self.version[hold.sku] += 1

    @precondition(lambda self: bool(self.holds))
    @rule(index=st.integers(0, 1000), qty=st.integers(1, 10))
    def resize(self, index: int, qty: int) -> None:
        rid = self._pick(index)
        assert rid is not None
        hold = self.holds[rid]
        if hold.state != "held" or self.now_us >= hold.expires_us:
            expected = (
                stockade.ReservationExpired
                if hold.expired > 0 or hold.state == "held"
                else stockade.InvalidState
            )
            try:
                self.engine.resize(rid, qty)
            except expected:
                if hold.state == "held":
                    self._expire_lazily(hold)  # it lapsed: the resize expired it
                return
            raise AssertionError(f"a resize of a {hold.state} hold succeeded")
        delta = qty - hold.held
        available = self.on_hand[hold.sku] - self.reserved[hold.sku]
        if delta > available:
            try:
                self.engine.resize(rid, qty)
            except stockade.OutOfStock:
                return
            raise AssertionError("a growth past the free units succeeded")
        r = self.engine.resize(rid, qty)
        if delta == 0:
            assert r.version == hold.version
            return
        if delta > 0:
            hold.qty += delta
        else:
            hold.released -= delta
        hold.version += 1
        assert r.version == hold.version
        self.reserved[hold.sku] += delta
        self.version[hold.sku] += 1

    @precondition(lambda self: bool(self.holds))
    @rule(index=st.integers(0, 1000), qty=st.integers(1, 4), restock=st.booleans())
    def return_units(self, index: int, qty: int, restock: bool) -> None:
        rid = self._pick(index)
        assert rid is not None
        hold = self.holds[rid]
        if qty > hold.confirmed - hold.returned:
            try:
                self.engine.return_units(rid, qty, restock=restock)
            except stockade.InvalidState:
                return
            raise AssertionError("a return of more than was sold succeeded")
        r = self.engine.return_units(rid, qty, restock=restock)
        hold.returned += qty
        hold.version += 1
        assert r.version == hold.version
        if restock:
            self.on_hand[hold.sku] += qty
            self.version[hold.sku] += 1

    @precondition(lambda self: self.clock is not None)
    @rule(seconds=st.integers(1, 90))
    def advance(self, seconds: int) -> None:
        assert self.clock is not None
        self.clock.advance(seconds)
        self.now_us += seconds * 1_000_000
        # The memory store lets holds lapse by themselves (sweeper=True): the next call,
        # whichever it is, finds every hold past its expiry expired.
        for hold in self.holds.values():
            if hold.state == "held" and hold.expires_us <= self.now_us:
                self._expire_lazily(hold)

    @rule(limit=st.integers(1, 5))
    def expire_due(self, limit: int) -> None:
        due = [h for h in self.holds.values() if h.state == "held" and h.expires_us <= self.now_us]
        n = self.engine.expire_due(limit=limit)
        assert n == min(limit, len(due))
        if n == len(due):
            for hold in due:
                self._expire_lazily(hold)
        else:  # which ones is the store's choice: read them back
            for rid, hold in self.holds.items():
                if hold in due and self.engine.reservation(rid).state == "expired":
                    self._expire_lazily(hold)

    # --- invariants ---

    @invariant()
    def stock_rows_match(self) -> None:
        for sku, on_hand in self.on_hand.items():
            lvl = self.engine.stock(self.prefix + sku)
            assert (lvl.on_hand, lvl.reserved, lvl.version) == (
                on_hand,
                self.reserved[sku],
                self.version[sku],
            )
            assert 0 <= lvl.reserved <= lvl.on_hand

    @invariant()
    def holds_match(self) -> None:
        for rid, hold in self.holds.items():
            r = self.engine.reservation(rid)
            assert (r.state.value, r.version, r.qty) == (hold.state, hold.version, hold.qty)
            assert (r.held, r.confirmed, r.released, r.expired, r.returned) == (
                hold.held,
                hold.confirmed,
                hold.released,
                hold.expired,
                hold.returned,
            )
        held_qty = {s: 0 for s in self.on_hand}
        for hold in self.holds.values():
            if hold.state == "held":
                held_qty[hold.sku] += hold.held
        assert held_qty == self.reserved

    def teardown(self) -> None:
        # The audit agrees with the model: the engine's data proves its own invariants,
        # and the journal chains every row to the state the model expects.
        report = self.engine.audit(expiry_lag=10**6)
        assert report.ok, report.violations[:5]


TestEngineModel = EngineModel.TestCase
TestEngineModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_the_postgres_store_follows_the_model(stockade_engine: stockade.Engine) -> None:
    run_state_machine_as_test(
        lambda: EngineModel(stockade_engine),
        settings=settings(max_examples=80, stateful_step_count=40, deadline=None),
    )
