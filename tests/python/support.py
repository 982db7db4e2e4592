"""Constants and helpers shared by the pytest modules (imported as a plain module)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, List

import stockade
from stockade.tools.pgserver import run_sql

# The strategies that serve each request in its own transaction, and all of them (batched
# folds requests into shared transactions; auto picks atomic or batched per SKU), in the
# order of stockade.Strategy.
ALL_STRATEGIES = [s.value for s in stockade.Strategy]
PER_REQUEST_STRATEGIES = [s for s in ALL_STRATEGIES if s not in ("batched", "auto")]

# The migrations in sql/, in order: the numbered files there.
SQL_DIR = Path(__file__).parents[2] / "sql"
MIGRATIONS = sorted(p.name for p in SQL_DIR.glob("[0-9][0-9][0-9]_*.sql"))

# Every API test runs on each store, and on the Citus layout of the PostgreSQL one (a
# three-node cluster; skipped where the Citus build beside the project does not fit).
BACKENDS = ["memory", "postgres", "citus"]

# Where every ManualClock of the suite starts.
START = datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc)

# The store's current time, and a way to let store time pass (see conftest).
Now = Callable[[], datetime]
Wait = Callable[[float], None]


def field(dsn: str, name: str) -> str:
    """One key=value field of a connection string (dbname, host, port)."""
    return dsn.split(f"{name}=")[1].split()[0]


def wait_for_session(dsn: str, where: str) -> None:
    """Waits until another session on the database matches `where` (pg_stat_activity):
    tests sequence their sessions by what the server sees, not by sleeping."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        f"AND pid <> pg_backend_pid() AND {where}"
    )
    deadline = time.monotonic() + 30
    while int(run_sql(dsn, query)) == 0:
        assert time.monotonic() < deadline, f"no session with {where}"
        time.sleep(0.02)


def in_doubt_after_cut(pooled: bool, cut: str) -> bool:
    """Whether a write whose connection a CommitCuttingProxy cut ``cut`` its COMMIT must end
    InDoubt. Directly, the engine ends the lost server session and then looks, so it
    always knows. Behind a transaction-mode pooler (``--stockade-pooler pgbouncer``) it
    cannot end the session: a write that landed (cut after) is found and answered, one
    that did not (cut before) may still land for all the engine knows."""
    return pooled and cut == "before"


def wait_for(check: Callable[[], bool], seconds: float = 15.0) -> bool:
    """Polls ``check`` until it holds or ``seconds`` pass; returns its last answer."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def until_decided(call: Callable[[], object], attempts: int = 50) -> bool:
    """True if the call was granted, False if refused (OutOfStock); retries a lost
    optimistic race (RetriesExhausted), as a client would, at most `attempts` times."""
    for _ in range(attempts):
        try:
            call()
            return True
        except stockade.OutOfStock:
            return False
        except stockade.RetriesExhausted:
            continue
    raise AssertionError(f"lost the optimistic race {attempts} times")


def children_of(pid: int) -> List[int]:
    """The live child processes of ``pid`` (a server's workers or backends), from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def assert_audit_clean(engine: stockade.Engine) -> None:
    """After a race: the audit finds nothing (docs/journal.md)."""
    report = engine.audit(expiry_lag=3600)
    assert report.ok, report.violations[:10]
