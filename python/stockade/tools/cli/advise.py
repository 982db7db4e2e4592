"""``stockade advise``: the Claim Test's four questions, and the strategy that fits."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence, TextIO

from ...claim import claim_test
from ._common import Commands, emit_json, number, say, usage_error

# The questions, each with the option that answers it.
ZERO = "0. Can one conditional statement (or a constraint) do the whole write?"
HOLD = "1. Hold: does the read-to-write window fit in one short transaction?"
ODDS = (
    "2. Odds: what fraction of writes to one row collide (0 to 1; engine.recommend(sku) "
    "measures it)?"
)
COST = "3. Cost: is losing the race safe and cheap to redo?"
RETRY_ANSWERS = ["safe", "cheap", "unsafe", "expensive"]
fraction = number(float, 0.0, 1.0)


def _read(args: argparse.Namespace, question: str, option: str, out: TextIO) -> str:
    """One answer from stdin (the question printed to `out` first); a usage error when
    stdin is closed or missing (input() raises RuntimeError without one)."""
    try:
        print(question, end=" ", file=out, flush=True)
        return input().strip()
    except (EOFError, OSError, RuntimeError, ValueError):
        usage_error(args, f"no answer to question {question[0]} (stdin closed): give {option}")


def _ask(
    args: argparse.Namespace,
    question: str,
    option: str,
    answer: Optional[str],
    choices: Sequence[str],
    out: TextIO = sys.stdout,
) -> str:
    """The answer given on the command line (argparse checked it), or one read from stdin,
    asked again until it is one of `choices`."""
    while answer is None or answer not in choices:
        if answer is not None:
            print(f"  please answer one of: {', '.join(choices)}", file=out)
        answer = _read(args, f"{question} [{'/'.join(choices)}]", option, out).lower()
    return answer


def _ask_rate(args: argparse.Namespace, out: TextIO) -> float:
    if args.conflict_rate is not None:
        return float(args.conflict_rate)
    while True:
        try:
            return float(fraction(_read(args, ODDS, "--conflict-rate", out)))
        except argparse.ArgumentTypeError:
            print("  please answer a number between 0 and 1", file=out)


def advise(args: argparse.Namespace) -> int:
    out = say(args)
    print("The Claim Test: which answer to the lost update fits this write?\n", file=out)
    zero = _ask(args, ZERO, "--single-statement", args.single_statement, ["yes", "no"], out)
    fits, rate, retry = "yes", 0.0, "safe"
    if zero == "no":
        fits = _ask(
            args, HOLD, "--fits-in-transaction", args.fits_in_transaction, ["yes", "no"], out
        )
    if zero == "no" and fits == "yes":
        rate = _ask_rate(args, out)
        retry = _ask(args, COST, "--retry", args.retry, RETRY_ANSWERS, out)
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
        "the Claim Test: four questions, one strategy",
        "Asks the Claim Test's four questions (question zero, hold, odds, cost), or takes "
        "the answers as options, and names the strategy that fits, with its reasons. A "
        "question an earlier answer makes moot is not asked.",
    )
    a.add_argument(
        "--single-statement",
        choices=["yes", "no"],
        help="0: can one conditional statement do the whole write? (default: asked on stdin)",
    )
    a.add_argument(
        "--fits-in-transaction",
        choices=["yes", "no"],
        help="1: does the read-to-write window fit in one short transaction? "
        "(default: asked on stdin)",
    )
    a.add_argument(
        "--conflict-rate",
        type=fraction,
        metavar="RATE",
        help="2: the fraction of writes to one row that collide, 0 to 1 (default: asked on stdin)",
    )
    a.add_argument(
        "--retry",
        choices=RETRY_ANSWERS,
        help="3: is losing the race safe and cheap to redo? (default: asked on stdin)",
    )
    a.set_defaults(run=advise)
