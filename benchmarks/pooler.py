"""Benchmark: stockade through PgBouncer in transaction mode against direct connections,
side by side on one throwaway PostgreSQL (fsync and synchronous_commit on).

Three ways to reach the server, each with an engine of --clients connections:

  direct          straight to PostgreSQL: prepared statements, session settings
  direct/stateless  straight to PostgreSQL, but with pooler="pgbouncer-transaction": what
                  running without session state costs, without the hop
  direct/unnamed  the same without the statement routines that migrate() makes (dropped
                  after it, as on a schema an earlier release migrated): every statement
                  unnamed, planned on each execution, and BEGIN a round trip of its own
  pgbouncer       through a throwaway PgBouncer (pool_mode = transaction) with as many
                  server connections as the engine has clients: the cost of the hop and
                  of running without session state (statement routines, SET LOCAL
                  lock_timeout in every transaction)
  pgbouncer/unnamed  the same without the statement routines
  pgbouncer/N     the same with --server-pool N server connections (16) for all the
                  clients: what a fleet of replicas sharing few server connections sees

Each runs --clients blocking C++ clients (64) for --seconds (3), after untimed seconds of the
same load until its rate stops rising (at most --warmup, 10), on:

  hot/auto      one SKU that every client hits (auto goes batched)
  hot/atomic    the same, each request its own conditional UPDATE
  wide/auto     --skus SKUs (10,000) picked uniformly (auto stays atomic)
  wide/keyed    the same with an idempotency key on every request

    python benchmarks/pooler.py [--seconds 3] [--warmup 10] [--clients 64] [--skus 10000]
                                [--server-pool 16] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios (each against direct, in the
same run) and checks no target. It needs the Debian package `pgbouncer`.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from common import parser, route_table, run_routes, write_json
from stockade.tools.pgbouncer import TemporaryPgBouncer
from stockade.tools.pgserver import TemporaryPostgres

CASES = ("hot/auto", "hot/atomic", "wide/auto", "wide/keyed")


def main(argv: List[str]) -> int:
    ap = parser(__doc__)
    ap.add_argument("--server-pool", type=int, default=16)
    args = ap.parse_args(argv)

    report: Dict[str, Any] = {"args": vars(args)}
    with TemporaryPostgres() as pg:
        server = pg.sql("SHOW server_version").strip()
        with (
            TemporaryPgBouncer(pg, pool_size=args.clients) as wide_bouncer,
            TemporaryPgBouncer(pg, pool_size=args.server_pool) as narrow_bouncer,
        ):
            stateless = "pgbouncer-transaction"
            routes = {
                "direct": {"dsn": pg.dsn(), "pooler": "none"},
                "direct/stateless": {"dsn": pg.dsn(), "pooler": stateless},
                "direct/unnamed": {"dsn": pg.dsn(), "pooler": stateless, "drop_routines": pg.dsn()},
                "pgbouncer": {"dsn": wide_bouncer.dsn(), "pooler": stateless},
                "pgbouncer/unnamed": {
                    "dsn": wide_bouncer.dsn(),
                    "pooler": stateless,
                    "drop_routines": pg.dsn(),
                },
                f"pgbouncer/{args.server_pool}": {"dsn": narrow_bouncer.dsn(), "pooler": stateless},
            }
            print(
                f"PostgreSQL {server}, {args.clients} C++ clients, {args.seconds} s a run, "
                f"PgBouncer in transaction mode"
            )
            report.update(run_routes(routes, CASES, args))
    route_table(report, routes, CASES, "direct")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
