"""The example shop as a service runs it: gunicorn with two UvicornWorker processes, its
shipped gunicorn.conf.py, against the suite's PostgreSQL, driven over HTTP on loopback.

Checks, with bounded load (a few hundred requests) and a bounded time:
- the exact sell-out: as many 201s as units, each reservation in the database once;
- metrics: every scrape answers for both workers, the reserve count never goes down over
  scrapes, and once the load stops it equals the 201s exactly;
- a worker SIGKILLed mid-run loses nothing that was acknowledged: clients retry with the
  same Idempotency-Key and get the one reservation of their key;
- nothing from stockade or the app is logged at ERROR.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import stockade
from stockade.testing import race
from stockade.tools.pgserver import _free_port
from support import children_of

httpx = pytest.importorskip("httpx")
pytest.importorskip("gunicorn")
pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

pytestmark = [pytest.mark.postgres, pytest.mark.load]

SHOP = Path(__file__).resolve().parents[2] / "examples" / "fastapi_shop"


class Shop:
    def __init__(self, dsn: str, metrics_dir: Path, log: Path) -> None:
        self.url = f"http://127.0.0.1:{_free_port()}"
        env = dict(
            os.environ,
            STOCKADE_DSN=dsn,
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
            SHOP_BIND=self.url.removeprefix("http://"),
            SHOP_WORKERS="2",
        )
        self._log = open(log, "w")
        conf = str(SHOP / "gunicorn.conf.py")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", conf, "--chdir", str(SHOP), "app:app"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, workers: int = 2, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "gunicorn exited"
            try:
                if (
                    httpx.get(f"{self.url}/metrics", timeout=2).status_code == 200
                    and len(children_of(self.proc.pid)) == workers
                ):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError("the shop did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                for pid in children_of(self.proc.pid):
                    os.kill(pid, signal.SIGKILL)
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture
def shop(stockade_database: str, tmp_path: Path) -> Iterator[Shop]:
    (tmp_path / "metrics").mkdir()
    server = Shop(stockade_database, tmp_path / "metrics", tmp_path / "gunicorn.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def reserved_ok(text: str) -> float:
    """stockade_calls_total for successful reserves, summed over its series."""
    pattern = r'^stockade_calls_total\{[^}]*op="reserve"[^}]*outcome="ok"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, flags=re.M))


class Buyers:
    """Threads that each buy one unit per key, retrying a key (at most 20 times) while the
    shop cannot answer; records each key's final answer."""

    def __init__(self, url: str, keys: List[str], threads: int = 12) -> None:
        self.url = url
        self.answers: Dict[str, Tuple[int, Optional[str]]] = {}
        self.retries = 0
        self._keys = iter(keys)
        self._lock = threading.Lock()
        self._thread_count = threads

    def run(self) -> None:
        out = race(self._thread_count, lambda _: self._run(), timeout=120)
        assert not any(out.errors), out.errors

    def _next(self) -> Optional[str]:
        with self._lock:
            return next(self._keys, None)

    def _run(self) -> None:
        with httpx.Client(timeout=15) as client:
            while (key := self._next()) is not None:
                self._buy(client, key)

    def _buy(self, client: httpx.Client, key: str) -> None:
        for _ in range(20):
            try:
                r = client.post(
                    f"{self.url}/skus/hot/reservations",
                    json={"qty": 1},
                    headers={"Idempotency-Key": key},
                )
            except httpx.TransportError:  # the worker died under the request
                r = None
            if r is not None and r.status_code in (201, 409):
                rid = r.json()["id"] if r.status_code == 201 else None
                with self._lock:
                    self.answers[key] = (r.status_code, rid)
                return
            assert r is None or r.status_code == 503, (r.status_code, r.text)
            with self._lock:
                self.retries += 1
            time.sleep(0.1)
        raise AssertionError(f"key {key} got no answer in 20 tries")


def test_gunicorn_workers_sell_out_exactly_with_metrics_that_add_up(
    shop: Shop, stockade_database: str, tmp_path: Path
) -> None:
    units = 150
    with stockade.Engine.postgres(stockade_database, pool_size=1) as eng:
        eng.restock("hot", units)

        # Phase 1, no fault: the metrics equal the grants once the workers publish.
        first = Buyers(shop.url, [f"a-{i}" for i in range(100)])
        first.run()
        granted = [k for k, (status, _) in first.answers.items() if status == 201]
        assert len(granted) == 100 and first.retries == 0
        time.sleep(2.5)  # publish_interval: the other worker's figures reach the directory
        scrapes = [reserved_ok(httpx.get(f"{shop.url}/metrics").text) for _ in range(6)]
        assert scrapes == [100.0] * 6, scrapes  # whichever worker answers

        # Phase 2: a worker SIGKILLed mid-run; scrapes go on meanwhile.
        second = Buyers(shop.url, [f"b-{i}" for i in range(400)])
        seen: List[float] = []
        killed: List[int] = []
        stop = threading.Event()

        def scrape() -> None:
            while not stop.is_set():
                try:
                    seen.append(reserved_ok(httpx.get(f"{shop.url}/metrics", timeout=5).text))
                except httpx.TransportError:
                    pass
                time.sleep(0.05)

        def kill_one() -> None:  # once the phase is under way
            deadline = time.monotonic() + 30
            while len(second.answers) < 40 and time.monotonic() < deadline:
                time.sleep(0.001)
            os.kill(children_of(shop.proc.pid)[0], signal.SIGKILL)
            killed.append(len(second.answers))

        threads = [threading.Thread(target=scrape), threading.Thread(target=kill_one)]
        for t in threads:
            t.start()
        try:
            second.run()
        finally:
            stop.set()
            for t in threads:
                t.join(30)
        assert seen and seen == sorted(seen), "a scrape went down"
        assert seen[0] >= 100

        answers = {**first.answers, **second.answers}
        ids = [rid for status, rid in answers.values() if status == 201]
        assert len(ids) == len(set(ids)) == units  # the exact sell-out, no id twice
        for rid in ids:
            assert eng.reservation(rid).qty == 1  # every acknowledged one is there
        level = eng.stock("hot")
        assert (level.on_hand, level.reserved) == (units, units)
        assert eng.row_counts()["reservation_count"] == units
        assert killed and killed[0] < len(second.answers), "the kill came after the load"
        print(
            f"gunicorn: {len(answers)} keys, a worker killed after {killed[0]} answers, "
            f"{second.retries} retries"
        )

    log = (tmp_path / "gunicorn.log").read_text()
    ours = re.compile(r" (ERROR|CRITICAL) \[\d+\] (stockade|uvicorn)")
    errors = [line for line in log.splitlines() if ours.search(line)]
    assert not errors, errors[:5]
    assert re.search(r"INFO \[\d+\] stockade(\.\w+)?: ", log), "stockade's INFO records are missing"
    uuid.UUID(ids[0])  # the shop answers with the reservation's id
