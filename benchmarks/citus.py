"""Benchmark: the Citus layout on a three-node cluster against a single PostgreSQL node,
side by side in one run (fsync and synchronous_commit on everywhere).

Five routes, each an engine of --clients connections:

  single          one throwaway PostgreSQL 15, the plain layout (prepared statements,
                  session settings)
  single/stateless  the same server with pooler="pgbouncer-transaction": no session
                  state, unnamed statements, SET LOCAL in each transaction, which is how
                  the Citus layout runs (Citus carries no session SET to its workers)
  citus           a coordinator and two workers on loopback (stockade.tools.citus,
                  --shards shards per table), layout="citus"
  citus/direct    the same cluster with citus_routing="direct": the atomic reserve goes
                  straight to the worker that holds the row (a pool per worker)
  citus/literal  the coordinator route on a schema without citus/113's functions: the
                  batch's statement forms send their reservations and keys as SQL text,
                  as before that migration (the STATEMENT_FORMS cases only)

Each runs --clients blocking C++ clients (64) for --seconds (3), after untimed seconds of the
same load until its rate stops rising (at most --warmup, 10: the pools open, a Citus
worker's backends past their start and their caches built), on:

  hot/auto      one SKU that every client hits (auto goes batched)
  wide/auto     --skus SKUs (10,000) picked uniformly (auto stays atomic)
  wide/keyed    the same with an idempotency key on every request
  wide/sell     the same SKUs, each request a sell of 1 unit (auto: atomic, per request)
  hot/keyed-sell  one SKU, each request a sell of 1 unit with an idempotency key (batched:
                on Citus the one-row statement form, its key through citus/113's call)
  hot/buyers    one SKU, each reserve for one of 1,000 buyers under a purchase limit
                (batched: on Citus the full path, its holds through citus/113's call; a
                buyer's count on another worker than the row commits in two phases)
  wide/confirm  the same SKUs, each client reserving 1 unit and confirming the hold at
                once (each confirm counts as a request)
  hot/allocate  one SKU at three locations, each request an allocation of 1 unit from
                the three (priority, auto: it walks the pool through the batcher)
  wide/allocate --skus SKUs (at most 1,000) at three locations each, allocations picked
                uniformly (auto stays per request: the pool locked, on Citus its rows on
                three shards, a two-phase commit)
  hot/allocate-shared, wide/allocate-shared  the same on SKUs picked so that their three
                rows lie on one Citus shard: what the layout would cost if a SKU's
                locations shared a shard (a shard key of the SKU alone), measured on
                today's layout by choosing the names (the run checks the placement)

and then purge, on every route: --purge-skus SKUs (64) reserved and confirmed with a key
each, batched, until about --purge-rows rows (20,000: keys and reservations) are there,
then engine.purge() of all of it (rows/s; the same work on every route). --cases runs
some cases only (--cases '' the purge alone).

All three nodes of the cluster share this machine's cores with the clients, so the
figures show what the distribution costs per request, not what more machines would add.
For that, each case also prints the CPU seconds per 1,000 granted requests of the single
server and of each node of the cluster (from /proc): the inputs of the capacity model in
docs/scaling-out.md.

    python benchmarks/citus.py [--seconds 3] [--warmup 10] [--clients 64] [--skus 10000]
                               [--shards 32] [--purge-skus 64] [--purge-rows 20000]
                               [--cases hot/auto,...] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios (each against single, in the
same run) and checks no target. It needs the Citus build beside the project
(../shared/citus), which fits Debian 12's PostgreSQL 15 only.
"""

from __future__ import annotations

import sys
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List

import stockade
from common import POOL, parser, route_table, run_routes, write_json
from stockade import _core
from stockade.tools import drive_load
from stockade.tools.citus import TemporaryCitus, citus_available
from stockade.tools.pgserver import TemporaryPostgres, run_sql

# The cases whose batches take the Citus statement forms (citus/113), and the functions
# the citus/literal route drops.
STATEMENT_FORMS = ("hot/keyed-sell", "hot/buyers")
BATCH_WRITES = (
    "batch_holds(bigint, uuid[], text[], text[], bigint[], bigint[], bigint[], text[], text[],"
    " text[], text[], text[], text[], integer)",
    "batch_keys(text[], text[], text[], text[], boolean, integer)",
    "batch_key_outcomes(text[], text[], integer)",
)
PURGE_LOAD_S = 180.0  # the most time the purge case's load takes on one route

CASES = (
    "hot/auto",
    "wide/auto",
    "wide/keyed",
    "wide/sell",
    "hot/keyed-sell",
    "hot/buyers",
    "wide/confirm",
    "hot/allocate",
    "wide/allocate",
    "hot/allocate-shared",
    "wide/allocate-shared",
)


def colocation(pg: TemporaryPostgres, shards: int) -> Callable[[str], bool]:
    """Whether a SKU's rows at POOL's locations lie on one Citus shard. A row's shard key
    is _core.shard_key_of(sku, location) (16 bits); Citus hashes an integer distribution
    column with hashint4 and splits the 32-bit hash range into `shards` equal ranges."""
    hashes = pg.sql(
        "SELECT string_agg(hashint4(k)::text, ',' ORDER BY k) FROM generate_series(0, 65535) k"
    )
    width = 2**32 // shards
    shard = [(int(h) + 2**31) // width for h in hashes.strip().split(",")]

    def together(sku: str) -> bool:
        return len({shard[_core.shard_key_of(sku, location)] for location in POOL}) == 1

    return together


def check_colocated(cluster: TemporaryCitus, schema: str) -> int:
    """How many SKUs of the shared cases have rows on more than one shard (Citus's own
    answer; 0 when colocation() chose well)."""
    return int(
        run_sql(
            cluster.dsn(),
            "SELECT count(*) FROM (SELECT sku FROM "
            f"{schema}.stock WHERE sku LIKE '%-shared-%' GROUP BY sku HAVING count(DISTINCT"
            f" get_shard_id_for_distribution_column('{schema}.stock', shard_key)) > 1) s",
        ).strip()
    )


def purge_rate(options: Dict[str, Any], schema: str, args: Any) -> Dict[str, float]:
    """Keyed reserve+confirm over --purge-skus SKUs until about --purge-rows rows (keys and
    reservations) are there, the same on every route (at most PURGE_LOAD_S seconds), then
    one purge() of it."""
    with stockade.Engine.postgres(pool_size=args.clients, schema=schema, **options) as eng:
        eng.migrate()
        skus = [f"p-{i}" for i in range(args.purge_skus)]
        for s in skus:
            eng.restock(s, 10**12)
        rows = 0
        until = time.monotonic() + PURGE_LOAD_S
        while 2 * rows < args.purge_rows and time.monotonic() < until:
            drive_load(
                eng,
                skus,
                clients=args.clients,
                seconds=min(1.0, args.seconds),
                strategy="batched",
                keyed=True,
                confirm=True,
            )
            rows = eng.row_counts()["reservation_count"]
        time.sleep(0.01)
        started = time.perf_counter()
        purged = eng.purge(timedelta(0))
        took = time.perf_counter() - started
        return {"rows": purged, "reservations": rows, "seconds": took, "rate": purged / took}


def cpu_table(report: Dict[str, Any], route: str, cases: List[str]) -> None:
    """CPU seconds per 1,000 granted requests of each server in each case: the single
    server's, and the coordinator's and each worker's on `route` (from /proc, all three on
    this machine), with the coordinator's share against a worker's."""
    print(f"\n  CPU seconds per 1,000 granted requests, by server ({route}):")
    print(
        f"  {'case':22}{'single':>10}{'coordinator':>13}{'worker1':>10}{'worker2':>10}"
        f"{'cluster':>10}{'coord/worker':>14}"
    )
    for case in cases:
        single, citus = report["single"][case], report[route][case]

        def per_k(run: Dict[str, Any], node: str) -> float:
            return 1000 * run["cpu_s"][node] / max(run["granted"], 1)

        nodes = [per_k(citus, n) for n in ("coordinator", "worker1", "worker2")]
        worker = (nodes[1] + nodes[2]) / 2
        share = nodes[0] / worker if worker > 0 else float("nan")
        print(
            f"  {case:22}{per_k(single, 'server'):10.3f}{nodes[0]:13.3f}{nodes[1]:10.3f}"
            f"{nodes[2]:10.3f}{sum(nodes):10.3f}{share:13.2f}x"
        )
    print("  (coord/worker: the coordinator's CPU per request against a worker's, on average)")


def main(argv: List[str]) -> int:
    ap = parser(__doc__)
    ap.add_argument("--shards", type=int, default=32, help="citus.shard_count of each table")
    ap.add_argument("--purge-skus", type=int, default=64, help="SKUs of the purge case")
    ap.add_argument(
        "--purge-rows", type=int, default=20_000, help="rows the purge case deletes on each route"
    )
    ap.add_argument(
        "--cases", default=",".join(CASES), help="the cases to run, by name ('': purge alone)"
    )
    args = ap.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}: the cases are {', '.join(CASES)}")
    ok, why = citus_available()
    if not ok:
        print(f"Citus is not available here: {why}", file=sys.stderr)
        return 3

    report: Dict[str, Any] = {"args": dict(vars(args))}
    with TemporaryPostgres() as pg, TemporaryCitus() as cluster:
        server = pg.sql("SHOW server_version").strip()
        citus_dsn = cluster.dsn() + f"?options=-c%20citus.shard_count%3D{args.shards}"
        nodes = dict(zip(("coordinator", "worker1", "worker2"), cluster.pids(), strict=True))
        routes = {
            "single": {"dsn": pg.dsn(), "servers": {"server": pg.pid}},
            "single/stateless": {"dsn": pg.dsn(), "pooler": "pgbouncer-transaction"},
            "citus": {"dsn": citus_dsn, "layout": "citus", "servers": nodes},
            "citus/direct": {
                "dsn": citus_dsn,
                "layout": "citus",
                "citus_routing": "direct",
                "servers": nodes,
            },
            "citus/literal": {
                "dsn": citus_dsn,
                "layout": "citus",
                "servers": nodes,
                "drop_functions": BATCH_WRITES,
                "cases": STATEMENT_FORMS,
            },
        }
        print(
            f"PostgreSQL {server}; Citus: a coordinator and 2 workers on this machine, "
            f"{args.shards} shards per table; {args.clients} C++ clients, {args.seconds} s a run"
        )
        args.together = colocation(pg, args.shards)
        if not set(cases) & set(STATEMENT_FORMS):
            del routes["citus/literal"]
        if cases:
            report.update(run_routes(routes, cases, args))
        if any(c.endswith("-shared") for c in cases):
            report["spread_shared_skus"] = check_colocated(cluster, "b_citus")
        report["purge"] = {
            route: purge_rate(
                {k: v for k, v in options.items() if k != "servers"},
                "p_" + route.replace("/", "_"),
                args,
            )
            for route, options in routes.items()
            if "cases" not in options  # the purge does not take the statement forms
        }
    if cases:
        route_table(report, routes, cases, "single")
        cpu_table(report, "citus", cases)
        cpu_table(report, "citus/direct", cases)
    if "spread_shared_skus" in report:
        print(
            f"\n  shared cases: {report['spread_shared_skus']} SKUs with rows on more than one"
            " shard (Citus's placement; 0 expected)"
        )
    base = report["purge"]["single"]["rate"]
    print("\n  purge() of keyed, confirmed reservations (keys and reservations):")
    for route, p in report["purge"].items():
        print(
            f"  {route:18} {p['rows']:>9,} rows in {p['seconds']:6.2f} s ="
            f" {p['rate']:>9,.0f} rows/s {p['rate'] / base:5.2f}x"
        )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
