"""Failover: a primary and a streaming standby on loopback, the primary SIGKILLed under
load and the standby promoted; the engine, on a multi-host DSN with
target_session_attrs=read-write, reconnects by itself.

Synchronous replication: every acknowledged reservation is on the new primary. Either
way: each InDoubt is settled by a same-key retry, each key ends with exactly one
reservation, and the ledger is exact. The figures (acknowledged writes lost, the time back
to serving) are printed.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import stockade
from nemesis_load import Workload, engine, read_history
from stockade.tools.pgserver import TemporaryPostgres, _free_port
from support import children_of
from test_faults import Load
from test_nemesis import check, prepare, second_process

pytestmark = pytest.mark.faults


class Standby:
    """A streaming standby of ``primary`` (pg_basebackup -R), in a directory of its own,
    stopped and removed by stop()."""

    def __init__(self, primary: TemporaryPostgres) -> None:
        self.primary = primary
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="stockade-standby-"))
        self.run_as: List[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self.run_as = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        source = ["-h", "127.0.0.1", "-p", str(primary.port), "-U", primary.user]
        self._run(
            "pg_basebackup",
            [*source, "-D", str(self.data), "-R", "-X", "stream", "--no-sync", "-c", "fast"],
        )
        options = f"-c port={self.port} -c listen_addresses=127.0.0.1"
        options += f" -c unix_socket_directories={self.dir}"
        log = str(self.dir / "log")
        self._run("pg_ctl", ["-D", str(self.data), "-l", log, "-o", options, "-w", "start"])

    def _run(self, tool: str, argv: List[str]) -> None:
        done = subprocess.run(
            [*self.run_as, str(self.primary.bindir / tool), *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip()[-500:]}")

    def promote(self) -> None:
        self._run("pg_ctl", ["-D", str(self.data), "-w", "-t", "60", "promote"])

    def caught_up(self) -> bool:
        lag = self.primary.sql(
            "SELECT count(*) FROM pg_stat_replication WHERE replay_lsn = pg_current_wal_lsn()"
        )
        return lag == "1"

    def stop(self) -> None:
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
            time.sleep(0.2)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(params=["synchronous", "asynchronous"])
def pair(request: pytest.FixtureRequest) -> Iterator[Tuple[TemporaryPostgres, Standby, str]]:
    """(primary, standby, mode). The synchronous primary names its standby only after the
    base backup, so the promoted standby does not inherit synchronous_standby_names (it
    would wait for itself)."""
    settings = {"wal_level": "replica", "max_wal_senders": "4"}
    primary = TemporaryPostgres(max_connections=100, settings=settings).start()
    standby: Optional[Standby] = None
    try:
        primary.sql("CREATE DATABASE shop")
        with stockade.Engine.postgres(primary.dsn("shop"), pool_size=1) as eng:
            eng.migrate()
        standby = Standby(primary)
        if request.param == "synchronous":  # after the base backup: the standby lacks it
            primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
            primary.sql("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            sync = "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
            while primary.sql(sync) != "1":
                assert time.monotonic() < deadline, "the standby never became synchronous"
                time.sleep(0.05)
        yield primary, standby, request.param
    finally:
        if standby is not None:
            standby.stop()
        primary.stop()


class Buyers(Load):
    """The fault suite's Load, with every strategy in turn and the times of each call:
    key -> (strategy, outcome, when the call started, when it returned)."""

    STRATEGIES = ("atomic", "pessimistic", "batched", "auto")

    def __init__(self, eng: stockade.Engine, threads: int = 8) -> None:
        super().__init__(eng, "auto", threads)
        self.times: Dict[str, Tuple[str, object, float, float]] = {}

    def _run(self, t: int) -> None:
        i = 0
        while not self._stop.is_set():
            key, strategy = f"k-{t}-{i}", self.STRATEGIES[(t + i) % len(self.STRATEGIES)]
            i += 1
            started = time.monotonic()
            try:
                out: object = self.eng.reserve("hot", 1, idempotency_key=key, strategy=strategy)
            except stockade.StockadeError as e:
                out = e
                time.sleep(0.02)
            with self._lock:
                self.told[key] = out
                self.times[key] = (strategy, out, started, time.monotonic())


def test_a_failover_loses_nothing_it_should_not_and_the_engine_comes_back(
    pair: Tuple[TemporaryPostgres, Standby, str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="stockade")
    primary, standby, mode = pair
    dsn = (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} dbname=shop "
        f"user={primary.user} target_session_attrs=read-write connect_timeout=2"
    )
    with stockade.Engine.postgres(dsn, pool_size=8, resolve_timeout=2) as eng:
        eng.restock("hot", 1_000_000)
        before = eng.stats()["pool"]
        deadline = time.monotonic() + 30
        while not standby.caught_up() and time.monotonic() < deadline:
            time.sleep(0.05)
        with Buyers(eng) as buyers:
            time.sleep(1.0)
            kill_server(primary)
            killed_at = time.monotonic()
            standby.promote()
            promoted_in = time.monotonic() - killed_at
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                time.sleep(0.1)
                if len(served_since(buyers.times, killed_at)) >= 50:
                    break
            time.sleep(0.5)
        told = dict(buyers.times)
        acked = {k: t[1] for k, t in told.items() if isinstance(t[1], stockade.Reservation)}
        lost = [k for k, r in acked.items() if not _there(eng, r)]
        in_doubt = [k for k, t in told.items() if isinstance(t[1], stockade.InDoubt)]
        # Every key, retried with its request, ends with exactly one reservation.
        for key, (strategy, out, _, _) in told.items():
            r = eng.reserve("hot", 1, idempotency_key=key, strategy=strategy)
            if isinstance(out, stockade.Reservation) and key not in lost:
                assert r == out
        level = eng.stock("hot")
        assert level.reserved == len(told) == eng.row_counts()["reservation_count"]
        after = served_since(told, killed_at)
        assert after, "the engine never served again"
        print(
            f"failover ({mode}): {len(acked)} acknowledged, {len(lost)} of them lost, "
            f"{len(in_doubt)} InDoubt (settled by their retries), promoted in "
            f"{promoted_in:.2f} s, first success "
            f"{after[0]:.2f} s after the kill, the 50th {after[min(49, len(after) - 1)]:.2f} s"
        )
        if mode == "synchronous":
            assert not lost, lost[:5]
        # The engine saw the server change: same cluster, a new timeline.
        after_pool = eng.stats()["pool"]
        assert before["server_changes"] == 0 and after_pool["server_changes"] >= 1
        assert after_pool["server"].split("/")[0] == before["server"].split("/")[0]
        assert after_pool["server"] != before["server"]
    # The fence never takes the promoted standby's word for the old primary's session:
    # a session absent there proves nothing (design.md), so no lost commit is "final".
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("stockade")]
    assert not [m for m in messages if "during COMMIT" in m and "outcome is final" in m]
    assert [m for m in messages if "reached another server than the one before" in m]


def kill_server(server: TemporaryPostgres) -> None:
    """SIGKILLs the postmaster and every backend: the primary dies without a word."""
    for pid in [server.pid, *children_of(server.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def served_since(told: Dict[str, Tuple[str, object, float, float]], kill: float) -> List[float]:
    """When the successes of calls made after the kill returned, in seconds after it."""
    return sorted(
        done - kill
        for _, out, started, done in told.values()
        if isinstance(out, stockade.Reservation) and started > kill
    )


def _there(eng: stockade.Engine, r: stockade.Reservation) -> bool:
    try:
        return eng.reservation(r.id).id == r.id
    except stockade.NotFound:
        return False


def test_a_failover_under_mixed_calls_from_two_processes_keeps_every_rule(
    pair: Tuple[TemporaryPostgres, Standby, str], tmp_path: Path
) -> None:
    # The nemesis test's workload (keyed and keyless reserves under every strategy, with
    # buyers under a limit, confirms, releases, extends, restocks, fenced restocks) from
    # this process and a second one, the primary SIGKILLed and the standby promoted
    # mid-run; then the nemesis checker on the new primary. Synchronous: no rule broken.
    # Asynchronous: what it finds is what the failover lost, printed.
    primary, standby, mode = pair
    dsn = (
        f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} dbname=shop "
        f"user={primary.user} target_session_attrs=read-write connect_timeout=2"
    )
    prepare(dsn)
    deadline = time.monotonic() + 30
    while not standby.caught_up() and time.monotonic() < deadline:
        time.sleep(0.05)
    seed = random.randrange(10**6)
    history_file = tmp_path / "history.jsonl"  # pytest keeps the last runs' only
    started = time.monotonic()
    worker = second_process(dsn, seed, 9.0, history_file)
    try:
        with engine(dsn) as eng:
            load = Workload(eng, seed, "p1", threads=4).start()
            time.sleep(3.0)
            kill_server(primary)
            killed_at = time.monotonic()
            standby.promote()
            time.sleep(max(0.0, started + 9.0 - time.monotonic()))
            load.stop()
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(30)
    history = load.history + read_history(str(history_file))
    checker, settled = check(dsn, history)
    served = [r for r in history if r["out"] == "ok" and r["t0"] > killed_at]
    print(
        f"failover ({mode}) under two processes, seed {seed}: {len(history)} calls, "
        f"{len(served)} served after the kill, {settled} InDoubt keys settled, "
        f"{len(checker.violations)} rules broken"
    )
    assert served, "nothing was served after the failover"
    if mode == "synchronous":
        assert not checker.violations, checker.report(seed)
    elif checker.violations:
        print(checker.report(seed))
