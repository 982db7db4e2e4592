"""The ``stockade`` command line.

``stockade demo`` runs a flash sale against every strategy side by side and prints what
each granted, refused and oversold, with throughput and latency, next to the naive
read-modify-write canary that shows what the strategies prevent.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from . import __version__
from .engine import Engine
from .errors import NotSupported
from .loadgen import NAIVE, FlashSaleReport, flash_sale

STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic"]


def _table(reports: List[FlashSaleReport]) -> str:
    head = (f"{'strategy':<14}{'granted':>9}{'refused':>9}{'failed':>8}{'oversold':>10}"
            f"{'retries':>9}{'req/s':>11}{'p50 us':>9}{'p99 us':>9}")
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.strategy:<14}{r.granted:>9,}{r.refused:>9,}{r.failed:>8,}{r.oversold:>10,}"
            f"{r.retried:>9,}{r.throughput:>11,.0f}{r.percentile_us(0.5):>9.0f}"
            f"{r.percentile_us(0.99):>9.0f}")
    return "\n".join(lines)


def _engine(args: argparse.Namespace) -> Engine:
    if args.backend == "memory":
        return Engine.memory()
    return Engine.postgres(args.dsn or "")


def demo(args: argparse.Namespace) -> int:
    try:
        engine = _engine(args)
    except NotSupported as exc:
        print(f"stockade demo: {exc}", file=sys.stderr)
        return 2
    print(f"stockade {__version__} flash sale on the {engine.backend} store: "
          f"{args.buyers:,} buyers, {args.units:,} units of one SKU, {args.clients} client "
          f"threads, one unit per buyer\n")
    reports = [flash_sale(engine, buyers=args.buyers, units=args.units, strategy=s,
                          clients=args.clients) for s in STRATEGIES]
    canary = flash_sale(engine, buyers=args.buyers, units=args.units, strategy=NAIVE,
                        clients=args.clients)
    print(_table(reports + [canary]))
    print(f"\n{NAIVE} is the canary: read, then write back a value computed from the stale "
          "read.\nIt loses updates and sells units that do not exist; every real strategy "
          "must show oversold 0.")
    broken = [r.strategy for r in reports if r.oversold or r.granted != min(args.units, args.buyers)]
    if broken:
        print(f"\nERROR: {', '.join(broken)} did not grant exactly the units there were",
              file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="stockade", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"stockade {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="flash sale: every strategy side by side, and the canary")
    d.add_argument("--backend", choices=["memory", "postgres"], default="memory")
    d.add_argument("--dsn", help="PostgreSQL connection string (with --backend postgres)")
    d.add_argument("--buyers", type=int, default=10_000)
    d.add_argument("--units", type=int, default=1_000)
    d.add_argument("--clients", type=int, default=64)
    d.set_defaults(run=demo)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
