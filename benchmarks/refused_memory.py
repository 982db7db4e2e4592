"""Benchmark: what refused requests on made-up SKUs cost the process in memory.

A hostile client can send any SKU. Requests for SKUs that do not exist are refused
(NotFound); they must not leave per-SKU state behind. This sends ``--requests`` reserves,
each for a distinct SKU that does not exist, from ``--threads`` threads, on the memory store
and on a throwaway PostgreSQL, and prints the process's resident memory (VmRSS) before and
after, side by side with a control run of the same number of requests on one real SKU.

    python benchmarks/refused_memory.py [--requests 1000000] [--threads 8]

It is a benchmark, not a test: it prints figures and checks no target (issue target: less
than 20 MB of growth per million refused requests).
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Callable, List

import stockade
from common import rss_mb
from stockade.tools.pgserver import TemporaryPostgres


def send(eng: stockade.Engine, requests: int, threads: int, sku_of: Callable[[int], str]) -> float:
    """Sends `requests` reserves (each expected to be refused) from `threads` threads;
    returns requests per second."""
    per = requests // threads

    def run(t: int) -> None:
        for i in range(t * per, (t + 1) * per):
            try:
                eng.reserve(sku_of(i), 1, strategy="atomic")
            except (stockade.NotFound, stockade.OutOfStock):
                pass

    workers = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return per * threads / (time.perf_counter() - start)


def measure(name: str, eng: stockade.Engine, requests: int, threads: int) -> List[str]:
    eng.restock("real", 1)
    eng.reserve("real", 1)  # sold out: the control run is refused too (OutOfStock)
    send(eng, min(requests, 20_000), threads, lambda i: f"warm-{i}")  # warm up allocators
    before = rss_mb()
    control = send(eng, requests, threads, lambda i: "real")
    after_control = rss_mb()
    made_up = send(eng, requests, threads, lambda i: f"made-up-{i:012d}")
    after = rss_mb()
    return [
        f"| {name} | {requests:,} | {control:,.0f} | {after_control - before:+.1f} | "
        f"{made_up:,.0f} | {after - after_control:+.1f} | "
        f"{(after - after_control) * 1_000_000 / requests:+.1f} |"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    rows = [
        "| store | requests | one real SKU, req/s | RSS MB | made-up SKUs, req/s | RSS MB "
        "| MB per million |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    with stockade.Engine.memory() as eng:
        rows += measure("memory", eng, args.requests, args.threads)
    with TemporaryPostgres() as server:
        with stockade.Engine.postgres(server.dsn(), pool_size=args.threads) as eng:
            eng.migrate()
            rows += measure("postgres", eng, args.requests, args.threads)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
