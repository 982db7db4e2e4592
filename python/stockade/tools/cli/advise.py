"""``stockade advise``: the Claim Test's three questions, and the strategy that fits."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence, TextIO

from ...claim import claim_test
from ._common import Commands, emit_json, say


def _ask(
    question: str, answer: Optional[str], choices: Sequence[str], out: TextIO = sys.stdout
) -> str:
    """The answer given on the command line, or one read from stdin (prompts to `out`)."""
    while answer is None or answer not in choices:
        if answer is not None:
            print(f"  please answer one of: {', '.join(choices)}", file=out)
        try:
            print(f"{question} [{'/'.join(choices)}] ", end="", file=out, flush=True)
            answer = input().strip().lower()
        except (EOFError, OSError, RuntimeError, ValueError):
            # EOF, a closed or missing stdin (input() raises RuntimeError without one)
            raise SystemExit("stockade advise: no answer (stdin closed)") from None
    return answer


def advise(args: argparse.Namespace) -> int:
    out = say(args)
    print("The Claim Test: which answer to the lost update fits this write?\n", file=out)
    zero = _ask(
        "0. Can one conditional statement (or a constraint) do the whole write?",
        args.single_statement,
        ["yes", "no"],
        out,
    )
    fits, rate, retry = "yes", 0.0, "safe"
    if zero == "no":
        fits = _ask(
            "1. Hold: does the read-to-write window fit in one short transaction?",
            args.fits_in_transaction,
            ["yes", "no"],
            out,
        )
    if zero == "no" and fits == "yes":
        rate_text = args.conflict_rate
        while True:
            if rate_text is None:
                print(
                    "2. Odds: what fraction of writes to one row collide (0 to 1; "
                    "engine.recommend(sku) measures it)? ",
                    end="",
                    file=out,
                    flush=True,
                )
                try:
                    rate_text = input().strip()
                except (EOFError, OSError, RuntimeError, ValueError):
                    raise SystemExit("stockade advise: no answer (stdin closed)") from None
            try:
                rate = float(rate_text)
                if 0.0 <= rate <= 1.0:
                    break
            except ValueError:
                pass
            print("  please answer a number between 0 and 1", file=out)
            rate_text = None
        retry = _ask(
            "3. Cost: is losing the race safe and cheap to redo?",
            args.retry,
            ["safe", "cheap", "unsafe", "expensive"],
            out,
        )
    advice = claim_test(
        fits_in_transaction=fits == "yes",
        conflict_rate=rate,
        retry=retry,
        single_statement=zero == "yes",
    )
    if args.json:
        emit_json({"strategy": advice.strategy.value, "reasons": list(advice.reasons)})
        return 0
    print(f"\n=> {advice.strategy.value}")
    for reason in advice.reasons:
        print(f"   - {reason}")
    return 0


def add(commands: Commands) -> None:
    a = commands.command(
        "advise",
        "the Claim Test: three questions, one strategy",
        "Asks the Claim Test's questions (or takes the answers as options) and names the "
        "strategy that fits, with its reasons.",
    )
    a.add_argument(
        "--single-statement",
        choices=["yes", "no"],
        help="can one conditional statement do the whole write?",
    )
    a.add_argument(
        "--fits-in-transaction",
        choices=["yes", "no"],
        help="does the read-to-write window fit in one short transaction?",
    )
    a.add_argument("--conflict-rate", help="the fraction of writes to one row that collide")
    a.add_argument(
        "--retry",
        choices=["safe", "cheap", "unsafe", "expensive"],
        help="is losing the race safe and cheap to redo?",
    )
    a.set_defaults(run=advise)
