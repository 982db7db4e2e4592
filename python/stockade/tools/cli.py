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
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Literal, Optional, Sequence, TextIO, Union

from .. import __version__
from ..claim import claim_test
from ..engine import Engine
from ..env import dsn_from_environment
from ..errors import StockadeError
from ..grants import runtime_grants
from ..values import Strategy
from . import bench as benchmod
from .loadgen import NAIVE, FlashSaleReport, flash_sale
from .pgserver import TemporaryPostgres, run_sql

STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]

DSN_HELP = (
    "a PostgreSQL server of yours (libpq connection string); default: $STOCKADE_DSN, else "
    "libpq's PG* variables when one of them is set"
)


def _say(args: argparse.Namespace) -> TextIO:
    """Where progress and prose go: stdout, or stderr when --json keeps stdout for JSON."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def _emit_json(document: Dict[str, Any]) -> None:
    print(json.dumps(document, indent=2, default=str))


def _report_dict(r: FlashSaleReport) -> Dict[str, Any]:
    return {
        "strategy": r.strategy,
        "granted": r.granted,
        "refused": r.refused,
        "failed": r.failed,
        "oversold": r.oversold,
        "requests_per_s": r.throughput,
        "p50_ms": r.percentile_us(0.5) / 1000,
        "p99_ms": r.percentile_us(0.99) / 1000,
        "retries": r.retried,
        "lock_waits": r.lock_waits,
    }


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


DEMO_SCHEMA = "stockade_demo"


@contextlib.contextmanager
def _engine(args: argparse.Namespace) -> Iterator[tuple[Engine, str]]:
    """The engine the demo runs on, and a description of where it runs. On a server of
    yours (--dsn) the demo works in the schema stockade_demo and drops it afterwards if it
    made it, unless --keep."""
    if args.backend == "memory":
        with Engine.memory() as engine:
            yield engine, "the embedded memory store"
        return
    pool = max(1, min(args.clients, 32))
    if args.dsn is not None:
        with Engine.postgres(args.dsn, schema=DEMO_SCHEMA, pool_size=pool) as engine:
            plan = engine.migration_plan()
            made = bool(plan) and plan[0][0] == "(create schema)"  # not there before
            engine.migrate()
            try:
                yield engine, f"PostgreSQL (--dsn or the environment), schema {DEMO_SCHEMA}"
            finally:
                if made and not args.keep:
                    engine.drop_schema(confirm=DEMO_SCHEMA)
                    print(
                        f"dropped the schema {DEMO_SCHEMA} the demo made (--keep keeps it)",
                        file=_say(args),
                    )
                elif not made:
                    print(
                        f"left the schema {DEMO_SCHEMA} in place: it was there before",
                        file=_say(args),
                    )
        return
    say = _say(args)
    print("starting a throwaway PostgreSQL server (initdb, fsync on) ...", file=say, flush=True)
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
                file=_say(args),
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
    broken = [
        r.strategy for r in reports[:-1] if r.oversold or r.granted != min(args.units, args.buyers)
    ]
    if args.json:
        _emit_json(
            {
                "stockade_version": __version__,
                "timestamp": datetime.now(timezone.utc).isoformat(),
                "where": where,
                "buyers": args.buyers,
                "units": args.units,
                "clients": args.clients,
                "strategies": [_report_dict(r) for r in reports],
                "exact": not broken,
            }
        )
    else:
        print(_table(reports))
        print(
            f"\n{NAIVE} is the canary: read, then write back a value computed from the stale "
            "read.\nIt loses updates and sells units that do not exist; every real strategy "
            "must show oversold 0."
        )
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
    if args.skus < 1 or args.clients < 1 or args.seconds <= 0:
        return "--skus, --clients and --seconds must be positive"
    if args.flush_delay_us and (args.backend == "memory" or args.dsn is not None):
        return (
            "--flush-delay-us sets up the throwaway server; it does not combine with a DSN"
            " (--dsn or the environment) or --backend memory"
        )
    if not 0 <= args.flush_delay_us <= benchmod.FLUSH_DELAY_MAX_US:
        return f"--flush-delay-us is 0 to {benchmod.FLUSH_DELAY_MAX_US}"
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
        print(f"stockade bench: {refusal}", file=sys.stderr)
        return 2
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
            print(f"stockade {__version__} bench: {title}", file=_say(args), flush=True)
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
    except (StockadeError, RuntimeError) as exc:  # RuntimeError: a peer tool failed
        print(f"stockade bench: {exc}", file=sys.stderr)
        return 2
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


# --- migrate and advise ---


def migrate(args: argparse.Namespace) -> int:
    if args.print_grants is not None:  # no connection: the statements for the owner to run
        try:
            grants = runtime_grants(args.print_grants, schema=args.schema, owner=args.owner)
        except StockadeError as exc:
            print(f"stockade migrate: {exc}", file=sys.stderr)
            return 2
        print(f"-- run as the owner of schema {args.schema}, after migrating")
        print("\n".join(grants))
        return 0
    try:
        with Engine.postgres(
            args.dsn, schema=args.schema, pool_size=1, layout=args.layout
        ) as engine:
            if args.dry_run:
                plan = engine.migration_plan(to=args.to)
            else:
                applied = engine.migrate(to=args.to)
    except StockadeError as exc:
        print(f"stockade migrate: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        if args.json:
            _emit_json(
                {"schema": args.schema, "plan": [{"name": n, "sql": sql} for n, sql in plan]}
            )
        elif not plan:
            print(f"-- schema {args.schema} is up to date: nothing would run")
        else:
            for name, sql in plan:
                print(f"-- {name}\n{sql.strip()}\n")
        return 0
    if args.json:
        _emit_json({"schema": args.schema, "applied": applied})
    elif applied:
        print(f"applied to schema {args.schema}: " + ", ".join(applied))
    else:
        print(f"schema {args.schema} is up to date")
    return 0


def _ask(
    question: str, answer: Optional[str], choices: Sequence[str], out: TextIO = sys.stdout
) -> str:
    """The answer given on the command line, or one read from stdin (prompts to `out`)."""
    while answer is None or answer not in choices:
        if answer is not None:
            print(f"  please answer one of: {', '.join(choices)}", file=out)
        try:
            print(f"{question} [{'/'.join(choices)}] ", end="", file=out, flush=True)
            answer = input().strip().lower()
        except (EOFError, OSError, RuntimeError, ValueError):
            # EOF, a closed or missing stdin (input() raises RuntimeError without one)
            raise SystemExit("stockade advise: no answer (stdin closed)") from None
    return answer


def advise(args: argparse.Namespace) -> int:
    out = _say(args)
    print("The Claim Test: which answer to the lost update fits this write?\n", file=out)
    zero = _ask(
        "0. Can one conditional statement (or a constraint) do the whole write?",
        args.single_statement,
        ["yes", "no"],
        out,
    )
    fits, rate, retry = "yes", 0.0, "safe"
    if zero == "no":
        fits = _ask(
            "1. Hold: does the read-to-write window fit in one short transaction?",
            args.fits_in_transaction,
            ["yes", "no"],
            out,
        )
    if zero == "no" and fits == "yes":
        rate_text = args.conflict_rate
        while True:
            if rate_text is None:
                print(
                    "2. Odds: what fraction of writes to one row collide (0 to 1; "
                    "engine.recommend(sku) measures it)? ",
                    end="",
                    file=out,
                    flush=True,
                )
                try:
                    rate_text = input().strip()
                except (EOFError, OSError, RuntimeError, ValueError):
                    raise SystemExit("stockade advise: no answer (stdin closed)") from None
            try:
                rate = float(rate_text)
                if 0.0 <= rate <= 1.0:
                    break
            except ValueError:
                pass
            print("  please answer a number between 0 and 1", file=out)
            rate_text = None
        retry = _ask(
            "3. Cost: is losing the race safe and cheap to redo?",
            args.retry,
            ["safe", "cheap", "unsafe", "expensive"],
            out,
        )
    advice = claim_test(
        fits_in_transaction=fits == "yes",
        conflict_rate=rate,
        retry=retry,
        single_statement=zero == "yes",
    )
    if args.json:
        _emit_json({"strategy": advice.strategy.value, "reasons": list(advice.reasons)})
        return 0
    print(f"\n=> {advice.strategy.value}")
    for reason in advice.reasons:
        print(f"   - {reason}")
    return 0


def audit(args: argparse.Namespace) -> int:
    try:
        with Engine.postgres(
            args.dsn, schema=args.schema, layout=args.layout, pool_size=1
        ) as engine:
            report = engine.audit(sku=args.sku, limit=args.limit, expiry_lag=args.expiry_lag)
    except StockadeError as exc:
        print(f"stockade audit: {exc}", file=sys.stderr)
        return 2
    if args.json:
        _emit_json({"schema": args.schema, **report.to_dict()})
    else:
        for v in report.violations:
            slot = f" slot {v.slot}" if v.slot else ""
            where = f" {v.sku}@{v.location}{slot}" if v.sku else ""
            subject = f" {v.subject}" if v.subject else ""
            print(f"{v.check}:{where}{subject}: expected {v.expected}, found {v.found}")
        more = " (and more: raise --limit)" if report.truncated else ""
        journal = "" if report.journal_checked else "; the journal is off, not checked"
        print(
            f"audited {report.rows} rows, {report.reservations} reservations and "
            f"{report.movements} journal entries in {report.seconds:.2f} s: "
            f"{len(report.violations)} violations{more}{journal}"
        )
    return 0 if report.ok else 1


class _Commands:
    """The subcommands' parsers, each with ``--json`` and its defaults in ``--help``."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(self, name: str, summary: str, description: str) -> argparse.ArgumentParser:
        p = self.sub.add_parser(
            name,
            help=summary,
            description=description,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
        p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
        return p


def _backend_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=["memory", "postgres"],
        default="postgres",
        help="postgres (a throwaway local server unless --dsn) or the embedded memory store",
    )


def _add_demo(commands: _Commands) -> None:
    d = commands.command(
        "demo",
        "flash sale: every strategy side by side, and the canary",
        "Runs a flash sale against every strategy side by side, next to the naive "
        "read-modify-write canary, and prints what each granted, refused and oversold, "
        "with throughput, latency, retries and lock waits. Exits 1 if a strategy did not "
        "grant exactly the units there were.",
    )
    _backend_option(d)
    d.add_argument("--dsn", help=DSN_HELP + f" (schema {DEMO_SCHEMA})")
    d.add_argument(
        "--keep",
        action="store_true",
        help=f"with --dsn: keep the schema {DEMO_SCHEMA} the demo made (default: drop it)",
    )
    d.add_argument("--buyers", type=int, default=10_000, help="buyers, one unit each")
    d.add_argument("--units", type=int, default=1_000, help="units of the one SKU")
    d.add_argument("--clients", type=int, default=64, help="client threads")
    d.set_defaults(run=demo)


def _add_bench(commands: _Commands) -> None:
    b = commands.command(
        "bench",
        "strategies side by side (--peers: and pgbench, Redis)",
        "Measures reservations per second of each strategy for --seconds each, and writes "
        "bench.md, bench.json (with the stockade and PostgreSQL versions and a timestamp) "
        "and bench.png to --out.",
    )
    _backend_option(b)
    b.add_argument("--dsn", help=DSN_HELP + " (schema stockade_bench)")
    b.add_argument("--skus", type=int, default=1, help="1: one hot SKU; more: uniform load")
    b.add_argument("--clients", type=int, default=64, help="client threads")
    b.add_argument("--seconds", type=float, default=3.0, help="per case")
    b.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated")
    b.add_argument(
        "--peers",
        action="store_true",
        help="also pgbench running each classic strategy's SQL, and Redis if installed",
    )
    b.add_argument(
        "--flush-delay-us",
        type=int,
        default=0,
        help="the throwaway server's WAL flushes each wait this long first (commit_delay with"
        " commit_siblings=0: a network disk or a synchronous standby), and the run measures"
        " the server's ceiling with pgbench",
    )
    b.add_argument("--out", default="stockade-bench", help="where bench.md/.json/.png go")
    b.set_defaults(run=bench)


def _add_layout(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--layout", choices=["plain", "citus"], default="plain", help=text)


def _add_migrate(commands: _Commands) -> None:
    m = commands.command(
        "migrate",
        "create or upgrade the schema on a server",
        "Applies the migrations the schema lacks, under an advisory lock (safe from "
        "several processes at once). --dry-run prints the SQL instead.",
    )
    m.add_argument("--dsn", help=DSN_HELP)
    m.add_argument("--schema", default="stockade", help="the schema to create or upgrade")
    m.add_argument("--to", type=int, default=None, help="stop after this migration number")
    _add_layout(m, "citus: distribute the tables on a Citus coordinator (sql/citus/)")
    m.add_argument(
        "--dry-run", action="store_true", help="print the SQL that would run; change nothing"
    )
    m.add_argument(
        "--print-grants",
        metavar="ROLE",
        help="print the GRANTs that let ROLE serve as a runtime role (no DDL rights), for "
        "the schema's owner to run; connects to nothing",
    )
    m.add_argument(
        "--owner",
        help="with --print-grants: the role that runs later migrations (for the default "
        "privileges; default: whoever runs the statements)",
    )
    m.set_defaults(run=migrate)


def _add_advise(commands: _Commands) -> None:
    a = commands.command(
        "advise",
        "the Claim Test: three questions, one strategy",
        "Asks the Claim Test's questions (or takes the answers as options) and names the "
        "strategy that fits, with its reasons.",
    )
    a.add_argument(
        "--single-statement",
        choices=["yes", "no"],
        help="can one conditional statement do the whole write?",
    )
    a.add_argument(
        "--fits-in-transaction",
        choices=["yes", "no"],
        help="does the read-to-write window fit in one short transaction?",
    )
    a.add_argument("--conflict-rate", help="the fraction of writes to one row that collide")
    a.add_argument(
        "--retry",
        choices=["safe", "cheap", "unsafe", "expensive"],
        help="is losing the race safe and cheap to redo?",
    )
    a.set_defaults(run=advise)


def _add_audit(commands: _Commands) -> None:
    a = commands.command(
        "audit",
        "check the invariants from the data; exit 1 on a violation",
        "Reads the schema (no row lock) and lists every broken invariant with the row and "
        "what was expected: reserved against the holds, lapsed holds, purchase-limit "
        "counts, slot rows, keys, and the movement journal against the rows "
        "(docs/journal.md). Exits 0 when clean, 1 on a violation, 2 on an error.",
    )
    a.add_argument("--dsn", help=DSN_HELP)
    a.add_argument("--schema", default="stockade", help="the schema to audit")
    _add_layout(a, "citus: the schema is distributed on a Citus coordinator")
    a.add_argument("--sku", help="audit this SKU's rows only")
    a.add_argument("--limit", type=int, default=1000, help="report at most this many")
    a.add_argument(
        "--expiry-lag",
        type=float,
        default=300.0,
        help="seconds a hold may outlive its expiry before it counts (the sweeper's lag)",
    )
    a.set_defaults(run=audit)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="stockade",
        description="stockade: inventory reservations that never oversell. Run "
        "`stockade COMMAND --help` for a command's options and their defaults.",
    )
    parser.add_argument("--version", action="version", version=f"stockade {__version__}")
    commands = _Commands(parser)
    for add in (_add_demo, _add_bench, _add_migrate, _add_advise, _add_audit):
        add(commands)
    args = parser.parse_args(argv)
    if "dsn" in args:
        args.dsn_given = args.dsn
        args.dsn = dsn_from_environment(args.dsn)
    if args.command == "migrate" and args.dsn is None and args.print_grants is None:
        parser.error("migrate needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    if args.command == "audit" and args.dsn is None:
        parser.error("audit needs --dsn, STOCKADE_DSN or libpq's PG* variables")
    return int(args.run(args))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
