"""A deadline on every wait: call_timeout bounds each call, whatever the server does.

Two ways a server never answers, each on a real server:

- a COMMIT that waits for a synchronous standby that is gone (synchronous_standby_names
  names one that never connects): the engine cancels the wait, and PostgreSQL has then
  committed locally, so the caller is told InDoubt, never a failure;
- a server that stops answering without closing the socket (the cut proxy frozen): the
  cancel request cannot get through either, and the engine cuts the connection.

Each caller is answered within call_timeout + cancel_grace (plus scheduling slack), and
what it was told is true afterwards: a DeadlineExceeded or LockTimeout left nothing
behind, and an InDoubt is settled by a same-key retry to exactly one reservation.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade.testing import hold_lock, race
from stockade.tools.pgserver import TemporaryPostgres

pytestmark = pytest.mark.faults

CALL_TIMEOUT = 1.5
CANCEL_GRACE = 0.5
# The bound each caller must meet: the deadline, the grace before the cut, and slack for a
# loaded two-core machine (threads, the proxy, the server's own scheduling).
BOUND = CALL_TIMEOUT + CANCEL_GRACE + 1.5
DEFINITE = (stockade.DeadlineExceeded, stockade.LockTimeout)


@pytest.fixture(scope="module")
def server() -> Iterator[TemporaryPostgres]:
    with TemporaryPostgres(max_connections=60) as pg:
        yield pg


@pytest.fixture
def shop(server: TemporaryPostgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh migrated database with stock, and its DSN."""
    name = f"deadline_{abs(hash(request.node.name)) % 10**8}"
    dsn = server.create_database(name)
    with stockade.Engine.postgres(dsn, pool_size=1) as eng:
        eng.migrate()
        eng.restock("hot", 1000)
    yield dsn
    server.sql("ALTER SYSTEM RESET synchronous_standby_names")
    server.sql("SELECT pg_reload_conf()")
    server.drop_database(name)


def engine(dsn: str) -> stockade.Engine:
    return stockade.Engine.postgres(
        dsn,
        pool_size=8,
        lock_timeout=timedelta(seconds=1),
        call_timeout=timedelta(seconds=CALL_TIMEOUT),
        cancel_grace=timedelta(seconds=CANCEL_GRACE),
        resolve_timeout=timedelta(seconds=1),
    )


Told = Dict[str, Tuple[object, float]]


def call_all(calls: Dict[str, object], meanwhile: Optional[Callable[[], object]] = None) -> Told:
    """Runs each call on a thread of its own, at once (with `meanwhile` on this thread,
    stockade.testing.race); key -> (outcome, seconds taken)."""
    told: Told = {}
    lock = threading.Lock()
    items = list(calls.items())

    def one(i: int) -> None:
        key, call = items[i]
        started = time.monotonic()
        try:
            out: object = call()  # type: ignore[operator]
        except stockade.StockadeError as e:
            out = e
        with lock:
            told[key] = (out, time.monotonic() - started)

    out = race(len(items), one, timeout=30, meanwhile=meanwhile)
    assert not any(out.errors), out.errors
    assert len(told) == len(calls), "a caller was never answered"
    return told


def keys_stored(server: TemporaryPostgres, dsn: str) -> List[str]:
    dbname = dsn.split("dbname=")[1].split()[0]
    out = server.sql("SELECT string_agg(key, ',') FROM stockade.idempotency", dbname)
    return out.split(",") if out else []


def check_told_the_truth(
    eng: stockade.Engine, server: TemporaryPostgres, dsn: str, told: Told, before: int
) -> None:
    """A definite failure left no key behind; each keyed call, retried, ends with exactly
    one reservation; the ledger adds up (keyless InDoubt calls may or may not have landed).
    `before`: the reservations there were before the calls."""
    stored = set(keys_stored(server, dsn))
    for key, (out, _) in told.items():
        if isinstance(out, DEFINITE) and key.startswith("k-"):
            assert key not in stored, f"{key} was told {type(out).__name__}, yet it is stored"
    keyless_in_doubt = 0
    for key, (out, _) in told.items():
        if key.startswith("k-"):
            r = eng.reserve("hot", 1, idempotency_key=key)
            if isinstance(out, stockade.Reservation):
                assert r == out
        elif isinstance(out, stockade.InDoubt):
            keyless_in_doubt += 1
    keyed = sum(1 for key in told if key.startswith("k-"))
    made = eng.row_counts()["reservation_count"]
    assert eng.stock("hot").reserved == made
    assert before + keyed <= made <= before + keyed + keyless_in_doubt


@pytest.mark.parametrize("strategy", ["atomic", "pessimistic", "optimistic", "batched"])
def test_a_commit_waiting_for_a_gone_standby_is_answered_within_the_deadline(
    server: TemporaryPostgres, shop: str, strategy: str
) -> None:
    with engine(shop) as eng:
        eng.reserve("hot", 1, idempotency_key="warm-up", strategy=strategy)
        before = eng.row_counts()["reservation_count"]
        server.sql("ALTER SYSTEM SET synchronous_standby_names = 'gone'")
        server.sql("SELECT pg_reload_conf()")
        time.sleep(0.3)  # every backend has read the new setting
        calls: Dict[str, object] = {}
        for i in range(3):
            calls[f"k-{strategy}-{i}"] = lambda i=i: eng.reserve(
                "hot", 1, idempotency_key=f"k-{strategy}-{i}", strategy=strategy
            )
            calls[f"n-{strategy}-{i}"] = lambda: eng.reserve("hot", 1, strategy=strategy)
        told = call_all(calls)
        server.sql("ALTER SYSTEM RESET synchronous_standby_names")
        server.sql("SELECT pg_reload_conf()")
        time.sleep(0.3)
        slowest = max(took for _, took in told.values())
        print(f"hung commit, {strategy}: the longest caller waited {slowest:.2f} s")
        for key, (out, took) in told.items():
            assert took <= BOUND, f"{key} waited {took:.2f} s"
            # No commit can complete while the standby is gone: none is a success.
            assert isinstance(out, (stockade.InDoubt, *DEFINITE)), (key, out)
        assert any(isinstance(out, stockade.InDoubt) for out, _ in told.values())
        check_told_the_truth(eng, server, shop, told, before)


def test_close_returns_within_its_bound_while_commits_hang(
    server: TemporaryPostgres, shop: str
) -> None:
    # Batched callers are queued behind a commit that hangs when close() is called: close
    # drains them, each answered within its deadline, and returns within the same bound.
    eng = engine(shop)
    eng.reserve("hot", 1, strategy="batched")
    server.sql("ALTER SYSTEM SET synchronous_standby_names = 'gone'")
    server.sql("SELECT pg_reload_conf()")
    time.sleep(0.3)
    calls = {f"n-{i}": lambda: eng.reserve("hot", 1, strategy="batched") for i in range(6)}
    closing: List[float] = []

    def close_while_they_wait() -> None:
        time.sleep(0.2)
        started = time.monotonic()
        eng.close()
        closing.append(time.monotonic() - started)

    told = call_all(calls, meanwhile=close_while_they_wait)
    (closed_in,) = closing
    print(f"close() while commits hang: {closed_in:.2f} s")
    assert closed_in <= BOUND
    assert len(told) == 6
    for key, (out, took) in told.items():
        assert took <= BOUND, f"{key} waited {took:.2f} s"
        assert isinstance(out, (stockade.InDoubt, *DEFINITE, stockade.InvalidState)), (key, out)


@pytest.fixture
def frozen_proxy(server: TemporaryPostgres) -> Iterator[CommitCuttingProxy]:
    p = CommitCuttingProxy("127.0.0.1", server.port)
    yield p
    p.close()


def test_a_server_that_stops_answering_is_cut_at_the_deadline(
    server: TemporaryPostgres, shop: str, frozen_proxy: CommitCuttingProxy
) -> None:
    dbname = shop.split("dbname=")[1].split()[0]
    with (
        engine(frozen_proxy.dsn(dbname) + " connect_timeout=2") as eng,
        stockade.Engine.postgres(shop, pool_size=1) as holder,
    ):
        # Four connections open before the freeze, so that each caller starts on one: four
        # reserves wait together behind a row lock another session holds, each on a
        # connection of its own (quick calls one after another may share one).
        wait = lambda: eng.reserve("hot", 1, strategy="pessimistic")  # noqa: E731
        warm = {f"warm-{i}": wait for i in range(4)}
        with hold_lock(holder, "hot") as locked:

            def four_in_use_then_unlock() -> None:
                until = time.monotonic() + 0.8  # within lock_timeout (1 s)
                while eng.stats()["pool"]["in_use"] < 4 and time.monotonic() < until:
                    time.sleep(0.02)
                locked.release()

            call_all(warm, meanwhile=four_in_use_then_unlock)
        assert eng.stats()["pool"]["idle"] >= 4
        frozen_proxy.freeze()
        calls: Dict[str, object] = {
            "k-atomic": lambda: eng.reserve("hot", 1, idempotency_key="k-atomic"),
            "k-pessimistic": lambda: eng.reserve(
                "hot", 1, idempotency_key="k-pessimistic", strategy="pessimistic"
            ),
            "n-restock": lambda: eng.restock("hot", 5),
            "read": lambda: eng.stock("hot"),
        }
        told = call_all(calls)
        frozen_proxy.thaw()
        slowest = max(took for _, took in told.values())
        print(f"frozen server: the longest caller waited {slowest:.2f} s")
        for key, (out, took) in told.items():
            assert took <= BOUND, f"{key} waited {took:.2f} s"
            assert isinstance(out, (stockade.InDoubt, stockade.DeadlineExceeded)), (key, out)
        assert isinstance(told["read"][0], stockade.DeadlineExceeded)
        # Served again once the server answers, on fresh connections.
        deadline = time.monotonic() + 10
        while True:
            try:
                eng.stock("hot")
                break
            except (stockade.DeadlineExceeded, stockade.Unavailable):
                assert time.monotonic() < deadline, "never served again"
        stored = set(keys_stored(server, shop))
        for key, (out, _) in told.items():
            if isinstance(out, stockade.DeadlineExceeded) and key.startswith("k-"):
                assert key not in stored
        for key in ("k-atomic", "k-pessimistic"):
            eng.reserve("hot", 1, idempotency_key=key)
        assert eng.stock("hot").reserved == eng.row_counts()["reservation_count"]


def test_the_deadline_options_are_checked(server: TemporaryPostgres, shop: str) -> None:
    for bad in (timedelta(0), timedelta(minutes=11)):
        with pytest.raises(stockade.InvalidArgument, match="call_timeout"):
            stockade.Engine.postgres(shop, call_timeout=bad)
    with pytest.raises(stockade.InvalidArgument, match="cancel_grace"):
        stockade.Engine.postgres(shop, cancel_grace=timedelta(minutes=2))
