"""Benchmark: what backorders, soft delete, leases and purchase limits cost, side by side
with plain reserve, on one throwaway PostgreSQL (fsync and synchronous_commit on).

Two layouts, each with 64 blocking C++ clients (--clients) for --seconds per run:

  hot    one SKU that every client hits (auto goes batched);
  wide   --skus SKUs (10,000) picked uniformly (auto stays atomic).

For each layout, one run each of:

  reserve             plain reserve, auto (the baseline of the ratios)
  reserve/patterns    the same on rows with a backorder limit, that were discontinued and
                      reinstated, and leased and released (their guards all evaluated)
  reserve/buyer       reserve with a buyer (one of --buyers at random) on SKUs in a
                      purchase-limit group whose limit is never reached: the cost of the
                      parent row per (group, buyer)
  sell                plain sell, auto (the baseline of the fenced sell)
  sell/fenced         sell with a lease's fencing_token: runs per request, not batched

Then the two ways to keep a purchase limit without write skew, from --py-threads Python
threads per request (the test hook is reachable from Python only, so both sides pay the
same Python overhead), atomic: the parent row (stockade) and check-then-insert at
SERIALIZABLE with retries (given an index on reservation (buyer, sku), so that its sum is
a lookup). "hot" is one SKU and 8 buyers, "wide" --skus SKUs and --buyers buyers.

    python benchmarks/patterns.py [--seconds 3] [--warmup 10] [--clients 64] [--skus 10000]
                                  [--buyers 10000] [--py-threads 32] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List

import stockade
from common import measure, parser, warm_up, write_json
from stockade.testing import limited_reserve_by_check
from stockade.tools.pgserver import TemporaryPostgres

UNITS = 10**9
LIMIT = 10**9  # never reached: the runs measure the mechanism, not refusals


def run(
    eng: stockade.Engine, skus: List[str], seconds: float, clients: int, warmup: float, **kw: Any
) -> Dict[str, Any]:
    warm_up(eng, skus, warmup, clients=clients, seconds=seconds, **kw)
    return measure(eng, skus, clients=clients, seconds=seconds, **kw)


def layout(
    eng: stockade.Engine, name: str, skus: List[str], args: argparse.Namespace
) -> Dict[str, Any]:
    """The runs on `skus`, each variant on SKUs of its own, set up alike. The fenced sell
    runs on the hot layout only: drive_load carries one lease's token, for one SKU."""
    fenced = len(skus) == 1
    variants = ["reserve", "patterns", "buyer", "sell"] + (["fenced"] if fenced else [])
    rows = {v: [f"{name}-{v}-{s}" for s in skus] for v in variants}
    for v in variants:
        for sku in rows[v]:
            eng.restock(sku, UNITS)
    for sku in rows["patterns"]:
        eng.set_backorder_limit(sku, 1000)
        eng.discontinue(sku)
        eng.reinstate(sku)
        eng.release_lease(eng.acquire_lease(sku, timedelta(minutes=5)))
    eng.set_purchase_limit(f"{name}-drop", LIMIT, rows["buyer"])
    seconds, clients, warmup = args.seconds, args.clients, args.warmup
    out = {
        "reserve": run(eng, rows["reserve"], seconds, clients, warmup=warmup),
        "reserve/patterns": run(eng, rows["patterns"], seconds, clients, warmup=warmup),
        "reserve/buyer": run(
            eng, rows["buyer"], seconds, clients, warmup=warmup, buyers=args.buyers
        ),
        "sell": run(eng, rows["sell"], seconds, clients, warmup=warmup, sell=True),
    }
    if fenced:
        token = eng.acquire_lease(rows["fenced"][0], timedelta(hours=1)).token
        out["sell/fenced"] = run(
            eng, rows["fenced"], seconds, clients, warmup=warmup, sell=True, fencing_token=token
        )
    return out


def threaded(
    call: Callable[[random.Random], object], threads: int, seconds: float
) -> Dict[str, Any]:
    """`threads` Python threads calling call(rng) for `seconds`; counts outcomes."""
    counts = {"granted": 0, "limited": 0, "overloaded": 0, "failed": 0}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        mine = dict.fromkeys(counts, 0)
        rng = random.Random(i)
        while time.monotonic() < stop:
            try:
                call(rng)
                mine["granted"] += 1
            except stockade.LimitExceeded:
                mine["limited"] += 1
            except stockade.Overloaded:
                mine["overloaded"] += 1
            except stockade.StockadeError:
                mine["failed"] += 1
        with lock:
            for k, v in mine.items():
                counts[k] += v

    started = time.perf_counter()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    return {**counts, "seconds": elapsed, "rate": counts["granted"] / elapsed}


def limit_methods(eng: stockade.Engine, args: argparse.Namespace) -> Dict[str, Any]:
    """Parent row against SERIALIZABLE, on a hot group and on a wide one."""
    out: Dict[str, Any] = {}
    for case, nskus, buyers in (("hot", 1, 8), ("wide", args.skus, args.buyers)):
        for method in ("parent row", "serializable"):
            group = f"lim-{case}-{method.replace(' ', '-')}"
            skus = [f"{group}-{i}" for i in range(nskus)]
            for sku in skus:
                eng.restock(sku, UNITS)
            eng.set_purchase_limit(group, LIMIT, skus)

            def call(
                rng: random.Random, skus: List[str] = skus, method: str = method, n: int = buyers
            ) -> object:
                sku = skus[rng.randrange(len(skus))]
                buyer = f"b{rng.randrange(n)}"
                if method == "parent row":
                    return eng.reserve(sku, 1, buyer=buyer, strategy="atomic")
                return limited_reserve_by_check(
                    eng, sku, 1, buyer=buyer, serializable=True, window=timedelta(0)
                )

            out[f"{case}/{method}"] = threaded(call, args.py_threads, args.seconds)
    return out


def main(argv: List[str]) -> int:
    ap = parser(__doc__)
    ap.add_argument("--buyers", type=int, default=10_000)
    ap.add_argument("--py-threads", type=int, default=32)
    args = ap.parse_args(argv)

    report: Dict[str, Any] = {"args": vars(args)}
    with TemporaryPostgres() as pg:
        with stockade.Engine.postgres(pg.dsn(), pool_size=args.clients) as eng:
            eng.migrate()
            server = pg.sql("SHOW server_version").strip()
            print(f"PostgreSQL {server}, {args.clients} C++ clients, {args.seconds} s a run")
            for name, skus in (("hot", ["s"]), ("wide", [str(i) for i in range(args.skus)])):
                print(f"\n{name}: {len(skus)} SKU(s)")
                runs = layout(eng, name, skus, args)
                report[name] = runs
                base = {"reserve": runs["reserve"]["rate"], "sell": runs["sell"]["rate"]}
                for label, r in runs.items():
                    ref = base["sell" if label.startswith("sell") else "reserve"]
                    print(
                        f"  {label:18} {r['rate']:>10,.0f}/s  p99 {r['p99_us'] / 1000:7.1f} ms"
                        f"  {r['rate'] / ref:5.2f}x  failed {r['failed']}"
                    )
            # SERIALIZABLE sums a buyer's reservations: give it the index that makes that a
            # lookup (and its predicate locks narrow), as a fair alternative would have.
            pg.sql(
                "CREATE INDEX bench_reservation_buyer ON stockade.reservation (buyer, sku)"
                " WHERE buyer IS NOT NULL"
            )
            print(f"\npurchase limits, {args.py_threads} Python threads, atomic, per request:")
            methods = limit_methods(eng, args)
            report["limit_methods"] = methods
            for label, r in methods.items():
                case = label.split("/")[0]
                ref = methods[f"{case}/parent row"]["rate"]
                print(
                    f"  {label:20} {r['rate']:>9,.0f}/s  {r['rate'] / ref:5.2f}x"
                    f"  limited {r['limited']}  gave up (Overloaded) {r['overloaded']}"
                    f"  failed {r['failed']}"
                )
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
