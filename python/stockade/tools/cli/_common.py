"""What the commands share: the strategies, the DSN option's help, where prose goes, and
the subcommand parsers with --json."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, TextIO

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


class Commands:
    """The subcommands' parsers, each with ``--json`` and its defaults in ``--help``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(self, name: str, summary: str, description: str) -> argparse.ArgumentParser:
        p = self.sub.add_parser(
            name,
            help=summary,
            description=description,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        return p


def backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["memory", "postgres"],
        default="postgres",
        help="postgres (a throwaway local server unless --dsn) or the embedded memory store",
    )


def add_layout(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--layout", choices=["plain", "citus"], default="plain", help=text)
