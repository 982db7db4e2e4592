"""``stockade demo``: a flash sale against every strategy side by side, and the canary."""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import datetime, timezone
from typing import Any, Dict, Iterator, List, Literal, Union

from ... import __version__
from ...engine import Engine
from ...limits import QUANTITY_MAX
from ...values import Strategy
from ..loadgen import NAIVE, FlashSaleReport, flash_sale
from ..pgserver import TemporaryPostgres
from ._common import (
    DSN_HELP,
    STRATEGIES,
    Commands,
    backend_option,
    emit_json,
    number,
    say,
    usage_error,
)


def _report_dict(r: FlashSaleReport) -> Dict[str, Any]:
    return {
        "strategy": r.strategy,
        "granted": r.granted,
        "refused": r.refused,
        "failed": r.failed,
        "oversold": r.oversold,
        "requests_per_s": r.throughput,
        "p50_ms": r.percentile_us(0.5) / 1000,
        "p99_ms": r.percentile_us(0.99) / 1000,
        "retries": r.retried,
        "lock_waits": r.lock_waits,
    }


def _table(reports: List[FlashSaleReport]) -> str:
    head = (
        f"{'strategy':<14}{'granted':>9}{'refused':>9}{'failed':>8}{'oversold':>10}"
        f"{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'retries':>9}{'lock waits':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.strategy:<14}{r.granted:>9,}{r.refused:>9,}{r.failed:>8,}{r.oversold:>10,}"
            f"{r.throughput:>10,.0f}{r.percentile_us(0.5) / 1000:>9.2f}"
            f"{r.percentile_us(0.99) / 1000:>9.2f}{r.retried:>9,}{r.lock_waits:>12,}"
        )
    return "\n".join(lines)


DEMO_SCHEMA = "stockade_demo"
# Bounds of the sale (flash_sale's): each buyer is a request whose latency the demo keeps,
# each client a thread.
BUYERS_MAX = 10_000_000
CLIENTS_MAX = 1024


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[tuple[Engine, str]]:
    """The engine the demo runs on, and a description of where it runs. On a server of
    yours (--dsn) the demo works in the schema stockade_demo and drops it afterwards if it
    made it, unless --keep."""
    if args.backend == "memory":
        with Engine.memory() as engine:
            yield engine, "the embedded memory store"
        return
    pool = max(1, min(args.clients, 32))
    if args.dsn is not None:
        with Engine.postgres(args.dsn, schema=DEMO_SCHEMA, pool_size=pool) as engine:
            plan = engine.migration_plan()
            made = bool(plan) and plan[0][0] == "(create schema)"  # not there before
            engine.migrate()
            try:
                yield engine, f"PostgreSQL (--dsn or the environment), schema {DEMO_SCHEMA}"
            finally:
                if made and not args.keep:
                    engine.drop_schema(confirm=DEMO_SCHEMA)
                    print(
                        f"dropped the schema {DEMO_SCHEMA} the demo made (--keep keeps it)",
                        file=say(args),
                    )
                elif not made:
                    print(
                        f"left the schema {DEMO_SCHEMA} in place: it was there before",
                        file=say(args),
                    )
        return
    out = say(args)
    print("starting a throwaway PostgreSQL server (initdb, fsync on) ...", file=out, flush=True)
    with TemporaryPostgres() as server:
        with Engine.postgres(server.dsn(), pool_size=pool) as engine:
            engine.migrate()
            yield (
                engine,
                (
                    f"a throwaway PostgreSQL at {server.host}:{server.port} "
                    f"(fsync on), pool of {pool} connections"
                ),
            )


def demo(args: argparse.Namespace) -> int:
    if args.dsn_given and args.backend == "memory":
        usage_error(args, "--dsn needs --backend postgres")
    with _engine(args) as (engine, where):
        print(
            f"stockade {__version__} flash sale on {where}: {args.buyers:,} buyers, "
            f"{args.units:,} units of one SKU, {args.clients} client threads, one unit "
            "per buyer\n",
            file=say(args),
            flush=True,
        )
        reports = []
        choices: List[Union[Strategy, Literal["naive-unsafe"]]] = [
            *(Strategy(s) for s in STRATEGIES),
            NAIVE,
        ]
        for choice in choices:
            reports.append(
                flash_sale(
                    engine,
                    buyers=args.buyers,
                    units=args.units,
                    strategy=choice,
                    clients=args.clients,
                    check=False,
                )
            )
    broken = [
        r.strategy for r in reports[:-1] if r.oversold or r.granted != min(args.units, args.buyers)
    ]
    if args.json:
        emit_json(
            {
                "stockade_version": __version__,
                "timestamp": datetime.now(timezone.utc).isoformat(),
                "where": where,
                "buyers": args.buyers,
                "units": args.units,
                "clients": args.clients,
                "strategies": [_report_dict(r) for r in reports],
                "exact": not broken,
            }
        )
    else:
        print(_table(reports))
        print(
            f"\n{NAIVE} is the canary: read, then write back a value computed from the stale "
            "read.\nIt loses updates and sells units that do not exist; every real strategy "
            "must show oversold 0."
        )
    if broken:
        print(
            f"\nERROR: {', '.join(broken)} did not grant exactly the units there were",
            file=sys.stderr,
        )
        return 1
    return 0


def add(commands: Commands) -> None:
    d = commands.command(
        "demo",
        "flash sale: every strategy side by side, and the canary",
        "Runs a flash sale against every strategy side by side, next to the naive "
        "read-modify-write canary, and prints what each granted, refused and oversold, "
        "with throughput, latency, retries and lock waits. Exits 1 if a strategy did not "
        "grant exactly the units there were.",
    )
    backend_option(d)
    d.add_argument("--dsn", help=DSN_HELP + f" (schema {DEMO_SCHEMA})")
    d.add_argument(
        "--keep",
        action="store_true",
        help=f"with --dsn: keep the schema {DEMO_SCHEMA} the demo made (default: drop it)",
    )
    d.add_argument(
        "--buyers", type=number(int, 1, BUYERS_MAX), default=10_000, help="buyers, one unit each"
    )
    d.add_argument(
        "--units", type=number(int, 1, QUANTITY_MAX), default=1_000, help="units of the one SKU"
    )
    d.add_argument("--clients", type=number(int, 1, CLIENTS_MAX), default=64, help="client threads")
    d.set_defaults(run=demo)
