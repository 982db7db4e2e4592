"""Benchmark: the order lifecycle's partial steps against the whole-hold flow, side by side
in one run, on one throwaway PostgreSQL.

    python benchmarks/lifecycle.py [--seconds 3] [--clients 64] [--rounds 3]
                                   [--flush-delay-us 0] [--json FILE]

64 blocking C++ clients on one hot SKU (`batched`, so confirms and releases batch too):

  - whole:   each client reserves 3 units, then confirms the hold (2 calls an order);
  - partial: each client reserves 3 units, confirms 2 of them, releases the last one
             (3 calls an order: a partial shipment);
  - one step: the same order, the confirm of 2 releasing the rest itself
             (confirm(id, qty=2, release_rest=True): 2 calls an order).

The cases alternate, `--rounds` times, so that drift on a shared machine hits both alike.
The figure compared is orders settled per second (granted reserves whose steps all
succeeded); the partial flow makes one call more per order, so calls per second are shown
too. With `--flush-delay-us` every WAL flush waits that long first (commit_delay,
commit_siblings=0), as on a network disk.

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Dict, List

import stockade
from common import rounds_on_postgres, rounds_parser, write_json
from stockade.tools import drive_load

# confirm_qty (0: the whole hold of 3), release_rest, and calls per order.
CASES = {"whole": (0, False, 2), "partial": (2, False, 3), "one step": (2, True, 2)}


def one_case(eng: stockade.Engine, sku: str, case: str, args: argparse.Namespace) -> Dict[str, Any]:
    eng.restock(sku, 10**9)
    r = asdict(
        drive_load(
            eng,
            [sku],
            clients=args.clients,
            seconds=args.seconds,
            qty=3,
            ttl=timedelta(minutes=10),
            strategy="batched",
            confirm=True,
            confirm_qty=CASES[case][0],
            release_rest=CASES[case][1],
        )
    )
    # Every call of an order counts as a request; an order is settled when all went.
    r["orders_per_s"] = (r["granted"] / CASES[case][2]) / r["seconds"]
    r["calls_per_s"] = r["granted"] / r["seconds"]
    level = eng.stock(sku)
    r["reserved_left"] = level.reserved  # 0: every hold was settled whole
    return r


def main() -> None:
    ap = rounds_parser(__doc__)
    ap.add_argument("--clients", type=int, default=64)
    args = ap.parse_args()
    runs, audit_ok = rounds_on_postgres(
        args, "lifecycle", list(CASES), one_case, warm=["partial"], pool_size=16,
        strategy="batched",
    )  # fmt: skip
    print(
        f"one hot SKU, {args.clients} C++ clients, batched, WAL flush delay "
        f"{args.flush_delay_us} us, {args.seconds} s a case"
    )
    print(f"{'case':<9}{'round':>6}{'orders/s':>10}{'calls/s':>10}{'failed':>8}{'p50 ms':>8}")
    for case, rows in runs.items():
        for n, r in enumerate(rows):
            print(
                f"{case:<9}{n:>6}{r['orders_per_s']:>10,.0f}{r['calls_per_s']:>10,.0f}"
                f"{r['failed']:>8}{r['p50_us'] / 1000:>8.2f}"
            )
    ratios: Dict[str, List[float]] = {}
    for case in ("partial", "one step"):
        pairs = zip(runs[case], runs["whole"], strict=True)
        ratios[case] = [c["orders_per_s"] / w["orders_per_s"] for c, w in pairs]
        print(
            f"{case} / whole, orders per second, per round: "
            + ", ".join(f"{x:.2f}x" for x in ratios[case])
            + f"; median {statistics.median(ratios[case]):.2f}x"
        )
    left = sum(r["reserved_left"] for rows in runs.values() for r in rows)
    print(f"units still reserved after the runs: {left}; audit clean: {audit_ok}")
    write_json(
        args.json,
        {"flush_delay_us": args.flush_delay_us, "runs": runs, "against_whole": ratios},
    )


if __name__ == "__main__":
    main()
