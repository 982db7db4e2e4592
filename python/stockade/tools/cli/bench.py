"""``stockade bench``: the strategies side by side (``--peers``: next to pgbench and Redis)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

from ... import __version__
from ...engine import Engine
from .. import bench as benchmod
from ..pgserver import TemporaryPostgres, run_sql
from ._common import (
    DSN_HELP,
    STRATEGIES,
    Commands,
    Failed,
    backend_option,
    number,
    say,
    usage_error,
)

# Bounds of a run: SKUs it restocks, client threads, seconds per case.
SKUS_MAX = 1_000_000
CLIENTS_MAX = 1024
SECONDS_MAX = 3600.0


@contextlib.contextmanager
def _bench_target(args: argparse.Namespace) -> Iterator[tuple[Engine, Optional[str], str]]:
    """The engine to bench, the DSN peers run against (None on memory), and a description."""
    if args.backend == "memory":
        with Engine.memory() as engine:
            yield engine, None, "the embedded memory store"
        return
    if args.dsn is not None:
        with Engine.postgres(args.dsn, schema="stockade_bench", pool_size=args.clients) as eng:
            eng.migrate()
            yield eng, args.dsn, "PostgreSQL (--dsn or the environment), schema stockade_bench"
        return
    print(
        "starting a throwaway PostgreSQL server (initdb, fsync on) ...", file=sys.stderr, flush=True
    )
    flush = (
        f", each WAL flush delayed {args.flush_delay_us} us (commit_delay, commit_siblings=0)"
        if args.flush_delay_us
        else ""
    )
    with TemporaryPostgres(settings=benchmod.slow_flush_settings(args.flush_delay_us)) as server:
        with Engine.postgres(server.dsn(), pool_size=args.clients) as engine:
            engine.migrate()
            yield engine, server.dsn(), f"a throwaway PostgreSQL (fsync on{flush})"


def _restocker(engine: Engine, dsn: Optional[str], schema: str) -> Callable[[List[str]], None]:
    def restock(names: List[str]) -> None:
        if dsn is None or len(names) < 50:
            for name in names:
                engine.restock(name, benchmod.UNITS)
            return
        values = ", ".join(f"('{n}', 'default', {benchmod.UNITS})" for n in names)
        run_sql(dsn, f"INSERT INTO {schema}.stock (sku, location, on_hand) VALUES {values}")

    return restock


def _bench_refusal(args: argparse.Namespace) -> Optional[str]:
    """Why bench cannot run with these options, or None."""
    if args.peers and args.backend == "memory":
        return "--peers needs PostgreSQL (drop --backend memory)"
    if args.flush_delay_us and (args.backend == "memory" or args.dsn is not None):
        return (
            "--flush-delay-us sets up the throwaway server; it does not combine with a DSN"
            " (--dsn or the environment) or --backend memory"
        )
    return None


def _ceiling_line(ceiling: benchmod.Ceiling, clients: int, best: float) -> str:
    bound = ceiling.bound(clients)
    return (
        f"The server's ceiling (pgbench, a {ceiling.batch}-row batch transaction): "
        f"{ceiling.one_row_tps * ceiling.batch:,.0f} rows/s on one row, "
        f"{ceiling.rows_tps * ceiling.batch:,.0f} on {ceiling.rows}; a row stays locked "
        f"{ceiling.commit_latency_ms:.2f} ms per transaction, so {clients} blocking "
        f"clients reach at most {bound:,.0f} reservations/s (Little's law). Best case: "
        f"{best / bound:.2f} of it."
    )


def _bench_meta(
    args: argparse.Namespace, server_version: Optional[str], ceiling: Optional[benchmod.Ceiling]
) -> Dict[str, object]:
    """What bench.json records beside the cases."""
    return {
        "skus": args.skus,
        "clients": args.clients,
        "seconds": args.seconds,
        "stockade_version": __version__,
        "postgres_version": server_version,
        "flush_delay_us": args.flush_delay_us,
        "ceiling": ceiling.as_dict(args.clients) if ceiling else None,
        "timestamp": datetime.now(timezone.utc).isoformat(),
    }


def bench(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    refusal = _bench_refusal(args)
    if refusal is not None:
        usage_error(args, refusal)
    redis = args.peers and benchmod.redis_available()
    steps = (
        len(strategies)
        + (len(benchmod.PGBENCH_STRATEGIES) if args.peers else 0)
        + (2 if redis else 0)
        + (1 if args.flush_delay_us else 0)
    )
    cases: List[benchmod.BenchCase] = []
    server_version: Optional[str] = None
    ceiling: Optional[benchmod.Ceiling] = None
    try:
        with _bench_target(args) as (engine, dsn, where):
            if dsn is not None:
                server_version = run_sql(dsn, "SHOW server_version")
            schema = "stockade_bench" if args.dsn is not None else "stockade"
            title = (
                f"{args.skus:,} SKU(s), {args.clients} clients, {args.seconds:g} s per case, "
                f"on {where}"
            )
            print(f"stockade {__version__} bench: {title}", file=say(args), flush=True)
            progress = benchmod.Progress(steps)
            if args.flush_delay_us and dsn is not None:
                progress.step("the server's ceiling (pgbench)")
                ceiling = benchmod.run_ceiling(dsn, schema, rows=4, seconds=args.seconds)
            restock = _restocker(engine, dsn, schema)
            for strategy in strategies:
                progress.step(f"stockade {strategy}")
                cases.append(
                    benchmod.run_stockade(
                        engine,
                        strategy,
                        skus=args.skus,
                        clients=args.clients,
                        seconds=args.seconds,
                        restock=restock,
                    )
                )
            if args.peers and dsn is not None:
                pooled = engine.stats()["pool"]["pooled"]
                cases += _peers(dsn, schema, args, progress, redis, pooled)
            progress.finish()
    except RuntimeError as exc:  # a peer tool failed (a StockadeError goes to main)
        raise Failed(str(exc)) from exc
    meta = _bench_meta(args, server_version, ceiling)
    written = benchmod.write_reports(cases, Path(args.out), title, meta)
    if args.json:
        print(written[1].read_text())
        return 0
    print()
    print(benchmod.markdown(cases, title))
    if ceiling is not None:
        print(_ceiling_line(ceiling, args.clients, max(c.rate for c in cases)))
    if args.peers and not redis:
        print("(Redis: not measured; install redis-server and redis-tools to add it)")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _peers(
    dsn: str,
    schema: str,
    args: argparse.Namespace,
    progress: benchmod.Progress,
    redis: bool,
    pooled: bool,
) -> List[benchmod.BenchCase]:
    cases = []
    for strategy in benchmod.PGBENCH_STRATEGIES:
        progress.step(f"pgbench {strategy}")
        cases.append(
            benchmod.run_pgbench(
                dsn,
                schema,
                strategy,
                skus=args.skus,
                clients=args.clients,
                seconds=args.seconds,
                prepared=not pooled,  # a transaction-mode pooler keeps no prepared statements
            )
        )
    if redis:
        # redis-benchmark takes a request count, not a duration: about --seconds of work at
        # the 40,000-70,000 reservations/s Redis reaches here.
        requests = max(1000, int(args.seconds * 40_000))
        for fsync in ("always", "everysec"):
            progress.step(f"redis appendfsync {fsync}")
            cases.append(
                benchmod.run_redis(fsync, skus=args.skus, clients=args.clients, requests=requests)
            )
    return cases


def add(commands: Commands) -> None:
    b = commands.command(
        "bench",
        "strategies side by side (--peers: and pgbench, Redis)",
        "Measures reservations per second of each strategy for --seconds each, and writes "
        "bench.md, bench.json (with the stockade and PostgreSQL versions and a timestamp) "
        "and bench.png to --out.",
    )
    backend_option(b)
    b.add_argument("--dsn", help=DSN_HELP + " (schema stockade_bench)")
    b.add_argument(
        "--skus",
        type=number(int, 1, SKUS_MAX),
        default=1,
        help="1: one hot SKU; more: uniform load",
    )
    b.add_argument("--clients", type=number(int, 1, CLIENTS_MAX), default=64, help="client threads")
    b.add_argument("--seconds", type=number(float, 0.01, SECONDS_MAX), default=3.0, help="per case")
    b.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    b.add_argument(
        "--peers",
        action="store_true",
        help="also pgbench running each classic strategy's SQL, and Redis if installed",
    )
    b.add_argument(
        "--flush-delay-us",
        type=number(int, 0, benchmod.FLUSH_DELAY_MAX_US),
        default=0,
        help="the throwaway server's WAL flushes each wait this long first (commit_delay with"
        " commit_siblings=0: a network disk or a synchronous standby), and the run measures"
        " the server's ceiling with pgbench",
    )
    b.add_argument("--out", default="stockade-bench", help="where bench.md/.json/.png go")
    b.set_defaults(run=bench)
