"""The ``stockade`` command line.

``stockade bench`` puts the strategies side by side (``--peers``: next to pgbench running
their plain SQL, and Redis when installed) and writes a markdown table, JSON and a PNG.
``stockade migrate --dsn`` creates or upgrades the schema. ``stockade advise`` asks the
Claim Test's four questions and names the strategy that fits. ``stockade audit`` checks
the invariants from the data. ``stockade demo`` runs a
flash sale against every strategy side by side and prints what
each granted, refused and oversold, with throughput, latency, retries and lock waits, next
to the naive read-modify-write canary that shows what the strategies prevent. By default
it runs on a throwaway local PostgreSQL server (fsync on); ``--dsn`` runs it on a server
of yours (in the schema ``stockade_demo``), ``--backend memory`` on the embedded store.

One module per command, each with its handler beside its parser (``add``); ``_common``
holds what they share. Every command exits 2 on a usage error or an error, with one line
on stderr (and with ``--json`` a JSON object ``{"error": {"code", "message"}}`` on stdout).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import List, Optional, Sequence

from ... import __version__
from ...env import dsn_from_environment
from ...errors import StockadeError
from . import advise, audit, bench, demo, migrate
from ._common import Commands, Failed, Parser, UsageError, emit_json

__all__ = ["main"]


def _parser() -> tuple[argparse.ArgumentParser, Commands]:
    parser = Parser(
        prog="stockade",
        description="stockade: inventory reservations that never oversell. Run "
        "`stockade COMMAND --help` for a command's options and their defaults.",
    )
    parser.add_argument("--version", action="version", version=f"stockade {__version__}")
    commands = Commands(parser)
    for command in (demo, bench, migrate, advise, audit):
        command.add(commands)
    return parser, commands


def _quiet_library_log() -> None:
    """A command reports its own errors. Where nothing else handles the ``stockade``
    loggers, their records would reach Python's last-resort handler and print an error a
    second time (a refused connection is logged by the core, then raised): a NullHandler
    stops that; a handler the caller configured still receives every record."""
    logger = logging.getLogger("stockade")
    if not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
        logger.addHandler(logging.NullHandler())


def _fail(message: str, code: str, as_json: bool) -> int:
    """One line on stderr and, with --json, the error as JSON on stdout: exit status 2."""
    print(message, file=sys.stderr)
    if as_json:
        emit_json({"error": {"code": code, "message": message}})
    return 2


def _run(parser: argparse.ArgumentParser, commands: Commands, argv: List[str]) -> int:
    args = parser.parse_args(argv)
    if "dsn" in args:
        args.dsn_given = args.dsn
        args.dsn = dsn_from_environment(args.dsn)
    needs_dsn = args.command == "audit" or (args.command == "migrate" and args.print_grants is None)
    if needs_dsn and args.dsn is None:
        commands.parsers[args.command].error("needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    try:
        return int(args.run(args))
    except StockadeError as exc:
        return _fail(f"stockade {args.command}: {exc}", exc.code, args.json)
    except Failed as exc:
        return _fail(f"stockade {args.command}: {exc}", "failed", args.json)
    except UsageError:
        raise  # main() answers it
    except Exception as exc:  # 1 means "a violation" (audit) or "oversold" (demo): never this
        text = f"{type(exc).__name__}: {exc}"[:500]
        return _fail(f"stockade {args.command}: unexpected error: {text}", "internal", args.json)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one command; returns its exit status (2: a usage error or an error)."""
    words = list(sys.argv[1:] if argv is None else argv)
    _quiet_library_log()
    parser, commands = _parser()
    try:
        return _run(parser, commands, words)
    except UsageError as exc:
        return _fail(str(exc), "usage", "--json" in words)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
