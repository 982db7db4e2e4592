"""The `stockade` command line: the demo runs and reports every strategy; bench writes its
table, JSON and plot, with its peers; migrate and advise do what they say."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import stockade
from stockade.tools.cli import main
from stockade.tools.loadgen import NAIVE, flash_sale
from stockade.tools.pgserver import run_sql
from support import ALL_STRATEGIES, MIGRATIONS, PER_REQUEST_STRATEGIES


def demo_rows(out: str) -> dict[str, list[str]]:
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    for name in [*PER_REQUEST_STRATEGIES, NAIVE]:
        assert name in rows, out
    return rows


def test_demo_reports_every_strategy_with_no_oversell(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["demo", "--backend", "memory", "--buyers", "600", "--units", "50", "--clients", "8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = demo_rows(out)
    for name in ALL_STRATEGIES:
        granted, refused, failed, oversold = rows[name][1:5]
        assert (granted, refused, failed, oversold) == ("50", "550", "0", "0"), out


def test_demo_on_postgres_reports_every_strategy_with_no_oversell(
    capsys: pytest.CaptureFixture[str], stockade_database: str
) -> None:
    argv = [
        "demo",
        "--dsn",
        stockade_database,
        "--buyers",
        "200",
        "--units",
        "20",
        "--clients",
        "8",
    ]
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
    out = subprocess.run(
        [sys.executable, "-m", "stockade", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.startswith("stockade ")


def test_flash_sale_report_counts_every_buyer(engine: stockade.Engine) -> None:
    report = flash_sale(engine, buyers=300, units=40, strategy="optimistic", clients=6)
    assert report.granted == 40 and report.oversold == 0
    assert report.granted + report.refused + report.failed == 300
    assert report.reserved_after == 40
    assert len(report.latencies_us) == 300 and report.throughput > 0
    assert 0 < report.percentile_us(0.5) <= report.percentile_us(0.99)


def test_bench_on_memory_writes_table_json_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "bench",
        "--backend",
        "memory",
        "--seconds",
        "0.1",
        "--clients",
        "4",
        "--strategies",
        "atomic,batched",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "| stockade | atomic |" in out.out and "| stockade | batched |" in out.out
    assert "2/2" in out.err  # the progress line
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [c["strategy"] for c in report["cases"]] == ["atomic", "batched"]
    assert all(c["rate"] > 0 for c in report["cases"])
    assert (tmp_path / "bench.md").read_text().startswith("### ")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_peers_runs_pgbench_and_redis_next_to_stockade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], stockade_database: str
) -> None:
    argv = [
        "bench",
        "--dsn",
        stockade_database,
        "--peers",
        "--seconds",
        "0.5",
        "--clients",
        "4",
        "--skus",
        "3",
        "--strategies",
        "atomic,pessimistic,batched",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    cases = json.loads((tmp_path / "bench.json").read_text())["cases"]
    runners = {(c["runner"], c["strategy"]) for c in cases}
    for strategy in PER_REQUEST_STRATEGIES:
        assert ("pgbench", strategy) in runners
    assert all(c["rate"] > 0 for c in cases if c["strategy"] != "optimistic")
    assert "- pgbench atomic: stockade atomic" in out
    if shutil.which("redis-server"):
        assert ("redis", "lua, appendfsync always") in runners
        assert "- redis lua, appendfsync everysec: stockade" in out


@pytest.mark.postgres
@pytest.mark.own_server
def test_bench_slow_flush_delays_every_flush_and_measures_the_ceiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("STOCKADE_DSN", "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)  # the throwaway server, with the delay
    monkeypatch.delenv("PGSERVICE", raising=False)
    argv = ["bench", "--flush-delay-us", "2000", "--seconds", "1", "--clients", "4"]
    argv += ["--strategies", "batched", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["flush_delay_us"] == 2000
    assert "each WAL flush delayed 2000 us" in report["title"]
    ceiling = report["ceiling"]
    # Each transaction on one row waits for its own flush, which waits 2 ms first: the
    # delay did reach the server (a slower machine only makes this longer).
    assert ceiling["commit_latency_ms"] >= 2.0
    assert ceiling["rows_tps"] > 0 and ceiling["bound"] == pytest.approx(
        4 / (ceiling["commit_latency_ms"] / 1000)
    )
    assert "Little's law" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--backend", "memory", "--flush-delay-us", "2000"], "does not combine"),
        (["--dsn", "host=127.0.0.1 dbname=x", "--flush-delay-us", "2000"], "does not combine"),
        (["--flush-delay-us", "100001"], "--flush-delay-us: must be from 0 to 100000"),
        (["--flush-delay-us", "-1"], "--flush-delay-us: must be from 0 to 100000"),
    ],
)
def test_bench_refuses_a_flush_delay_it_cannot_apply(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_refuses_peers_on_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--backend", "memory", "--peers"]) == 2
    assert "--peers needs PostgreSQL" in capsys.readouterr().err


def test_migrate_applies_then_reports_up_to_date(
    empty_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop"]) == 0
    assert "applied to schema shop: 001_schema.sql" in capsys.readouterr().out
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop"]) == 0
    assert "schema shop is up to date" in capsys.readouterr().out


@pytest.fixture
def empty_db(stockade_postgres: object) -> object:
    from stockade.tools.pytest_plugin import PostgresForTests

    assert isinstance(stockade_postgres, PostgresForTests)
    name = "stockade_cli_migrate"
    stockade_postgres.drop_database(name)
    stockade_postgres.sql(f"CREATE DATABASE {name}")
    yield stockade_postgres.dsn(name)
    stockade_postgres.drop_database(name)  # WITH (FORCE): a pooler may hold connections


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--single-statement", "yes"], "=> atomic"),
        (["--single-statement", "no", "--fits-in-transaction", "no"], "=> optimistic"),
        (
            [
                "--single-statement",
                "no",
                "--fits-in-transaction",
                "yes",
                "--conflict-rate",
                "0.8",
                "--retry",
                "safe",
            ],
            "=> batched",
        ),
        (
            [
                "--single-statement",
                "no",
                "--fits-in-transaction",
                "yes",
                "--conflict-rate",
                "0.8",
                "--retry",
                "unsafe",
            ],
            "=> pessimistic",
        ),
    ],
)
def test_advise_answers_from_flags(
    flags: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise", *flags]) == 0
    assert expected in capsys.readouterr().out


def test_advise_asks_the_questions_it_was_not_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("maybe\nno\nyes\n2\n0.01\nsafe\n"))
    assert main(["advise"]) == 0
    out = capsys.readouterr().out
    assert "please answer one of: yes, no" in out and "between 0 and 1" in out
    assert "=> optimistic" in out and "odds: 1% of writes" in out


# --- --help, --json, --dry-run, --keep ---


@pytest.mark.parametrize("command", ["demo", "bench", "migrate", "advise", "audit"])
def test_every_command_explains_itself_and_shows_its_defaults(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "(default:" in out
    assert len(out.split("options:")[0]) > 80  # a description, not just the usage line


def test_migrate_dry_run_prints_the_sql_and_changes_nothing(
    empty_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--dry-run"]) == 0
    sql = capsys.readouterr().out
    assert "-- (create schema)" in sql and "CREATE SCHEMA IF NOT EXISTS shop" in sql
    assert "CREATE TABLE shop.stock" in sql and "-- 002_retention.sql" in sql
    assert "{{schema}}" not in sql
    # Nothing ran: the same plan, and then the real thing, one migration at a time.
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    # With every migration applied, migrate() makes the statement routines too.
    assert [p["name"] for p in plan] == ["(create schema)", *MIGRATIONS, "(statement routines)"]
    assert "-- shop.stockade_hold_atomic_" in plan[-1]["sql"]
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--to", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"schema": "shop", "applied": ["001_schema.sql"]}
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--dry-run", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert [p["name"] for p in plan] == [*MIGRATIONS[1:], "(statement routines)"]
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--to", "1", "--dry-run"]) == 0
    assert "-- schema shop is up to date" in capsys.readouterr().out  # none short of the last
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop"]) == 0
    capsys.readouterr()
    assert main(["migrate", "--dsn", empty_db, "--schema", "shop", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"] == []  # the routines were made


def test_demo_json_and_the_schema_it_leaves_behind(
    stockade_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "demo",
        "--dsn",
        stockade_database,
        "--buyers",
        "60",
        "--units",
        "10",
        "--clients",
        "4",
        "--json",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["exact"] is True and report["units"] == 10
    by_name = {r["strategy"]: r for r in report["strategies"]}
    assert by_name["atomic"]["granted"] == 10 and by_name["atomic"]["oversold"] == 0
    assert "dropped the schema stockade_demo" in captured.err

    def demo_schema_exists() -> bool:
        with stockade.Engine.postgres(stockade_database, schema="stockade_demo") as eng:
            return not eng.migration_plan() or eng.migration_plan()[0][0] != "(create schema)"

    assert not demo_schema_exists()
    assert main([*argv, "--keep"]) == 0
    assert demo_schema_exists()
    assert main(argv) == 0  # it was there before: left in place
    assert "left the schema stockade_demo in place" in capsys.readouterr().err
    assert demo_schema_exists()
    # A schema of the same name that someone else made (no migration table) is never
    # dropped either: the demo migrates into it and leaves it.
    with stockade.Engine.postgres(stockade_database, schema="stockade_demo") as eng:
        eng.drop_schema(confirm="stockade_demo")
    run_sql(stockade_database, "CREATE SCHEMA stockade_demo")
    run_sql(stockade_database, "CREATE TABLE stockade_demo.theirs (x int)")
    assert main(argv) == 0
    assert "left the schema stockade_demo in place" in capsys.readouterr().err
    assert run_sql(stockade_database, "SELECT count(*) FROM stockade_demo.theirs") == "0"


def test_advise_and_bench_speak_json(
    stockade_database: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["advise", "--json", "--single-statement", "yes"]) == 0
    advice = json.loads(capsys.readouterr().out)
    assert advice["strategy"] == "atomic" and advice["reasons"]
    argv = [
        "bench",
        "--dsn",
        stockade_database,
        "--seconds",
        "0.2",
        "--clients",
        "2",
        "--strategies",
        "atomic",
        "--out",
        str(tmp_path),
        "--json",
    ]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stockade_version"] == stockade.__version__
    assert report["postgres_version"][:2].isdigit() and "T" in report["timestamp"]
    assert [c["strategy"] for c in report["cases"]] == ["atomic"]


# --- usage errors, errors, and the help's defaults ---

USAGE_ERRORS = [
    ["demo", "--backend", "memory", "--clients", "0"],
    ["demo", "--backend", "memory", "--buyers", "-5"],
    ["demo", "--backend", "memory", "--units", "many"],
    ["demo", "--backend", "memory", "--dsn", "host=127.0.0.1 port=1"],
    ["advise", "--single-statement", "no", "--fits-in-transaction", "yes",
     "--conflict-rate", "2", "--retry", "safe"],
    ["advise", "--conflict-rate", "nan"],
    ["bench", "--backend", "memory", "--clients", "0"],
    ["bench", "--backend", "memory", "--seconds", "inf"],
    ["audit", "--dsn", "host=127.0.0.1 port=1", "--limit", "0"],
    ["audit", "--dsn", "host=127.0.0.1 port=1", "--expiry-lag", "-1"],
    ["migrate", "--dsn", "host=127.0.0.1 port=1", "--no-such-option"],
    ["no-such-command"],
    [],
]  # fmt: skip


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=lambda a: " ".join(a) or "(nothing)")
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_usage_error_exits_2_with_one_line_and_no_prompt(
    argv: list[str],
    as_json: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Goal: a command line a command cannot run exits 2 with one argparse-style line on
    # stderr, never a traceback, a usage dump or a prompt (stdin is closed); with --json,
    # stdout carries a JSON error object and nothing else.
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main([*argv, "--json"] if as_json else argv) == 2
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stockade") and ": error: " in lines[0], err
    if as_json:
        assert json.loads(out)["error"]["code"] == "usage", out
        assert json.loads(out)["error"]["message"] == lines[0]
    else:
        assert out == "", out  # no prompt, no report


def test_a_demo_with_no_client_says_so_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--backend", "memory", "--clients", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "stockade demo: error: argument --clients: must be from 1 to 1024, got 0\n"


def test_an_out_of_range_conflict_rate_never_reaches_the_prompt() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "advise", "--single-statement", "no",
         "--fits-in-transaction", "yes", "--conflict-rate", "2", "--retry", "safe"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "Odds" not in done.stdout and "please answer" not in done.stdout
    assert done.stderr == (
        "stockade advise: error: argument --conflict-rate: must be from 0 to 1, got 2\n"
    )


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_error_is_printed_once(as_json: bool) -> None:
    # Goal: an error reaches the user once: the command's own line, not also the core's
    # log record of the same failure through Python's last-resort handler.
    json_flag = ["--json"] if as_json else []
    done = subprocess.run(
        [sys.executable, "-m", "stockade", "audit", "--dsn",
         "host=127.0.0.1 port=1 connect_timeout=2 user=nobody", *json_flag],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert done.stderr.count("cannot connect to PostgreSQL") == 1, done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    if as_json:
        error = json.loads(done.stdout)["error"]
        assert error["code"] == "unavailable" and "cannot connect" in error["message"]
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("command", ["demo", "bench", "migrate", "advise", "audit"])
def test_the_help_shows_each_default_once(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    options = capsys.readouterr().out.split("options:")[1]
    # One block per option: its line and the help lines indented under it.
    blocks = re.split(r"\n  (?=-)", options)
    assert len(blocks) > 3, options
    for block in blocks:
        text = " ".join(block.split())
        assert text.count("default:") <= 1, text
        assert "(default: None)" not in text and "(default: False)" not in text, text


def test_the_docs_count_the_questions_advise_asks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Goal: the manual and the command's help say how many questions `stockade advise`
    # asks, and agree with what it asks when every question applies.
    monkeypatch.setattr(sys, "stdin", io.StringIO("no\nyes\n0.5\nsafe\n"))
    assert main(["advise"]) == 0
    asked = set(re.findall(r"(?:^|\s)(\d)\. [A-Z]", capsys.readouterr().out))
    word = {3: "three", 4: "four", 5: "five"}[len(asked)]
    docs = Path(__file__).resolve().parents[2] / "docs"
    cli_md, strategies_md = (docs / "cli.md").read_text(), (docs / "strategies.md").read_text()
    assert f"{word} questions" in cli_md and f"a question of {word}" in strategies_md
    others = {"three", "four", "five"} - {word}
    assert not any(f"{other} questions" in cli_md for other in others), cli_md[:600]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert f"{word} questions" in capsys.readouterr().out


def test_an_unexpected_error_exits_2_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 1 means "a violation" (audit) or "oversold" (demo): a bug in a command must not
    # be read as one.
    from stockade.tools import cli
    from stockade.tools.cli import demo

    def broken(args: object) -> int:
        raise RuntimeError("something broke")

    monkeypatch.setattr(demo, "demo", broken)
    assert cli.main(["demo", "--backend", "memory"]) == 2
    assert "unexpected error: RuntimeError: something broke" in capsys.readouterr().err
