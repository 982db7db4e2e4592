"""Logging (the `stockade` loggers, fed by the core) and Prometheus metrics
(stockade.prometheus), on both stores."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, List

import pytest

import stockade
from stockade import _core
from stockade.tools.pytest_plugin import PostgresForTests
from support import wait_for

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import stockade.prometheus  # noqa: E402
from stockade.prometheus import StockadeCollector  # noqa: E402


def messages(caplog: pytest.LogCaptureFixture, name: str) -> List[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


# --- logging ---


def test_core_records_reach_the_stockade_loggers_at_their_level(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with stockade.Engine.memory():  # starts the log thread
        pass
    caplog.set_level(logging.WARNING, logger="stockade")
    time.sleep(0.5)  # the log thread reads the level again
    _core.log_for_test(logging.INFO, "quiet-info")
    _core.log_for_test(logging.WARNING, "loud-warning")
    assert wait_for(lambda: "loud-warning" in messages(caplog, "stockade"))
    assert "quiet-info" not in messages(caplog, "stockade")
    caplog.set_level(logging.INFO, logger="stockade")
    time.sleep(0.5)
    _core.log_for_test(logging.INFO, "now-info")
    assert wait_for(lambda: "now-info" in messages(caplog, "stockade"))
    record = next(r for r in caplog.records if r.getMessage() == "now-info")
    assert record.levelno == logging.INFO and abs(record.created - time.time()) < 10


def test_migrations_and_connections_are_logged_without_secrets(
    stockade_postgres: PostgresForTests, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stockade")
    time.sleep(0.5)
    name = stockade_postgres.new_database(migrated=False)
    try:
        dsn = stockade_postgres.dsn(name) + " password=sekrit-pass"
        with stockade.Engine.postgres(dsn) as eng:
            eng.migrate()
        assert wait_for(
            lambda: any(
                "applied migration 002_retention.sql" in m
                for m in messages(caplog, "stockade.postgres")
            )
        )
        assert wait_for(
            lambda: any(
                m.startswith("made ") and "statement routines" in m
                for m in messages(caplog, "stockade.postgres")
            )
        )
        connected = [m for m in messages(caplog, "stockade") if m.startswith("connected")]
        assert connected and f"dbname='{name}'" in connected[0]
    finally:
        stockade_postgres.drop_database(name)
    with pytest.raises(stockade.Unavailable):
        stockade.Engine.postgres(
            "host=127.0.0.1 port=1 user=u password=sekrit-pass connect_timeout=2"
        )
    assert wait_for(
        lambda: any("cannot connect" in m for m in messages(caplog, "stockade.postgres"))
    )
    assert all("sekrit" not in r.getMessage() for r in caplog.records)


def test_sweeper_leadership_is_logged(
    stockade_database: str, pooled: bool, caplog: pytest.LogCaptureFixture
) -> None:
    if pooled:
        pytest.skip(
            "behind a transaction-mode pooler the sweeper is elected per transaction, and "
            "engines taking turns is logged at debug"
        )
    caplog.set_level(logging.INFO, logger="stockade")
    time.sleep(0.5)
    with stockade.Engine.postgres(
        stockade_database, sweeper=True, sweep_interval=timedelta(milliseconds=50)
    ):
        assert wait_for(
            lambda: any("now sweeps" in m for m in messages(caplog, "stockade.sweeper"))
        )


# --- Prometheus ---


def scrape(collector: StockadeCollector) -> Dict[str, Dict[tuple, float]]:
    """Sample name -> {sorted label pairs: value}, through the text exposition format."""
    registry = prometheus_client.CollectorRegistry()
    collector.register(registry)
    text = prometheus_client.generate_latest(registry).decode()
    out: Dict[str, Dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("stockade_")
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def labels(**pairs: str) -> tuple:
    return tuple(sorted(pairs.items()))


def test_calls_outcomes_and_latency_are_exported(engine: stockade.Engine) -> None:
    engine.restock("s", 3)
    for _ in range(3):
        engine.reserve("s", 1, strategy="atomic")
    with pytest.raises(stockade.OutOfStock):
        engine.reserve("s", 1, strategy="atomic")
    engine.restock("b", 5)
    engine.reserve("b", 2, strategy="batched")
    m = scrape(StockadeCollector(engine))
    calls = m["stockade_calls_total"]
    assert calls[labels(op="reserve", strategy="atomic", outcome="ok")] == 3
    assert calls[labels(op="reserve", strategy="atomic", outcome="out_of_stock")] == 1
    assert calls[labels(op="reserve", strategy="batched", outcome="ok")] == 1
    assert calls[labels(op="restock", strategy="none", outcome="ok")] == 2
    count = m["stockade_call_duration_seconds_count"]
    assert count[labels(op="reserve", strategy="atomic")] == 4
    buckets = m["stockade_call_duration_seconds_bucket"]
    assert buckets[labels(op="reserve", strategy="atomic", le="+Inf")] == 4
    assert m["stockade_call_duration_seconds_sum"][labels(op="reserve", strategy="atomic")] > 0
    assert m["stockade_batch_size_count"][()] >= 1
    assert m["stockade_up"][()] == 1
    assert m["stockade_rows"][labels(kind="held")] == 4
    assert "stockade_lock_wait_seconds_total" in m and "stockade_purged_total" in m
    assert "stockade_batch_gathered_total" in m
    slots = m["stockade_auto_slots_total"]
    assert {slots[labels(outcome=o)] for o in ("split", "learned", "kept", "merged")} == {0}


def test_hot_sku_labels_are_bounded(engine: stockade.Engine) -> None:
    for n in range(30):
        engine.restock(f"sku-{n}", 100)
        for _ in range(n % 4 + 1):
            engine.reserve(f"sku-{n}", 1)
    m = scrape(StockadeCollector(engine, hottest_skus=5, engine_label="shop"))
    assert len(m["stockade_hot_sku_requests"]) == 5
    assert all(("engine", "shop") in key for key in m["stockade_hot_sku_requests"])
    assert max(m["stockade_hot_sku_requests"].values()) == 4


def test_pool_and_sweeper_gauges_and_a_failed_scrape(stockade_database: str) -> None:
    eng = stockade.Engine.postgres(
        stockade_database, pool_size=3, sweeper=True, sweep_interval=timedelta(milliseconds=50)
    )
    collector = StockadeCollector(eng)
    eng.restock("s", 1)
    assert wait_for(lambda: eng.stats()["sweeper"]["leader"])
    m = scrape(collector)
    assert m["stockade_pool_size"][()] == 3
    in_use = m["stockade_pool_connections"][labels(state="in_use")]
    idle = m["stockade_pool_connections"][labels(state="idle")]
    assert 1 <= in_use + idle <= 3 and m["stockade_pool_waiting"][()] == 0
    assert m["stockade_sweeper_leader"][()] == 1
    assert m["stockade_audit_violations"][()] == -1  # no audit ran yet
    assert eng.audit().ok
    assert scrape(collector)["stockade_audit_violations"][()] == 0
    eng.close()
    m = scrape(collector)  # stats() now fails: the scrape says so and still exports calls
    assert m["stockade_up"][()] == 0
    assert m["stockade_calls_total"][labels(op="restock", strategy="none", outcome="ok")] == 1


def test_collector_arguments_are_checked(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.InvalidType):
        StockadeCollector("engine")  # type: ignore[arg-type]
    with pytest.raises(stockade.InvalidArgument):
        StockadeCollector(engine, hottest_skus=1000)


# --- pre-fork servers: one scrape answers for every worker ---

WORKER = r"""
import sys
import stockade
from stockade.prometheus import StockadeCollector

eng = stockade.Engine.memory()
eng.restock("s", 100)
for _ in range(int(sys.argv[2])):
    eng.reserve("s", 1, strategy="atomic")
collector = StockadeCollector(eng, multiprocess_dir=sys.argv[1], publish_interval=0.05)
print(__import__("os").getpid(), flush=True)
if sys.argv[3] == "stay":
    sys.stdin.readline()  # live until the test says
collector.close()
"""


def worker(directory: str, reserves: int, stay: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, directory, str(reserves), "stay" if stay else "go"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_scrape_answers_for_every_worker_of_a_pre_fork_service(tmp_path: Path) -> None:
    # Two workers that ran and exited, one still alive, and the scraped one: counters and
    # histograms add up over all four, gauges over the live two, and folding the dead
    # workers into the archive changes no total.
    dead = []
    for n in (3, 5):
        proc = worker(str(tmp_path), n, stay=False)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        dead.append(int(out.split()[0]))
    live = worker(str(tmp_path), 7, stay=True)
    assert live.stdout is not None
    live.stdout.readline()  # it has published
    try:
        with stockade.Engine.memory() as eng:
            eng.restock("s", 10)
            eng.reserve("s", 1, strategy="atomic")
            with StockadeCollector(eng, multiprocess_dir=tmp_path) as collector:
                ok = labels(op="reserve", strategy="atomic", outcome="ok")
                m = scrape(collector)
                assert m["stockade_calls_total"][ok] == 3 + 5 + 7 + 1
                restocks = labels(op="restock", strategy="none", outcome="ok")
                assert m["stockade_calls_total"][restocks] == 4
                assert (
                    m["stockade_call_duration_seconds_count"][
                        labels(op="reserve", strategy="atomic")
                    ]
                    == 16
                )
                # gauges: the live worker and this one only
                hot = m["stockade_hot_sku_requests"][labels(sku="s", location="default")]
                assert hot == 1 + 7  # the reserves of the live two
                assert m["stockade_rows"][labels(kind="held")] == 7  # the largest
                assert m["stockade_up"][()] == 1
                for pid in dead:
                    stockade.prometheus.mark_process_dead(pid, tmp_path)
                pids = {p.name.split("_")[1] for p in tmp_path.glob("stockade_*_*.json")}
                assert pids == {str(live.pid), str(os.getpid())}
                assert (tmp_path / "stockade_archive.json").exists()
                again = scrape(collector)
                assert again["stockade_calls_total"][ok] == 16
                assert (
                    again["stockade_call_duration_seconds_count"]
                    == m["stockade_call_duration_seconds_count"]
                )
    finally:
        live.communicate("\n", timeout=60)
    # The live worker exited after a last publish: its counts stay, its gauges go.
    with stockade.Engine.memory() as eng:
        m = scrape(StockadeCollector(eng, multiprocess_dir=tmp_path))
        ok = labels(op="reserve", strategy="atomic", outcome="ok")
        assert m["stockade_calls_total"][ok] == 16
        assert labels(sku="s", location="default") not in m.get("stockade_hot_sku_requests", {})


KILLED_WORKER = r"""
import sys
import stockade
from stockade.prometheus import StockadeCollector

eng = stockade.Engine.memory()
eng.restock("s", 100)
for _ in range(3):
    eng.reserve("s", 1, strategy="atomic")
collector = StockadeCollector(eng, multiprocess_dir=sys.argv[1], publish_interval=3600)
for _ in range(4):  # after its one publish, and no other before the kill
    eng.reserve("s", 1, strategy="atomic")
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_worker_killed_with_sigkill_loses_its_last_counts_and_no_total_goes_down(
    tmp_path: Path,
) -> None:
    # What docs/service.md says of a kill -9: the counts a worker made since its last
    # publish are lost (no scrape showed them), and no total goes down across its death.
    with subprocess.Popen(
        [sys.executable, "-c", KILLED_WORKER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            ok = labels(op="reserve", strategy="atomic", outcome="ok")
            with stockade.Engine.memory() as eng:
                with StockadeCollector(eng, multiprocess_dir=tmp_path) as collector:
                    before = scrape(collector)["stockade_calls_total"][ok]
                    proc.kill()
                    proc.wait(timeout=60)
                    after = scrape(collector)["stockade_calls_total"][ok]
                    stockade.prometheus.mark_process_dead(proc.pid, tmp_path)
                    archived = scrape(collector)["stockade_calls_total"][ok]
            assert before == after == archived == 3  # 7 made; the 4 after its publish are lost
        finally:
            proc.kill()


def test_without_a_multiprocess_directory_a_collector_is_per_process(
    engine: stockade.Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    with pytest.raises(stockade.InvalidArgument, match="PROMETHEUS_MULTIPROC_DIR"):
        StockadeCollector(engine)
    with StockadeCollector(engine, multiprocess_dir="") as collector:  # "" turns it off
        assert "stockade_up" in scrape(collector)
    assert not tmp_path.exists() or not list(tmp_path.glob("stockade_*.json"))
    with pytest.raises(stockade.InvalidArgument):
        StockadeCollector(engine, multiprocess_dir=tmp_path, publish_interval=0)
