"""``stockade bench``: the strategies side by side, and their peers, in one run.

Each stockade case drives the engine from C++ client threads (``stockade.tools.drive_load``), so
the figures measure the engine and the database, not a Python loop. With ``peers``,
pgbench runs the plain-SQL equivalent of each classic strategy against the same server,
and, when ``redis-server`` is installed, a Redis Lua check-and-decrement runs with
``appendfsync always`` and ``everysec``. Every reservation writes its record (stock never
runs out), and every case reports reservations per second, so their ratios compare.

``slow_flush_settings`` gives a throwaway server the flush of a network disk or a
synchronous standby, and ``run_ceiling`` measures what such a server allows a hot SKU
(with pgbench, on the same server), so that every figure can be read against it.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO

from ..engine import Engine
from ..values import Strategy
from .load import drive_load
from .pgserver import child_connection, find_bindir, run_sql

__all__ = [
    "BenchCase",
    "Ceiling",
    "Progress",
    "run_ceiling",
    "run_pgbench",
    "run_redis",
    "run_stockade",
    "slow_flush_settings",
    "write_reports",
]

UNITS = 10**9
TTL_US = 15 * 60 * 10**6
PGBENCH_STRATEGIES = ["atomic", "pessimistic", "advisory", "optimistic"]


@dataclass
class BenchCase:
    """One measured case: who ran it, with which strategy, and what it reached."""

    runner: str  # "stockade", "pgbench" or "redis"
    strategy: str
    rate: float  # reservations committed per second
    mean_ms: float
    p99_ms: Optional[float] = None  # pgbench and redis-benchmark report no p99 here
    failed: int = 0  # requests that did not reserve (lost races, errors)
    extra: Dict[str, float] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.runner} {self.strategy}"


class Progress:
    """A progress line on stderr: a bar redrawn in place on a terminal, one line per
    step otherwise (logs, CI)."""

    def __init__(self, total: int, stream: Optional[TextIO] = None) -> None:
        stream = stream if stream is not None else sys.stderr
        self.total, self.done, self.stream = total, 0, stream
        self.tty = stream.isatty()
        self.started = time.monotonic()

    def step(self, label: str) -> None:
        width = 24
        filled = width * self.done // max(self.total, 1)
        elapsed = time.monotonic() - self.started
        line = (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done + 1}/{self.total} "
            f"{label} ({elapsed:.0f} s)"
        )
        self.done += 1
        if self.tty:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self.stream.write(f"done in {time.monotonic() - self.started:.0f} s\n")
        self.stream.flush()


def skus_named(prefix: str, count: int) -> List[str]:
    return [prefix] if count == 1 else [f"{prefix}-{i}" for i in range(1, count + 1)]


def run_stockade(
    engine: Engine,
    strategy: str,
    *,
    skus: int,
    clients: int,
    seconds: float,
    restock: Callable[[List[str]], None],
) -> BenchCase:
    """One strategy on fresh SKUs, driven by ``clients`` blocking C++ threads."""
    names = skus_named(f"bench-{strategy}-{time.monotonic_ns()}", skus)
    restock(names)
    r = drive_load(
        engine,
        names,
        clients=clients,
        seconds=seconds,
        ttl=timedelta(microseconds=TTL_US),
        strategy=Strategy(strategy),
    )
    return BenchCase(
        "stockade", strategy, r.per_second, r.mean_us / 1000, r.p99_us / 1000, r.failed
    )


# --- pgbench: the classic strategies in plain SQL ---

_KEY = "sku = :prefix::text || :i::text AND location = 'default'"
_INSERT = (
    "INSERT INTO {s}.reservation (id, sku, location, qty, state, version, expires_at, "
    "created_at, updated_at) "
)
_HOLD_VALUES = (
    "VALUES (gen_random_uuid(), :prefix::text || :i::text, 'default', 1, 'held', "
    "1, now() + interval '15 minutes', now(), now());"
)
_HOLD_FROM = (
    "SELECT gen_random_uuid(), sku, 'default', 1, 'held', 1, "
    "now() + interval '15 minutes', now(), now() FROM moved;"
)
_UPDATE = (
    "UPDATE {s}.stock SET reserved = reserved + 1, version = version + 1, "
    "updated_at = now() WHERE " + _KEY
)

PGBENCH_SCRIPTS = {
    # One conditional statement: the update and the reservation row together.
    "atomic": (
        "WITH moved AS ("
        + _UPDATE
        + " AND on_hand - reserved >= 1 RETURNING sku) "
        + _INSERT
        + _HOLD_FROM
    ),
    # Lock the row, read, decide, write, in one transaction.
    "pessimistic": (
        "BEGIN;\nSELECT on_hand - reserved AS avail FROM {s}.stock WHERE "
        + _KEY
        + " FOR UPDATE \\gset\n\\if :avail >= 1\n"
        + _UPDATE
        + ";\n"
        + _INSERT
        + _HOLD_VALUES
        + "\n\\endif\nCOMMIT;"
    ),
    # A named lock that is not the row, around the same read-decide-write.
    "advisory": (
        "BEGIN;\nSELECT pg_advisory_xact_lock(hashtext(:prefix::text || :i::text));\n"
        "SELECT on_hand - reserved AS avail FROM {s}.stock WHERE "
        + _KEY
        + " \\gset\n\\if :avail >= 1\n"
        + _UPDATE
        + ";\n"
        + _INSERT
        + _HOLD_VALUES
        + "\n\\endif\nCOMMIT;"
    ),
    # Read the version, write only if it is unchanged; a lost race writes nothing (a client
    # would retry: that is the wasted work this strategy pays).
    "optimistic": (
        "SELECT version AS v FROM {s}.stock WHERE " + _KEY + " \\gset\n"
        "WITH moved AS (" + _UPDATE + " AND version = :v AND on_hand - reserved >= 1"
        " RETURNING sku) " + _INSERT + _HOLD_FROM
    ),
}


def pgbench_script(strategy: str, schema: str) -> str:
    return "\\set i random(1, :nskus)\n" + PGBENCH_SCRIPTS[strategy].format(s=schema) + "\n"


def run_pgbench(
    dsn: str,
    schema: str,
    strategy: str,
    *,
    skus: int,
    clients: int,
    seconds: float,
    prepared: bool = True,
) -> BenchCase:
    """pgbench running ``strategy``'s SQL with ``clients`` connections for ``seconds``:
    prepared statements, or (``prepared=False``, as behind a transaction-mode pooler that
    keeps none) the extended protocol with unnamed ones, as stockade then sends."""
    prefix = f"pgbench-{strategy}-{time.monotonic_ns()}-"
    _stock_rows(dsn, schema, prefix, skus)
    out = _pgbench(
        dsn,
        pgbench_script(strategy, schema),
        clients=clients,
        seconds=seconds,
        defines={"nskus": str(skus), "prefix": prefix},
        prepared=prepared,
        what=strategy,
    )
    granted = int(
        run_sql(dsn, f"SELECT count(*) FROM {schema}.reservation WHERE sku LIKE '{prefix}%'")
    )
    tx = int(_field(out, r"number of transactions actually processed: (\d+)"))
    mean_ms = _field(out, r"latency average = ([\d.]+) ms")
    duration = _field(out, r"duration: (\d+) s")
    return BenchCase("pgbench", strategy, granted / duration, mean_ms, None, tx - granted)


def _stock_rows(dsn: str, schema: str, prefix: str, count: int) -> None:
    """Stock rows `prefix`1 .. `prefix`count, each with UNITS units, for a pgbench script."""
    run_sql(
        dsn,
        f"INSERT INTO {schema}.stock (sku, location, on_hand) SELECT '{prefix}' || i, "
        f"'default', {UNITS} FROM generate_series(1, {count}) AS i",
    )


def _pgbench(
    dsn: str,
    script: str,
    *,
    clients: int,
    seconds: float,
    defines: Dict[str, str],
    prepared: bool,
    what: str,
) -> str:
    """Runs pgbench on ``script`` (its variables in ``defines``); returns its report."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
        f.write(script)
    conninfo, env = child_connection(dsn)  # the password goes in pgbench's environment
    command = [
        str(find_bindir() / "pgbench"),
        "-n",
        "-M",
        "prepared" if prepared else "extended",
        "-c",
        str(clients),
        "-j",
        str(min(clients, os.cpu_count() or 2)),
        "-T",
        str(max(1, round(seconds))),
    ]
    for name, value in defines.items():
        command += ["-D", f"{name}={value}"]
    try:
        out = subprocess.run(
            [*command, "-f", f.name, conninfo],
            capture_output=True,
            text=True,
            env=env,
            timeout=seconds + 120,
        )
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise RuntimeError(f"pgbench failed for {what}: {out.stderr.strip()[-500:]}")
    return out.stdout


# --- the slow-flush regime, and the server's ceiling for one hot SKU ---

FLUSH_DELAY_MAX_US = 100_000  # commit_delay's own maximum


def slow_flush_settings(delay_us: int) -> Dict[str, str]:
    """Server settings under which every WAL flush first waits ``delay_us`` microseconds,
    as on a network-attached disk or with a synchronous standby: ``commit_delay`` with
    ``commit_siblings = 0`` makes each flush's leader sleep that long before it flushes
    (holding the WAL write lock, so commits that arrive meanwhile join its flush), which
    burns no CPU. 0 gives no settings (the machine's own disk)."""
    if not 0 <= delay_us <= FLUSH_DELAY_MAX_US:
        raise ValueError(f"the flush delay is 0 to {FLUSH_DELAY_MAX_US:,} microseconds")
    if delay_us == 0:
        return {}
    return {"commit_delay": str(delay_us), "commit_siblings": "0"}


@dataclass
class Ceiling:
    """What the server allows a hot SKU, measured with pgbench: a batch transaction (one
    stock row's UPDATE and ``batch`` reservation rows) by ``clients`` connections, on one
    stock row and spread over ``rows`` rows."""

    batch: int
    clients: int
    rows: int
    one_row_tps: float  # batch transactions per second on one row
    rows_tps: float  # ... spread over `rows` rows

    @property
    def commit_latency_ms(self) -> float:
        """How long one row stays locked per transaction: its writes, COMMIT and the flush
        (on one row the transactions run one after another, so 1 / their rate)."""
        return 1000.0 / self.one_row_tps

    def bound(self, clients: int) -> float:
        """Little's law: ``clients`` blocking clients reach at most clients / latency
        requests per second, if each request commits in the next transaction on its row."""
        return clients * self.one_row_tps  # clients / (1 / one_row_tps)

    def as_dict(self, clients: int) -> Dict[str, float]:
        return {
            **asdict(self),
            "one_row_rows_per_s": self.one_row_tps * self.batch,
            "rows_rows_per_s": self.rows_tps * self.batch,
            "commit_latency_ms": self.commit_latency_ms,
            "bound_clients": clients,
            "bound": self.bound(clients),
        }


CEILING_SCRIPT = """\\set r random(1, :nrows)
BEGIN;
UPDATE {s}.stock SET reserved = reserved + :batch, version = version + 1, updated_at = now()
    WHERE sku = :prefix::text || :r::text AND location = 'default' AND slot = 0;
INSERT INTO {s}.reservation (id, sku, location, qty, state, version, expires_at, created_at,
    updated_at) SELECT gen_random_uuid(), :prefix::text || :r::text, 'default', 1, 'held', 1,
    now() + interval '15 minutes', now(), now() FROM generate_series(1, :batch);
COMMIT;
"""


def run_ceiling(
    dsn: str, schema: str, *, rows: int, batch: int = 32, clients: int = 8, seconds: float = 3.0
) -> Ceiling:
    """The server's ceiling for one hot SKU (see Ceiling): pgbench on one row, then on
    ``rows`` rows, each for ``seconds``."""
    rates = []
    for nrows in (1, rows):
        prefix = f"ceiling-{nrows}-{time.monotonic_ns()}-"
        _stock_rows(dsn, schema, prefix, nrows)
        out = _pgbench(
            dsn,
            CEILING_SCRIPT.format(s=schema),
            clients=clients,
            seconds=seconds,
            defines={"nrows": str(nrows), "prefix": prefix, "batch": str(batch)},
            prepared=True,
            what="the ceiling",
        )
        tx = _field(out, r"number of transactions actually processed: (\d+)")
        rates.append(tx / _field(out, r"duration: (\d+) s"))
    return Ceiling(batch, clients, rows, rates[0], rates[1])


def _field(text: str, pattern: str) -> float:
    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"unexpected pgbench output (no {pattern!r}):\n{text[-800:]}")
    return float(match.group(1))


# --- Redis: a Lua check-and-decrement, when redis-server is installed ---

REDIS_LUA = (
    "local left = tonumber(redis.call('GET', KEYS[1]) or '0') "
    "if left < 1 then return 0 end "
    "redis.call('DECRBY', KEYS[1], 1) "
    "local id = redis.call('INCR', 'reservation:next') "
    "redis.call('HSET', 'reservation:' .. id, 'sku', KEYS[1], 'qty', 1, 'state', 'held') "
    "return id"
)


def redis_available() -> bool:
    return shutil.which("redis-server") is not None and shutil.which("redis-benchmark") is not None


def run_redis(fsync: str, *, skus: int, clients: int, requests: int) -> BenchCase:
    """redis-benchmark running the Lua reservation with ``appendfsync fsync``."""
    from .pgserver import _free_port

    port = _free_port()
    with tempfile.TemporaryDirectory() as data:
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", data]
        argv += ["--appendonly", "yes", "--appendfsync", fsync, "--save", ""]
        server = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _redis_wait(port)
            # redis-benchmark -r N puts a 12-digit number below N in place of __rand_int__.
            keys = ["stock"] if skus == 1 else [f"stock-{i:012d}" for i in range(skus)]
            for key in keys:
                _redis_cli(port, "SET", key, str(UNITS))
            key = "stock" if skus == 1 else "stock-__rand_int__"
            argv = ["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests)]
            argv += ["-r", str(skus), "--csv", "EVAL", REDIS_LUA, "1", key]
            out = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=600,
            )
            if out.returncode != 0:
                raise RuntimeError(f"redis-benchmark failed: {out.stderr.strip()[-500:]}")
            # --csv: a header ("test","rps","avg_latency_ms",...,"p99_latency_ms",...) and a
            # row; the test name is the whole command, commas included, so parse it as CSV
            # and read the columns by name.
            row = list(csv.DictReader(out.stdout.strip().splitlines()))[-1]
            granted = int(_redis_cli(port, "GET", "reservation:next") or "0")
            return BenchCase(
                "redis",
                f"lua, appendfsync {fsync}",
                float(row["rps"]),
                float(row["avg_latency_ms"]),
                float(row["p99_latency_ms"]),
                requests - granted,
            )
        finally:
            server.terminate()
            server.wait(30)


def _redis_cli(port: int, *args: str) -> str:
    out = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip()


def _redis_wait(port: int) -> None:
    deadline = time.monotonic() + 20
    while _redis_cli(port, "PING") != "PONG":
        if time.monotonic() > deadline:
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)


# --- reports ---


def markdown(cases: Sequence[BenchCase], title: str) -> str:
    """The cases as a table, each with its ratio to stockade's atomic; then stockade's
    ratio to each peer: the same strategy, and stockade's fastest case."""
    base = next((c.rate for c in cases if c.runner == "stockade" and c.strategy == "atomic"), None)
    lines = [
        f"### {title}",
        "",
        "| runner | strategy | reservations/s | mean ms | p99 ms | not reserved "
        "| vs stockade atomic |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in cases:
        vs_atomic = f"{c.rate / base:.1f}x" if base else "-"
        p99 = f"{c.p99_ms:.2f}" if c.p99_ms is not None else "-"
        lines.append(
            f"| {c.runner} | {c.strategy} | {c.rate:,.0f} | {c.mean_ms:.2f} | {p99} "
            f"| {c.failed:,} | {vs_atomic} |"
        )
    ours = {c.strategy: c for c in cases if c.runner == "stockade"}
    peers = [c for c in cases if c.runner != "stockade"]
    if ours and peers:
        best = max(ours.values(), key=lambda c: c.rate)
        lines += ["", "stockade's ratio to each peer:", ""]
        for peer in peers:
            twin = ours.get(peer.strategy)
            same = f"stockade {twin.strategy} {twin.rate / peer.rate:.2f}x, " if twin else ""
            lines.append(
                f"- {peer.label}: {same}stockade {best.strategy} {best.rate / peer.rate:.1f}x"
            )
    return "\n".join(lines) + "\n"


def write_reports(
    cases: Sequence[BenchCase], out_dir: Path, title: str, meta: Dict[str, object]
) -> List[Path]:
    """bench.md, bench.json and (with matplotlib installed) bench.png in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "bench.md", out_dir / "bench.json"]
    written[0].write_text(markdown(cases, title))
    written[1].write_text(
        json.dumps(
            {"title": title, **meta, "cases": [{**asdict(c), "label": c.label} for c in cases]},
            indent=2,
        )
    )
    png = plot(cases, title, out_dir / "bench.png")
    if png is not None:
        written.append(png)
    return written


def plot(cases: Sequence[BenchCase], title: str, path: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no PNG: install matplotlib for the plot)", file=sys.stderr)
        return None
    colors = {"stockade": "#1f77b4", "pgbench": "#7f7f7f", "redis": "#d62728"}
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(cases) + 1.5))
    labels = [c.label for c in cases]
    ax.barh(labels, [c.rate for c in cases], color=[colors[c.runner] for c in cases])
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("reservations committed per second (log scale)")
    ax.set_title(title, fontsize=10)
    for i, c in enumerate(cases):
        ax.text(c.rate, i, f" {c.rate:,.0f}", va="center", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
