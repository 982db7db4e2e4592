"""What an idempotency key costs a batched reserve on one hot SKU: keyed against keyless,
side by side in one run, with where the time goes.

    python benchmarks/keyed_batch.py [--flush-delay-us 2000] [--rounds 3] [--seconds 3]

64 blocking C++ clients reserve one unit each from one hot SKU (`batched`), keyless and
keyed in turn, each case `--rounds` times, alternating so that drift on a shared machine
hits both alike. The server runs `pg_stat_statements`, so each case also reports its
batches: how many, their mean size, and the mean time the batch statement ran
(`batch_fast_one` keyless, `batch_fast_one_keyed` keyed; a keyed batch whose statement
found a key taken runs the full path, counted apart). With `--flush-delay-us` every WAL
flush waits that long first (commit_delay with commit_siblings=0), as on a network disk
or with a synchronous standby: the regime in which the hot-row issue's 0.9x target is set.
"""

from __future__ import annotations

import argparse
import statistics
from datetime import timedelta
from typing import Any, Dict, List

import stockade
from stockade.tools import drive_load
from stockade.tools.bench import slow_flush_settings
from stockade.tools.pgserver import TemporaryPostgres, run_sql


def kind_of(query: str) -> str:
    """Which batch statement a pg_stat_statements entry is, by its text."""
    if query.startswith("WITH moved AS (UPDATE") and ".stock AS s SET" in query:
        return "full path"  # batch_write: the full path's one write
    if query.startswith("WITH moved AS (UPDATE"):
        return "keyed" if "claim AS (INSERT" in query else "keyless"
    return "other"


def statement_stats(dsn: str) -> Dict[str, Dict[str, float]]:
    """calls and total time (ms) of each kind of batch statement since the last reset."""
    out = run_sql(
        dsn,
        "SELECT calls, total_exec_time, replace(replace(query, E'\\n', ' '), '|', ' ')"
        " FROM pg_stat_statements",
    )
    stats: Dict[str, Dict[str, float]] = {}
    for line in out.splitlines():
        calls, total, query = line.split("|", 2)
        entry = stats.setdefault(kind_of(query), {"calls": 0.0, "ms": 0.0})
        entry["calls"] += float(calls)
        entry["ms"] += float(total)
    return stats


def one_case(
    eng: stockade.Engine, dsn: str, sku: str, keyed: bool, seconds: float
) -> Dict[str, Any]:
    run_sql(dsn, "SELECT pg_stat_statements_reset()")
    eng.restock(sku, 100_000_000)
    r = drive_load(
        eng,
        [sku],
        clients=64,
        window=1,
        seconds=seconds,
        ttl=timedelta(minutes=10),
        strategy="batched",
        keyed=keyed,
    )
    stats = statement_stats(dsn)
    own = stats.get("keyed" if keyed else "keyless", {"calls": 0.0, "ms": 0.0})
    batches = max(own["calls"], 1.0)
    return {
        "rate": r.granted / r.seconds,
        "batches": own["calls"],
        "batch_size": r.granted / batches,
        "statement_ms": own["ms"] / batches,
        "full_path_batches": stats.get("full path", {"calls": 0.0})["calls"],
        "p50_ms": r.p50_us / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flush-delay-us", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    settings = slow_flush_settings(args.flush_delay_us)
    settings["shared_preload_libraries"] = "pg_stat_statements"
    settings["pg_stat_statements.track"] = "all"
    with TemporaryPostgres(settings=settings) as pg:
        dsn = pg.create_database("keyed")
        run_sql(dsn, "CREATE EXTENSION pg_stat_statements")
        cases: Dict[str, List[Dict[str, Any]]] = {"keyless": [], "keyed": []}
        with stockade.Engine.postgres(dsn, pool_size=16) as eng:
            eng.migrate()
            one_case(eng, dsn, "warm-up", True, 1.0)  # plans made, the key index warm
            for n in range(args.rounds):
                for case in ("keyless", "keyed"):
                    sku = f"hot-{case}-{n}"
                    cases[case].append(one_case(eng, dsn, sku, case == "keyed", args.seconds))
    print(f"one hot SKU, 64 C++ clients, batched, WAL flush delay {args.flush_delay_us} us")
    print(
        f"{'case':<9}{'round':>6}{'req/s':>10}{'batches':>9}{'size':>7}{'stmt ms':>9}"
        f"{'full path':>10}{'p50 ms':>8}"
    )
    for case, runs in cases.items():
        for n, c in enumerate(runs):
            print(
                f"{case:<9}{n:>6}{c['rate']:>10,.0f}{c['batches']:>9,.0f}{c['batch_size']:>7.1f}"
                f"{c['statement_ms']:>9.3f}{c['full_path_batches']:>10,.0f}{c['p50_ms']:>8.2f}"
            )
    pairs = list(zip(cases["keyed"], cases["keyless"], strict=True))
    ratios = [k["rate"] / u["rate"] for k, u in pairs]
    stmt = [k["statement_ms"] - u["statement_ms"] for k, u in pairs]
    print(
        f"keyed / keyless, per round: {', '.join(f'{r:.2f}x' for r in ratios)}; "
        f"median {statistics.median(ratios):.2f}x"
    )
    print(
        f"the keyed statement's extra time per batch, per round: "
        f"{', '.join(f'{d:+.3f} ms' for d in stmt)}"
    )


if __name__ == "__main__":
    main()
