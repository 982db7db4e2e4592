"""Benchmark: stockade through PgBouncer in transaction mode against direct connections,
side by side on one throwaway PostgreSQL (fsync and synchronous_commit on).

Three ways to reach the server, each with an engine of --clients connections:

  direct          straight to PostgreSQL: prepared statements, session settings
  direct/stateless  straight to PostgreSQL, but with pooler="pgbouncer-transaction": what
                  running without session state costs, without the hop
  pgbouncer       through a throwaway PgBouncer (pool_mode = transaction) with as many
                  server connections as the engine has clients: the cost of the hop and
                  of running without session state (unnamed statements, SET LOCAL
                  lock_timeout in every transaction)
  pgbouncer/N     the same with --server-pool N server connections (16) for all the
                  clients: what a fleet of replicas sharing few server connections sees

Each runs --clients blocking C++ clients (64) for --seconds (3) on:

  hot/auto      one SKU that every client hits (auto goes batched)
  hot/atomic    the same, each request its own conditional UPDATE
  wide/auto     --skus SKUs (10,000) picked uniformly (auto stays atomic)
  wide/keyed    the same with an idempotency key on every request

    python benchmarks/pooler.py [--seconds 3] [--clients 64] [--skus 10000]
                                [--server-pool 16] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios (each against direct, in the
same run) and checks no target. It needs the Debian package `pgbouncer`.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List

import stockade
from common import measure
from stockade.tools.pgbouncer import TemporaryPgBouncer
from stockade.tools.pgserver import TemporaryPostgres

UNITS = 10**9
CASES = ("hot/auto", "hot/atomic", "wide/auto", "wide/keyed")


def cases(eng: stockade.Engine, prefix: str, args: argparse.Namespace) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for case in CASES:
        layout, how = case.split("/")
        n = 1 if layout == "hot" else args.skus
        skus = [f"{prefix}-{case}-{i}" for i in range(n)]
        for sku in skus:
            eng.restock(sku, UNITS)
        kw: Dict[str, Any] = {"clients": args.clients, "seconds": args.seconds}
        if how == "atomic":
            kw["strategy"] = "atomic"
        if how == "keyed":
            kw["keyed"] = True
        out[case] = measure(eng, skus, **kw)
    return out


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--skus", type=int, default=10_000)
    ap.add_argument("--server-pool", type=int, default=16)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)

    report: Dict[str, Any] = {"args": vars(args)}
    with TemporaryPostgres() as pg:
        server = pg.sql("SHOW server_version").strip()
        with (
            TemporaryPgBouncer(pg, pool_size=args.clients) as wide_bouncer,
            TemporaryPgBouncer(pg, pool_size=args.server_pool) as narrow_bouncer,
        ):
            routes = {
                "direct": (pg.dsn(), "none"),
                "direct/stateless": (pg.dsn(), "pgbouncer-transaction"),
                "pgbouncer": (wide_bouncer.dsn(), "pgbouncer-transaction"),
                f"pgbouncer/{args.server_pool}": (narrow_bouncer.dsn(), "pgbouncer-transaction"),
            }
            print(
                f"PostgreSQL {server}, {args.clients} C++ clients, {args.seconds} s a run, "
                f"PgBouncer in transaction mode"
            )
            for route, (dsn, pooler) in routes.items():
                schema = "b_" + route.replace("/", "_")
                with stockade.Engine.postgres(
                    dsn, pool_size=args.clients, pooler=pooler, schema=schema
                ) as eng:
                    eng.migrate()
                    report[route] = cases(eng, schema, args)
    base = report["direct"]
    print(f"\n  {'case':12}" + "".join(f"{route:>26}" for route in routes))
    for case in CASES:
        cells = []
        for route in routes:
            r = report[route][case]
            ratio = r["rate"] / base[case]["rate"]
            cells.append(f"{r['rate']:>12,.0f}/s {ratio:5.2f}x f{r['failed']:<2}")
        print(f"  {case:12}" + "".join(f"{c:>26}" for c in cells))
    print("\n  (ratio: against direct in this run; f: failed requests)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
