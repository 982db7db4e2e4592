"""Hostile and odd input, and secrets: every case gets a clear, typed error, changes
nothing, and no password or unbounded input reaches a message.

Goal: what a careless or hostile caller can send (reserved words as schema names, huge
integers, look-alike digits, megabyte ids, control characters, another client encoding,
a clock at the end of time, a DSN that libpq quotes back) never yields a raw exception,
a forged log line, a mojibake row or a leaked password.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

import stockade
from stockade.env import dsn_from_environment
from stockade.tools.pgserver import child_connection, run_sql
from support import field

# --- schema names ---


@pytest.mark.parametrize("schema", ["user", "select", "order", "table", "join", "pg_stockade"])
def test_reserved_words_are_refused_as_schema_names_before_connecting(schema: str) -> None:
    # Port 1 on loopback: nothing listens, so reaching the server would be Unavailable.
    with pytest.raises(stockade.InvalidArgument, match="reserved word"):
        stockade.Engine.postgres("host=127.0.0.1 port=1", schema=schema)


def test_a_schema_name_that_is_not_reserved_works(stockade_database: str) -> None:
    with stockade.Engine.postgres(stockade_database, schema="users_2", pool_size=1) as eng:
        eng.migrate()
        assert eng.restock("s", 3).on_hand == 3


# --- numeric options ---

HUGE = [2**31, 2**63, 2**70]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize("option", ["retries_max", "batch_max", "batch_shards", "async_workers"])
def test_count_options_out_of_range_raise_a_short_invalid_argument(option: str, value: int) -> None:
    with pytest.raises(stockade.InvalidArgument) as info:
        stockade.Engine.memory(**{option: value})
    assert option in str(info.value) and len(str(info.value)) < 120


@pytest.mark.parametrize("option", ["pool_size", "sweep_batch"])
def test_postgres_count_options_out_of_range_raise_invalid_argument(option: str) -> None:
    with pytest.raises(stockade.InvalidArgument, match=option):
        stockade.Engine.postgres("host=127.0.0.1 port=1", **{option: 2**31})


@pytest.mark.parametrize("linger", [-0.001, 0.2, 2**70])
def test_batch_linger_out_of_range_raises_invalid_argument(linger: float) -> None:
    with pytest.raises(stockade.InvalidArgument, match="linger"):
        stockade.Engine.memory(batch_linger=linger)


def test_batch_linger_of_the_wrong_type_raises_invalid_type() -> None:
    with pytest.raises(stockade.InvalidType, match="batch_linger"):
        stockade.Engine.memory(batch_linger="300us")  # type: ignore[arg-type]


def test_expire_due_limit_out_of_range_raises_invalid_argument() -> None:
    with stockade.Engine.memory() as eng, pytest.raises(stockade.InvalidArgument):
        eng.expire_due(limit=2**64)


# --- ETags ---


@pytest.mark.parametrize(
    "etag", ['"²"', '"١٢"', '"１２"', '"' + "9" * 20 + '"', '"9223372036854775808"', '""', "12"]
)
def test_version_from_etag_takes_ascii_digits_within_bounds(etag: str) -> None:
    with pytest.raises(stockade.InvalidArgument):
        stockade.version_from_etag(etag)


def test_version_from_etag_reads_strong_and_weak_tags() -> None:
    assert stockade.version_from_etag('"12"') == 12
    assert stockade.version_from_etag('W/"7"') == 7
    assert stockade.version_from_etag('"9223372036854775807"') == 2**63 - 1


def test_an_etag_error_does_not_echo_a_megabyte() -> None:
    with pytest.raises(stockade.InvalidArgument) as info:
        stockade.version_from_etag('"' + "x" * 1_000_000 + '"')
    assert len(str(info.value)) < 200


# --- messages: bounded, no control characters ---


def test_a_megabyte_reservation_id_gives_a_short_message(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.InvalidArgument) as info:
        engine.reservation("x" * 1_000_000)
    assert len(str(info.value)) < 200


def test_a_sku_with_a_newline_cannot_forge_a_log_line(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.NotFound) as info:
        engine.stock("boots\nERROR forged entry\x1b[31m")
    message = str(info.value)
    assert "\n" not in message and "\x1b" not in message
    assert "boots\\nERROR forged entry\\x1b[31m" in message


def test_a_long_sku_is_cut_in_messages(engine: stockade.Engine) -> None:
    sku = "é" * 128  # 256 bytes: the longest SKU there is
    with pytest.raises(stockade.NotFound) as info:
        engine.stock(sku)
    message = str(info.value)
    assert "(256 bytes)" in message and len(message) < 200


def test_a_long_idempotency_key_is_cut_in_a_conflict(engine: stockade.Engine) -> None:
    engine.restock("s", 10)
    key = "k" * 255 + "\n"
    engine.reserve("s", 1, idempotency_key=key)
    with pytest.raises(stockade.IdempotencyConflict) as info:
        engine.reserve("s", 2, idempotency_key=key)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


# --- client encoding ---


def test_text_is_utf8_whatever_pgclientencoding_says(
    stockade_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGCLIENTENCODING", "LATIN1")
    with stockade.Engine.postgres(stockade_database, pool_size=1) as eng:
        assert eng.restock("naïve😀", 3).sku == "naïve😀"
        assert eng.stock("naïve😀").on_hand == 3
        assert eng.reserve("naïve😀", 1).sku == "naïve😀"
    stored = run_sql(stockade_database, "SELECT sku FROM stockade.stock")
    assert stored == "naïve😀"


# --- the clock at the end of time ---


def test_a_hold_that_would_expire_after_the_year_9999_is_refused_before_it_is_written() -> None:
    clock = stockade.ManualClock(datetime(9999, 12, 31, 23, 0, tzinfo=timezone.utc))
    with stockade.Engine.memory(clock=clock) as eng:
        eng.restock("s", 10)
        with pytest.raises(stockade.InvalidArgument, match="9999"):
            eng.reserve("s", 1, ttl=timedelta(hours=2))
        assert eng.stock("s").reserved == 0 and eng.row_counts()["reservation_count"] == 0
        held = eng.reserve("s", 1, ttl=timedelta(minutes=30))
        with pytest.raises(stockade.InvalidArgument, match="9999"):
            eng.extend(held.id, ttl=timedelta(hours=2))
        assert eng.reservation(held.id) == held


def test_a_manual_clock_stays_within_the_years_1_to_9999() -> None:
    clock = stockade.ManualClock(datetime(9999, 12, 31, tzinfo=timezone.utc))
    with pytest.raises(stockade.InvalidArgument):
        clock.advance(timedelta(days=2))
    assert clock.now() == datetime(9999, 12, 31, tzinfo=timezone.utc)


# --- secrets ---

SECRET = "hunter2-s3cret"


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://user:{SECRET}%zz@127.0.0.1:1/db",  # a bad percent escape
        f"postgresql://user:{SECRET}@[::1/db",  # an unclosed IPv6 bracket
        f"host=127.0.0.1 password='{SECRET}",  # an unterminated quote
        f"host=127.0.0.1 port=1 password={SECRET} nonsense_keyword=1",  # an unknown keyword
    ],
)
def test_an_unparsable_dsn_is_refused_without_quoting_it(dsn: str) -> None:
    with pytest.raises(stockade.InvalidArgument) as info:
        stockade.Engine.postgres(dsn)
    assert SECRET not in str(info.value) and "hunter2" not in repr(info.value)


@pytest.mark.parametrize(
    "dsn",
    [
        f"host=127.0.0.1 port=1 user=u password={SECRET} connect_timeout=2",
        f"postgresql://u:{SECRET}@127.0.0.1:1/db?connect_timeout=2",
    ],
)
def test_a_connection_failure_never_shows_the_password(dsn: str) -> None:
    with pytest.raises(stockade.Unavailable) as info:
        stockade.Engine.postgres(dsn)
    assert SECRET not in str(info.value)


def test_child_processes_get_the_password_in_their_environment_not_their_argv(
    stockade_database: str,
) -> None:
    dsn = stockade_database + f" password={SECRET}"
    conninfo, env = child_connection(dsn)
    assert SECRET not in conninfo and env["PGPASSWORD"] == SECRET
    assert field(conninfo.replace("'", ""), "dbname") == field(stockade_database, "dbname")
    assert run_sql(dsn, "SELECT 1") == "1"  # trust auth: the password is unused but passed
    with pytest.raises(stockade.InvalidArgument):
        child_connection(stockade_database + " sslpassword=x")


# --- the command line ---


def test_the_cli_takes_the_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STOCKADE_DSN", "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PGSERVICE", raising=False)
    assert dsn_from_environment(None) is None
    assert dsn_from_environment("host=a") == "host=a"
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    assert dsn_from_environment(None) == ""  # libpq reads PG* itself
    monkeypatch.setenv("STOCKADE_DSN", "host=b")
    assert dsn_from_environment(None) == "host=b"
    assert dsn_from_environment("host=a") == "host=a"


def test_migrate_runs_on_stockade_dsn_and_on_pg_variables(
    stockade_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "STOCKADE_DSN"))}
    cli = [sys.executable, "-m", "stockade", "migrate", "--schema", "via_env"]
    by_dsn = subprocess.run(
        cli, env={**base, "STOCKADE_DSN": stockade_database}, capture_output=True, text=True
    )
    assert by_dsn.returncode == 0, by_dsn.stderr
    pg = {
        "PGHOST": field(stockade_database, "host"),
        "PGPORT": field(stockade_database, "port"),
        "PGUSER": field(stockade_database, "user"),
        "PGDATABASE": field(stockade_database, "dbname"),
    }
    by_pg = subprocess.run(cli, env={**base, **pg}, capture_output=True, text=True)
    assert by_pg.returncode == 0 and "up to date" in by_pg.stdout, by_pg.stderr
    neither = subprocess.run(cli, env=base, capture_output=True, text=True)
    assert neither.returncode == 2 and "STOCKADE_DSN" in neither.stderr


@pytest.mark.parametrize("stdin", ["devnull", "closed"])
def test_advise_with_no_stdin_says_so_without_a_traceback(stdin: str) -> None:
    def close_stdin() -> None:
        os.close(0)

    done = subprocess.run(
        [sys.executable, "-m", "stockade", "advise"],
        stdin=subprocess.DEVNULL if stdin == "devnull" else None,
        preexec_fn=close_stdin if stdin == "closed" else None,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr and "no answer" in done.stderr
