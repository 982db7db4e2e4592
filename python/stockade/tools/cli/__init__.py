"""The ``stockade`` command line.

``stockade bench`` puts the strategies side by side (``--peers``: next to pgbench running
their plain SQL, and Redis when installed) and writes a markdown table, JSON and a PNG.
``stockade migrate --dsn`` creates or upgrades the schema. ``stockade advise`` asks the
Claim Test's three questions and names the strategy that fits. ``stockade demo`` runs a
flash sale against every strategy side by side and prints what
each granted, refused and oversold, with throughput, latency, retries and lock waits, next
to the naive read-modify-write canary that shows what the strategies prevent. By default
it runs on a throwaway local PostgreSQL server (fsync on); ``--dsn`` runs it on a server
of yours (in the schema ``stockade_demo``), ``--backend memory`` on the embedded store.

One module per command, each with its handler beside its parser (``add``); ``_common``
holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ... import __version__
from ...env import dsn_from_environment
from . import advise, audit, bench, demo, migrate
from ._common import Commands

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade",
        description="stockade: inventory reservations that never oversell. Run "
        "`stockade COMMAND --help` for a command's options and their defaults.",
    )
    parser.add_argument("--version", action="version", version=f"stockade {__version__}")
    commands = Commands(parser)
    for command in (demo, bench, migrate, advise, audit):
        command.add(commands)
    args = parser.parse_args(argv)
    if "dsn" in args:
        args.dsn_given = args.dsn
        args.dsn = dsn_from_environment(args.dsn)
    if args.command == "migrate" and args.dsn is None and args.print_grants is None:
        parser.error("migrate needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    if args.command == "audit" and args.dsn is None:
        parser.error("audit needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
