"""The ``stockade`` command line.

``stockade demo`` runs a flash sale against every strategy side by side and prints what
each granted, refused and oversold, with throughput, latency, retries and lock waits, next
to the naive read-modify-write canary that shows what the strategies prevent. By default
it runs on a throwaway local PostgreSQL server (fsync on); ``--dsn`` runs it on a server
of yours (in the schema ``stockade_demo``), ``--backend memory`` on the embedded store.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Iterator, List, Optional, Sequence

from . import __version__
from .engine import Engine
from .errors import StockadeError
from .loadgen import NAIVE, FlashSaleReport, flash_sale
from .pgserver import TemporaryPostgres

STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]


def _table(reports: List[FlashSaleReport]) -> str:
    head = (f"{'strategy':<14}{'granted':>9}{'refused':>9}{'failed':>8}{'oversold':>10}"
            f"{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'retries':>9}{'lock waits':>12}")
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.strategy:<14}{r.granted:>9,}{r.refused:>9,}{r.failed:>8,}{r.oversold:>10,}"
            f"{r.throughput:>10,.0f}{r.percentile_us(0.5) / 1000:>9.2f}"
            f"{r.percentile_us(0.99) / 1000:>9.2f}{r.retried:>9,}{r.lock_waits:>12,}")
    return "\n".join(lines)


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[tuple[Engine, str]]:
    """The engine the demo runs on, and a description of where it runs."""
    if args.backend == "memory":
        with Engine.memory() as engine:
            yield engine, "the embedded memory store"
        return
    pool = max(1, min(args.clients, 32))
    if args.dsn:
        with Engine.postgres(args.dsn, schema="stockade_demo", pool_size=pool) as engine:
            engine.migrate()
            yield engine, "PostgreSQL (--dsn), schema stockade_demo"
        return
    print("starting a throwaway PostgreSQL server (initdb, fsync on) ...", flush=True)
    with TemporaryPostgres() as server:
        with Engine.postgres(server.dsn(), pool_size=pool) as engine:
            engine.migrate()
            yield engine, (f"a throwaway PostgreSQL at {server.host}:{server.port} "
                           f"(fsync on), pool of {pool} connections")


def demo(args: argparse.Namespace) -> int:
    if args.dsn and args.backend == "memory":
        print("stockade demo: --dsn needs --backend postgres", file=sys.stderr)
        return 2
    try:
        with _engine(args) as (engine, where):
            print(f"stockade {__version__} flash sale on {where}: {args.buyers:,} buyers, "
                  f"{args.units:,} units of one SKU, {args.clients} client threads, one unit "
                  "per buyer\n", flush=True)
            reports = []
            for name in STRATEGIES + [NAIVE]:
                reports.append(flash_sale(engine, buyers=args.buyers, units=args.units,
                                          strategy=name, clients=args.clients))
    except StockadeError as exc:
        print(f"stockade demo: {exc}", file=sys.stderr)
        return 2
    print(_table(reports))
    print(f"\n{NAIVE} is the canary: read, then write back a value computed from the stale "
          "read.\nIt loses updates and sells units that do not exist; every real strategy "
          "must show oversold 0.")
    broken = [r.strategy for r in reports[:-1] if r.oversold or r.granted != min(args.units, args.buyers)]
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
    d.add_argument("--backend", choices=["memory", "postgres"], default="postgres",
                   help="postgres (default: a throwaway local server unless --dsn) or memory")
    d.add_argument("--dsn", help="a PostgreSQL server of yours (libpq connection string)")
    d.add_argument("--buyers", type=int, default=10_000)
    d.add_argument("--units", type=int, default=1_000)
    d.add_argument("--clients", type=int, default=64)
    d.set_defaults(run=demo)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
