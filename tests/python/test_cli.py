"""The `stockade` command line: the demo runs and reports every strategy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stockade.cli import main
from stockade.loadgen import NAIVE, flash_sale

import stockade


def test_demo_reports_every_strategy_with_no_oversell(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--buyers", "600", "--units", "50", "--clients", "8"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name in ["atomic", "pessimistic", "advisory", "optimistic", NAIVE]:
        assert name in rows, out
    for name in ["atomic", "pessimistic", "advisory", "optimistic"]:
        granted, refused, failed, oversold = rows[name][1:5]
        assert (granted, refused, failed, oversold) == ("50", "550", "0", "0"), out


def test_demo_on_an_unbuilt_backend_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "postgres"]) == 2
    assert "not built yet" in capsys.readouterr().err


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
