"""What only the PostgreSQL store has: migrations, the schema's CHECK constraints, the
connection pool, reconnection, in-doubt commits, the sweeper, SKIP LOCKED expiry, sorted
lock order between engines, and races between engines in separate processes.

Every test runs against the throwaway server of the stockade pytest plugin, on a fresh
database cloned from the migrated template (or an empty one where migration is tested).
"""

from __future__ import annotations

import multiprocessing
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, List

import pytest

import stockade
import stockade.testing
from pgproxy import CommitCuttingProxy
from stockade import ReservationState
from stockade.tools.pgserver import child_connection, conninfo_with, run_sql
from stockade.tools.pytest_plugin import PostgresForTests
from support import MIGRATIONS, field, in_doubt_after_cut, wait_for_session

pytestmark = pytest.mark.postgres


@pytest.fixture
def empty_database(stockade_postgres: PostgresForTests) -> Iterator[str]:
    """The DSN of a database without the stockade schema."""
    name = stockade_postgres.new_database(migrated=False)
    try:
        yield stockade_postgres.dsn(name)
    finally:
        stockade_postgres.drop_database(name)


def sql(dsn: str, statement: str) -> str:
    return run_sql(dsn, statement)


# --- migrations and schema ---


def test_migrate_applies_each_file_once_and_records_it(empty_database: str) -> None:
    with stockade.Engine.postgres(empty_database, pool_size=1) as eng:
        with pytest.raises(stockade.SchemaNotMigrated, match="migrate") as unmigrated:
            eng.restock("s", 1)  # no schema yet: a clear error, not a crash
        # The service's own set-up, not the request's conflict: 500, and no retry fixes it.
        error = unmigrated.value
        assert (error.http_status, error.retryable) == (500, False)
        assert error.sqlstate in ("42P01", "3F000")  # a missing table, or schema
        assert isinstance(error, stockade.InvalidState) and not str(error).endswith("\n")
        assert eng.migrate() == MIGRATIONS
        assert eng.migrate() == []
        assert eng.restock("s", 1).on_hand == 1
    rows = sql(empty_database, "SELECT version, name FROM stockade.schema_migrations")
    assert rows.splitlines() == [f"{n}|{name}" for n, name in enumerate(MIGRATIONS, 1)]


def test_concurrent_migrations_apply_each_file_exactly_once(empty_database: str) -> None:
    engines = [stockade.Engine.postgres(empty_database, pool_size=1) for _ in range(4)]
    out = stockade.testing.race(4, lambda i: engines[i].migrate())
    for eng in engines:
        eng.close()
    assert out.errors == [None] * 4
    applied = sorted(name for names in out.results for name in names)
    assert applied == MIGRATIONS
    # and the statement routines, made once under the same lock (see test_pooler.py)
    routines = sql(
        empty_database,
        "SELECT count(*), count(DISTINCT proname) FROM pg_proc"
        " WHERE pronamespace = 'stockade'::regnamespace AND proname LIKE 'stockade\\_%'",
    )
    count, distinct = map(int, routines.split("|"))
    assert count == distinct and count >= 20


def test_a_changed_migration_is_refused(stockade_database: str) -> None:
    sql(stockade_database, "UPDATE stockade.schema_migrations SET checksum = 'edited'")
    with stockade.Engine.postgres(stockade_database, pool_size=1) as eng:
        with pytest.raises(stockade.InvalidState, match="must never change"):
            eng.migrate()


def test_schema_name_is_configurable_and_checked(stockade_database: str) -> None:
    with stockade.Engine.postgres(stockade_database, schema="shop_eu", pool_size=1) as eu:
        assert eu.migrate() == MIGRATIONS
        eu.restock("s", 7)
        with stockade.Engine.postgres(stockade_database, pool_size=1) as default:
            with pytest.raises(stockade.NotFound):
                default.stock("s")  # another schema, another inventory
    with pytest.raises(stockade.InvalidArgument, match="schema"):
        stockade.Engine.postgres(stockade_database, schema="Robert'); DROP TABLE x;--")


def test_check_constraint_refuses_an_oversold_row(stockade_database: str) -> None:
    # The last line of defense holds even for SQL that bypasses the engine.
    with stockade.Engine.postgres(stockade_database, pool_size=1) as eng:
        eng.restock("s", 5)
    with pytest.raises(stockade.StockadeError, match="stock_claimed_within_limit"):
        sql(stockade_database, "UPDATE stockade.stock SET reserved = 6 WHERE sku = 's'")


@pytest.mark.engine_bug_expected
def test_a_check_violation_surfaces_as_invariant_violation(
    stockade_engine: stockade.Engine, stockade_database: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The naive canary writes reserved from a stale read; if on_hand falls meanwhile, the
    # CHECK constraint refuses the write. The engine must report it as a bug-level error
    # with its SQLSTATE, never swallow it, and log it at ERROR for an operator.
    stockade_engine.restock("s", 10)

    def sell_while_the_canary_waits() -> None:
        wait_for_session(stockade_database, "state = 'idle in transaction'")  # it has read
        stockade_engine.sell("s", 10)

    out = stockade.testing.race(
        2,
        lambda i: (
            stockade.testing.naive_reserve(stockade_engine, "s", 1, window=2.0)
            if i == 0
            else sell_while_the_canary_waits()
        ),
    )
    assert isinstance(out.errors[0], stockade.InvariantViolation), out.errors
    assert out.errors[0].sqlstate == "23514"
    bugs = [r for r in caplog.records if "a bug in the engine" in r.getMessage()]
    assert bugs and bugs[0].levelname == "ERROR" and bugs[0].name == "stockade"
    lvl = stockade_engine.stock("s")
    assert (lvl.on_hand, lvl.reserved) == (0, 0)


# --- connections ---


def test_an_unreachable_server_raises_unavailable() -> None:
    with pytest.raises(stockade.Unavailable, match="cannot connect"):
        stockade.Engine.postgres(UNREACHABLE)


UNREACHABLE = "host=127.0.0.1 port=1 connect_timeout=2 user=x dbname=x"


def _refused(dsn: str, secret: str = "") -> stockade.Misconfigured:
    with pytest.raises(stockade.Misconfigured, match="configuration error") as refused:
        stockade.Engine.postgres(dsn, pool_size=1)
    error = refused.value
    assert (error.http_status, error.retryable) == (500, False)
    assert not isinstance(error, stockade.Unavailable)
    assert str(error) == str(error).strip() and "\n" not in str(error)
    if secret:
        assert secret not in str(error)
    return error


def test_a_dsn_naming_a_missing_database_or_role_is_misconfigured(
    stockade_postgres: PostgresForTests,
) -> None:
    missing = f"stockade_missing_{uuid.uuid4().hex[:8]}"
    _refused(conninfo_with(stockade_postgres.dsn("postgres"), dbname=missing))
    if not stockade_postgres.pooled:  # a pooler answers for roles itself, by its own auth
        dsn = conninfo_with(stockade_postgres.dsn("postgres"), user=missing)
        _refused(dsn)


def test_a_database_not_in_utf8_is_refused_before_anything_is_created(
    stockade_postgres: PostgresForTests,
) -> None:
    name = f"stockade_latin1_{uuid.uuid4().hex[:8]}"
    stockade_postgres.sql(
        f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )
    try:
        with pytest.raises(stockade.Misconfigured, match=r"encoding is LATIN1.*ENCODING 'UTF8'"):
            with stockade.Engine.postgres(stockade_postgres.dsn(name)) as eng:
                eng.migrate()
        schemas = "SELECT count(*) FROM pg_namespace WHERE nspname = 'stockade'"
        assert stockade_postgres.sql(schemas, name).strip() == "0"
    finally:
        stockade_postgres.drop_database(name)


@pytest.fixture
def password_role(stockade_postgres: PostgresForTests) -> Iterator[str]:
    """A role that must log in with a password (a scram-sha-256 pg_hba.conf line of its own,
    ahead of the server's trust lines); yields its name, whose password is 'right'."""
    if stockade_postgres.pooled:
        pytest.skip("PgBouncer authenticates clients itself; the server never sees them")
    role = f"stockade_pw_{uuid.uuid4().hex[:8]}"
    hba = Path(stockade_postgres.sql("SHOW hba_file").strip())
    try:
        original = hba.read_text()
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n{original}")
    except OSError as e:  # an external server (--stockade-dsn) whose files are not ours
        pytest.skip(f"cannot edit the server's pg_hba.conf: {e}")
    stockade_postgres.sql(f"CREATE ROLE {role} LOGIN PASSWORD 'right'")
    stockade_postgres.sql("SELECT pg_reload_conf()")
    try:
        yield role
    finally:
        hba.write_text(original)
        stockade_postgres.sql("SELECT pg_reload_conf()")
        stockade_postgres.sql(f"DROP ROLE IF EXISTS {role}")


def test_a_wrong_password_is_misconfigured_and_the_right_one_connects(
    stockade_postgres: PostgresForTests, password_role: str
) -> None:
    base = stockade_postgres.dsn("postgres")
    error = _refused(conninfo_with(base, user=password_role, password="hunter2-wrong"), "hunter2")
    assert "password authentication failed" in str(error)
    _refused(conninfo_with(base, user=password_role), "right")  # no password at all
    with stockade.Engine.postgres(conninfo_with(base, user=password_role, password="right")) as eng:
        assert eng.backend == "postgres"


@pytest.mark.parametrize(
    "options",
    [
        {"pool_size": 0},
        {"pool_size": 100_000},
        {"schema": ""},
        {"schema": "Shop"},
        {"pool_timeout": 0},
        {"sweep_interval": -1},
        {"sweep_batch": 0},
        {"retries_max": -1},
        {"lock_timeout": 0},
        {"default_ttl": 0},
        {"strategy": "yolo"},
    ],
    ids=lambda o: next(iter(o)),
)
def test_bad_options_raise_invalid_argument_before_connecting(options: dict[str, object]) -> None:
    # The DSN is unreachable: a check made after connecting would raise Unavailable.
    with pytest.raises(stockade.InvalidArgument):
        stockade.Engine.postgres(UNREACHABLE, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "options",
    [
        {"pool_size": "8"},
        {"pool_size": True},
        {"sweeper": 1},
        {"schema": b"x"},
        {"dsn": None},
    ],
    ids=lambda o: next(iter(o)),
)
def test_options_of_the_wrong_type_raise_invalid_type(options: dict[str, object]) -> None:
    kwargs = {"dsn": UNREACHABLE, **options}
    with pytest.raises(stockade.InvalidType):
        stockade.Engine.postgres(**kwargs)  # type: ignore[arg-type]


def test_a_full_pool_raises_overloaded_after_pool_timeout(stockade_database: str) -> None:
    with stockade.Engine.postgres(stockade_database, pool_size=1, pool_timeout=0.1) as eng:
        eng.restock("s", 5)
        errors: List[BaseException] = []

        def wait_for_the_row() -> None:
            try:
                eng.reserve("s", 1, strategy="pessimistic", lock_timeout=2.0)
            except stockade.StockadeError as exc:
                errors.append(exc)

        with stockade.testing.hold_lock(eng, "s"):
            # The pool's one connection waits for the row lock ...
            blocked = threading.Thread(target=wait_for_the_row)
            blocked.start()
            wait_for_session(stockade_database, "wait_event_type = 'Lock'")
            # ... so another call finds no connection within pool_timeout.
            with pytest.raises(stockade.Overloaded, match="pool_size 1"):
                eng.stock("s")
            blocked.join()
        assert [type(e) for e in errors] == [stockade.LockTimeout]
        assert eng.stock("s").reserved == 0


def test_broken_connections_are_replaced_transparently(
    stockade_engine: stockade.Engine, stockade_database: str
) -> None:
    # Fill the pool with idle connections: eight callers queue on a held row lock.
    stockade_engine.restock("s", 100)
    with stockade.testing.hold_lock(stockade_engine, "s") as locked:
        out = stockade.testing.race(
            8,
            lambda i: stockade_engine.reserve("s", 1, strategy="pessimistic"),
            meanwhile=lambda: locked.release_after(0.3),
        )
    assert not any(out.errors), out.errors
    dbname = field(stockade_database, "dbname")
    killed = sql(
        stockade_database,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        f"WHERE datname = '{dbname}' AND pid <> pg_backend_pid()",
    )
    assert int(killed) >= 8  # as a server restart would: every pooled connection is dead
    assert stockade_engine.reserve("s", 2).qty == 2  # reconnects; nothing was in flight
    assert stockade_engine.stock("s").reserved == 10


def test_the_engine_lock_timeout_bounds_calls_without_lock_options(
    stockade_database: str,
) -> None:
    with stockade.Engine.postgres(stockade_database, lock_timeout=0.2, pool_size=2) as eng:
        eng.restock("s", 5)
        r = eng.reserve("s", 1)
        with stockade.testing.hold_lock(eng, "s"):
            out = stockade.testing.race(
                2, lambda i: eng.restock("s", 1) if i == 0 else eng.confirm(r.id)
            )
        assert [type(e) for e in out.errors] == [stockade.LockTimeout] * 2
        assert eng.stock("s").on_hand == 5 and eng.reservation(r.id).state == "held"


def test_calls_after_close_raise_unavailable(stockade_database: str) -> None:
    eng = stockade.Engine.postgres(stockade_database, pool_size=1)
    eng.restock("s", 1)
    eng.close()
    eng.close()
    with pytest.raises(stockade.Unavailable, match="the engine is closed"):
        eng.stock("s")


def test_serialization_failures_are_retried_within_bounds(
    stockade_database: str, strategy: str
) -> None:
    # Under SERIALIZABLE (a server default some teams choose), concurrent writers to one
    # row fail with 40001. The engine retries those transactions a bounded number of
    # times, then raises Overloaded with the SQLSTATE; nothing is lost or oversold.
    dbname = field(stockade_database, "dbname")
    sql(
        stockade_database,
        f"ALTER DATABASE {dbname} SET default_transaction_isolation = 'serializable'",
    )
    with stockade.Engine.postgres(stockade_database, pool_size=8) as eng:
        eng.restock("hot", 1000)
        out = stockade.testing.race(
            32, lambda i: [eng.reserve("hot", 1, strategy=strategy) for _ in range(5)]
        )
        assert eng.stats()["strategies"][strategy]["retries"] > 0
        for e in out.errors:
            if isinstance(e, stockade.Overloaded):  # the retry budget ran out
                assert e.sqlstate == "40001", e
            else:  # optimistic may also run out of its own retries
                assert e is None or (
                    strategy == "optimistic" and isinstance(e, stockade.RetriesExhausted)
                ), e
        granted = eng.stats()["strategies"][strategy]["granted"]
        assert granted > 0
        assert eng.stock("hot").reserved == granted == eng.row_counts()["reservation_count"]


# --- in-doubt commits ---


@pytest.mark.parametrize("cut", ["after", "before"])
def test_a_reserve_whose_commit_is_cut_is_resolved_by_the_engine(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str, strategy: str
) -> None:
    # COMMIT reached the server or it did not. The engine ends the lost session, so the
    # outcome is final, and looks for the reservation it was making: there, it answers
    # with it; absent, nothing changed and it runs the reservation once more. Behind a
    # transaction-mode pooler it cannot end the session: found, it answers; absent, the
    # write may still land, so InDoubt, and the retry with the key settles it.
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(proxy.dsn(dbname), pool_size=1, sweeper=False) as eng:
        eng.restock("s", 10)
        proxy.arm(cut)
        if in_doubt_after_cut(pooled, cut):
            with pytest.raises(stockade.InDoubt, match="pooler"):
                eng.reserve("s", 3, idempotency_key="order-1", strategy=strategy, ttl=60)
            assert proxy.cuts == 1 and eng.stock("s").reserved == 0
        r = eng.reserve("s", 3, idempotency_key="order-1", strategy=strategy, ttl=60)
        assert proxy.cuts == 1
        assert r.state is ReservationState.HELD and r.qty == 3
        lvl = eng.stock("s")
        assert (lvl.reserved, lvl.available) == (3, 7)
        assert eng.row_counts()["reservation_count"] == 1
        assert eng.reservation(r.id) == r
        assert eng.reserve("s", 3, idempotency_key="order-1", strategy=strategy, ttl=60) == r


@pytest.mark.parametrize("cut", ["after", "before"])
def test_a_cut_commit_the_engine_cannot_settle_is_in_doubt_and_a_retry_resolves_it(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str, strategy: str
) -> None:
    # The server cannot be reached after the cut, so the engine cannot end the lost
    # session within resolve_timeout: it says InDoubt, never a definite outcome.
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(
        proxy.dsn(dbname), pool_size=1, resolve_timeout=0.3, sweeper=False
    ) as eng:
        eng.restock("s", 10)
        proxy.arm(cut)
        proxy.refuse_new = True
        with pytest.raises(stockade.InDoubt) as info:
            eng.reserve("s", 3, idempotency_key="order-1", strategy=strategy, ttl=60)
        proxy.refuse_new = False
        assert proxy.cuts == 1 and info.value.sku == "s"
        assert ("pooler" if pooled else "could not be ended") in str(info.value)
        # The proxy did what it says: COMMIT reached the server or it did not.
        assert eng.stock("s").reserved == (3 if cut == "after" else 0)
        # The retry with the same key learns the outcome: the original reservation if
        # COMMIT went through, a new one if it did not; never two, never none.
        r = eng.reserve("s", 3, idempotency_key="order-1", strategy=strategy, ttl=60)
        assert r.state is ReservationState.HELD and r.qty == 3
        lvl = eng.stock("s")
        assert (lvl.reserved, lvl.available) == (3, 7)
        assert eng.row_counts()["reservation_count"] == 1
        assert eng.reservation(r.id) == r


def test_an_in_doubt_confirm_can_be_read_back(
    proxy: CommitCuttingProxy, stockade_database: str
) -> None:
    dbname = field(stockade_database, "dbname")
    with stockade.Engine.postgres(proxy.dsn(dbname), pool_size=1, sweeper=False) as eng:
        eng.restock("s", 10)
        r = eng.reserve("s", 4)
        proxy.arm("after")
        with pytest.raises(stockade.InDoubt):
            eng.confirm(r.id)
        assert eng.reservation(r.id).state is ReservationState.CONFIRMED
        assert eng.stock("s").on_hand == 6


# --- expiry ---


def test_expire_due_skips_holds_locked_by_a_transition(
    stockade_engine: stockade.Engine, stockade_database: str
) -> None:
    stockade_engine.restock("s", 10)
    locked = stockade_engine.reserve("s", 1, ttl=0.1)
    free = stockade_engine.reserve("s", 2, ttl=0.1)
    time.sleep(0.15)
    holder = subprocess.Popen(
        [
            "psql",
            "-X",
            "-q",
            "-d",
            stockade_database,
            "-c",
            f"BEGIN; SELECT 1 FROM stockade.reservation WHERE id = '{locked.id}' FOR UPDATE; "
            "SELECT pg_sleep(5); COMMIT;",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_session(stockade_database, "query LIKE '%pg_sleep%' AND state = 'active'")
        start = time.monotonic()
        assert stockade_engine.expire_due() == 1  # SKIP LOCKED: no wait for the locked row
        assert time.monotonic() - start < 2.5
        assert stockade_engine.reservation(free.id).state is ReservationState.EXPIRED
        assert stockade_engine.reservation(locked.id).state is ReservationState.HELD
    finally:
        assert holder.wait(10) == 0
    assert stockade_engine.expire_due() == 1
    assert stockade_engine.stock("s").reserved == 0


def test_expire_due_works_in_bounded_batches(stockade_engine: stockade.Engine) -> None:
    stockade_engine.restock("a", 100)
    stockade_engine.restock("b", 100)
    for i in range(30):
        stockade_engine.reserve("a" if i % 2 else "b", 1, ttl=0.05)
    time.sleep(0.1)
    assert [stockade_engine.expire_due(limit=12) for _ in range(4)] == [12, 12, 6, 0]
    assert stockade_engine.stock("a").reserved == stockade_engine.stock("b").reserved == 0


def test_the_sweeper_expires_due_holds_and_one_engine_sweeps(
    stockade_database: str, pooled: bool
) -> None:
    # Directly, one engine's session holds the election lock and that engine sweeps.
    # Behind a transaction-mode pooler each sweeper transaction takes the lock for itself,
    # so the engines may take turns: still each hold expires exactly once.
    options = dict(sweeper=True, sweep_interval=0.05, pool_size=2)
    with (
        stockade.Engine.postgres(stockade_database, **options) as a,
        stockade.Engine.postgres(stockade_database, **options) as b,
    ):
        a.restock("s", 10)
        held = [a.reserve("s", 1, ttl=0.1) for _ in range(3)] + [b.reserve("s", 1, ttl=0.1)]
        deadline = time.monotonic() + 10
        while a.stock("s").reserved and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.stock("s").reserved == 0
        assert {a.reservation(r.id).state for r in held} == {ReservationState.EXPIRED}
        sweepers = [a.stats()["sweeper"], b.stats()["sweeper"]]
        assert [s["enabled"] for s in sweepers] == [True, True]
        assert sum(s["expired"] for s in sweepers) == 4
        assert [s["errors"] for s in sweepers] == [0, 0]
        assert [a.stats()["pool"]["pooled"], b.stats()["pool"]["pooled"]] == [pooled, pooled]
        if pooled:
            return
        assert sorted(s["leader"] for s in sweepers) == [False, True]
        leaders = sql(
            stockade_database,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
        )
        assert leaders == "1"
    with stockade.Engine.postgres(stockade_database, pool_size=1) as c:
        assert c.stats()["sweeper"]["enabled"] is True  # on by default
    with stockade.Engine.postgres(stockade_database, pool_size=1, sweeper=False) as c:
        assert c.stats()["sweeper"]["enabled"] is False


# --- lock order between engines ---


@pytest.mark.parametrize("strategy_name", ["pessimistic", "advisory", "atomic", "optimistic"])
def test_orders_in_opposite_orders_from_two_engines_never_deadlock(
    stockade_database: str, strategy_name: str
) -> None:
    rounds = 60
    with (
        stockade.Engine.postgres(stockade_database, pool_size=4) as one,
        stockade.Engine.postgres(stockade_database, pool_size=4) as two,
    ):
        for sku in ("a", "b", "c"):
            one.restock(sku, 10_000)
        orders = [{"a": 1, "b": 1, "c": 1}, {"c": 1, "b": 1, "a": 1}]

        def place(i: int) -> int:
            eng = one if i % 2 else two
            placed = 0
            for _ in range(rounds):
                try:
                    eng.reserve_order(orders[i % 2], strategy=strategy_name)
                    placed += 1
                except stockade.RetriesExhausted:
                    assert strategy_name == "optimistic"
            return placed

        out = stockade.testing.race(8, place)
        assert out.errors == [None] * 8
        placed = sum(out.results)
        assert placed > 0
        if strategy_name != "optimistic":  # optimistic counts its own retries there
            # A deadlock (40P01) would have been retried and counted: there were none.
            for eng in (one, two):
                assert eng.stats()["strategies"][strategy_name]["retries"] == 0
        for sku in ("a", "b", "c"):
            assert one.stock(sku).reserved == placed


# --- races between processes ---


def _buyer_process(
    dsn: str, strategy: str, threads: int, barrier: object, results: "multiprocessing.Queue[int]"
) -> None:
    import stockade as sk

    with sk.Engine.postgres(dsn, pool_size=8) as eng:

        def buy(i: int) -> bool:
            for _ in range(50):
                try:
                    eng.reserve("hot", 1, strategy=strategy)
                    return True
                except sk.OutOfStock:
                    return False
                except sk.RetriesExhausted:
                    continue
            raise AssertionError("lost the optimistic race 50 times")

        barrier.wait()  # type: ignore[attr-defined]
        out = sk.testing.race(threads, buy)
        if any(e is not None for e in out.errors):
            results.put(-1)
            return
        results.put(sum(1 for granted in out.results if granted))


def test_two_engines_in_two_processes_grant_exactly_the_units(
    stockade_engine: stockade.Engine, stockade_database: str, strategy: str
) -> None:
    units = 100
    stockade_engine.restock("hot", units)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results: "multiprocessing.Queue[int]" = ctx.Queue()
    procs = [
        ctx.Process(
            target=_buyer_process, args=(stockade_database, strategy, 128, barrier, results)
        )
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    granted: List[int] = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
    assert -1 not in granted
    assert sum(granted) == units
    lvl = stockade_engine.stock("hot")
    assert (lvl.reserved, lvl.available) == (units, 0)
    assert stockade_engine.row_counts()["reservation_count"] == units


def test_reservation_ids_are_uuid_v7(stockade_engine: stockade.Engine) -> None:
    stockade_engine.restock("s", 2)
    a = stockade_engine.reserve("s", 1)
    b = stockade_engine.reserve("s", 1)
    assert isinstance(a.id, uuid.UUID) and a.id.version == 7
    assert a.id.bytes[:6] <= b.id.bytes[:6]  # time-ordered


# --- application_name ---


def test_connections_carry_an_application_name(
    stockade_database: str, pooled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if pooled:
        pytest.skip(
            "behind a transaction-mode pooler a server session shows the application_name "
            "of whichever client ran on it last (the pooler's), not one engine's"
        )
    monkeypatch.delenv("PGAPPNAME", raising=False)
    count = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = '{}'"
    )
    with stockade.Engine.postgres(stockade_database, pool_size=1):
        assert int(sql(stockade_database, count.format("stockade"))) >= 1
    with stockade.Engine.postgres(stockade_database, pool_size=1, application_name="shop api"):
        assert int(sql(stockade_database, count.format("shop api"))) >= 1
    # The DSN's own application_name wins, in key=value and URI form alike.
    with stockade.Engine.postgres(stockade_database + " application_name=mine", pool_size=1):
        assert int(sql(stockade_database, count.format("mine"))) >= 1
    host, port = field(stockade_database, "host"), field(stockade_database, "port")
    db = field(stockade_database, "dbname")
    uri = f"postgresql://postgres@{host}:{port}/{db}?sslmode=disable"
    with stockade.Engine.postgres(uri, pool_size=1, application_name="via uri"):
        assert int(sql(stockade_database, count.format("via uri"))) >= 1
    for bad in ("x" * 64, "it's", "tab\there", "naïve"):
        with pytest.raises(stockade.InvalidArgument):
            stockade.Engine.postgres(stockade_database, application_name=bad)


# --- configuration from the environment ---

_ENV = ("STOCKADE_DSN", "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def test_engine_from_env_reads_the_dsn_and_the_options(
    stockade_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(stockade.InvalidArgument, match="STOCKADE_DSN"):
        stockade.Engine.from_env()
    monkeypatch.setenv("STOCKADE_DSN", stockade_database)
    monkeypatch.setenv("STOCKADE_STRATEGY", "batched")
    monkeypatch.setenv("STOCKADE_POOL_SIZE", "2")
    monkeypatch.setenv("STOCKADE_LOCK_TIMEOUT", "2.5")
    monkeypatch.setenv("STOCKADE_SWEEPER", "no")
    with stockade.Engine.from_env() as eng:
        assert eng.strategy is stockade.Strategy.BATCHED
        assert eng.restock("s", 2).on_hand == 2
        assert eng.stats()["sweeper"]["enabled"] is False
    with stockade.Engine.from_env(strategy="atomic") as eng:  # keywords override
        assert eng.strategy is stockade.Strategy.ATOMIC
    monkeypatch.setenv("STOCKADE_RETENTION", "86400")
    with pytest.raises(stockade.InvalidArgument, match="needs sweeper=True"):
        stockade.Engine.from_env()  # retention without the sweeper is refused
    monkeypatch.setenv("STOCKADE_SWEEPER", "yes")
    with stockade.Engine.from_env() as eng:
        assert eng.stats()["sweeper"]["enabled"] is True
    monkeypatch.setenv("STOCKADE_SWEEPER", "no")
    monkeypatch.delenv("STOCKADE_RETENTION")
    monkeypatch.setenv("STOCKADE_POOL_SIZE", "many")
    with pytest.raises(stockade.InvalidArgument, match="STOCKADE_POOL_SIZE"):
        stockade.Engine.from_env()
    monkeypatch.delenv("STOCKADE_POOL_SIZE")
    # libpq's own variables, with no STOCKADE_DSN.
    monkeypatch.delenv("STOCKADE_DSN")
    monkeypatch.setenv("PGHOST", field(stockade_database, "host"))
    monkeypatch.setenv("PGPORT", field(stockade_database, "port"))
    monkeypatch.setenv("PGUSER", field(stockade_database, "user"))
    monkeypatch.setenv("PGDATABASE", field(stockade_database, "dbname"))
    with stockade.Engine.from_env() as eng:
        assert eng.stock("s").on_hand == 2


def test_drop_schema_runs_again_after_it_lost_a_deadlock(
    stockade_database: str, pooled: bool
) -> None:
    # DROP SCHEMA locks the schema's objects one by one. Another session holds a lock on
    # stock, waits until the DROP holds some other table and waits for stock, then asks
    # for that table too: a deadlock, which the DROP, waiting longer, loses. It runs
    # again once the other session is gone, instead of failing (a sweeper's transaction
    # did this to a test on Citus once).
    if pooled:
        pytest.skip("the other session's locks must stay on one server session")
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    before = int(run_sql(stockade_database, deadlocks))
    with stockade.Engine.postgres(stockade_database, schema="dropped", pool_size=1) as eng:
        eng.migrate()
        conninfo, env = child_connection(stockade_database)
        holder = subprocess.Popen(
            ["psql", "-X", "-q", "-A", "-t", conninfo],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        assert holder.stdin is not None and holder.stdout is not None
        errors: List[BaseException] = []
        try:
            holder.stdin.write(
                "BEGIN; LOCK TABLE dropped.stock IN ACCESS SHARE MODE; SELECT 'locked';\n"
            )
            holder.stdin.flush()
            assert holder.stdout.readline().strip() == "locked"

            def drop() -> None:
                try:
                    eng.drop_schema(confirm="dropped")
                except BaseException as exc:
                    errors.append(exc)

            dropper = threading.Thread(target=drop)
            dropper.start()
            held = ""
            deadline = time.monotonic() + 20
            while not held and time.monotonic() < deadline:
                held = run_sql(
                    stockade_database,
                    "SELECT c.relname FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
                    " JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE a.query LIKE 'DROP SCHEMA%' AND l.granted"
                    " AND l.mode = 'AccessExclusiveLock' AND c.relkind = 'r'"
                    " AND c.relnamespace = 'dropped'::regnamespace AND c.relname <> 'stock'"
                    " AND EXISTS (SELECT 1 FROM pg_locks w WHERE w.pid = l.pid AND NOT w.granted)"
                    " LIMIT 1",
                )
                time.sleep(0.05)
            assert held, "the DROP never held a table while it waited for stock"
            holder.stdin.write(f"LOCK TABLE dropped.{held} IN ACCESS SHARE MODE; COMMIT;\n")
            holder.stdin.flush()
            dropper.join(60)
            assert not dropper.is_alive()
        finally:
            holder.stdin.close()
            holder.wait(30)
            holder.stdout.close()
        assert errors == []
        assert run_sql(stockade_database, "SELECT to_regnamespace('dropped') IS NULL") == "t"
        # and a deadlock did happen (the server counts them; a session reports when idle)
        deadline = time.monotonic() + 10
        while int(run_sql(stockade_database, deadlocks)) == before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert int(run_sql(stockade_database, deadlocks)) > before


def test_drop_schema_needs_its_name_repeated(stockade_database: str) -> None:
    with stockade.Engine.postgres(stockade_database, schema="scratch", pool_size=1) as eng:
        eng.migrate()
        eng.restock("s", 1)
        with pytest.raises(stockade.InvalidArgument, match="repeat the name"):
            eng.drop_schema(confirm="stockade")
        assert eng.stock("s").on_hand == 1
        eng.drop_schema(confirm="scratch")
        plan = [name for name, _ in eng.migration_plan()]
        assert plan[:2] == ["(create schema)", "001_schema.sql"]
        with pytest.raises(stockade.SchemaNotMigrated, match="migrate"):
            eng.stock("s")  # no schema any more: the clear error of an unmigrated database
    with stockade.Engine.memory() as mem:
        mem.drop_schema(confirm="anything")  # no schema: nothing happens
        assert mem.migration_plan() == []
