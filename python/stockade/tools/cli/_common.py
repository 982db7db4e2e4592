"""What the commands share: the strategies, the DSN option's help, where prose goes, the
subcommand parsers with --json, their help and their errors.

A usage error (a value out of range, options that do not combine, a question left
unanswered on a closed stdin) raises :class:`UsageError`; a command that could not do its
work raises :class:`Failed` or lets a :class:`~stockade.StockadeError` through. ``main``
reports either once: one line on stderr, exit status 2, and with ``--json`` a JSON error
object on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Callable, Dict, NoReturn, TextIO

from ...values import Strategy

# Every strategy, in the order of stockade.Strategy.
STRATEGIES = [s.value for s in Strategy]


DSN_HELP = (
    "a PostgreSQL server of yours (libpq connection string); default: $STOCKADE_DSN, else "
    "libpq's PG* variables when one of them is set"
)


def say(args: argparse.Namespace) -> TextIO:
    """Where progress and prose go: stdout, or stderr when --json keeps stdout for JSON."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def emit_json(document: Dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, default=str))


class UsageError(Exception):
    """A command line the command cannot run: exit status 2, as argparse's own errors."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(f"{prog}: error: {message}")


class Failed(Exception):
    """A command that could not do its work for a reason other than stockade's (a peer
    tool that failed): exit status 2, the message once."""


def usage_error(args: argparse.Namespace, message: str) -> NoReturn:
    raise UsageError(f"stockade {args.command}", message)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors raise :class:`UsageError` (one line, no usage dump)
    for ``main`` to report, instead of printing and exiting here."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message)


class DefaultsOnce(argparse.HelpFormatter):
    """Help that shows each option's default once: ``(default: X)`` is added unless the
    help already speaks of its default, or there is none worth showing (None, or a flag's
    False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        nothing = action.default is None or action.default is False
        if nothing or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        if "default" in text.lower():
            return text
        return text + " (default: %(default)s)"


class Commands:
    """The subcommands' parsers, each with ``--json`` and its defaults in ``--help``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
        self.parsers: Dict[str, argparse.ArgumentParser] = {}

    def command(self, name: str, summary: str, description: str) -> argparse.ArgumentParser:
        p = self.sub.add_parser(
            name, help=summary, description=description, formatter_class=DefaultsOnce
        )
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        self.parsers[name] = p
        return p


def number(kind: Callable[[str], Any], low: float, high: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: a finite ``kind`` (int or float) from ``low`` to ``high``; anything
    else is a usage error that says the range."""

    def shown(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else f"{x:g}"

    def parse(text: str) -> Any:
        span = (
            f"at least {shown(low)}" if high == math.inf else f"from {shown(low)} to {shown(high)}"
        )
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number {span}, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return value

    return parse


def backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["memory", "postgres"],
        default="postgres",
        help="postgres (a throwaway local server unless --dsn) or the embedded memory store",
    )


def add_layout(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--layout", choices=["plain", "citus"], default="plain", help=text)
