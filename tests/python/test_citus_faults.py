"""Faults on a Citus cluster: a worker stopped as by a crash under load, and started again.

The test runs on a three-node cluster of its own (stockade.tools.citus), since it stops a
node. What it holds the engine to:

- the calls for SKUs whose shards live on the other worker keep their rate while one
  worker is down (a dead node costs only the calls that need it), and the whole engine
  keeps at least 0.4x of its rate with half the shards alive;
- within 5 s of the worker's return, the rate is back (at least 0.8x of before);
- every error is typed (Unavailable, or InDoubt where a commit may have landed, or
  DeadlineExceeded), and only calls for the dead worker's SKUs fail;
- nothing acknowledged is missing after the restart, a keyed call left in doubt settles
  when it is retried with its key, and the audit finds every row and hold consistent.

Rates are compared with each other in one run (ratios), never with a clock figure."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Dict, List, Set, Tuple

import pytest

import stockade
from stockade import _core
from stockade.tools.citus import TemporaryCitus, citus_available
from stockade.tools.pgserver import run_sql
from support import assert_audit_clean

pytestmark = [pytest.mark.citus, pytest.mark.own_server]

SKUS = [f"sku-{i}" for i in range(64)]
THREADS = 16
TYPED = (stockade.Unavailable, stockade.InDoubt, stockade.DeadlineExceeded)


def _worker_of(cluster: TemporaryCitus, schema: str, sku: str) -> str:
    key = _core.shard_key_of(sku, "default")
    port = run_sql(
        cluster.dsn(),
        "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)"
        f" WHERE p.shardid = get_shard_id_for_distribution_column('{schema}.stock', {key})",
    )
    return "worker1" if int(port) == cluster.node_port("worker1") else "worker2"


class Load:
    """THREADS threads, each reserving one unit of the SKUs in turn with a new key."""

    def __init__(self, engine: stockade.Engine) -> None:
        self.engine = engine
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.calls: List[Tuple[float, str, str]] = []  # (end, sku, outcome)
        self.acked: List[bytes] = []
        self.in_doubt: List[Tuple[str, str]] = []  # (sku, key)
        self.untyped: List[str] = []
        self.said: Dict[Tuple[str, str], str] = {}  # the first message of each failure
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(THREADS)]

    def _run(self, first: int) -> None:
        i = first
        while not self.stop.is_set():
            sku, key = SKUS[i % len(SKUS)], uuid.uuid4().hex
            i += 1
            try:
                r = self.engine.reserve(sku, 1, idempotency_key=key)
                outcome = "ok"
            except TYPED as e:
                outcome = type(e).__name__
                with self.lock:
                    self.said.setdefault((sku, outcome), str(e)[:300])
            except Exception as e:  # what the test must not see
                outcome = "untyped"
                with self.lock:
                    self.untyped.append(f"{type(e).__name__}: {str(e)[:200]}")
            with self.lock:
                self.calls.append((time.monotonic() - self.start, sku, outcome))
                if outcome == "ok":
                    self.acked.append(r.id)
                elif outcome == "InDoubt":
                    self.in_doubt.append((sku, key))

    def now(self) -> float:
        return time.monotonic() - self.start

    def rate(self, since: float, until: float, skus: Set[str]) -> float:
        with self.lock:
            n = sum(1 for t, s, o in self.calls if since <= t < until and o == "ok" and s in skus)
        return n / (until - since)

    def failures(self, skus: Set[str]) -> Dict[str, int]:
        out: Dict[str, int] = {}
        with self.lock:
            for _, s, o in self.calls:
                if o != "ok" and s in skus:
                    out[o] = out.get(o, 0) + 1
        return out


def test_a_dead_worker_costs_only_its_own_calls_and_the_rate_returns() -> None:
    ok, why = citus_available()
    if not ok:
        pytest.skip(why)
    with TemporaryCitus() as cluster:
        engine = stockade.Engine.postgres(
            cluster.dsn(), layout="citus", schema="faults", pool_size=THREADS, call_timeout=5.0
        )
        with engine:
            engine.migrate()
            for sku in SKUS:
                engine.restock(sku, 1_000_000)
            live = {s for s in SKUS if _worker_of(cluster, "faults", s) == "worker1"}
            dead = set(SKUS) - live
            assert live and dead, "the SKUs' shards must lie on both workers"
            everything = set(SKUS)

            load = Load(engine)
            for t in load.threads:
                t.start()
            try:
                time.sleep(4.0)
                before = (1.0, load.now())
                cluster.stop_node("worker2", mode="immediate")
                down = load.now()
                time.sleep(4.0)
                outage = (down + 0.5, load.now())
                cluster.start_node("worker2")  # waits through crash recovery
                back = load.now()
                time.sleep(5.5)
                after = (back + 2.0, back + 5.0)
            finally:
                load.stop.set()
                for t in load.threads:
                    t.join()

            def ratio(window: Tuple[float, float], skus: Set[str]) -> float:
                return load.rate(*window, skus) / load.rate(*before, skus)

            assert not load.untyped, load.untyped[:5]
            assert load.failures(live) == {}, [m for (s, _), m in load.said.items() if s in live]
            assert load.failures(dead), "no call for the dead worker's SKUs failed: no fault"
            assert set(load.failures(dead)) <= {"Unavailable", "InDoubt", "DeadlineExceeded"}
            shown = {
                "live_during": ratio(outage, live),
                "all_during": ratio(outage, everything),
                "all_after": ratio(after, everything),
            }
            print("rates against before:", {k: round(v, 2) for k, v in shown.items()})
            assert shown["live_during"] >= 0.8, shown
            assert shown["all_during"] >= 0.4, shown
            assert shown["all_after"] >= 0.8, shown

            # Nothing acknowledged is missing; a keyed call in doubt settles with its key.
            for rid in load.acked:
                assert engine.get_reservation(rid).qty == 1
            settled = [engine.reserve(sku, 1, idempotency_key=key) for sku, key in load.in_doubt]
            held = len(load.acked) + len(settled)
            assert sum(engine.stock(s).reserved for s in SKUS) == held
            assert_audit_clean(engine)
