"""The Claim Test: which answer to the lost update fits a write (docs/design.md, section 1,
"The problem and the strategies").

Question zero: can one atomic statement (or a constraint) remove the window entirely?
Then no lock at all. Otherwise, in order: Hold (does the window fit inside one short
transaction?), Odds (how often do writes to the same row collide?), Cost (what does losing
the race cost: is a retry safe?).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import List, Tuple

from . import _core
from .errors import InvalidArgument, InvalidType
from .values import Strategy, shown

__all__ = ["HOT_CONFLICT_RATE", "LOW_CONFLICT_RATE", "ClaimAdvice", "claim_test"]

# Conflicts per write on one row, from the core (contention.hpp), where `auto` and
# recommend() use the same figures. Below LOW, optimistic retries are rare and cheap; past
# HOT, one row is a queue and folding requests into batches beats any per-request lock.
LOW_CONFLICT_RATE: float = _core.LOW_CONFLICT_RATE
HOT_CONFLICT_RATE: float = _core.HOT_CONFLICT_RATE

_RETRY = {"safe": True, "cheap": True, "unsafe": False, "expensive": False}


@dataclass(frozen=True)
class ClaimAdvice:
    """The strategy the Claim Test picks, and why, one reason per question asked."""

    strategy: Strategy
    reasons: Tuple[str, ...]

    def rows(self) -> List[Tuple[str, str]]:
        """``(question, answer)`` pairs: the strategy first, then one per reason (a reason
        that names its question, as in ``"odds: ..."``, is split there)."""
        out = [("strategy", self.strategy.value)]
        for reason in self.reasons:
            head, sep, tail = reason.partition(": ")
            out.append((head, tail) if sep and len(head) <= 24 else ("", reason))
        return out

    def __str__(self) -> str:
        """A two-column table, wrapped to 88 characters."""
        rows = self.rows()
        width = max(len(q) for q, _ in rows)
        lines = []
        for question, answer in rows:
            wrapped = textwrap.wrap(answer, 86 - width) or [""]
            lines.append(f"{question:>{width}}  {wrapped[0]}")
            lines.extend(f"{'':>{width}}  {more}" for more in wrapped[1:])
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        """How Jupyter shows it: a table."""
        cells = [f"| {f'**{q}**' if q else ''} | {a.replace('|', '/')} |" for q, a in self.rows()]
        return "\n".join(["| question | answer |", "|---|---|", *cells])


def _checked(
    fits_in_transaction: object, conflict_rate: object, retry: object, single_statement: object
) -> bool:
    """claim_test's arguments checked; whether a retry is safe."""
    if not all(isinstance(v, bool) for v in (fits_in_transaction, single_statement)):
        raise InvalidType("fits_in_transaction and single_statement must be bools")
    if isinstance(conflict_rate, bool) or not isinstance(conflict_rate, (int, float)):
        raise InvalidType("conflict_rate must be a number between 0 and 1")
    if not 0.0 <= conflict_rate <= 1.0:
        raise InvalidArgument(f"conflict_rate must be between 0 and 1, got {conflict_rate}")
    if retry not in _RETRY:
        raise InvalidArgument(f"retry must be one of {', '.join(_RETRY)}, got {shown(str(retry))}")
    return _RETRY[str(retry)]


def claim_test(
    *,
    fits_in_transaction: bool,
    conflict_rate: float,
    retry: str = "safe",
    single_statement: bool = False,
) -> ClaimAdvice:
    """Answers the Claim Test.

    ``fits_in_transaction``: does the read-to-write window fit inside one short database
    transaction? ``conflict_rate``: the measured fraction of writes to one row that collide
    (0 to 1; per row, not requests per second). ``retry``: ``"safe"``/``"cheap"`` if
    redoing the work is harmless, ``"unsafe"``/``"expensive"`` if it is not (a payment, an
    e-mail). ``single_statement``: question zero, can one conditional statement do it all?
    """
    retry_safe = _checked(fits_in_transaction, conflict_rate, retry, single_statement)

    if single_statement:
        return ClaimAdvice(
            Strategy.ATOMIC,
            ("question zero: one conditional statement removes the window, so no lock is needed",),
        )
    if not fits_in_transaction:
        return ClaimAdvice(
            Strategy.OPTIMISTIC,
            (
                "hold: the window spans requests, so no database lock can cover it",
                "use a version (ETag / If-Match) checked at write time, or a lease with expiry "
                "and a fencing token",
            ),
        )
    hold = "hold: the window fits inside one short transaction"
    odds = f"odds: {conflict_rate:.0%} of writes to one row collide"
    if not retry_safe:
        return ClaimAdvice(
            Strategy.PESSIMISTIC,
            (
                hold,
                odds,
                "cost: losing the race is unsafe to redo, so lock first",
            ),
        )
    if conflict_rate >= HOT_CONFLICT_RATE:
        return ClaimAdvice(
            Strategy.BATCHED,
            (
                hold,
                odds + f" (hot: >= {HOT_CONFLICT_RATE:.0%})",
                "cost: retries would mostly collide again; fold requests into batches",
            ),
        )
    if conflict_rate <= LOW_CONFLICT_RATE:
        return ClaimAdvice(
            Strategy.OPTIMISTIC,
            (
                hold,
                odds + f" (low: <= {LOW_CONFLICT_RATE:.0%})",
                "cost: a rare, safe retry is cheaper than taking a lock every time",
            ),
        )
    return ClaimAdvice(
        Strategy.PESSIMISTIC,
        (
            hold,
            odds + " (frequent)",
            "cost: retries would waste work at this rate; waiting for a lock is cheaper",
        ),
    )
