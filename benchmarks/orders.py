"""Benchmark: an order settled in one step against line by line, and a reserve with a ref
against one without, side by side in one run, on one throwaway PostgreSQL.

    python benchmarks/orders.py [--seconds 3] [--threads 16] [--rounds 3]
                                [--flush-delay-us 0] [--json FILE]

Orders: `--threads` Python threads, each in a loop making an order of three lines (three
SKUs drawn from 300) and settling it: `confirm_order` (one transaction for the three
lines) or three `confirm` calls. Figures: orders settled per second.

References: the same threads reserving one unit of one hot SKU under `batched`, with
`ref=` (which runs per request: the batcher does not carry references) or without.
Figures: reserves per second.

The cases alternate, `--rounds` times, so that drift on a shared machine hits them alike.
With `--flush-delay-us` every WAL flush waits that long first (commit_delay,
commit_siblings=0), as on a network disk. It is a benchmark, not a test: it prints figures
and ratios and checks no target.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any, Callable, Dict, List

import stockade
from common import rounds_parser, write_json
from stockade.tools.bench import slow_flush_settings
from stockade.tools.pgserver import TemporaryPostgres

SKUS = [f"o-{i}" for i in range(300)]
HOT = "hot-1"


def order_step(eng: stockade.Engine, rng: random.Random) -> None:
    order = eng.reserve_order({sku: 1 for sku in rng.sample(SKUS, 3)})
    eng.confirm_order(order)


def line_by_line(eng: stockade.Engine, rng: random.Random) -> None:
    order = eng.reserve_order({sku: 1 for sku in rng.sample(SKUS, 3)})
    for line in order:
        eng.confirm(line.id)


def hot_plain(eng: stockade.Engine, rng: random.Random) -> None:
    eng.reserve(HOT, 1, strategy="batched")


def hot_ref(eng: stockade.Engine, rng: random.Random) -> None:
    eng.reserve(HOT, 1, strategy="batched", ref=f"line-{rng.randrange(10**9)}")


CASES: Dict[str, Callable[[stockade.Engine, random.Random], None]] = {
    "confirm_order": order_step,
    "3 x confirm": line_by_line,
    "reserve, batched": hot_plain,
    "reserve, batched, ref": hot_ref,
}
PAIRS = [("confirm_order", "3 x confirm"), ("reserve, batched, ref", "reserve, batched")]


def run(eng: stockade.Engine, case: str, threads: int, seconds: float) -> float:
    """Calls of `case` per second over `threads` threads for `seconds`."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        rng = random.Random(i)
        while time.monotonic() < stop:
            CASES[case](eng, rng)
            counts[i] += 1

    started = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / (time.monotonic() - started)


def main() -> None:
    ap = rounds_parser(__doc__)
    ap.add_argument("--threads", type=int, default=16)
    args = ap.parse_args()
    settings = slow_flush_settings(args.flush_delay_us)
    rates: Dict[str, List[float]] = {case: [] for case in CASES}
    with TemporaryPostgres(settings=settings) as pg:
        dsn = pg.create_database("bench")
        with stockade.Engine.postgres(dsn, pool_size=args.threads) as eng:
            eng.migrate()
            for sku in [*SKUS, HOT]:
                eng.restock(sku, 10**9)
            for _ in range(args.rounds):
                for case in CASES:
                    rates[case].append(run(eng, case, args.threads, args.seconds))
            audit = eng.audit()
            held = sum(eng.stock(sku).reserved for sku in SKUS)
    flush = f"{args.flush_delay_us} us flush delay" if args.flush_delay_us else "local disk"
    print(f"orders and references, {args.threads} threads, {flush}, {args.rounds} rounds\n")
    for case, got in rates.items():
        print(f"  {case:24} " + " ".join(f"{r:>9,.0f}/s" for r in got))
    report: Dict[str, Any] = {"rates": rates, "ratios": {}}
    print()
    for a, b in PAIRS:
        ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
        report["ratios"][f"{a} / {b}"] = ratios
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"  {a} / {b}: {each} (median {statistics.median(ratios):.2f}x)")
    report["audit_ok"], report["held_left"] = audit.ok, held
    print(f"\n  audit clean: {audit.ok}; units still held on the order SKUs: {held}")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
