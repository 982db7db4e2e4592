"""A race that proves the change feed (docs/journal.md): 8 threads here and 2 processes
reserve, confirm, release and restock 16 SKUs while backend kills and a server restart hit
them; two consumers poll and commit all along, one of them restarted midway. Afterwards
each consumer's changes, per row, form a gap-free chain of versions in order that ends
at the row's version and matches the journal entry for entry, and the audit is clean."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

import stockade
from stockade.testing import race
from stockade.tools.pgserver import TemporaryPostgres, run_sql

pytestmark = pytest.mark.faults

SKUS = [f"f-{i:02d}" for i in range(16)]
SECONDS = 12.0
KILL_BACKENDS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
)

TRAFFIC = textwrap.dedent(
    """
    import random, sys, time
    import stockade
    SKUS = [f"f-{i:02d}" for i in range(16)]

    def traffic(eng, rng, until):
        held = []
        while time.monotonic() < until:
            sku = rng.choice(SKUS)
            try:
                roll = rng.random()
                if roll < 0.45:
                    strategy = rng.choice(["atomic", "batched", "pessimistic"])
                    held.append(eng.reserve(sku, rng.randint(1, 3), strategy=strategy).id)
                elif roll < 0.65 and held:
                    eng.confirm(held.pop(rng.randrange(len(held))))
                elif roll < 0.85 and held:
                    eng.release(held.pop(rng.randrange(len(held))))
                else:
                    eng.restock(sku, rng.randint(1, 20), reason="race")
            except stockade.StockadeError:
                time.sleep(0.01)

    if __name__ == "__main__":
        dsn, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
        with stockade.Engine.postgres(dsn, pool_size=4) as eng:
            traffic(eng, random.Random(seed), time.monotonic() + seconds)
    """
)


class Consumer(threading.Thread):
    """Polls and commits until told to stop and the feed is drained; with `restart_at`,
    closes its engine at that moment and opens the consumer again on a new one."""

    def __init__(self, dsn: str, name: str, restart_at: Optional[float] = None) -> None:
        super().__init__(daemon=True)
        self.dsn, self.name, self.restart_at = dsn, name, restart_at
        self.seen: List[stockade.StockChange] = []
        self.stop = threading.Event()
        self.restarts = 0
        self.errors = 0

    def run(self) -> None:
        while not self._session():
            self.restarts += 1

    def _session(self) -> bool:
        """One engine's life; True when drained after stop."""
        try:
            eng = stockade.Engine.postgres(self.dsn, pool_size=1, call_timeout=10)
        except stockade.StockadeError:
            time.sleep(0.2)
            return False
        with eng:
            feed: Optional[stockade.Feed] = None
            while True:
                if self.restart_at is not None and time.monotonic() >= self.restart_at:
                    self.restart_at = None
                    return False  # a consumer restarted midway: resumes from its commit
                stopping = self.stop.is_set()
                try:
                    feed = feed or eng.feed(self.name)
                    changes = feed.poll(limit=500, timeout=0.2)
                    self.seen += changes
                    feed.commit()
                except stockade.StockadeError:
                    self.errors += 1
                    feed = None  # opened again: resumes after its last commit
                    time.sleep(0.1)
                    continue
                if stopping and not changes:
                    return True


@pytest.fixture(scope="module")
def race_server() -> Iterator[TemporaryPostgres]:
    with TemporaryPostgres(max_connections=100) as server:
        yield server


def first_seen(changes: List[stockade.StockChange]) -> Dict[Tuple[str, str, int], List]:
    """Per row, the changes in the order first delivered (repeats dropped by their key)."""
    rows: Dict[Tuple[str, str, int], List[stockade.StockChange]] = {}
    keys = set()
    for c in changes:
        if (c.key, c.slot) in keys:
            continue
        keys.add((c.key, c.slot))
        rows.setdefault((c.sku, c.location, c.slot), []).append(c)
    return rows


def test_two_consumers_see_every_change_in_order_through_kills_and_a_restart(
    race_server: TemporaryPostgres,
) -> None:
    name = f"feed_{uuid.uuid4().hex[:10]}"
    dsn = race_server.create_database(name)
    with stockade.Engine.postgres(dsn, pool_size=8, resolve_timeout=2) as eng:
        eng.migrate()
        consumers = [
            Consumer(dsn, "steady"),
            Consumer(dsn, "restarted", restart_at=time.monotonic() + SECONDS / 3),
        ]
        for c in consumers:
            eng.feed(c.name)  # registered before the first change
            c.start()
        for sku in SKUS:
            eng.restock(sku, 50)
        script = {"__name__": "race"}
        exec(compile(TRAFFIC, "traffic", "exec"), script)
        until = time.monotonic() + SECONDS
        workers = [
            subprocess.Popen([sys.executable, "-c", TRAFFIC, dsn, str(SECONDS), str(seed)])
            for seed in (1, 2)
        ]

        def kills_and_a_restart() -> None:
            for n in range(int(SECONDS / 1.5)):
                time.sleep(1.5)
                if n == 3:
                    race_server.restart("immediate")
                else:
                    run_sql(dsn, KILL_BACKENDS)

        try:
            out = race(
                8,
                lambda s: script["traffic"](eng, random.Random(s), until),
                meanwhile=kills_and_a_restart,
            )
            assert not any(out.errors), out.errors
            for w in workers:
                assert w.wait(timeout=120) == 0
        finally:
            for w in workers:
                if w.poll() is None:
                    w.kill()
                    w.wait()
        for c in consumers:
            c.stop.set()
        for c in consumers:
            c.join(timeout=120)
            assert not c.is_alive(), f"{c.name} did not drain"
        check_feed(eng, consumers)
        report = eng.audit()
        assert report.ok, report.violations
        print(
            f"feed race: {len(eng.movements(limit=100_000))} changes, "
            + ", ".join(
                f"{c.name}: {len(c.seen)} delivered, {c.restarts} restarts, {c.errors} errors"
                for c in consumers
            )
        )
    race_server.drop_database(name)


def check_feed(eng: stockade.Engine, consumers: List[Consumer]) -> None:
    entries = {sku: eng.movements(sku, limit=100_000) for sku in SKUS}
    assert consumers[1].restarts >= 1
    for c in consumers:
        rows = first_seen(c.seen)
        for sku in SKUS:
            journal = entries[sku]
            got = rows.get((sku, "default", 0), [])
            # Gap-free and in order, from the row's making to its version now.
            assert [g.version_before for g in got] == [0] + [g.version for g in got[:-1]], sku
            assert got[-1].version == eng.stock(sku).version
            # Entry for entry, the journal.
            assert [g.position for g in got] == [m.position for m in journal], sku
