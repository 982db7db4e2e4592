"""Benchmark: one hot SKU under every strategy, side by side, on one throwaway PostgreSQL.

Every reservation writes its row (the SKU holds 10^9 units, so nothing sells out), with
fsync and synchronous_commit on. Figures from one run share the machine's noise, so
compare the ratios, not the absolute numbers. With --flush-delay-us N the server flushes
as a network disk or a synchronous standby does: each WAL flush waits N microseconds first
(commit_delay = N, commit_siblings = 0), and the header and the JSON say so. Sections:

  0. the server's ceiling: pgbench running a 32-row batch transaction on one stock row and
     on --replicas rows, and from it the Little's-law bound for the blocking clients
     (clients / the time a row stays locked per transaction); sections 1 and 5 show each
     case as a share of that bound;
  1. hot SKU, 64 C++ client threads, one blocking call at a time, every strategy, and
     batched with an idempotency key on every request;
  2. hot SKU, 64 C++ clients keeping --window async requests each in flight (batched, auto);
  3. hot SKU, asyncio tasks in Python awaiting reserve_async (batched, auto): 64 of them,
     and --asyncio-tasks of them;
  4. --cold-skus SKUs under uniform load, 64 C++ clients: atomic against auto;
  5. replicas: the hot SKU from --replicas processes sharing the --clients (4 x 16),
     against one process with all of them (1 x 64), batched and auto; each process is an
     engine of its own, as gunicorn workers or pods are. Two more cases bound what
     hot-row slots (k rows for one SKU) could gain here: the same processes each on a
     SKU of its own (one row per process, no shared row lock), and one process whose
     clients spread over --replicas SKUs. And the hot SKU with --replicas hot-row slots
     (Engine.set_slots), each process on a slot of its own (home_slot), and one process
     on that SKU (all its clients on its one home slot: what slots cost a single process).
     Last, the shared row again with batch_linger=0: what the flushers' wait on a row that
     other processes write too adds. Each case also reports CPU seconds per 1,000
     reservations, of the client and engine processes and of the server's processes.
  6. a sold-out SKU under the same 64 clients: refusals per second, on a plain row and on
     a SKU with --replicas slots (a refusal there reads every row of the SKU).
  7. many small replicas: the hot SKU from --small-replicas processes (16) with 2 clients
     each, atomic, auto and batched, and with 1 client each, atomic and auto. No process
     sees the 4 requests in flight that make a row hot on its own: auto batches here only
     from the row's version (the writes of the others).

    python benchmarks/hot_sku.py [--seconds 3] [--clients 64] [--window 16]
                                 [--asyncio-tasks 1024] [--cold-skus 10000]
                                 [--replicas 4] [--small-replicas 16]
                                 [--flush-delay-us 0] [--sections 0,1,2,3,4,5,6,7]
                                 [--json FILE]

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

import stockade
from common import process_cpu_s, server_cpu_s
from stockade.tools import drive_load
from stockade.tools.bench import run_ceiling, slow_flush_settings
from stockade.tools.pgserver import TemporaryPostgres

UNITS = 10**9
TTL_US = 15 * 60 * 10**6
STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]


def c_load(
    eng: stockade.Engine,
    skus: List[str],
    strategy: str,
    clients: int,
    window: int,
    seconds: float,
    keyed: bool = False,
) -> Dict[str, Any]:
    out: Dict[str, Any] = asdict(
        drive_load(
            eng,
            skus,
            clients=clients,
            window=window,
            seconds=seconds,
            ttl=timedelta(microseconds=TTL_US),
            strategy=strategy,
            keyed=keyed,
        )
    )
    out["rate"] = out["granted"] / out["seconds"]
    return out


async def _asyncio_load(
    eng: stockade.Engine, sku: str, strategy: str, tasks: int, seconds: float
) -> Dict[str, Any]:
    loop = asyncio.get_running_loop()
    latencies: List[float] = []
    counts = {"granted": 0, "failed": 0}
    stop_at = loop.time() + seconds

    async def requester() -> None:
        while loop.time() < stop_at:
            start = time.perf_counter()
            try:
                await eng.reserve_async(sku, 1, strategy=strategy)
                counts["granted"] += 1
            except stockade.StockadeError:
                counts["failed"] += 1
            latencies.append(time.perf_counter() - start)

    started = time.perf_counter()
    await asyncio.gather(*(requester() for _ in range(tasks)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "granted": counts["granted"],
        "failed": counts["failed"],
        "seconds": elapsed,
        "rate": counts["granted"] / elapsed,
        "p50_us": latencies[len(latencies) // 2] * 1e6 if latencies else 0.0,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6 if latencies else 0.0,
    }


def asyncio_load(
    eng: stockade.Engine, sku: str, strategy: str, tasks: int, seconds: float
) -> Dict[str, Any]:
    return asyncio.run(_asyncio_load(eng, sku, strategy, tasks, seconds))


# One replica: an engine in its own process, driving the hot SKU from C++ threads; prints
# its figures as JSON. Once connected it says "ready" and waits for the shared instant to
# start at, which comes on its stdin. The DSN comes in the environment.
REPLICA = """
import json, os, sys, time
import stockade
from stockade.tools import drive_load
sku, strategy, clients, seconds, home, linger = sys.argv[1:7]
home_slot = None if home == "-" else int(home)
options = {} if linger == "-" else {"batch_linger": float(linger)}
with stockade.Engine.postgres(
    os.environ["STOCKADE_DSN"], pool_size=int(clients), home_slot=home_slot, **options
) as eng:
    eng.stock(sku)  # connected before the start
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    cpu = os.times()
    r = drive_load(eng, [sku], clients=int(clients), seconds=float(seconds), strategy=strategy)
    done = os.times()
    batcher = eng.stats()["batcher"]
    print(json.dumps({"granted": r.granted, "failed": r.failed, "seconds": r.seconds,
                      "cpu_s": done.user + done.system - cpu.user - cpu.system,
                      "p50_us": r.p50_us, "p99_us": r.p99_us,
                      "batch_size_mean": batcher["batch_size_mean"],
                      "lingered": batcher["lingered_batches"], "batches": batcher["batches"],
                      "batched_requests": batcher["requests"]}))
"""


def start_together(children: List["subprocess.Popen[str]"]) -> float:
    """Waits until every replica says it is connected (each exits if it cannot connect,
    within its connect timeout), then gives them all one instant to start at, a little
    ahead; returns that instant."""
    for child in children:
        assert child.stdout is not None and child.stdin is not None
        if child.stdout.readline().strip() != "ready":
            raise SystemExit(f"a replica failed to start (exit {child.wait(timeout=60)})")
    start_at = time.time() + 0.05
    for child in children:
        assert child.stdin is not None
        child.stdin.write(f"{start_at!r}\n")
        child.stdin.flush()  # communicate() closes it
    return start_at


def replicas_load(
    dsn: str,
    postmaster: int,
    skus: List[str],
    strategy: str,
    clients: int,
    seconds: float,
    slots: bool = False,
    linger: Optional[float] = None,
) -> Dict[str, Any]:
    """One replica per entry of `skus` (the SKU it drives), with clients // len(skus) C++
    clients each, started together; with `slots`, replica i has home_slot i; `linger`
    (seconds) sets batch_linger, else the default. The CPU seconds of the load: the
    replicas' own (each measures its load) and the server's (`postmaster`'s processes, from
    the load's start until the replicas have ended)."""
    env = {**os.environ, "STOCKADE_DSN": dsn}
    per = str(clients // len(skus))
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                REPLICA,
                sku,
                strategy,
                per,
                str(seconds),
                str(i) if slots else "-",
                "-" if linger is None else repr(linger),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i, sku in enumerate(skus)
    ]
    start_at = start_together(children)
    time.sleep(max(0.0, start_at - time.time()))
    server_cpu = server_cpu_s(postmaster)
    outs = []
    for child in children:
        stdout, _ = child.communicate(timeout=seconds + 120)
        if child.returncode != 0:
            raise SystemExit(f"a replica failed (exit {child.returncode})")
        outs.append(json.loads(stdout))
    server_cpu = server_cpu_s(postmaster) - server_cpu
    elapsed = max(o["seconds"] for o in outs)
    granted = sum(o["granted"] for o in outs)
    return {
        "engine_cpu_s": sum(o["cpu_s"] for o in outs),
        "server_cpu_s": server_cpu,
        "granted": granted,
        "failed": sum(o["failed"] for o in outs),
        "seconds": elapsed,
        "rate": granted / elapsed,
        "p50_us": sum(o["p50_us"] for o in outs) / len(outs),
        "p99_us": max(o["p99_us"] for o in outs),
        "batch_size_mean": sum(o["batch_size_mean"] for o in outs) / len(outs),
        "lingered_share": (
            sum(o["lingered"] for o in outs) / max(1, sum(o["batches"] for o in outs))
        ),
        # the share of requests that went through a batcher (auto's choice, for auto)
        "batched_share": (
            sum(o["batched_requests"] for o in outs)
            / max(1, sum(o["granted"] + o["failed"] for o in outs))
        ),
    }


def table(
    title: str,
    rows: List[Dict[str, Any]],
    base: Optional[float] = None,
    bound: Optional[float] = None,
) -> None:
    """A section's cases; with `bound` (the server's Little's-law bound for these clients,
    see section 0), each case's share of it too."""
    print(f"\n### {title}\n")
    print(
        "| case | reservations/s | p50 ms | p99 ms | failed | vs atomic |"
        + (" of the bound |" if bound else "")
    )
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if bound else ""))
    for r in rows:
        ratio = f"{r['rate'] / base:.1f}x" if base else "-"
        print(
            f"| {r['case']} | {r['rate']:,.0f} | {r['p50_us'] / 1000:.2f} | "
            f"{r['p99_us'] / 1000:.2f} | {r['failed']} | {ratio} |"
            + (f" {r['rate'] / bound:.2f} |" if bound else "")
        )
    sys.stdout.flush()


def ceiling_section(
    dsn: str, args: argparse.Namespace, report: Dict[str, Any], ratios: Dict[str, float]
) -> float:
    """Section 0: what the server allows one hot SKU (stockade.tools.bench.run_ceiling:
    pgbench, a 32-row batch transaction by 8 clients, on one stock row and on --replicas
    rows), and the Little's-law bound for --clients blocking clients; returns the bound."""
    c = run_ceiling(dsn, "stockade", rows=args.replicas, seconds=args.seconds)
    figures = c.as_dict(args.clients)
    print(
        f"\n### 0. the server's ceiling (pgbench: a transaction of one stock row's UPDATE and"
        f" {c.batch} reservation rows, {c.clients} clients)\n\n"
        f"- on one row: {c.one_row_tps:,.0f} transactions/s = "
        f"{figures['one_row_rows_per_s']:,.0f} rows/s; a row stays locked "
        f"{c.commit_latency_ms:.2f} ms per transaction\n"
        f"- on {c.rows} rows: {c.rows_tps:,.0f} transactions/s = "
        f"{figures['rows_rows_per_s']:,.0f} rows/s ({c.rows_tps / c.one_row_tps:.2f}x)\n"
        f"- Little's law for {args.clients} blocking clients: at most "
        f"{figures['bound']:,.0f} reservations/s, if each commits in the next transaction on"
        " its row"
    )
    report["ceiling"] = figures
    ratios[f"ceiling_{c.rows}_rows_vs_1"] = c.rows_tps / c.one_row_tps
    return float(figures["bound"])


def run(
    eng: stockade.Engine, pg_sql: Any, args: argparse.Namespace, dsn: str = ""
) -> Dict[str, Any]:
    def fresh_sku(eng: stockade.Engine, name: str) -> str:
        # Every case starts from a checkpoint, so none pays for the WAL an earlier one wrote.
        pg_sql("CHECKPOINT")
        eng.restock(name, UNITS)
        return name

    report: Dict[str, Any] = {
        "seconds": args.seconds,
        "clients": args.clients,
        "flush_delay_us": args.flush_delay_us,
    }
    sections = {int(x) for x in args.sections.split(",")}
    ratios: Dict[str, float] = {}
    atomic = 0.0
    args.bound = ceiling_section(dsn, args, report, ratios) if 0 in sections else None
    if 1 in sections or 2 in sections or 3 in sections:
        atomic = hot_sections(eng, args, fresh_sku, report, ratios)
    if 4 in sections:
        cold_section(eng, pg_sql, args, report, ratios)
    if 5 in sections:
        replicas_section(eng, pg_sql, args, dsn, fresh_sku, report, ratios, atomic)
    if 6 in sections:
        sold_out_section(eng, pg_sql, args, report, ratios)
    if 7 in sections:
        small_replicas_section(eng, args, dsn, fresh_sku, report, ratios)
    report["ratios"] = ratios
    print("\n### ratios\n")
    for name, value in ratios.items():
        print(f"- {name}: {value:,.2f}")
    stats = eng.stats()["batcher"]
    print(
        f"\nbatcher: {stats['batches']:,} batches, {stats['requests']:,} requests, "
        f"mean {stats['batch_size_mean']:.1f}, max {stats['batch_size_max']}"
    )
    return report


def hot_sections(
    eng: stockade.Engine,
    args: argparse.Namespace,
    fresh_sku: Any,
    report: Dict[str, Any],
    ratios: Dict[str, float],
) -> float:
    hot: List[Dict[str, Any]] = []
    for strategy in STRATEGIES:
        r = c_load(
            eng, [fresh_sku(eng, f"hot-{strategy}")], strategy, args.clients, 1, args.seconds
        )
        hot.append({"case": strategy, **r})
    # An idempotency key on every request: a batch claims its keys in its own transaction.
    r = c_load(eng, [fresh_sku(eng, "hot-keyed")], "batched", args.clients, 1, args.seconds, True)
    hot.append({"case": "batched, keyed", **r})
    atomic = hot[0]["rate"]
    table(f"1. one hot SKU, {args.clients} C++ clients, blocking calls", hot, atomic, args.bound)
    report["hot_blocking"] = hot

    windowed = []
    for strategy in ["batched", "auto"]:
        r = c_load(
            eng,
            [fresh_sku(eng, f"hot-window-{strategy}")],
            strategy,
            args.clients,
            args.window,
            args.seconds,
        )
        windowed.append({"case": f"{strategy}, {args.window} in flight per client", **r})
    table(
        f"2. one hot SKU, {args.clients} C++ clients x {args.window} async requests in flight",
        windowed,
        atomic,
    )
    report["hot_windowed"] = windowed

    aio = []
    for strategy in ["batched", "auto"]:
        for tasks in [args.clients, args.asyncio_tasks]:
            r = asyncio_load(
                eng,
                fresh_sku(eng, f"hot-asyncio-{strategy}-{tasks}"),
                strategy,
                tasks,
                args.seconds,
            )
            aio.append({"case": f"{strategy}, {tasks} asyncio tasks", **r})
    table("3. one hot SKU, asyncio tasks in one Python event loop", aio, atomic)
    report["hot_asyncio"] = aio

    batched = hot[STRATEGIES.index("batched")]["rate"]
    auto_hot = hot[STRATEGIES.index("auto")]["rate"]
    ratios.update(
        {
            "batched_vs_atomic_hot": batched / atomic,
            "auto_vs_batched_hot": auto_hot / batched,
            "keyed_vs_keyless_batched_hot": hot[-1]["rate"] / batched,
            "cpp_windowed_batched_per_s": windowed[0]["rate"],
            "asyncio_batched_per_s": aio[0]["rate"],
            "asyncio_batched_many_tasks_per_s": aio[1]["rate"],
        }
    )
    return atomic


def cold_section(
    eng: stockade.Engine,
    pg_sql: Any,
    args: argparse.Namespace,
    report: Dict[str, Any],
    ratios: Dict[str, float],
) -> None:
    pg_sql(
        f"INSERT INTO stockade.stock (sku, location, on_hand) SELECT 'cold-' || i, "
        f"'default', {UNITS} FROM generate_series(1, {args.cold_skus}) AS i"
    )
    pg_sql("CHECKPOINT")
    cold_skus = [f"cold-{i}" for i in range(1, args.cold_skus + 1)]
    cold = []
    for strategy in ["atomic", "auto"]:
        pg_sql("CHECKPOINT")
        r = c_load(eng, cold_skus, strategy, args.clients, 1, args.seconds)
        cold.append({"case": f"{strategy}, {args.cold_skus:,} cold SKUs", **r})
    table(
        f"4. {args.cold_skus:,} cold SKUs, uniform, {args.clients} C++ clients",
        cold,
        cold[0]["rate"],
    )
    report["cold"] = cold
    ratios["auto_vs_atomic_cold_p50_latency"] = cold[1]["p50_us"] / cold[0]["p50_us"]
    ratios["auto_vs_atomic_cold_throughput"] = cold[1]["rate"] / cold[0]["rate"]


def replicas_section(
    eng: stockade.Engine,
    pg_sql: Any,
    args: argparse.Namespace,
    dsn: str,
    fresh_sku: Any,
    report: Dict[str, Any],
    ratios: Dict[str, float],
    atomic: float,
) -> None:
    replicas = []
    n, per = args.replicas, args.clients // args.replicas
    for strategy in ["batched", "auto"]:
        one = fresh_sku(eng, f"hot-replicas-{strategy}-1")
        shared = fresh_sku(eng, f"hot-replicas-{strategy}-{n}")
        own = [fresh_sku(eng, f"hot-replicas-{strategy}-own-{i}") for i in range(n)]
        spread = [fresh_sku(eng, f"hot-replicas-{strategy}-spread-{i}") for i in range(n)]
        slotted = fresh_sku(eng, f"hot-replicas-{strategy}-slots")
        eng.set_slots(slotted, n)
        unlingered = fresh_sku(eng, f"hot-replicas-{strategy}-{n}-no-linger")
        # (case, the SKU of each replica process or None (then this process drives the
        # SKUs listed), whether replica i runs on slot i, and its batch_linger)
        loads: List[Tuple[str, Optional[List[str]], List[str], bool, Optional[float]]] = [
            (f"{strategy}, 1 x {args.clients} clients", [one], [], False, None),
            (f"{strategy}, {n} x {per} clients", [shared] * n, [], False, None),
            (f"{strategy}, {n} x {per} clients, a SKU per process", own, [], False, None),
            (f"{strategy}, 1 x {args.clients} clients over {n} SKUs", None, spread, False, None),
            (f"{strategy}, {n} x {per} clients, {n} slots", [slotted] * n, [], True, None),
            (f"{strategy}, 1 x {args.clients} clients, {n} slots", None, [slotted], False, None),
            (f"{strategy}, {n} x {per} clients, batch_linger=0", [unlingered] * n, [], False, 0.0),
        ]
        cases = []
        for case, processes, local, slots, linger in loads:
            pg_sql("CHECKPOINT")  # each case starts from a checkpoint, as fresh_sku's do
            if processes is not None:
                r = replicas_load(
                    dsn,
                    args.postmaster,
                    processes,
                    strategy,
                    args.clients,
                    args.seconds,
                    slots,
                    linger,
                )
            else:
                cpu = (process_cpu_s(), server_cpu_s(args.postmaster))
                r = c_load(eng, local, strategy, args.clients, 1, args.seconds)
                r["engine_cpu_s"] = process_cpu_s() - cpu[0]
                r["server_cpu_s"] = server_cpu_s(args.postmaster) - cpu[1]
            per_1000 = 1000 / max(1, r["granted"])
            r["engine_cpu_s_per_1000"] = r["engine_cpu_s"] * per_1000
            r["server_cpu_s_per_1000"] = r["server_cpu_s"] * per_1000
            cases.append((case, r))
        # What the shared row ended as: `auto` splits a row several processes batch.
        cases[1][1]["slots_after"] = eng.slot_count(shared)
        replicas += [{"case": case, **r} for case, r in cases]
        base = cases[0][1]["rate"]
        ratios[f"replicas_{n}_vs_1_{strategy}"] = cases[1][1]["rate"] / base
        for side in ("engine", "server"):  # CPU per reservation, n x per against 1 x all
            key = f"{side}_cpu_s_per_1000"
            ratios[f"replicas_{n}_vs_1_{side}_cpu_{strategy}"] = cases[1][1][key] / cases[0][1][key]
        ratios[f"replicas_{n}_no_linger_vs_1_{strategy}"] = cases[6][1]["rate"] / base
        ratios[f"replicas_{n}_linger_vs_no_linger_{strategy}"] = (
            cases[1][1]["rate"] / cases[6][1]["rate"]
        )
        ratios[f"replicas_{n}_own_skus_vs_1_{strategy}"] = cases[2][1]["rate"] / base
        ratios[f"one_process_{n}_skus_vs_1_{strategy}"] = cases[3][1]["rate"] / base
        ratios[f"replicas_{n}_slots_vs_1_{strategy}"] = cases[4][1]["rate"] / base
        ratios[f"replicas_{n}_slots_vs_{n}_shared_{strategy}"] = (
            cases[4][1]["rate"] / cases[1][1]["rate"]
        )
        ratios[f"one_process_{n}_slots_vs_1_{strategy}"] = cases[5][1]["rate"] / base
        # the same SKU and slots, all clients in one process: the stricter baseline
        ratios[f"replicas_{n}_slots_vs_1_slotted_{strategy}"] = (
            cases[4][1]["rate"] / cases[5][1]["rate"]
        )
        if strategy == "auto":  # no set_slots call, against the same case on set_slots(n)
            ratios[f"auto_unslotted_vs_set_slots_1x{args.clients}"] = base / cases[5][1]["rate"]
            ratios[f"auto_unslotted_vs_set_slots_{n}x{per}"] = (
                cases[1][1]["rate"] / cases[4][1]["rate"]
            )
    table(
        f"5. one hot SKU, {args.clients} C++ clients in 1 process and in {args.replicas}",
        replicas,
        atomic or None,
        args.bound,
    )
    for r in replicas:
        if "batch_size_mean" in r:
            lingered = r.get("lingered_share")
            print(
                f"- {r['case']}: batches of {r['batch_size_mean']:.1f} requests on average"
                + ("" if lingered is None else f", {lingered:.0%} of them lingered")
                + (f"; the SKU ended on {r['slots_after']} rows" if "slots_after" in r else "")
            )
    if args.bound:
        ratios["best_of_bound"] = max(r["rate"] for r in replicas) / args.bound
    print(
        "\nCPU seconds per 1,000 reservations, over the load alone (engine: the processes"
        " of the C++ clients and their engines; server: every PostgreSQL process, from"
        " /proc):\n"
    )
    for r in replicas:
        print(
            f"- {r['case']}: engine {r['engine_cpu_s_per_1000']:.3f} s, server "
            f"{r['server_cpu_s_per_1000']:.3f} s"
        )
    report["hot_replicas"] = replicas


def sold_out_section(
    eng: stockade.Engine,
    pg_sql: Any,
    args: argparse.Namespace,
    report: Dict[str, Any],
    ratios: Dict[str, float],
) -> None:
    rows = []
    for strategy in ["batched", "atomic"]:
        for slots in [1, args.replicas]:
            sku = f"sold-out-{strategy}-{slots}"
            eng.restock(sku, 1)
            if slots > 1:
                eng.set_slots(sku, slots)
            eng.reserve(sku, 1)
            pg_sql("CHECKPOINT")
            r = c_load(eng, [sku], strategy, args.clients, 1, args.seconds)
            r["rate"] = r["refused"] / r["seconds"]
            where = "a plain row" if slots == 1 else f"{slots} slots"
            rows.append({"case": f"{strategy}, sold out, {where}", **r})
        ratios[f"sold_out_{args.replicas}_slots_vs_plain_{strategy}"] = (
            rows[-1]["rate"] / rows[-2]["rate"]
        )
    print(f"\n### 6. a sold-out SKU, {args.clients} C++ clients, blocking calls\n")
    print("| case | refusals/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['case']} | {r['rate']:,.0f} | {r['p50_us'] / 1000:.2f} | "
            f"{r['p99_us'] / 1000:.2f} |"
        )
    report["sold_out"] = rows


def small_replicas_section(
    eng: stockade.Engine,
    args: argparse.Namespace,
    dsn: str,
    fresh_sku: Any,
    report: Dict[str, Any],
    ratios: Dict[str, float],
) -> None:
    """Many processes with few clients each on one row: none of them sees 4 requests in
    flight, so auto must learn the row's heat from its version (the other processes'
    writes) to batch it; with one client each, batching has nothing to fold, and auto
    should stay atomic."""
    n = args.small_replicas
    rows = []
    for per in [2, 1]:
        strategies = ["atomic", "auto", "batched"] if per == 2 else ["atomic", "auto"]
        rates: Dict[str, float] = {}
        for strategy in strategies:
            sku = fresh_sku(eng, f"hot-small-{n}x{per}-{strategy}")
            r = replicas_load(dsn, args.postmaster, [sku] * n, strategy, n * per, args.seconds)
            rates[strategy] = r["rate"]
            rows.append({"case": f"{strategy}, {n} x {per} clients", **r})
        ratios[f"small_replicas_{n}x{per}_auto_vs_atomic"] = rates["auto"] / rates["atomic"]
        if "batched" in rates:
            ratios[f"small_replicas_{n}x{per}_batched_vs_atomic"] = (
                rates["batched"] / rates["atomic"]
            )
    table(f"7. one hot SKU, {n} processes with 2 and with 1 C++ clients each", rows)
    for r in rows:
        print(
            f"- {r['case']}: {r['batched_share']:.0%} of requests batched, "
            f"batches of {r['batch_size_mean']:.1f}"
        )
    report["hot_small_replicas"] = rows


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per case")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument(
        "--asyncio-tasks", type=int, default=1024, help="the second asyncio case: this many tasks"
    )
    parser.add_argument("--cold-skus", type=int, default=10_000)
    parser.add_argument(
        "--replicas", type=int, default=4, help="section 5: processes sharing the clients"
    )
    parser.add_argument(
        "--small-replicas", type=int, default=16, help="section 7: processes of 2 and 1 clients"
    )
    parser.add_argument(
        "--flush-delay-us",
        type=int,
        default=0,
        help="a slow flush: every WAL flush waits this long first (commit_delay with"
        " commit_siblings=0), as on a network disk or with a synchronous standby",
    )
    parser.add_argument(
        "--sections", default="0,1,2,3,4,5,6,7", help="which sections to run (1-3 run together)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    try:
        settings = slow_flush_settings(args.flush_delay_us)
    except ValueError as exc:
        parser.error(str(exc))
    flush = (
        f"; a slow flush: commit_delay = {args.flush_delay_us} us with commit_siblings = 0"
        if settings
        else "; the machine's own disk"
    )
    print(
        f"# stockade hot-SKU benchmark: {args.clients} clients, {args.seconds:g} s per case, "
        "fsync and synchronous_commit on" + flush
    )
    with TemporaryPostgres(settings=settings) as pg:
        dsn = pg.dsn()
        args.postmaster = pg.pid
        with stockade.Engine.postgres(dsn, pool_size=args.clients) as eng:
            eng.migrate()
            report = run(eng, lambda sql: pg.sql(sql), args, dsn)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
