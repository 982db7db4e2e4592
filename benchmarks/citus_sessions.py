"""Benchmark: the private memory of the sessions on the Citus workers that run the
engine's delegated calls, over many calls, on a three-node cluster on this machine: the
engine's own sessions with --routing direct, the coordinator's with --routing
coordinator.

Citus 13.2 can grow a worker session's local plan cache by a plan on every execution of
a generic plan of a statement on a distributed table inside a function (citus issues 8371
and 8783). The delegated functions (sql/citus/105 to 109) avoid that plan shape; this
measures that they do, over as many calls as asked: --clients C++ clients reserve one
unit at a time (atomic, delegated, half of them keyed) on --skus SKUs, in rounds of
--seconds, until --calls reserves were granted. After each round it prints the calls so
far and the private memory (Private_* of /proc/PID/smaps_rollup) summed over the engine's
sessions on the workers, and at the end the growth from the first round to the last,
per call.

    python benchmarks/citus_sessions.py [--calls 1000000] [--routing direct]
                                        [--clients 16] [--skus 2000] [--seconds 30]
                                        [--json FILE]

It is a benchmark, not a test: it prints figures and checks nothing. It needs the Citus
build beside the project (../shared/citus), which fits Debian 12's PostgreSQL 15 only.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict, List

import stockade
from common import write_json
from stockade.tools import drive_load
from stockade.tools.citus import TemporaryCitus, citus_available

APP = "stockade-sessions"


def sessions_kib(cluster: TemporaryCitus, routing: str) -> int:
    """The private memory of the sessions that run the calls on both workers, in KiB: the
    engine's own (direct) or the coordinator's (Citus names them citus_internal ...)."""
    return cluster.workers_sessions_kib(APP if routing == "direct" else "citus_internal%")[0]


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=1_000_000)
    ap.add_argument("--routing", choices=("direct", "coordinator"), default="direct")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--skus", type=int, default=2_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    ok, why = citus_available()
    if not ok:
        print(f"Citus is not available here: {why}", file=sys.stderr)
        return 3
    rounds: List[Dict[str, Any]] = []
    with TemporaryCitus() as cluster:
        with stockade.Engine.postgres(
            cluster.dsn(),
            layout="citus",
            citus_routing=args.routing,
            pool_size=args.clients,
            application_name=APP,
        ) as eng:
            eng.migrate()
            skus = [f"s-{i}" for i in range(args.skus)]
            for sku in skus:
                eng.restock(sku, 10**12)
            calls, started = 0, time.monotonic()
            while calls < args.calls:
                for keyed in (False, True):
                    got = drive_load(
                        eng,
                        skus,
                        clients=args.clients,
                        seconds=args.seconds / 2,
                        strategy="atomic",
                        keyed=keyed,
                    )
                    calls += got.granted
                kib = sessions_kib(cluster, args.routing)
                rounds.append({"calls": calls, "kib": kib, "s": time.monotonic() - started})
                print(f"  {calls:>10,} calls  {kib / 1024:8.1f} MiB", flush=True)
            routing = eng.stats()["pool"]["routing"]
    first, last = rounds[0], rounds[-1]
    grown = last["kib"] - first["kib"]
    per_call = grown * 1024 / max(last["calls"] - first["calls"], 1)
    print(
        f"\n  {last['calls']:,} calls in {last['s']:.0f} s; the sessions held"
        f" {first['kib'] / 1024:.1f} MiB after the first round, at most"
        f" {max(r['kib'] for r in rounds) / 1024:.1f} MiB, {last['kib'] / 1024:.1f} MiB at"
        f" the end: {grown / 1024:+.1f} MiB, {per_call:+.2f} bytes a call"
        f" ({args.routing}: routed {routing['routed']:,}, misses {routing['misses']})"
    )
    write_json(args.json, {"args": vars(args), "rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
