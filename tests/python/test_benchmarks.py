"""The benchmarks still run end to end (at a tiny size; they check no figure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Each benchmark starts its own server (or cluster): the pooled pass would run it again
# unchanged.
pytestmark = pytest.mark.own_server


def run_benchmark(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs benchmarks/<script> with `args` (bounded: 300 s); it must exit 0."""
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


# hot_sku.py at a tiny size: 8 clients, 0.2 s a case.
TINY_HOT = ["--seconds", "0.2", "--clients", "8", "--window", "2", "--asyncio-tasks", "16"]


@pytest.mark.postgres
def test_hot_sku_benchmark_prints_every_table(tmp_path: Path) -> None:
    out = run_benchmark(
        "hot_sku.py",
        *TINY_HOT,
        "--cold-skus",
        "50",
        "--replicas",
        "2",
        "--json",
        str(tmp_path / "hot.json"),
    )
    titles = ("1. one hot SKU", "2. one hot SKU", "3. one hot SKU", "4. 50 cold SKUs")
    for title in (*titles, "5. one hot SKU, 8 C++ clients in 1 process and in 2"):
        assert title in out.stdout
    for strategy in ("atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"):
        assert f"| {strategy} |" in out.stdout
    assert "| batched, keyed |" in out.stdout and "keyed_vs_keyless_batched_hot" in out.stdout
    assert (tmp_path / "hot.json").read_text().count("rate") >= 16
    assert "replicas_2_vs_1_batched" in out.stdout
    # the ceiling of hot-row slots: a row per process, and one process over several rows
    assert "| auto, 2 x 4 clients, a SKU per process |" in out.stdout
    assert "| batched, 1 x 8 clients over 2 SKUs |" in out.stdout
    assert "replicas_2_own_skus_vs_1_auto" in out.stdout
    assert "one_process_2_skus_vs_1_batched" in out.stdout
    # hot-row slots: each replica on a slot of its own
    assert "| batched, 2 x 4 clients, 2 slots |" in out.stdout
    assert "replicas_2_slots_vs_1_auto" in out.stdout
    assert "| batched, sold out, 2 slots |" in out.stdout
    assert "sold_out_2_slots_vs_plain_atomic" in out.stdout
    # the server's ceiling, and the CPU each replica case costs
    assert "### 0. the server's ceiling" in out.stdout
    assert "Little's law for 8 blocking clients" in out.stdout
    assert "- batched, 2 x 4 clients: engine " in out.stdout
    report = json.loads((tmp_path / "hot.json").read_text())
    assert report["flush_delay_us"] == 0 and report["ceiling"]["bound"] > 0
    assert all(r["server_cpu_s_per_1000"] > 0 for r in report["hot_replicas"])


@pytest.mark.postgres
def test_hot_sku_benchmark_runs_with_a_slow_flush(tmp_path: Path) -> None:
    out = run_benchmark(
        "hot_sku.py",
        "--flush-delay-us",
        "2000",
        "--sections",
        "0,1",
        *TINY_HOT,
        "--json",
        str(tmp_path / "hot.json"),
    )
    assert "a slow flush: commit_delay = 2000 us with commit_siblings = 0" in out.stdout
    report = json.loads((tmp_path / "hot.json").read_text())
    assert report["flush_delay_us"] == 2000
    # a row's transactions wait for their flush, which waits 2 ms first
    assert report["ceiling"]["commit_latency_ms"] >= 2.0
    assert "| of the bound |" in out.stdout


@pytest.mark.postgres
def test_refused_memory_benchmark_prints_both_stores() -> None:
    out = run_benchmark(
        "refused_memory.py",
        "--requests",
        "2000",
        "--threads",
        "2",
    )
    assert "| memory | 2,000 |" in out.stdout and "| postgres | 2,000 |" in out.stdout


@pytest.mark.postgres
def test_retention_benchmark_prints_every_section(tmp_path: Path) -> None:
    out = run_benchmark(
        "retention.py",
        "--seconds",
        "0.2",
        "--rounds",
        "2",
        "--old-rows",
        "2000",
        "--warm-skus",
        "20",
        "--layout-rows",
        "2000",
        "--cycle",
        "0",
        "--steady-seconds",
        "1",
        "--retention",
        "0.2",
        "--live-holds",
        "2000",
        "--lapsed",
        "500",
        "--idle-seconds",
        "0.6",
        "--json",
        str(tmp_path / "retention.json"),
    )
    for title in ("### 1.", "### 2.", "### 3.", "### 3b.", "### 4.", "### 5.", "### 6.", "### 7."):
        assert title in out.stdout
    assert "| keyed (a fresh key each), round 2 |" in out.stdout
    assert "keyed against keyless over all rounds: " in out.stdout
    report = (tmp_path / "retention.json").read_text()
    for section in ("keyed_vs_keyless", "growth", "purge_under_load", "layout", "steady"):
        assert f'"{section}"' in report
    background = json.loads(report)["background"]
    for schema in ("fresh", "grown"):  # every lapsed hold expired, every old row purged
        assert [r["expired"] for r in background["runs"][schema]] == [500, 500]
        assert [r["purged"] for r in background["runs"][schema]] == [1000, 1000]


@pytest.mark.postgres
def test_patterns_benchmark_prints_every_run(tmp_path: Path) -> None:
    out = run_benchmark(
        "patterns.py",
        "--seconds",
        "0.2",
        "--warmup",
        "0.1",
        "--clients",
        "4",
        "--skus",
        "20",
        "--buyers",
        "50",
        "--py-threads",
        "2",
        "--json",
        str(tmp_path / "patterns.json"),
    )
    for label in ("reserve/patterns", "reserve/buyer", "sell/fenced", "wide/serializable"):
        assert label in out.stdout
    assert (tmp_path / "patterns.json").read_text().count('"rate"') == 13


@pytest.mark.postgres
def test_pooler_benchmark_prints_every_route(tmp_path: Path) -> None:
    from stockade.tools.pgbouncer import find_pgbouncer

    if find_pgbouncer() is None:
        pytest.skip("pgbouncer is not installed (Debian package pgbouncer)")
    out = run_benchmark(
        "pooler.py",
        "--seconds",
        "0.2",
        "--warmup",
        "0.1",
        "--clients",
        "4",
        "--skus",
        "20",
        "--server-pool",
        "2",
        "--json",
        str(tmp_path / "pooler.json"),
    )
    for label in ("direct/stateless", "direct/unnamed", "pgbouncer/2", "hot/auto", "wide/keyed"):
        assert label in out.stdout
    report = json.loads((tmp_path / "pooler.json").read_text())
    routes = ["direct", "direct/stateless", "direct/unnamed", "pgbouncer", "pgbouncer/unnamed"]
    cases = ("hot/auto", "hot/atomic", "wide/auto", "wide/keyed")
    rates = [report[r][case]["rate"] for r in [*routes, "pgbouncer/2"] for case in cases]
    assert len(rates) == 24 and min(rates) > 0
    # The unnamed routes really ran without the statement routines, the others with them.
    assert {r: report[r]["pool"]["routines"] for r in routes} == {
        "direct": False,  # prepared statements
        "direct/stateless": True,
        "direct/unnamed": False,
        "pgbouncer": True,
        "pgbouncer/unnamed": False,
    }


@pytest.mark.citus
def test_citus_benchmark_prints_every_route(stockade_citus: object) -> None:
    # stockade_citus (conftest) skips this where the Citus build does not fit; the script
    # starts a cluster of its own.
    out = run_benchmark(
        "citus.py",
        "--seconds",
        "0.3",
        "--warmup",
        "0.1",
        "--clients",
        "4",
        "--skus",
        "20",
        "--shards",
        "4",
        "--purge-skus",
        "8",
        "--purge-rows",
        "100",
        "--cases",  # hot and wide, keyed, a pool, a shared pool, the statement forms
        "hot/auto,wide/keyed,hot/allocate,wide/allocate-shared,hot/keyed-sell,hot/buyers",
    )
    for route in ("single", "single/stateless", "citus", "citus/direct", "citus/literal"):
        assert route in out.stdout
    for case in ("hot/auto", "wide/keyed", "hot/allocate", "wide/allocate-shared"):
        assert case in out.stdout
    # The statement forms' cases run on every route, citus/literal too; the others not
    # there ("-").
    rates = out.stdout.split("CPU seconds per 1,000")[0].splitlines()
    for case in ("hot/keyed-sell", "hot/buyers"):
        (line,) = [line for line in rates if line.lstrip().startswith(case + " ")]
        assert line.count("/s ") == 5 and not line.rstrip().endswith("-"), line
    (line,) = [line for line in rates if line.lstrip().startswith("hot/auto ")]
    assert line.count("/s ") == 4 and line.rstrip().endswith("-"), line
    # The shared cases' SKUs were chosen by the hash Citus uses: its placement agrees.
    assert "shared cases: 0 SKUs with rows on more than one shard" in out.stdout
    assert " f0 " in out.stdout and " f1" not in out.stdout
    assert "purge() of keyed" in out.stdout and out.stdout.count(" rows/s ") == 4
    # Each case's CPU per request on the single server and on each node of the cluster.
    tables = out.stdout.split("CPU seconds per 1,000 granted requests")[1:]
    assert len(tables) == 2 and "(citus/direct)" in tables[1]
    assert all(case in tables[1] for case in ("hot/auto", "wide/keyed", "wide/allocate-shared"))


@pytest.mark.citus
def test_citus_sessions_benchmark_reports_the_workers_sessions(
    stockade_citus: object, tmp_path: Path
) -> None:
    out = run_benchmark(
        "citus_sessions.py",
        *("--calls", "200", "--clients", "2", "--skus", "10", "--seconds", "0.4"),
        *("--json", str(tmp_path / "s.json")),
    )
    rounds = json.loads((tmp_path / "s.json").read_text())["rounds"]
    assert rounds and rounds[-1]["calls"] >= 200
    assert all(r["kib"] > 0 for r in rounds)  # the engine's sessions on the workers, found
    assert "bytes a call" in out.stdout and "misses 0" in out.stdout


@pytest.mark.postgres
def test_journal_benchmark_prints_every_section(tmp_path: Path) -> None:
    out = run_benchmark(
        "journal.py",
        "--seconds",
        "0.2",
        "--rounds",
        "2",
        "--lag-seconds",
        "0.5",
        "--reservations",
        "2000",
        "--json",
        str(tmp_path / "journal.json"),
    )
    for title in ("## 1.", "## 2.", "## 3."):
        assert title in out.stdout
    report = json.loads((tmp_path / "journal.json").read_text())
    assert set(report["overhead"]) == {"batched", "atomic"}
    lag = report["lag"]
    assert lag["changes_read"] == lag["changes_written"]  # the consumer missed nothing
    assert report["audit"]["reservations"] >= 2000


@pytest.mark.citus
def test_journal_benchmark_runs_on_citus(stockade_citus: object, tmp_path: Path) -> None:
    # stockade_citus (conftest) skips this where the Citus build does not fit; the script
    # starts a cluster of its own.
    out = run_benchmark(
        "journal.py", "--citus", "--sections", "1,2", "--seconds", "0.2", "--rounds", "2",
        "--lag-seconds", "0.5", "--json", str(tmp_path / "journal.json"),
    )  # fmt: skip
    assert "Citus cluster" in out.stdout
    report = json.loads((tmp_path / "journal.json").read_text())
    assert report["citus"] and set(report["overhead"]) == {"batched", "atomic"}
    lag = report["lag"]
    assert lag["changes_read"] == lag["changes_written"] > 0  # every node read, nothing missed


def test_lifecycle_benchmark_prints_every_case(tmp_path: Path) -> None:
    out = run_benchmark(
        "lifecycle.py", "--seconds", "0.2", "--clients", "8", "--rounds", "1",
        "--json", str(tmp_path / "lifecycle.json"),
    )  # fmt: skip
    assert "partial / whole" in out.stdout and "one step / whole" in out.stdout
    report = json.loads((tmp_path / "lifecycle.json").read_text())
    assert set(report["runs"]) == {"whole", "partial", "one step"}
    for runs in report["runs"].values():
        assert runs[0]["granted"] > 0 and runs[0]["failed"] == 0
        assert runs[0]["reserved_left"] == 0  # every order settled its whole hold
    assert "audit clean: True" in out.stdout


def test_orders_benchmark_prints_every_ratio(tmp_path: Path) -> None:
    out = run_benchmark(
        "orders.py", "--seconds", "0.2", "--threads", "4", "--rounds", "1",
        "--json", str(tmp_path / "orders.json"),
    )  # fmt: skip
    report = json.loads((tmp_path / "orders.json").read_text())
    assert set(report["ratios"]) == {
        "confirm_order / 3 x confirm",
        "reserve, batched, ref / reserve, batched",
    }
    assert all(rates[0] > 0 for rates in report["rates"].values())
    assert report["audit_ok"] and report["held_left"] == 0  # every order settled whole
    assert "audit clean: True" in out.stdout


def test_keyed_writes_benchmark_prints_every_ratio(tmp_path: Path) -> None:
    out = run_benchmark(
        "keyed_writes.py", "--seconds", "0.2", "--clients", "8", "--rounds", "1",
        "--json", str(tmp_path / "keyed.json"),
    )  # fmt: skip
    report = json.loads((tmp_path / "keyed.json").read_text())
    assert set(report["ratios"]) == {
        "sell atomic, keyed / sell atomic",
        "sell batched, keyed / sell batched",
        "restock atomic, keyed / restock atomic",
    }
    for runs in report["runs"].values():
        assert runs[0]["calls_per_s"] > 0 and runs[0]["failed"] == 0
    assert "audit clean: True" in out.stdout


def test_locations_benchmark_prints_every_ratio(tmp_path: Path) -> None:
    out = run_benchmark(
        "locations.py", "--seconds", "0.2", "--clients", "8", "--rounds", "1",
        "--json", str(tmp_path / "locations.json"),
    )  # fmt: skip
    assert "allocate batched / reserve" in out.stdout
    assert "allocate auto / allocate atomic" in out.stdout
    report = json.loads((tmp_path / "locations.json").read_text())
    assert set(report["runs"]) == {
        "reserve", "allocate batched", "allocate auto", "allocate atomic", "drained batched"
    }  # fmt: skip
    for case, runs in report["runs"].items():
        assert runs[0]["granted"] > 0 and runs[0]["failed"] == 0, case
    drained = report["runs"]["drained batched"][0]["held"]
    assert drained["north"] == 0 and drained["south"] > 0  # the walk passed north over
    assert "audit clean: True" in out.stdout
