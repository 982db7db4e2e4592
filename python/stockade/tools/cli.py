"""The ``stockade`` command line.

``stockade bench`` puts the strategies side by side (``--peers``: next to pgbench running
their plain SQL, and Redis when installed) and writes a markdown table, JSON and a PNG.
``stockade migrate --dsn`` creates or upgrades the schema. ``stockade advise`` asks the
Claim Test's three questions and names the strategy that fits. ``stockade demo`` runs a
flash sale against every strategy side by side and prints what
each granted, refused and oversold, with throughput, latency, retries and lock waits, next
to the naive read-modify-write canary that shows what the strategies prevent. By default
it runs on a throwaway local PostgreSQL server (fsync on); ``--dsn`` runs it on a server
of yours (in the schema ``stockade_demo``), ``--backend memory`` on the embedded store.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator, List, Literal, Optional, Sequence, Union

from .. import __version__
from ..claim import claim_test
from ..engine import Engine
from ..env import dsn_from_environment
from ..errors import StockadeError
from ..values import Strategy
from . import bench as benchmod
from .loadgen import NAIVE, FlashSaleReport, flash_sale
from .pgserver import TemporaryPostgres, run_sql

STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]

DSN_HELP = (
    "a PostgreSQL server of yours (libpq connection string); default: $STOCKADE_DSN, else "
    "libpq's PG* variables when one of them is set"
)


def _table(reports: List[FlashSaleReport]) -> str:
    head = (
        f"{'strategy':<14}{'granted':>9}{'refused':>9}{'failed':>8}{'oversold':>10}"
        f"{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'retries':>9}{'lock waits':>12}"
    )
    lines = [head, "-" * len(head)]
    for r in reports:
        lines.append(
            f"{r.strategy:<14}{r.granted:>9,}{r.refused:>9,}{r.failed:>8,}{r.oversold:>10,}"
            f"{r.throughput:>10,.0f}{r.percentile_us(0.5) / 1000:>9.2f}"
            f"{r.percentile_us(0.99) / 1000:>9.2f}{r.retried:>9,}{r.lock_waits:>12,}"
        )
    return "\n".join(lines)


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[tuple[Engine, str]]:
    """The engine the demo runs on, and a description of where it runs."""
    if args.backend == "memory":
        with Engine.memory() as engine:
            yield engine, "the embedded memory store"
        return
    pool = max(1, min(args.clients, 32))
    if args.dsn is not None:
        with Engine.postgres(args.dsn, schema="stockade_demo", pool_size=pool) as engine:
            engine.migrate()
            yield engine, "PostgreSQL (--dsn or the environment), schema stockade_demo"
        return
    print("starting a throwaway PostgreSQL server (initdb, fsync on) ...", flush=True)
    with TemporaryPostgres() as server:
        with Engine.postgres(server.dsn(), pool_size=pool) as engine:
            engine.migrate()
            yield (
                engine,
                (
                    f"a throwaway PostgreSQL at {server.host}:{server.port} "
                    f"(fsync on), pool of {pool} connections"
                ),
            )


def demo(args: argparse.Namespace) -> int:
    if args.dsn_given and args.backend == "memory":
        print("stockade demo: --dsn needs --backend postgres", file=sys.stderr)
        return 2
    try:
        with _engine(args) as (engine, where):
            print(
                f"stockade {__version__} flash sale on {where}: {args.buyers:,} buyers, "
                f"{args.units:,} units of one SKU, {args.clients} client threads, one unit "
                "per buyer\n",
                flush=True,
            )
            reports = []
            choices: List[Union[Strategy, Literal["naive-unsafe"]]] = [
                *(Strategy(s) for s in STRATEGIES),
                NAIVE,
            ]
            for choice in choices:
                reports.append(
                    flash_sale(
                        engine,
                        buyers=args.buyers,
                        units=args.units,
                        strategy=choice,
                        clients=args.clients,
                        check=False,
                    )
                )
    except StockadeError as exc:
        print(f"stockade demo: {exc}", file=sys.stderr)
        return 2
    print(_table(reports))
    print(
        f"\n{NAIVE} is the canary: read, then write back a value computed from the stale "
        "read.\nIt loses updates and sells units that do not exist; every real strategy "
        "must show oversold 0."
    )
    broken = [
        r.strategy for r in reports[:-1] if r.oversold or r.granted != min(args.units, args.buyers)
    ]
    if broken:
        print(
            f"\nERROR: {', '.join(broken)} did not grant exactly the units there were",
            file=sys.stderr,
        )
        return 1
    return 0


# --- bench ---


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
    with TemporaryPostgres() as server:
        with Engine.postgres(server.dsn(), pool_size=args.clients) as engine:
            engine.migrate()
            yield engine, server.dsn(), "a throwaway PostgreSQL (fsync on)"


def _restocker(engine: Engine, dsn: Optional[str], schema: str) -> Callable[[List[str]], None]:
    def restock(names: List[str]) -> None:
        if dsn is None or len(names) < 50:
            for name in names:
                engine.restock(name, benchmod.UNITS)
            return
        values = ", ".join(f"('{n}', 'default', {benchmod.UNITS})" for n in names)
        run_sql(dsn, f"INSERT INTO {schema}.stock (sku, location, on_hand) VALUES {values}")

    return restock


def bench(args: argparse.Namespace) -> int:
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if args.peers and args.backend == "memory":
        print("stockade bench: --peers needs PostgreSQL (drop --backend memory)", file=sys.stderr)
        return 2
    if args.skus < 1 or args.clients < 1 or args.seconds <= 0:
        print("stockade bench: --skus, --clients and --seconds must be positive", file=sys.stderr)
        return 2
    redis = args.peers and benchmod.redis_available()
    steps = (
        len(strategies)
        + (len(benchmod.PGBENCH_STRATEGIES) if args.peers else 0)
        + (2 if redis else 0)
    )
    cases: List[benchmod.BenchCase] = []
    try:
        with _bench_target(args) as (engine, dsn, where):
            schema = "stockade_bench" if args.dsn is not None else "stockade"
            title = (
                f"{args.skus:,} SKU(s), {args.clients} clients, {args.seconds:g} s per case, "
                f"on {where}"
            )
            print(f"stockade {__version__} bench: {title}", flush=True)
            progress = benchmod.Progress(steps)
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
                cases += _peers(dsn, schema, args, progress, redis)
            progress.finish()
    except (StockadeError, RuntimeError) as exc:  # RuntimeError: a peer tool failed
        print(f"stockade bench: {exc}", file=sys.stderr)
        return 2
    meta = {"skus": args.skus, "clients": args.clients, "seconds": args.seconds}
    written = benchmod.write_reports(cases, Path(args.out), title, meta)
    print()
    print(benchmod.markdown(cases, title))
    if args.peers and not redis:
        print("(Redis: not measured; install redis-server and redis-tools to add it)")
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _peers(
    dsn: str, schema: str, args: argparse.Namespace, progress: benchmod.Progress, redis: bool
) -> List[benchmod.BenchCase]:
    cases = []
    for strategy in benchmod.PGBENCH_STRATEGIES:
        progress.step(f"pgbench {strategy}")
        cases.append(
            benchmod.run_pgbench(
                dsn, schema, strategy, skus=args.skus, clients=args.clients, seconds=args.seconds
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


# --- migrate and advise ---


def migrate(args: argparse.Namespace) -> int:
    try:
        with Engine.postgres(args.dsn, schema=args.schema, pool_size=1) as engine:
            applied = engine.migrate()
    except StockadeError as exc:
        print(f"stockade migrate: {exc}", file=sys.stderr)
        return 2
    if applied:
        print(f"applied to schema {args.schema}: " + ", ".join(applied))
    else:
        print(f"schema {args.schema} is up to date")
    return 0


def _ask(question: str, answer: Optional[str], choices: Sequence[str]) -> str:
    """The answer given on the command line, or one read from stdin."""
    while answer is None or answer not in choices:
        if answer is not None:
            print(f"  please answer one of: {', '.join(choices)}")
        try:
            answer = input(f"{question} [{'/'.join(choices)}] ").strip().lower()
        except (EOFError, OSError, RuntimeError, ValueError):
            # EOF, a closed or missing stdin (input() raises RuntimeError without one)
            raise SystemExit("stockade advise: no answer (stdin closed)") from None
    return answer


def advise(args: argparse.Namespace) -> int:
    print("The Claim Test: which answer to the lost update fits this write?\n")
    zero = _ask(
        "0. Can one conditional statement (or a constraint) do the whole write?",
        args.single_statement,
        ["yes", "no"],
    )
    fits, rate, retry = "yes", 0.0, "safe"
    if zero == "no":
        fits = _ask(
            "1. Hold: does the read-to-write window fit in one short transaction?",
            args.fits_in_transaction,
            ["yes", "no"],
        )
    if zero == "no" and fits == "yes":
        rate_text = args.conflict_rate
        while True:
            rate_text = (
                rate_text
                if rate_text is not None
                else input(
                    "2. Odds: what fraction of writes to one row collide (0 to 1; "
                    "engine.recommend(sku) measures it)? "
                ).strip()
            )
            try:
                rate = float(rate_text)
                if 0.0 <= rate <= 1.0:
                    break
            except ValueError:
                pass
            print("  please answer a number between 0 and 1")
            rate_text = None
        retry = _ask(
            "3. Cost: is losing the race safe and cheap to redo?",
            args.retry,
            ["safe", "cheap", "unsafe", "expensive"],
        )
    advice = claim_test(
        fits_in_transaction=fits == "yes",
        conflict_rate=rate,
        retry=retry,
        single_statement=zero == "yes",
    )
    print(f"\n=> {advice.strategy.value}")
    for reason in advice.reasons:
        print(f"   - {reason}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--version", action="version", version=f"stockade {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="flash sale: every strategy side by side, and the canary")
    d.add_argument(
        "--backend",
        choices=["memory", "postgres"],
        default="postgres",
        help="postgres (default: a throwaway local server unless --dsn) or memory",
    )
    d.add_argument("--dsn", help=DSN_HELP)
    d.add_argument("--buyers", type=int, default=10_000)
    d.add_argument("--units", type=int, default=1_000)
    d.add_argument("--clients", type=int, default=64)
    d.set_defaults(run=demo)

    b = sub.add_parser("bench", help="strategies side by side (--peers: and pgbench, Redis)")
    b.add_argument("--backend", choices=["memory", "postgres"], default="postgres")
    b.add_argument("--dsn", help=DSN_HELP + " (schema stockade_bench)")
    b.add_argument("--skus", type=int, default=1, help="1: one hot SKU; more: uniform load")
    b.add_argument("--clients", type=int, default=64)
    b.add_argument("--seconds", type=float, default=3.0, help="per case")
    b.add_argument("--strategies", default=",".join(STRATEGIES))
    b.add_argument(
        "--peers",
        action="store_true",
        help="also pgbench running each classic strategy's SQL, and Redis if installed",
    )
    b.add_argument("--out", default="stockade-bench", help="where bench.md/.json/.png go")
    b.set_defaults(run=bench)

    m = sub.add_parser("migrate", help="create or upgrade the schema on a server")
    m.add_argument("--dsn", help=DSN_HELP)
    m.add_argument("--schema", default="stockade")
    m.set_defaults(run=migrate)

    a = sub.add_parser("advise", help="the Claim Test: three questions, one strategy")
    a.add_argument("--single-statement", choices=["yes", "no"])
    a.add_argument("--fits-in-transaction", choices=["yes", "no"])
    a.add_argument("--conflict-rate")
    a.add_argument("--retry", choices=["safe", "cheap", "unsafe", "expensive"])
    a.set_defaults(run=advise)
    args = parser.parse_args(argv)
    if "dsn" in args:
        args.dsn_given = args.dsn
        args.dsn = dsn_from_environment(args.dsn)
    if args.command == "migrate" and args.dsn is None:
        parser.error("migrate needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
