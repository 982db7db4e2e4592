"""The `stockade` command line: the demo runs and reports every strategy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stockade.cli import main
from stockade.loadgen import NAIVE, flash_sale

import stockade


def demo_rows(out: str) -> dict[str, list[str]]:
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name in ["atomic", "pessimistic", "advisory", "optimistic", NAIVE]:
        assert name in rows, out
    return rows


def test_demo_reports_every_strategy_with_no_oversell(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--backend", "memory", "--buyers", "600", "--units", "50", "--clients", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = demo_rows(out)
    for name in ["atomic", "pessimistic", "advisory", "optimistic"]:
        granted, refused, failed, oversold = rows[name][1:5]
        assert (granted, refused, failed, oversold) == ("50", "550", "0", "0"), out


def test_demo_on_postgres_reports_every_strategy_with_no_oversell(
    capsys: pytest.CaptureFixture[str], stockade_database: str
) -> None:
    argv = ["demo", "--dsn", stockade_database, "--buyers", "200", "--units", "20",
            "--clients", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "PostgreSQL" in out
    rows = demo_rows(out)
    for name in ["atomic", "pessimistic", "advisory"]:
        assert rows[name][1:5] == ["20", "180", "0", "0"], out
    # An optimistic buyer may give up after its retries (failed), but never oversells.
    assert rows["optimistic"][1] == "20" and rows["optimistic"][4] == "0", out


def test_demo_on_an_unreachable_server_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--dsn", "host=127.0.0.1 port=1 connect_timeout=2 user=nobody"]
    assert main(argv) == 2
    assert "cannot connect to PostgreSQL" in capsys.readouterr().err


def test_python_dash_m_stockade_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "stockade", "--version"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("stockade ")


def test_flash_sale_report_counts_every_buyer(engine: stockade.Engine) -> None:
    report = flash_sale(engine, buyers=300, units=40, strategy="optimistic", clients=6)
    assert report.granted == 40 and report.oversold == 0
    assert report.granted + report.refused + report.failed == 300
    assert report.reserved_after == 40
    assert len(report.latencies_us) == 300 and report.throughput > 0
    assert 0 < report.percentile_us(0.5) <= report.percentile_us(0.99)
