"""Benchmark: what the movement journal and its change feed cost, and how fast the audit
reads, on one throwaway PostgreSQL (docs/journal.md).

  1. the hot SKU, 64 blocking C++ clients, batched (and atomic): with the journal and
     the feed on (the stock table's row trigger, the engine's NOTIFYs, and a consumer
     polling and committing all along) against both off (the trigger disabled, an engine
     with feed_notify=False, no consumer), the cases interleaved --rounds times; the
     ratio of the medians;
  2. a consumer keeping up with the hot SKU at full speed for --lag-seconds: it polls
     and commits all along (after a poll that was not full it waits 20 ms first); each
     change's lag is the time from its transaction's start (the entry's `at`, on the
     database clock of this same host) to its delivery. p50, p99 and the largest, and the
     changes it read against those written;
  3. the audit of --reservations holds over 1,000 SKUs (written with plain SQL in one
     consistent state): seconds, and rows per second.

With --flush-delay-us N every WAL flush waits N microseconds first (commit_delay with
commit_siblings = 0: a network disk or a synchronous standby). With --citus, sections 1
and 2 run on a three-node Citus cluster on loopback instead (layout="citus"; the Citus
build beside the project), where the trigger runs on the workers' shards and the feed
reads each node by its own snapshots; the server's CPU is the three nodes'.

    python benchmarks/journal.py [--seconds 3] [--rounds 5] [--lag-seconds 60]
                                 [--reservations 1000000] [--flush-delay-us 0]
                                 [--sections 1,2,3] [--citus] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Tuple

import stockade
from common import process_cpu_s, server_cpu_s
from hot_sku import UNITS, c_load
from stockade.tools.bench import slow_flush_settings
from stockade.tools.citus import TemporaryCitus
from stockade.tools.pgserver import TemporaryPostgres, run_sql

TRIGGER = "ALTER TABLE stockade.stock {} TRIGGER stock_journal"
# A consumer that got less than a full poll waits this long (seconds) before the next one,
# as a Kafka consumer's fetch.max.wait does: a poll and a commit per 20 ms, not per batch.
LINGER = 0.02


class Consumer:
    """A feed consumer polling and committing in a thread of its own while a case runs."""

    def __init__(self, eng: stockade.Engine, name: str) -> None:
        self.feed = eng.feed(name, start="latest")
        self.stop = threading.Event()
        self.read = 0
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self) -> None:
        while True:
            stopping = self.stop.is_set()
            changes = self.feed.poll(limit=5000, timeout=0.05)
            self.read += len(changes)
            self.feed.commit()
            if stopping and not changes:
                return
            if len(changes) < 5000:
                time.sleep(LINGER)  # let changes gather: a poll per LINGER, not per batch

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def overhead_section(
    engines: Dict[str, stockade.Engine], sql: Callable[[str], str], args: argparse.Namespace
) -> Dict[str, Any]:
    """ "on": the trigger, the engine's NOTIFYs and a consumer polling all along; "off":
    none of them."""
    out: Dict[str, Any] = {}
    print("\n## 1. the journal and the feed on against off: one hot SKU, 64 blocking C++ clients")
    print(
        "| strategy | journal and feed | rounds (reservations/s) | median | CPU s per 1,000:"
        " engine and consumer | server |\n|---|---|---|---:|---:|---:|"
    )
    for strategy in ("batched", "atomic"):
        rates: Dict[str, List[float]] = {"on": [], "off": []}
        cpu_ms: Dict[str, List[Tuple[float, float]]] = {"on": [], "off": []}
        for n in range(args.rounds):
            for state in ("on", "off") if n % 2 == 0 else ("off", "on"):
                sql(TRIGGER.format("ENABLE" if state == "on" else "DISABLE"))
                sql("CHECKPOINT")
                eng = engines[state]
                sku = f"hot-{strategy}-{state}-{n}"
                eng.restock(sku, UNITS)
                consumer = Consumer(eng, f"bench-{sku}") if state == "on" else None
                cpu = (process_cpu_s(), server_cpu(args))
                try:
                    r = c_load(eng, [sku], strategy, 64, 1, args.seconds)
                finally:
                    if consumer is not None:
                        consumer.close()
                per_k = 1000 / max(r["granted"], 1)
                cpu_ms[state].append(
                    (
                        (process_cpu_s() - cpu[0]) * per_k,
                        (server_cpu(args) - cpu[1]) * per_k,
                    )
                )
                rates[state].append(r["rate"])
        sql(TRIGGER.format("ENABLE"))
        for state in ("on", "off"):
            shown = ", ".join(f"{r:,.0f}" for r in rates[state])
            engine_s = statistics.median(c[0] for c in cpu_ms[state])
            server_s = statistics.median(c[1] for c in cpu_ms[state])
            print(
                f"| {strategy} | {state} | {shown} | {statistics.median(rates[state]):,.0f} |"
                f" {engine_s:.3f} | {server_s:.3f} |"
            )
        ratio = statistics.median(rates["on"]) / statistics.median(rates["off"])
        print(f"\n{strategy}: on / off = {ratio:.2f}x")
        out[strategy] = {"on": rates["on"], "off": rates["off"], "ratio": ratio, "cpu_s": cpu_ms}
    return out


def lag_section(eng: stockade.Engine, args: argparse.Namespace) -> Dict[str, Any]:
    print(f"\n## 2. a consumer at full speed for {args.lag_seconds:g} s (batched, 64 clients)")
    feed = eng.feed("bench-lag", start="latest")
    lags: List[float] = []
    stop = threading.Event()
    read = [0]

    def consume() -> None:
        while True:
            stopping = stop.is_set()
            changes = feed.poll(limit=5000, timeout=0.05)
            now = datetime.now(timezone.utc)
            lags.extend((now - c.at).total_seconds() for c in changes)
            read[0] += len(changes)
            feed.commit()
            if stopping and not changes:
                return
            if len(changes) < 5000:
                time.sleep(LINGER)

    sku = "hot-lag"
    eng.restock(sku, UNITS)
    consumer = threading.Thread(target=consume)
    consumer.start()
    load = c_load(eng, [sku], "batched", 64, 1, args.lag_seconds)
    stop.set()
    consumer.join()
    written, after = 0, 0  # the restock too: it came after the feed began
    while page := eng.movements(sku, after=after, limit=100_000):
        written, after = written + len(page), page[-1].position
    lags.sort()
    pick = lambda q: lags[min(len(lags) - 1, int(len(lags) * q))] * 1000  # noqa: E731
    out = {
        "reservations_per_s": load["rate"],
        "changes_written": written,
        "changes_read": read[0],
        "lag_p50_ms": pick(0.50),
        "lag_p99_ms": pick(0.99),
        "lag_max_ms": lags[-1] * 1000,
    }
    print(
        f"{load['rate']:,.0f} reservations/s in {written:,} journal entries; the consumer "
        f"read {read[0]:,}; lag p50 {out['lag_p50_ms']:.1f} ms, p99 {out['lag_p99_ms']:.1f} ms,"
        f" max {out['lag_max_ms']:.1f} ms"
    )
    return out


def audit_section(
    eng: stockade.Engine, sql: Callable[[str], str], args: argparse.Namespace
) -> Dict[str, Any]:
    n = args.reservations
    print(f"\n## 3. the audit of {n:,} holds over 1,000 SKUs")
    sql(
        "INSERT INTO stockade.stock (sku, location, on_hand) SELECT 'audit-' || i, 'default',"
        f" {n} FROM generate_series(1, 1000) AS i"
    )
    sql(
        "INSERT INTO stockade.reservation (id, sku, location, qty, state, expires_at)"
        " SELECT gen_random_uuid(), 'audit-' || (1 + i % 1000), 'default', 1, 'held',"
        f" now() + interval '1 day' FROM generate_series(1, {n}) AS i"
    )
    sql(
        "UPDATE stockade.stock s SET reserved = h.n, version = version + 1 FROM (SELECT sku,"
        " count(*) AS n FROM stockade.reservation WHERE sku LIKE 'audit-%' GROUP BY sku) h"
        " WHERE s.sku = h.sku"
    )
    sql("VACUUM ANALYZE")
    started = time.perf_counter()
    report = eng.audit()
    seconds = time.perf_counter() - started
    assert report.ok, report.violations[:5]
    rate = report.reservations / seconds
    print(
        f"{report.rows:,} rows, {report.reservations:,} reservations, {report.movements:,} "
        f"journal entries: {seconds:.2f} s, {rate:,.0f} reservations/s, no violation"
    )
    return {"seconds": seconds, "reservations": report.reservations, "per_s": rate}


def server_cpu(args: argparse.Namespace) -> float:
    """CPU seconds so far of the server's nodes (one, or a Citus cluster's three)."""
    return sum(server_cpu_s(pid) for pid in args.postmasters)


def run_on_citus(args: argparse.Namespace, sections: set, report: Dict[str, Any]) -> None:
    """Sections 1 and 2 on a coordinator and two workers (--citus)."""
    with TemporaryCitus() as cluster:
        args.postmasters = cluster.pids()
        dsn = cluster.dsn() + "?options=-c%20citus.shard_count%3D4"
        # Citus changes a distributed table's triggers only under this setting.
        unsafe = dsn + "%20-c%20citus.enable_unsafe_triggers%3Don"
        with (
            stockade.Engine.postgres(dsn, layout="citus", pool_size=66) as eng,
            stockade.Engine.postgres(dsn, layout="citus", pool_size=66, feed_notify=False) as quiet,
        ):
            eng.migrate()
            sql = lambda statement: run_sql(unsafe, statement)  # noqa: E731
            if 1 in sections:
                report["overhead"] = overhead_section({"on": eng, "off": quiet}, sql, args)
            if 2 in sections:
                report["lag"] = lag_section(eng, args)
    if 3 in sections:
        print("\n(section 3, the audit's speed, is a one-server figure: not run with --citus)")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per case of section 1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lag-seconds", type=float, default=60.0)
    parser.add_argument("--reservations", type=int, default=1_000_000)
    parser.add_argument("--flush-delay-us", type=int, default=0)
    parser.add_argument("--sections", default="1,2,3")
    parser.add_argument(
        "--citus", action="store_true", help="sections 1 and 2 on a three-node Citus cluster"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    sections = {int(x) for x in args.sections.split(",")}
    settings = slow_flush_settings(args.flush_delay_us)
    flush = (
        f"a slow flush: commit_delay = {args.flush_delay_us} us, commit_siblings = 0"
        if settings
        else "the machine's own disk"
    )
    where = "a three-node Citus cluster on loopback" if args.citus else "one server"
    print(f"# stockade journal benchmark: {where}; fsync and synchronous_commit on; {flush}")
    report: Dict[str, Any] = {"flush_delay_us": args.flush_delay_us, "citus": args.citus}
    if args.citus:
        if settings:
            parser.error("--citus runs on the machine's own disk (no --flush-delay-us)")
        run_on_citus(args, sections, report)
    else:
        run_on_one_server(args, sections, settings, report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def run_on_one_server(
    args: argparse.Namespace, sections: set, settings: Dict[str, str], report: Dict[str, Any]
) -> None:
    with TemporaryPostgres(settings=settings) as pg:
        args.postmasters = [pg.pid]
        with (
            stockade.Engine.postgres(pg.dsn(), pool_size=66) as eng,
            stockade.Engine.postgres(pg.dsn(), pool_size=66, feed_notify=False) as quiet,
        ):
            eng.migrate()
            sql = pg.sql
            if 1 in sections:
                report["overhead"] = overhead_section({"on": eng, "off": quiet}, sql, args)
            if 2 in sections:
                report["lag"] = lag_section(eng, args)
            if 3 in sections:
                report["audit"] = audit_section(eng, sql, args)


if __name__ == "__main__":
    sys.exit(main())
