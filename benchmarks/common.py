"""Helpers the benchmark scripts share (each script imports this as a sibling module)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
from dataclasses import asdict
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import stockade
from stockade.tools import drive_load
from stockade.tools.bench import slow_flush_settings
from stockade.tools.pgserver import TemporaryPostgres, run_sql

# The pool of the allocating cases.
POOL = ["north", "south", "east"]
BUYERS = 1000  # the buyers of the "buyers" cases


WARMUP_SLICE_S = 1.0
WARMUP_SETTLED = 1.1  # a slice's rate at most this much above the one before


def warm_up(eng: stockade.Engine, skus: Sequence[str], warmup: float, **kw: Any) -> None:
    """The load of drive_load(eng, skus, **kw), untimed, in slices of a second (kw's
    seconds aside) until the request rate stops rising (a slice at most 10% above the one
    before) or `warmup` seconds have passed; its figures are dropped. The engine's pools
    open as the load needs them, and on a Citus worker each new backend builds its caches
    for every shard it touches: there the rate climbs for about five seconds (184, 639,
    868, 1,240, 1,488, 1,758/s in one-second slices of keyless reserves routed direct, 64
    clients), against one second on a single server."""
    spent, last = 0.0, -1.0
    while spent < warmup:
        piece = min(WARMUP_SLICE_S, warmup - spent)
        run = drive_load(eng, skus, **{**kw, "seconds": piece})
        spent += piece
        rate = run.requests / max(run.seconds, 1e-9)
        if last >= 0 and rate <= last * WARMUP_SETTLED:
            return
        last = rate


def measure(eng: stockade.Engine, skus: Sequence[str], **kw: Any) -> Dict[str, Any]:
    """One drive_load run (keyword arguments as drive_load's), as a dict with its "rate":
    granted requests per second. warm_up first, with the same load, so that the measured
    run starts with the engine's pools open and the servers' caches warm."""
    out: Dict[str, Any] = asdict(drive_load(eng, skus, **kw))
    out["rate"] = out["granted"] / out["seconds"]
    return out


def run_cases(
    eng: stockade.Engine,
    prefix: str,
    cases: Iterable[str],
    args: argparse.Namespace,
    servers: Optional[Dict[str, int]] = None,
) -> Dict[str, Any]:
    """Measures each case, "<hot|wide>/<auto|atomic|keyed|sell|keyed-sell|buyers|confirm|
    allocate>": one SKU or --skus of them (10**9 units each, restocked first), --clients
    blocking clients for --seconds, under auto, atomic, or auto with an idempotency key on
    every request, or auto selling instead of reserving (keyed-sell: with a key each), or
    auto reserving for one of BUYERS buyers each (a purchase limit on the SKUs that none
    reaches), or auto confirming each hold at once (the confirm counted as a request of its
    own); or (allocate)
    each request an allocation of 1 unit from POOL's three locations (priority, auto), each
    SKU stocked at all three (at most 1,000 SKUs: three rows each). "allocate-shared" is
    allocate on SKUs whose three rows `args.together` says lie on one shard. With
    `servers` (a name for each server's postmaster PID), each case also gets the CPU
    seconds each server spent in it ("cpu_s")."""
    out: Dict[str, Any] = {}
    for case in cases:
        layout, how = case.split("/")
        shared = how.endswith("-shared")
        how = how.removesuffix("-shared")
        count = 1 if layout == "hot" else args.skus
        if how == "allocate":
            count = min(count, 1000)
        names: Iterator[str] = (f"{prefix}-{case}-{i}" for i in itertools.count())
        if shared:
            names = (n for n in names if args.together(n))
        skus = list(itertools.islice(names, count))
        for sku in skus:
            for location in POOL if how == "allocate" else ["default"]:
                eng.restock(sku, 10**9, location=location)
        kw: Dict[str, Any] = {"clients": args.clients, "seconds": args.seconds}
        if how == "atomic":
            kw["strategy"] = "atomic"
        if how in ("keyed", "keyed-sell"):
            kw["keyed"] = True
        if how in ("sell", "keyed-sell"):
            kw["sell"] = True
        if how == "buyers":
            eng.set_purchase_limit(f"{prefix}-{case}", per_buyer=10**9, skus=skus)
            kw["buyers"] = BUYERS
        if how == "confirm":
            kw["confirm"] = True
        if how == "allocate":
            kw["pool"] = POOL
        warm_up(eng, skus, args.warmup, **kw)  # before the CPU counts start
        before = {name: server_cpu_s(pid) for name, pid in (servers or {}).items()}
        out[case] = measure(eng, skus, **kw)
        if servers:
            out[case]["cpu_s"] = {n: server_cpu_s(p) - before[n] for n, p in servers.items()}
    return out


def run_routes(
    routes: Dict[str, Dict[str, Any]], cases: Iterable[str], args: argparse.Namespace
) -> Dict[str, Any]:
    """For each route (a name, and the keyword arguments of Engine.postgres: dsn and
    options), an engine of --clients connections on a schema of its own, migrated, and
    run_cases on it; the figures by route. A route whose options name a "drop_routines"
    DSN runs without the statement routines migrate() made (dropped through that DSN
    right after it), as on a schema an earlier release migrated; one whose options name
    "drop_functions" (functions of the schema) runs without them. A route's "servers" (a
    name for each server's postmaster PID) has run_cases measure their CPU seconds; its
    "cases", if given, are the only ones it runs (of `cases`)."""
    report: Dict[str, Any] = {}
    for route, options in routes.items():
        options = dict(options)
        drop_through = options.pop("drop_routines", None)
        drop_functions = options.pop("drop_functions", ())
        servers = options.pop("servers", None)
        only = options.pop("cases", None)
        schema = "b_" + route.replace("/", "_")
        with stockade.Engine.postgres(pool_size=args.clients, schema=schema, **options) as eng:
            eng.migrate()
            if drop_through:
                run_sql(
                    drop_through,
                    "DO $$DECLARE f regprocedure; BEGIN FOR f IN SELECT oid FROM pg_proc"
                    f" WHERE pronamespace = '{schema}'::regnamespace"
                    " AND proname LIKE 'stockade\\_%' LOOP EXECUTE 'DROP FUNCTION ' || f;"
                    " END LOOP; END$$",
                )
            for function in drop_functions:
                run_sql(options["dsn"], f"DROP FUNCTION {schema}.{function}")
            mine = [c for c in cases if only is None or c in only]
            report[route] = run_cases(eng, schema, mine, args, servers)
            pool = eng.stats()["pool"]
            report[route]["pool"] = {"pooled": pool["pooled"], "routines": pool["routines"]}
    return report


def parser(doc: str) -> argparse.ArgumentParser:
    """The options every side-by-side script takes: --seconds, --warmup (the most seconds
    of untimed load before each measured run: see warm_up), --clients, --skus (the wide
    cases) and --json; a script adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument(
        "--warmup",
        type=float,
        default=10.0,
        help="at most this many seconds of the same load, untimed, before each run, until"
        " its rate stops rising",
    )
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--skus", type=int, default=10_000)
    ap.add_argument("--json", help="also write the figures to this file")
    return ap


def rounds_parser(doc: str) -> argparse.ArgumentParser:
    """The options every script of cases alternating in rounds takes: --seconds (a case),
    --rounds, --flush-delay-us (commit_delay, as on a network disk) and --json; a script
    adds its own (its clients or threads)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flush-delay-us", type=int, default=0)
    ap.add_argument("--json", help="also write the figures to this file")
    return ap


CaseRun = Callable[[stockade.Engine, str, Any, argparse.Namespace], Dict[str, Any]]


def rounds_on_postgres(
    args: argparse.Namespace,
    database: str,
    cases: Sequence[Any],
    one_case: CaseRun,
    *,
    warm: Sequence[Any],
    name: Callable[[Any], str] = str,
    **engine: Any,
) -> Tuple[Dict[str, List[Dict[str, Any]]], bool]:
    """One throwaway PostgreSQL (WAL flushes delayed by --flush-delay-us) and one engine on
    it (`engine`: its options): warms up (each case of `warm`, 1 s), then runs each case
    `args.rounds` times, the cases alternating so that drift on a shared machine hits all
    alike, each run `one_case(eng, sku, case, args)` on a SKU of its own. Returns the
    figures by case (`name(case)`), in round order, and whether the audit came out clean.

    Between warming up and the rounds it runs ANALYZE: the engine's connections plan each
    statement once (generic plans), on the table statistics of that moment, and on a table
    that was empty then the batch's reservation lookups stay sequential scans until
    autovacuum's first ANALYZE (within autovacuum_naptime, a minute) replans them."""
    runs: Dict[str, List[Dict[str, Any]]] = {name(case): [] for case in cases}
    with TemporaryPostgres(settings=slow_flush_settings(args.flush_delay_us)) as pg:
        dsn = pg.create_database(database)
        with stockade.Engine.postgres(dsn, **engine) as eng:
            eng.migrate()
            warming = argparse.Namespace(**{**vars(args), "seconds": 1.0})
            for case in warm:
                one_case(eng, "warm-up", case, warming)
            run_sql(dsn, "ANALYZE")
            for n in range(args.rounds):
                for i, case in enumerate(cases):
                    runs[name(case)].append(one_case(eng, f"hot-{n}-{i}", case, args))
            return runs, eng.audit().ok


def route_table(
    report: Dict[str, Any], routes: Iterable[str], cases: Iterable[str], base: str
) -> None:
    """Prints each case's rate per route (report[route][case]["rate"]), with its ratio to
    route `base` in the same run and its failed requests."""
    routes, cases = list(routes), list(cases)
    width = max(12, *(len(case) for case in cases))
    print(f"\n  {'case':{width}}" + "".join(f"{route:>26}" for route in routes))
    for case in cases:
        cells = []
        for route in routes:
            if case not in report[route]:
                cells.append("-")  # a route that runs some cases only
                continue
            r = report[route][case]
            ratio = r["rate"] / report[base][case]["rate"]
            cells.append(f"{r['rate']:>12,.0f}/s {ratio:5.2f}x f{r['failed']:<2}")
        print(f"  {case:{width}}" + "".join(f"{c:>26}" for c in cells))
    print(f"\n  (ratio: against {base} in this run; f: failed requests)")


def write_json(path: Optional[str], report: Dict[str, Any]) -> None:
    """Writes the figures to `path` (--json), if one was given."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


def rss_mb() -> float:
    """This process's resident memory (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> List[str]:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def server_cpu_s(postmaster: int) -> float:
    """CPU seconds (user and system) of a PostgreSQL server so far: its postmaster's, with
    those of the children it reaped (backends that have exited), and those of its live
    processes (backends, WAL writer, checkpointer, autovacuum), from /proc."""
    fields = _stat_fields(postmaster)  # utime, stime, cutime, cstime: fields 14-17
    ticks = sum(int(x) for x in fields[11:15])
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            child = _stat_fields(int(entry))
        except OSError:
            continue  # it exited meanwhile
        if int(child[1]) == postmaster:  # field 4: the parent
            ticks += int(child[11]) + int(child[12])
    return ticks / _TICK


def process_cpu_s() -> float:
    """CPU seconds (user and system) of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
