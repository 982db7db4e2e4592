"""Benchmark: the Citus layout on a three-node cluster against a single PostgreSQL node,
side by side in one run (fsync and synchronous_commit on everywhere).

Three routes, each an engine of --clients connections:

  single          one throwaway PostgreSQL 15, the plain layout (prepared statements,
                  session settings)
  single/stateless  the same server with pooler="pgbouncer-transaction": no session
                  state, unnamed statements, SET LOCAL in each transaction, which is how
                  the Citus layout runs (Citus carries no session SET to its workers)
  citus           a coordinator and two workers on loopback (stockade.tools.citus,
                  --shards shards per table), layout="citus"

Each runs --clients blocking C++ clients (64) for --seconds (3) on:

  hot/auto      one SKU that every client hits (auto goes batched)
  wide/auto     --skus SKUs (10,000) picked uniformly (auto stays atomic)
  wide/keyed    the same with an idempotency key on every request

All three nodes of the cluster share this machine's cores with the clients, so the
figures show what the distribution costs per request, not what more machines would add.

    python benchmarks/citus.py [--seconds 3] [--clients 64] [--skus 10000] [--shards 32]
                               [--json FILE]

It is a benchmark, not a test: it prints figures and ratios (each against single, in the
same run) and checks no target. It needs the Citus build beside the project
(../shared/citus), which fits Debian 12's PostgreSQL 15 only.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

from common import parser, route_table, run_routes, write_json
from stockade.tools.citus import TemporaryCitus, citus_available
from stockade.tools.pgserver import TemporaryPostgres

CASES = ("hot/auto", "wide/auto", "wide/keyed")


def main(argv: List[str]) -> int:
    ap = parser(__doc__)
    ap.add_argument("--shards", type=int, default=32, help="citus.shard_count of each table")
    args = ap.parse_args(argv)
    ok, why = citus_available()
    if not ok:
        print(f"Citus is not available here: {why}", file=sys.stderr)
        return 3

    report: Dict[str, Any] = {"args": vars(args)}
    with TemporaryPostgres() as pg, TemporaryCitus() as cluster:
        server = pg.sql("SHOW server_version").strip()
        citus_dsn = cluster.dsn() + f"?options=-c%20citus.shard_count%3D{args.shards}"
        routes = {
            "single": {"dsn": pg.dsn()},
            "single/stateless": {"dsn": pg.dsn(), "pooler": "pgbouncer-transaction"},
            "citus": {"dsn": citus_dsn, "layout": "citus"},
        }
        print(
            f"PostgreSQL {server}; Citus: a coordinator and 2 workers on this machine, "
            f"{args.shards} shards per table; {args.clients} C++ clients, {args.seconds} s a run"
        )
        report.update(run_routes(routes, CASES, args))
    route_table(report, routes, CASES, "single")
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
