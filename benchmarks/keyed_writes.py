"""Benchmark: keyed writes against keyless ones, side by side in one run, on one throwaway
PostgreSQL.

    python benchmarks/keyed_writes.py [--seconds 3] [--clients 64] [--rounds 3]
                                      [--flush-delay-us 0] [--json FILE]

Sells: 64 blocking C++ clients on one hot SKU, each sell of one unit with a fresh
idempotency key or none, under `atomic` and under `batched` (a keyed sell batches: the
batch claims its key and stores its outcome with it, in the batch's one statement on a
row). Restocks: 16 Python threads, keyed or not (restock is per request always). The
cases alternate, `--rounds` times, so that drift on a shared machine hits them alike.
With `--flush-delay-us` every WAL flush waits that long first (commit_delay,
commit_siblings=0), as on a network disk.

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any, Dict, List, Tuple

import stockade
from common import rounds_on_postgres, rounds_parser, write_json
from stockade.tools import drive_load

# (write, strategy, keyed)
CASES: List[Tuple[str, str, bool]] = [
    ("sell", "atomic", False),
    ("sell", "atomic", True),
    ("sell", "batched", False),
    ("sell", "batched", True),
    ("restock", "atomic", False),
    ("restock", "atomic", True),
]


def name(case: Tuple[str, str, bool]) -> str:
    return f"{case[0]} {case[1]}{', keyed' if case[2] else ''}"


def restocks(eng: stockade.Engine, sku: str, keyed: bool, seconds: float) -> Dict[str, Any]:
    """16 threads restocking one unit at a time for `seconds`; calls per second."""
    counts = [0] * 16
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        while time.monotonic() < stop:
            key = f"r-{uuid.uuid4().hex}" if keyed else None
            eng.restock(sku, 1, idempotency_key=key)
            counts[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"calls_per_s": sum(counts) / seconds, "failed": 0, "p50_us": 0.0}


def one_case(
    eng: stockade.Engine, sku: str, case: Tuple[str, str, bool], args: argparse.Namespace
) -> Dict[str, Any]:
    write, strategy, keyed = case
    eng.restock(sku, 10**9)
    if write == "restock":
        return restocks(eng, sku, keyed, args.seconds)
    r = asdict(
        drive_load(
            eng,
            [sku],
            clients=args.clients,
            seconds=args.seconds,
            qty=1,
            strategy=strategy,
            sell=True,
            keyed=keyed,
        )
    )
    r["calls_per_s"] = r["granted"] / r["seconds"]
    return r


def main() -> None:
    ap = rounds_parser(__doc__)
    ap.add_argument("--clients", type=int, default=64)
    args = ap.parse_args()
    runs, audit_ok = rounds_on_postgres(
        args, "keyed", CASES, one_case, warm=CASES, name=name, pool_size=16
    )
    print(
        f"one hot SKU, sells: {args.clients} C++ clients; restocks: 16 Python threads; "
        f"WAL flush delay {args.flush_delay_us} us, {args.seconds} s a case"
    )
    print(f"{'case':<24}{'round':>6}{'calls/s':>10}{'failed':>8}{'p50 ms':>8}")
    for case, rows in runs.items():
        for n, r in enumerate(rows):
            print(
                f"{case:<24}{n:>6}{r['calls_per_s']:>10,.0f}{r['failed']:>8}"
                f"{r['p50_us'] / 1000:>8.2f}"
            )
    ratios: Dict[str, List[float]] = {}
    pairs = [
        ("sell atomic, keyed", "sell atomic"),
        ("sell batched, keyed", "sell batched"),
        ("restock atomic, keyed", "restock atomic"),
    ]
    for keyed, keyless in pairs:
        ratios[f"{keyed} / {keyless}"] = [
            k["calls_per_s"] / u["calls_per_s"]
            for k, u in zip(runs[keyed], runs[keyless], strict=True)
        ]
    for label, values in ratios.items():
        print(
            f"{label}, per round: "
            + ", ".join(f"{x:.2f}x" for x in values)
            + f"; median {statistics.median(values):.2f}x"
        )
    print(f"audit clean: {audit_ok}")
    write_json(args.json, {"flush_delay_us": args.flush_delay_us, "runs": runs, "ratios": ratios})


if __name__ == "__main__":
    main()
