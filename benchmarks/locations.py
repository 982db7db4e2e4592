"""Benchmark: allocation from a pool of three locations against a reserve at one location,
side by side in one run, on one throwaway PostgreSQL.

    python benchmarks/locations.py [--seconds 3] [--clients 64] [--rounds 3]
                                   [--flush-delay-us 0] [--json FILE]

64 blocking C++ clients on one hot SKU stocked at three locations (north, south, east):

  - reserve:          reserve 1 unit at north (`batched`): the base;
  - allocate batched: allocate 1 unit from [north, south, east], priority (`batched`);
  - allocate auto:    the same under `auto`;
  - allocate atomic:  the same per request (`atomic`: every allocation locks the pool);
  - drained batched:  north has nothing free (south and east have plenty): a batched
                      allocation passes north over, a batch of its own, first.

The cases alternate, `--rounds` times, so that drift on a shared machine hits all alike.
With `--flush-delay-us` every WAL flush waits that long first (commit_delay,
commit_siblings=0), as on a network disk.

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import asdict
from typing import Any, Dict, List

import stockade
from common import rounds_on_postgres, rounds_parser, write_json
from stockade.tools import drive_load

POOL = ["north", "south", "east"]
# strategy, whether it allocates from the pool, whether north is drained first.
CASES = {
    "reserve": ("batched", False, False),
    "allocate batched": ("batched", True, False),
    "allocate auto": ("auto", True, False),
    "allocate atomic": ("atomic", True, False),
    "drained batched": ("batched", True, True),
}


def one_case(eng: stockade.Engine, sku: str, case: str, args: argparse.Namespace) -> Dict[str, Any]:
    strategy, pooled, drained = CASES[case]
    for location in POOL:
        eng.restock(sku, 10**9, location=location)
    if drained:
        eng.sell(sku, 10**9, location="north")
    r = asdict(
        drive_load(
            eng,
            [(sku, "north")],
            clients=args.clients,
            seconds=args.seconds,
            strategy=strategy,
            pool=POOL if pooled else None,
        )
    )
    r["rate"] = r["granted"] / r["seconds"]
    r["held"] = {loc: eng.stock(sku, location=loc).reserved for loc in POOL}
    return r


def main() -> None:
    ap = rounds_parser(__doc__)
    ap.add_argument("--clients", type=int, default=64)
    args = ap.parse_args()
    runs, audit_ok = rounds_on_postgres(
        args, "locations", list(CASES), one_case, warm=["allocate batched"], pool_size=16
    )
    print(
        f"one hot SKU at {len(POOL)} locations, {args.clients} C++ clients, WAL flush delay "
        f"{args.flush_delay_us} us, {args.seconds} s a case"
    )
    print(f"{'case':<18}{'round':>6}{'granted/s':>11}{'failed':>8}{'p50 ms':>8}  held per location")
    for case, rows in runs.items():
        for n, r in enumerate(rows):
            held = " ".join(f"{loc}={r['held'][loc]}" for loc in POOL)
            print(
                f"{case:<18}{n:>6}{r['rate']:>11,.0f}{r['failed']:>8}{r['p50_us'] / 1000:>8.2f}"
                f"  {held}"
            )
    ratios: Dict[str, List[float]] = {}
    for case, base in (
        ("allocate batched", "reserve"),
        ("allocate auto", "reserve"),
        ("drained batched", "reserve"),
        ("allocate auto", "allocate atomic"),
        ("allocate batched", "allocate atomic"),
    ):
        pairs = zip(runs[case], runs[base], strict=True)
        name = f"{case} / {base}"
        ratios[name] = [c["rate"] / b["rate"] for c, b in pairs]
        print(
            f"{name}: "
            + ", ".join(f"{x:.2f}x" for x in ratios[name])
            + f"; median {statistics.median(ratios[name]):.2f}x"
        )
    print(f"audit clean: {audit_ok}")
    write_json(args.json, {"flush_delay_us": args.flush_delay_us, "runs": runs, "ratios": ratios})


if __name__ == "__main__":
    main()
