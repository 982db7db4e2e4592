"""Benchmark: storage over time. Keyed against keyless batching, throughput before and
after the tables grow, purge speed under load, the physical layout of retention, the cost
of stats(), and a steady state under retention.

One throwaway PostgreSQL (fsync and synchronous_commit on), 64 C++ client threads making
blocking calls. Figures from one run share the machine's noise: compare the ratios.

  1. keyed vs keyless: one hot SKU, batched, with and without an idempotency key each,
     in --rounds alternating rounds (the ratio is over all of them, so that a machine
     whose speed drifts during the run weighs on both cases alike);
  2. growth: hot SKU batched (keyless, keyed) and --warm-skus SKUs under auto, on fresh
     tables, then again after --old-rows old reservations and as many old keys; each case
     runs twice: --seconds right after a CHECKPOINT (the worst moment: the first write to
     each index page after a checkpoint logs the whole page), and one whole checkpoint
     cycle (checkpoint_timeout = --cycle seconds, a sixth of the default), what a service
     sees on average;
  3. purge under load: engine.purge() of that backlog while the hot SKU runs, against
     the same load without it (rows/s, and the load's ratio);
  4. layout: dropping a time partition against batched deletes of the same rows;
  5. stats() against row_counts() (count(*)) on the grown tables;
  6. steady state: reserve+confirm with keys for --steady-seconds under --retention, with
     the sweeper purging; table size and process RSS sampled as it runs;
  7. background work on grown tables: two schemas on the server, both with --live-holds
     live holds (a sale in progress), one also with --old-rows old terminal reservations
     and keys inside the retention window; in --rounds rounds, alternating which schema
     goes first, each expires --lapsed lapsed holds (expire_due, as the sweeper does),
     purges as many old rows (purge()), times stats() and an idle sweeper round.

    python benchmarks/retention.py [--seconds 5] [--rounds 3] [--old-rows 3000000]
        [--warm-skus 2000] [--cycle 50] [--steady-seconds 120] [--retention 5]
        [--live-holds 700000] [--lapsed 100000] [--idle-seconds 3] [--json FILE]

It is a benchmark, not a test: it prints figures and ratios and checks no target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import threading
import time
from dataclasses import asdict
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional

import stockade
from common import rss_mb
from stockade.tools import drive_load
from stockade.tools.pgserver import TemporaryPostgres

UNITS = 10**12
CLIENTS = 64
TTL = timedelta(minutes=15)
Sql = Callable[[str], str]


def load(
    eng: stockade.Engine,
    skus: List[str],
    strategy: str,
    seconds: float,
    *,
    keyed: bool = False,
    confirm: bool = False,
) -> Dict[str, Any]:
    r = asdict(
        drive_load(
            eng,
            skus,
            clients=CLIENTS,
            seconds=seconds,
            ttl=TTL,
            strategy=strategy,  # type: ignore[arg-type]
            keyed=keyed,
            confirm=confirm,
        )
    )
    r["rate"] = (r["granted"]) / r["seconds"]
    return r


def row(case: str, r: Dict[str, Any], base: Optional[float] = None) -> str:
    ratio = f"{r['rate'] / base:.2f}x" if base else "-"
    return (
        f"| {case} | {r['rate']:,.0f} | {r['p50_us'] / 1000:.2f} | {r['p99_us'] / 1000:.2f} "
        f"| {r['failed']} | {ratio} |"
    )


def header(title: str, unit: str = "ops/s") -> None:
    print(f"\n### {title}\n")
    print(f"| case | {unit} | p50 ms | p99 ms | failed | ratio |")
    print("|---|---:|---:|---:|---:|---:|", flush=True)


def table_mb(sql: Sql) -> float:
    return (
        int(
            sql(
                "SELECT pg_total_relation_size('stockade.reservation')"
                " + pg_total_relation_size('stockade.idempotency')"
            )
        )
        / 2**20
    )


def fill_old(sql: Sql, rows: int) -> None:
    """`rows` confirmed reservations a month old, each with its key, as a service that ran
    for a while without retention would have."""
    sql(
        "INSERT INTO stockade.reservation (id, sku, location, qty, state, version,"
        " expires_at, idempotency_key, created_at, updated_at, confirmed)"
        " SELECT ('01800000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,"
        " 'old-' || (g % 5000), 'default', 1, 'confirmed', 2, t, md5(g::text), t, t, 1"
        f" FROM generate_series(1, {rows}) AS g,"
        " LATERAL (SELECT now() - interval '30 days' + g * interval '100 microseconds') AS x(t)"
    )
    sql(
        "INSERT INTO stockade.idempotency (key, request_fingerprint, reservation_ids,"
        " created_at) SELECT md5(g::text), 'old', ARRAY[('01800000-0000-7000-8000-' ||"
        " lpad(to_hex(g), 12, '0'))::uuid], now() - interval '30 days' + g * interval"
        f" '100 microseconds' FROM generate_series(1, {rows}) AS g"
    )
    sql("VACUUM ANALYZE stockade.reservation")
    sql("VACUUM ANALYZE stockade.idempotency")


def growth_cases(
    eng: stockade.Engine,
    sql: Sql,
    seconds: float,
    warm: List[str],
    tag: str,
    cycle: float,
) -> Dict[str, Dict[str, Any]]:
    """Each case right after a CHECKPOINT for `seconds`, then (if `cycle`) for one whole
    checkpoint cycle of `cycle` seconds, starting at a CHECKPOINT."""
    out = {}
    for case, skus, strategy, keyed in [
        ("hot SKU, batched, keyless", [f"hot-{tag}-a"], "batched", False),
        ("hot SKU, batched, keyed", [f"hot-{tag}-b"], "batched", True),
        (f"{len(warm):,} warm SKUs, auto, keyless", warm, "auto", False),
    ]:
        for s in skus if len(skus) == 1 else []:
            eng.restock(s, UNITS)
        sql("CHECKPOINT")
        out[case] = load(eng, skus, strategy, seconds, keyed=keyed)
        if cycle:
            sql(f"ALTER SYSTEM SET checkpoint_timeout = '{cycle:g}s'")
            sql("SELECT pg_reload_conf()")
            sql("CHECKPOINT")
            out[f"{case}, one checkpoint cycle"] = load(eng, skus, strategy, cycle, keyed=keyed)
            sql("ALTER SYSTEM RESET checkpoint_timeout")
            sql("SELECT pg_reload_conf()")
    return out


def purge_under_load(
    eng: stockade.Engine, sql: Sql, seconds: float, backlog: int
) -> Dict[str, Any]:
    """The hot SKU for `seconds` alone, then again while engine.purge() deletes the backlog
    of old rows (they were made in section 2; more are added to reach `backlog`)."""
    eng.restock("hot-purge", UNITS)
    sql("CHECKPOINT")
    alone = load(eng, ["hot-purge"], "batched", seconds, keyed=True)
    old = int(
        sql(
            "SELECT (SELECT count(*) FROM stockade.reservation WHERE state <> 'held'"
            " AND updated_at < now() - interval '1 day')"
            " + (SELECT count(*) FROM stockade.idempotency WHERE created_at < now() - interval"
            " '1 day')"
        )
    )
    sql("CHECKPOINT")
    purged: Dict[str, Any] = {}

    def purge() -> None:
        start = time.perf_counter()
        purged["rows"] = eng.purge(timedelta(days=1))
        purged["seconds"] = time.perf_counter() - start

    def purged_so_far() -> int:
        swept = eng.stats()["sweeper"]
        return int(swept["purged_reservations"] + swept["purged_keys"])

    start_count = purged_so_far()
    worker = threading.Thread(target=purge)
    worker.start()
    time.sleep(0.5)  # the purge is under way
    at_start, started = purged_so_far(), time.perf_counter()
    during = load(eng, ["hot-purge"], "batched", seconds, keyed=True)
    in_window = (purged_so_far() - at_start) / (time.perf_counter() - started)
    worker.join()
    assert purged_so_far() - start_count == purged["rows"]
    return {
        "backlog_rows": old,
        "purged_rows": purged["rows"],
        "purge_seconds": purged["seconds"],
        "purge_rows_per_s": purged["rows"] / purged["seconds"],
        "purge_rows_per_s_during_load": in_window,
        "load_alone": alone,
        "load_during_purge": during,
        "load_ratio": during["rate"] / alone["rate"],
    }


def sweeper_under_load(
    dsn: str, eng: stockade.Engine, sql: Sql, seconds: float, backlog: int
) -> Dict[str, Any]:
    """The same, with the backlog purged by a sweeper (retention=1 day, paced) of a second
    engine instead of an explicit purge()."""
    fill_old(sql, backlog)
    sql("CHECKPOINT")
    alone = load(eng, ["hot-purge"], "batched", seconds, keyed=True)
    with stockade.Engine.postgres(
        dsn,
        pool_size=2,
        sweeper=True,
        sweep_interval=timedelta(milliseconds=200),
        retention=timedelta(days=1),
    ) as sweeper:

        def purged() -> int:
            swept = sweeper.stats()["sweeper"]
            return int(swept["purged_reservations"] + swept["purged_keys"])

        deadline = time.monotonic() + 10
        while purged() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        at_start, started = purged(), time.perf_counter()
        during = load(eng, ["hot-purge"], "batched", seconds, keyed=True)
        rate = (purged() - at_start) / (time.perf_counter() - started)
    return {
        "load_alone": alone,
        "load_during_sweeper_purge": during,
        "load_ratio": during["rate"] / alone["rate"],
        "purge_rows_per_s_during_load": rate,
    }


def layout(sql: Sql, rows: int, partitions: int) -> Dict[str, Any]:
    """`rows` terminal reservations in a table partitioned by id (UUIDv7, so by time) into
    `partitions` ranges, and the same rows in a plain table with the retention index:
    drops the oldest partition, and deletes the same rows in batches of 5,000."""
    sql("CREATE SCHEMA layout")
    columns = (
        "(id uuid NOT NULL, sku text NOT NULL, state text NOT NULL,"
        " updated_at timestamptz NOT NULL, idempotency_key text)"
    )
    sql(f"CREATE TABLE layout.parted {columns} PARTITION BY RANGE (id)")
    sql(f"CREATE TABLE layout.plain {columns}")
    sql("CREATE INDEX ON layout.plain (updated_at) WHERE state <> 'held'")
    per = rows // partitions
    for p in range(partitions):
        lo, hi = p * per + 1, (p + 1) * per + 1
        sql(
            f"CREATE TABLE layout.p{p} PARTITION OF layout.parted FOR VALUES FROM"
            f" ('01800000-0000-7000-8000-{lo:012x}') TO ('01800000-0000-7000-8000-{hi:012x}')"
        )
    select = (
        "SELECT ('01800000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'old', 'confirmed',"
        " now() - interval '30 days' + g * interval '1 ms', md5(g::text)"
        f" FROM generate_series(1, {per * partitions}) AS g"
    )
    sql(f"INSERT INTO layout.parted {select}")
    sql(f"INSERT INTO layout.plain {select}")
    sql("ALTER TABLE layout.parted ADD PRIMARY KEY (id)")
    sql("ALTER TABLE layout.plain ADD PRIMARY KEY (id)")
    sql("VACUUM ANALYZE layout.parted")
    sql("VACUUM ANALYZE layout.plain")
    sql("CHECKPOINT")
    start = time.perf_counter()
    sql("ALTER TABLE layout.parted DETACH PARTITION layout.p0")
    sql("DROP TABLE layout.p0")
    dropped = time.perf_counter() - start
    horizon = (
        f"(SELECT max(updated_at) FROM layout.plain WHERE id < "
        f"'01800000-0000-7000-8000-{per + 1:012x}')"
    )
    sql("CHECKPOINT")
    start = time.perf_counter()
    deleted = 0
    while True:
        n = int(
            sql(
                "WITH d AS (DELETE FROM layout.plain WHERE id IN (SELECT id FROM layout.plain"
                f" WHERE state <> 'held' AND updated_at <= {horizon} ORDER BY updated_at"
                " LIMIT 5000 FOR UPDATE SKIP LOCKED) RETURNING 1) SELECT count(*) FROM d"
            )
        )
        deleted += n
        if n < 5000:
            break
    deleted_s = time.perf_counter() - start
    sql("DROP SCHEMA layout CASCADE")
    return {
        "rows": per,
        "drop_partition_s": dropped,
        "drop_rows_per_s": per / dropped,
        "batched_delete_rows": deleted,
        "batched_delete_s": deleted_s,
        "batched_delete_rows_per_s": deleted / deleted_s,
    }


def timed(call: Callable[[], Any], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def steady(dsn: str, sql: Sql, seconds: float, retention: float) -> Dict[str, Any]:
    """Reserve+confirm with keys, 64 clients over 64 SKUs, under retention; samples the
    size of the two tables and this process's RSS every tenth of the run."""
    samples = []
    ops = 0
    with stockade.Engine.postgres(
        dsn,
        pool_size=CLIENTS + 8,
        schema="steady",
        sweeper=True,
        sweep_interval=timedelta(milliseconds=500),
        retention=timedelta(seconds=retention),
    ) as eng:
        eng.migrate()
        skus = [f"s{i}" for i in range(64)]
        for s in skus:
            eng.restock(s, UNITS)
        slices = 10
        start = time.perf_counter()
        for _ in range(slices):
            r = load(eng, skus, "auto", seconds / slices, keyed=True, confirm=True)
            ops += r["granted"]
            size = int(
                sql(
                    "SELECT pg_total_relation_size('steady.reservation')"
                    " + pg_total_relation_size('steady.idempotency')"
                )
            )
            samples.append(
                {
                    "t": round(time.perf_counter() - start, 1),
                    "ops": ops,
                    "ops_per_s": r["rate"],
                    "tables_mb": round(size / 2**20, 1),
                    "rss_mb": round(rss_mb(), 1),
                }
            )
        swept = eng.stats()["sweeper"]
    return {"samples": samples, "ops": ops, "sweeper": swept}


RETAINED = timedelta(days=7)  # section 7's retention window


def v7(at: str, n: str) -> str:
    """SQL for a time-ordered id, as the engine makes them (UUID v7: the time `at` in
    milliseconds first), unique for distinct `n` at one time."""
    ms = f"lpad(to_hex((extract(epoch FROM {at}) * 1000)::bigint), 12, '0')"
    return (
        f"(substr({ms}, 1, 8) || '-' || substr({ms}, 9, 4) || '-7' ||"
        f" lpad(to_hex(({n}) % 4096), 3, '0') || '-8' || lpad(to_hex((({n}) / 4096) % 4096),"
        f" 3, '0') || '-' || lpad(to_hex({n}), 12, '0'))::uuid"
    )


def add_holds(sql: Sql, schema: str, prefix: str, skus: int, n: int, at: str, expires: str) -> None:
    """`n` holds on `skus` SKUs named `prefix`0.., each SKU stocked with exactly the units
    its holds reserve. `at` is hold g's creation time and `expires` its expiry, both SQL in
    terms of g (0..n-1)."""
    sql(
        f"INSERT INTO {schema}.stock (sku, location, on_hand, reserved)"
        f" SELECT '{prefix}' || k, 'default', n, n FROM generate_series(0, {skus - 1}) AS k,"
        f" LATERAL (SELECT ({n} / {skus}) + CASE WHEN k < {n} % {skus} THEN 1 ELSE 0 END)"
        " AS x(n)"
    )
    sql(
        f"INSERT INTO {schema}.reservation (id, sku, location, qty, state, expires_at,"
        f" created_at, updated_at) SELECT {v7('t', 'g')}, '{prefix}' || (g % {skus}),"
        f" 'default', 1, 'held', {expires}, t, t FROM generate_series(0, {n - 1}) AS g,"
        f" LATERAL (SELECT {at}) AS x(t)"
    )


def add_confirmed(sql: Sql, schema: str, prefix: str, skus: int, n: int, at: str) -> None:
    """`n` confirmed reservations on `skus` SKUs, each with its idempotency key `prefix`g
    (g = 1..n), made and last changed at `at` (SQL in terms of g)."""
    sql(
        f"INSERT INTO {schema}.reservation (id, sku, location, qty, state, version,"
        f" expires_at, idempotency_key, created_at, updated_at, confirmed) SELECT"
        f" {v7('t', 'g')}, '{prefix}' || (g % {skus}), 'default', 1, 'confirmed', 2, t,"
        f" '{prefix}' || g, t, t, 1"
        f" FROM generate_series(1, {n}) AS g, LATERAL (SELECT {at}) AS x(t)"
    )
    sql(
        f"INSERT INTO {schema}.idempotency (key, request_fingerprint, reservation_ids,"
        f" created_at) SELECT idempotency_key, 'confirmed', ARRAY[id], created_at FROM {schema}"
        f".reservation WHERE idempotency_key LIKE '{prefix}%'"
    )


def fill_background(sql: Sql, schema: str, live: int, old: int) -> None:
    """Section 7's standing rows in `schema`: `live` holds due in a day on 1,000 SKUs (their
    units reserved), and `old` confirmed reservations with their keys, a day old: inside
    the retention window, so that no purge takes them. Autovacuum is off on the two
    tables: each round vacuums them itself, so that both schemas start it alike."""
    if old:
        add_confirmed(
            sql,
            schema,
            "old-",
            5000,
            old,
            "now() - interval '1 day' + g * interval '10 microseconds'",
        )
    add_holds(sql, schema, "live-", 1000, live, "now()", "now() + interval '1 day'")
    for table in ("reservation", "idempotency"):
        sql(f"ALTER TABLE {schema}.{table} SET (autovacuum_enabled = off)")
    sql(f"VACUUM ANALYZE {schema}.stock, {schema}.reservation, {schema}.idempotency")


def add_due_work(sql: Sql, schema: str, tag: str, n: int) -> None:
    """`n` holds that lapsed a minute ago on 100 SKUs (their units reserved), and `n`
    confirmed reservations with their keys, a month old (past the retention window); then
    a VACUUM ANALYZE of the tables and a CHECKPOINT."""
    add_confirmed(
        sql,
        schema,
        f"gone-{tag}-",
        100,
        n,
        "now() - interval '30 days' + g * interval '1 millisecond'",
    )
    add_holds(
        sql,
        schema,
        f"lapse-{tag}-",
        100,
        n,
        "now() - interval '2 minutes' + g * interval '1 microsecond'",
        "t + interval '1 minute'",
    )
    sql(f"VACUUM ANALYZE {schema}.stock, {schema}.reservation, {schema}.idempotency")
    sql("CHECKPOINT")  # the pages VACUUM dirtied are written before the round, not during it


def background_round(dsn: str, eng: stockade.Engine, schema: str, idle: float) -> Dict[str, float]:
    """Expires every due hold in sweeper-sized batches, purges what is past the window,
    times stats(), then lets an engine with the sweeper on run idle rounds (the rounds of
    `idle` seconds, after half a second for its first round)."""
    start = time.perf_counter()
    calls, expired = [], 0
    while True:
        t0 = time.perf_counter()
        n = eng.expire_due(limit=1000)
        calls.append(time.perf_counter() - t0)
        expired += n
        if n < 1000:
            break
    expire_s = time.perf_counter() - start
    t0 = time.perf_counter()
    purged = eng.purge(RETAINED)
    purge_s = time.perf_counter() - t0
    stats_s = timed(eng.stats, repeat=25)  # the best of 25: a call is about a millisecond
    with stockade.Engine.postgres(
        dsn,
        pool_size=2,
        schema=schema,
        sweeper=True,
        sweep_interval=timedelta(milliseconds=50),
        retention=RETAINED,
    ) as sweeping:
        time.sleep(0.5)  # past the first round, which opens its session and prepares
        first = sweeping.stats()["sweeper"]
        time.sleep(idle)
        last = sweeping.stats()["sweeper"]
    swept = {key: last[key] - first[key] for key in ("runs", "round_seconds")}
    return {
        "expired": expired,
        "expire_per_s": expired / expire_s,
        "expire_call_ms": statistics.median(calls) * 1000,
        "purged": purged,
        "purge_per_s": purged / purge_s,
        "stats_ms": stats_s * 1000,
        "sweeper_rounds": swept["runs"],
        "sweeper_round_ms": swept["round_seconds"] / max(swept["runs"], 1) * 1000,
    }


# Section 7's measures: (key, label, higher is better).
BACKGROUND = [
    ("expire_per_s", "expire_due: lapsed holds expired per s", True),
    ("expire_call_ms", "expire_due(limit=1000): ms per call", False),
    ("purge_per_s", "purge(): rows per s", True),
    ("stats_ms", "stats(): ms, the best of 25 calls", False),
    ("sweeper_round_ms", "an idle sweeper round: ms", False),
]


def background(
    dsn: str, sql: Sql, rounds: int, live: int, old: int, lapsed: int, idle: float
) -> Dict[str, Any]:
    """Section 7: the same background work on fresh and on grown tables, alternating."""
    t0 = time.perf_counter()
    engines = {}
    with contextlib.ExitStack() as stack:
        for schema, rows in (("fresh", 0), ("grown", old)):
            engines[schema] = stack.enter_context(
                # No sweeper: the section times expire_due and purge itself.
                stockade.Engine.postgres(dsn, pool_size=4, schema=schema, sweeper=False)
            )
            engines[schema].migrate()
            fill_background(sql, schema, live, rows)
        filled_s = time.perf_counter() - t0
        runs: Dict[str, List[Dict[str, float]]] = {"fresh": [], "grown": []}
        for n in range(rounds):
            order = ["fresh", "grown"] if n % 2 == 0 else ["grown", "fresh"]
            for schema in order:
                add_due_work(sql, schema, str(n), lapsed)
                runs[schema].append(background_round(dsn, engines[schema], schema, idle))
    medians = {
        schema: {key: statistics.median(r[key] for r in runs[schema]) for key, _, _ in BACKGROUND}
        for schema in runs
    }
    ratios = {
        key: (medians["grown"][key] / medians["fresh"][key])
        if higher
        else (medians["fresh"][key] / medians["grown"][key])
        for key, _, higher in BACKGROUND
    }
    return {"filled_s": filled_s, "runs": runs, "medians": medians, "ratios": ratios}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per load case")
    parser.add_argument("--old-rows", type=int, default=3_000_000)
    parser.add_argument("--warm-skus", type=int, default=2000)
    parser.add_argument(
        "--cycle",
        type=float,
        default=50.0,
        help="section 2: also run each case for one checkpoint cycle this long (0: no)",
    )
    parser.add_argument("--layout-rows", type=int, default=3_000_000)
    parser.add_argument("--steady-seconds", type=float, default=120.0)
    parser.add_argument("--retention", type=float, default=5.0, help="seconds (section 6)")
    parser.add_argument("--live-holds", type=int, default=700_000, help="section 7")
    parser.add_argument("--lapsed", type=int, default=100_000, help="section 7, per round")
    parser.add_argument(
        "--idle-seconds", type=float, default=3.0, help="section 7: idle sweeper rounds timed"
    )
    parser.add_argument("--sections", default="1234567", help="which sections to run")
    parser.add_argument(
        "--rounds", type=int, default=3, help="sections 1 and 7: alternating rounds"
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a server setting for the throwaway PostgreSQL (repeatable)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    if 0 < args.cycle < 30:
        parser.error("--cycle is 0 (none) or at least 30 s, checkpoint_timeout's minimum")
    if args.rounds < 1:
        parser.error("--rounds is at least 1")
    if any("=" not in item for item in args.setting):
        parser.error("--setting takes NAME=VALUE")
    settings = dict(item.split("=", 1) for item in args.setting)
    print(
        f"# stockade retention benchmark: {CLIENTS} clients, {args.seconds:g} s per case, "
        "fsync and synchronous_commit on" + "".join(f", {k} = {v}" for k, v in settings.items())
    )
    report: Dict[str, Any] = {}
    with TemporaryPostgres(settings=settings) as pg:
        dsn = pg.dsn()

        def sql(statement: str) -> str:
            return pg.sql(statement)

        # The sections start their own sweepers where they measure one.
        with stockade.Engine.postgres(dsn, pool_size=CLIENTS + 8, sweeper=False) as eng:
            eng.migrate()
            warm = [f"warm-{i}" for i in range(args.warm_skus)]
            sql(
                "INSERT INTO stockade.stock (sku, location, on_hand) SELECT 'warm-' || i,"
                f" 'default', {UNITS} FROM generate_series(0, {args.warm_skus - 1}) AS i"
            )
            if "1" in args.sections:
                header(
                    "1. keyed vs keyless, one hot SKU, batched, 64 blocking clients"
                    f" ({args.rounds} alternating rounds)"
                )
                rounds = []
                for n in range(args.rounds):
                    pair = {}
                    for keyed in (False, True):
                        sku = f"kv-{n}-{'keyed' if keyed else 'keyless'}"
                        eng.restock(sku, UNITS)
                        sql("CHECKPOINT")
                        pair["keyed" if keyed else "keyless"] = load(
                            eng, [sku], "batched", args.seconds, keyed=keyed
                        )
                    print(row(f"keyless, round {n + 1}", pair["keyless"]))
                    print(
                        row(
                            f"keyed (a fresh key each), round {n + 1}",
                            pair["keyed"],
                            pair["keyless"]["rate"],
                        )
                    )
                    rounds.append(pair)
                total = {k: sum(p[k]["granted"] for p in rounds) for k in ("keyless", "keyed")}
                secs = {k: sum(p[k]["seconds"] for p in rounds) for k in ("keyless", "keyed")}
                ratio = (total["keyed"] / secs["keyed"]) / (total["keyless"] / secs["keyless"])
                print(f"\nkeyed against keyless over all rounds: {ratio:.2f}x")
                report["keyed_vs_keyless"] = {"rounds": rounds, "ratio": ratio}
            if "2" in args.sections:
                before = growth_cases(eng, sql, args.seconds, warm, "fresh", args.cycle)
                t0 = time.perf_counter()
                fill_old(sql, args.old_rows)
                filled = time.perf_counter() - t0
                after = growth_cases(eng, sql, args.seconds, warm, "grown", args.cycle)
                header(
                    f"2. growth: fresh tables, then {args.old_rows:,} old reservations and "
                    f"{args.old_rows:,} old keys (filled in {filled:.0f} s; tables now "
                    f"{table_mb(sql):,.0f} MB)"
                )
                ratios = {}
                for case in before:
                    print(row(f"{case}, fresh", before[case]))
                    print(row(f"{case}, grown", after[case], before[case]["rate"]))
                    ratios[case] = after[case]["rate"] / before[case]["rate"]
                report["growth"] = {"before": before, "after": after, "ratios": ratios}
            if "5" in args.sections:
                counts = eng.row_counts()
                stats_s = timed(eng.stats)
                exact_s = timed(eng.row_counts, repeat=3)
                print(
                    f"\n### 5. stats() against row_counts(), {counts['reservation_count']:,} "
                    f"reservations, {counts['sku_count']:,} SKUs\n\n"
                    f"- stats(): {stats_s * 1000:.2f} ms\n"
                    f"- row_counts() (count(*)): {exact_s * 1000:.1f} ms "
                    f"({exact_s / stats_s:,.0f}x)"
                )
                report["stats_cost"] = {
                    "stats_ms": stats_s * 1000,
                    "row_counts_ms": exact_s * 1000,
                    "counts": counts,
                }
            if "3" in args.sections:
                if "2" not in args.sections:
                    fill_old(sql, args.old_rows)
                p = purge_under_load(eng, sql, args.seconds, args.old_rows)
                header("3. purge under load: the hot SKU (batched, keyed) alone, then during")
                print(row("alone", p["load_alone"]))
                print(row("during engine.purge()", p["load_during_purge"], p["load_alone"]["rate"]))
                print(
                    f"\npurge: {p['purged_rows']:,} of {p['backlog_rows']:,} old rows in "
                    f"{p['purge_seconds']:.1f} s = {p['purge_rows_per_s']:,.0f} rows/s overall, "
                    f"{p['purge_rows_per_s_during_load']:,.0f} rows/s while the load ran"
                )
                report["purge_under_load"] = p
                w = sweeper_under_load(dsn, eng, sql, args.seconds, args.old_rows)
                header("3b. the same backlog purged by the sweeper (retention, paced)")
                print(row("alone", w["load_alone"]))
                print(
                    row(
                        "during the sweeper's purge",
                        w["load_during_sweeper_purge"],
                        w["load_alone"]["rate"],
                    )
                )
                print(
                    f"\nsweeper purge: {w['purge_rows_per_s_during_load']:,.0f} rows/s "
                    "while the load ran"
                )
                report["sweeper_under_load"] = w
        if "4" in args.sections:
            lay = layout(sql, args.layout_rows, 10)
            print(
                f"\n### 4. layout: {lay['rows']:,} old rows (one tenth of "
                f"{args.layout_rows:,})\n\n"
                f"- drop a time partition (DETACH + DROP): {lay['drop_partition_s'] * 1000:.0f}"
                f" ms = {lay['drop_rows_per_s']:,.0f} rows/s\n"
                f"- batched deletes, 5,000 per statement: {lay['batched_delete_s']:.1f} s = "
                f"{lay['batched_delete_rows_per_s']:,.0f} rows/s"
            )
            report["layout"] = lay
        if "6" in args.sections:
            s = steady(dsn, sql, args.steady_seconds, args.retention)
            print(
                f"\n### 6. steady state: reserve+confirm, a key each, 64 SKUs, auto, "
                f"retention {args.retention:g} s, {args.steady_seconds:g} s\n"
            )
            print("| t s | operations | ops/s | tables MB | RSS MB |")
            print("|---:|---:|---:|---:|---:|")
            for x in s["samples"]:
                print(
                    f"| {x['t']} | {x['ops']:,} | {x['ops_per_s']:,.0f} | {x['tables_mb']} "
                    f"| {x['rss_mb']} |"
                )
            sw = s["sweeper"]
            print(
                f"\nsweeper: purged {sw['purged_reservations']:,} reservations and "
                f"{sw['purged_keys']:,} keys; {sw['errors']} errors"
                + (f" (last: {sw['last_error'][:200]})" if sw["errors"] else "")
            )
            report["steady"] = s
        if "7" in args.sections:
            b = background(
                dsn,
                sql,
                args.rounds,
                args.live_holds,
                args.old_rows,
                args.lapsed,
                args.idle_seconds,
            )
            print(
                f"\n### 7. background work: fresh tables against grown ones ({args.old_rows:,}"
                f" old rows), both with {args.live_holds:,} live holds; {args.lapsed:,} lapsed"
                f" holds and old rows per round; medians of {args.rounds} alternating rounds"
                f" (filled in {b['filled_s']:.0f} s)\n"
            )
            print("| measure | fresh | grown | grown against fresh |")
            print("|---|---:|---:|---:|")
            for key, label, _ in BACKGROUND:
                fresh, grown = b["medians"]["fresh"][key], b["medians"]["grown"][key]
                print(f"| {label} | {fresh:,.1f} | {grown:,.1f} | {b['ratios'][key]:.2f}x |")
            print("\n(a ratio below 1 means the grown tables slow the work down)")
            report["background"] = b
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
