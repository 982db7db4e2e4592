"""The movement journal, the change feed, stock alerts and the audit: one contract on both
stores (docs/journal.md), and the feed's promise that a transaction which took its
position first and committed last is not skipped (PostgreSQL)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Iterator, List, NamedTuple

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade.testing import race
from stockade.tools.pgserver import find_bindir
from stockade.tools.pytest_plugin import PostgresForTests
from support import field


def engine_with(backend: str, request: pytest.FixtureRequest, **options: object) -> stockade.Engine:
    """A PostgreSQL engine of the backend with these options, on a migrated schema of its
    own, closed (and on Citus dropped) after the test."""
    factory = (
        "stockade_engine_factory" if backend == "postgres" else "stockade_citus_engine_factory"
    )
    return request.getfixturevalue(factory)(**options)


def causes(moves: List[stockade.Movement]) -> List[str]:
    return [m.cause for m in moves]


def test_every_change_is_journaled_with_its_cause(engine: stockade.Engine) -> None:
    engine.restock("a", 10, reason="delivery", actor="dock-1")
    held = engine.reserve("a", 3, strategy="atomic")
    engine.confirm(held.id)
    other = engine.reserve("a", 2, strategy="atomic")
    engine.release(other.id)
    engine.sell("a", 2, strategy="atomic")
    engine.set_on_hand("a", 4, reason="count", actor="clerk")
    engine.set_backorder_limit("a", 2)
    engine.discontinue("a")
    engine.reinstate("a")
    moves = engine.movements("a")
    assert causes(moves) == [
        "restock", "hold", "confirm", "hold", "release", "sell", "set_on_hand",
        "backorder_limit", "discontinue", "reinstate",
    ]  # fmt: skip
    first = moves[0]
    assert (first.reason, first.actor, first.version_before, first.version) == (
        "delivery", "dock-1", 0, 1,
    )  # fmt: skip
    assert moves[2].ref == str(held.id) and moves[4].ref == str(other.id)
    assert moves[6].reason == "count" and moves[6].on_hand_delta == -1
    # Each entry starts where the one before ended, and adds up to the row.
    for before, after in itertools.pairwise(moves):
        assert after.version_before == before.version
        assert before.on_hand + after.on_hand_delta == after.on_hand
        assert before.reserved + after.reserved_delta == after.reserved
    row = engine.stock("a")
    assert (moves[-1].version, moves[-1].on_hand, moves[-1].reserved) == (
        row.version, row.on_hand, row.reserved,
    )  # fmt: skip
    assert moves[-1].available == row.available


def test_a_batch_writes_one_entry_per_row_with_its_requests(engine: stockade.Engine) -> None:
    engine.restock("hot", 10_000)

    def buyer() -> None:
        for _ in range(50):
            engine.reserve("hot", 1, strategy="batched")

    out = race(8, lambda _: buyer())
    assert not any(out.errors), out.errors
    moves = engine.movements("hot", limit=10_000)
    holds = [m for m in moves if m.cause == "hold"]
    assert sum(m.requests for m in holds) == 400
    assert sum(m.reserved_delta for m in holds) == 400
    assert len(holds) <= 400
    assert moves[-1].version == engine.stock("hot").version


def test_movements_filter_and_page(engine: stockade.Engine, store_now) -> None:
    before = store_now() - timedelta(seconds=5)
    for sku in ("a", "b"):
        engine.restock(sku, 5)
        engine.restock(sku, 5, location="east")
    assert [m.sku for m in engine.movements()] == ["a", "a", "b", "b"]
    assert [(m.sku, m.location) for m in engine.movements("b", location="east")] == [("b", "east")]
    first_two = engine.movements(limit=2)
    rest = engine.movements(after=first_two[-1].position)
    assert [m.position for m in first_two + rest] == [m.position for m in engine.movements()]
    assert len(engine.movements(since=before)) == 4
    assert engine.movements(since=datetime(9000, 1, 1, tzinfo=timezone.utc)) == []


def test_bad_input_to_the_journal_is_refused_and_changes_nothing(engine: stockade.Engine) -> None:
    engine.restock("a", 5)
    with pytest.raises(stockade.InvalidArgument, match="reason"):
        engine.restock("a", 5, reason="x" * 201)
    with pytest.raises(stockade.InvalidArgument, match="control"):
        engine.restock("a", 5, actor="pos\x1f17")
    with pytest.raises(stockade.InvalidArgument):
        engine.movements(limit=0)
    with pytest.raises(stockade.InvalidArgument):
        engine.movements(location="east")  # a location needs its sku
    with pytest.raises(stockade.InvalidArgument):
        engine.movements(since=datetime(2027, 1, 1))  # naive: which zone?
    with pytest.raises(stockade.InvalidArgument, match="consumer"):
        engine.feed("")
    with pytest.raises(stockade.InvalidArgument, match="consumer"):
        engine.feed("x" * 129)
    with pytest.raises(stockade.InvalidArgument):
        engine.set_low_stock("a", -1)
    with pytest.raises(stockade.NotFound):
        engine.set_low_stock("nope", 3)
    assert engine.stock("a").on_hand == 5
    assert causes(engine.movements()) == ["restock"]


def test_alerts_mark_the_changes_that_cross_a_line(engine: stockade.Engine) -> None:
    engine.restock("a", 10)
    level = engine.set_low_stock("a", 5)
    assert level.low_stock == 5 and engine.stock("a").low_stock == 5
    engine.sell("a", 4, strategy="atomic")  # 6 left: above the line
    engine.sell("a", 2, strategy="atomic")  # 4: below
    engine.sell("a", 4, strategy="atomic")  # 0: sold out
    engine.restock("a", 3)  # 3: back in stock, still low
    engine.restock("a", 3)  # 6: recovered
    marks = [sorted(m.alerts) for m in engine.movements("a")[2:]]
    assert marks == [[], ["low_stock"], ["sold_out"], ["back_in_stock"], ["recovered"]]
    engine.set_low_stock("a", None)
    assert engine.stock("a").low_stock is None


def test_a_feed_delivers_every_change_once_committed_and_resumes(engine: stockade.Engine) -> None:
    feed = engine.feed("mailer")
    engine.restock("a", 5)
    engine.restock("b", 5)
    got = feed.poll()
    assert [(c.sku, c.version) for c in got] == [("a", 1), ("b", 1)]
    assert feed.poll() == []
    feed.commit()
    engine.restock("a", 1)
    assert [c.key for c in feed.poll()] == [("a", "default", 2)]
    # Not committed: a consumer opened again gets it again (at least once).
    again = engine.feed("mailer")
    assert [c.key for c in again.poll()] == [("a", "default", 2)]
    again.commit()
    assert engine.feed("mailer").poll() == []
    # A new consumer starts at the journal's start, or at its end.
    assert len(engine.feed("audit-log").poll()) == 3
    late = engine.feed("late", start="latest")
    assert late.poll() == []
    engine.restock("c", 1)
    assert [c.sku for c in late.poll()] == ["c"]
    assert late.drop() and not late.drop()
    with pytest.raises(stockade.NotFound):
        late.poll()


def test_a_feed_pages_through_a_large_batch_in_order(engine: stockade.Engine) -> None:
    feed = engine.feed("pager")
    for i in range(25):
        engine.restock(f"s{i % 5}", 1)
    seen: List[stockade.StockChange] = []
    while page := feed.poll(limit=4):
        assert len(page) <= 4
        seen += page
    assert len(seen) == 25
    assert [c.position for c in seen] == sorted(c.position for c in seen)
    for sku in {c.sku for c in seen}:
        assert [c.version for c in seen if c.sku == sku] == [1, 2, 3, 4, 5]


def test_poll_waits_for_a_change_up_to_its_timeout(engine: stockade.Engine) -> None:
    feed = engine.feed("waiter", start="latest")
    started = time.monotonic()
    assert feed.poll(timeout=0.2) == []
    assert time.monotonic() - started >= 0.2
    timer = threading.Timer(0.3, lambda: engine.restock("a", 1))
    timer.start()
    try:
        got = feed.poll(timeout=10)
    finally:
        timer.join()
    assert [c.sku for c in got] == ["a"]
    with pytest.raises(stockade.InvalidArgument):
        feed.poll(timeout=-1)


def test_a_waiting_poll_is_woken_by_a_change_from_another_engine(
    backend: str, request: pytest.FixtureRequest, pooled: bool
) -> None:
    if backend == "memory":
        writer = reader = request.getfixturevalue("memory_engine")
    elif backend == "citus":
        reader = request.getfixturevalue("stockade_citus_engine")
        writer = stockade.Engine.postgres(
            request.getfixturevalue("stockade_citus_dsn"), layout="citus", schema=reader._schema
        )
        request.addfinalizer(writer.close)
    else:
        reader = request.getfixturevalue("stockade_engine")
        writer = stockade.Engine.postgres(request.getfixturevalue("stockade_database"))
        request.addfinalizer(writer.close)
    feed = reader.feed("woken", start="latest")
    timer = threading.Timer(0.3, lambda: writer.restock("a", 1))
    timer.start()
    try:
        got = feed.poll(timeout=30)
    finally:
        timer.join()
    assert [c.sku for c in got] == ["a"]
    if backend == "postgres" and pooled:
        assert feed.wakes.get("unsupported", 0) >= 1  # no LISTEN: it polled with backoff
    else:
        assert feed.wakes.get("changed", 0) >= 1  # a NOTIFY, not the once-a-second look


def test_async_iteration_over_a_feed(engine: stockade.Engine) -> None:
    import asyncio

    async def main() -> List[str]:
        feed = engine.feed("async")
        await engine.restock_async("a", 1)
        await engine.restock_async("b", 1)
        out: List[str] = []
        async for change in feed:
            out.append(change.sku)
            if len(out) == 2:
                break
        assert await feed.poll_async() == []
        await feed.commit_async()
        return out

    assert asyncio.run(main()) == ["a", "b"]


def test_the_audit_is_clean_after_traffic(engine: stockade.Engine) -> None:
    engine.restock("a", 100)
    engine.set_purchase_limit("drop", 5, ["a"])
    ids = [engine.reserve("a", 1, buyer=f"b{i % 3}", idempotency_key=f"k{i}").id for i in range(9)]
    for i, rid in enumerate(ids):
        if i % 3 == 0:
            engine.confirm(rid)
        elif i % 3 == 1:
            engine.release(rid)
    report = engine.audit()
    assert report.ok, report.violations
    assert report.rows == 1 and report.reservations == 9
    assert report.journal_checked and "journal_chain" in report.checks
    assert engine._core.last_audit_violations == 0


def test_the_audit_lists_what_it_could_not_check(engine: stockade.Engine, wait) -> None:
    # Goal: an audit that skipped a part says so instead of passing it as checked. Method:
    # a row whose journal entries retention purged, and an audit of one SKU; each part the
    # audit could not cover is listed, with why, and the report is not complete.
    engine.restock("cold", 1)
    engine.restock("warm", 1)
    assert engine.audit().complete and engine.audit().unchecked == []
    wait(1.5)
    assert engine.purge_movements(timedelta(seconds=1)) == 2  # no consumer: both go
    engine.restock("warm", 1)  # a new entry: its row is checked again
    report = engine.audit()
    assert report.ok and not report.complete
    [gap] = report.unchecked
    assert gap.check == "journal_matches_row" and gap.reason.startswith("1 stock row has no")
    assert "journal_matches_row" in report.checks  # it ran over the other row
    assert report.to_dict()["unchecked"] == [{"check": gap.check, "reason": gap.reason}]
    one = engine.audit(sku="warm")
    assert one.complete is False and one.ok
    assert {u.check for u in one.unchecked} == {"limit_matches_holds", "key_has_reservations"}
    assert not {"limit_matches_holds", "key_has_reservations"} & set(one.checks)


def test_purge_movements_keeps_what_a_consumer_has_not_read(engine: stockade.Engine, wait) -> None:
    feed = engine.feed("slow")
    engine.restock("a", 1)
    engine.restock("a", 1)
    wait(1.5)
    assert engine.purge_movements(timedelta(seconds=1)) == 0  # the consumer has not read them
    feed.poll()
    feed.commit()
    assert engine.purge_movements(timedelta(seconds=1)) == 2
    assert engine.movements() == []
    assert feed.poll() == []


def test_a_consumer_passed_by_feed_lag_max_is_told(backend: str, request) -> None:
    if backend == "memory":
        eng = stockade.Engine.memory(journal_max=3)
        feed = eng.feed("behind")
        for _ in range(5):
            eng.restock("a", 1)  # the journal keeps 3: two the consumer had not read go
    else:
        eng = engine_with(backend, request, feed_lag_max=timedelta(seconds=1))
        feed = eng.feed("behind")
        eng.restock("a", 1)
        time.sleep(1.5)
        assert eng.purge_movements(timedelta(seconds=1)) == 1
    with pytest.raises(stockade.FeedOverrun):
        feed.poll()
    with pytest.raises(stockade.FeedOverrun):
        eng.feed("behind")
    assert feed.drop()
    assert eng.feed("behind").poll() == eng.movements()
    if backend == "memory":
        eng.close()


# --- PostgreSQL: the trap of `WHERE id > last_seen` ---


class OpenTransaction:
    """A psql session that begins a transaction, runs a statement and waits to commit."""

    def __init__(self, dsn: str, statement: str) -> None:
        psql = str(find_bindir() / "psql")
        self.proc = subprocess.Popen(
            [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", dsn],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._send(f"BEGIN; {statement}; \\echo ready")
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def commit(self) -> None:
        self.proc.communicate("COMMIT;\n", timeout=30)  # closes the pipes
        assert self.proc.returncode == 0


class OnSql(NamedTuple):
    """An engine on one PostgreSQL layout, a superuser's DSN to its database, its schema."""

    engine: stockade.Engine
    admin_dsn: str
    schema: str
    citus: bool


@pytest.fixture
def on_sql(backend: str, request: pytest.FixtureRequest) -> OnSql:
    if backend == "citus":
        eng = request.getfixturevalue("stockade_citus_engine")
        return OnSql(eng, request.getfixturevalue("stockade_citus_dsn"), eng._schema, True)
    pg: PostgresForTests = request.getfixturevalue("stockade_postgres")
    database = request.getfixturevalue("stockade_database")
    return OnSql(
        request.getfixturevalue("stockade_engine"),
        pg.admin_dsn(field(database, "dbname")),
        "stockade",
        False,
    )


# The tests that write with plain SQL beside the engine, on each PostgreSQL layout.
on_both_layouts = pytest.mark.parametrize("backend", ["postgres", "citus"])


@on_both_layouts
def test_a_transaction_that_commits_last_is_not_skipped(on_sql: OnSql) -> None:
    eng = on_sql.engine
    eng.restock("early", 1)
    eng.restock("late", 1)
    feed = eng.feed("careful")
    assert len(feed.poll()) == 2
    # The first transaction takes its journal position now and commits after another.
    bump = f"UPDATE {on_sql.schema}.stock SET on_hand = on_hand + 1, version = version + 1"
    first = OpenTransaction(on_sql.admin_dsn, bump + " WHERE sku = 'early'")
    try:
        eng.restock("late", 1)
        got = feed.poll()
        assert [c.sku for c in got] == ["late"]
    finally:
        first.commit()
    got = feed.poll()
    assert [(c.sku, c.version) for c in got] == [("early", 2)]
    if not on_sql.citus:  # one server's positions follow the transactions' order
        assert got[0].position < eng.movements("late")[-1].position  # it took its place first
    feed.commit()


@on_both_layouts
def test_a_rolled_back_change_never_appears(on_sql: OnSql) -> None:
    feed = on_sql.engine.feed("strict")
    on_sql.engine.restock("a", 1)
    psql(on_sql.admin_dsn, f"BEGIN; UPDATE {on_sql.schema}.stock SET on_hand = 99; ROLLBACK;")
    on_sql.engine.restock("a", 1)
    assert [c.on_hand for c in feed.poll()] == [1, 2]


@on_both_layouts
def test_a_manual_sql_change_is_journaled_and_the_audit_finds_its_damage(on_sql: OnSql) -> None:
    eng = on_sql.engine
    eng.restock("a", 10)
    eng.reserve("a", 2)
    psql(on_sql.admin_dsn, f"UPDATE {on_sql.schema}.stock SET reserved = 5 WHERE sku = 'a'")
    last = eng.movements("a")[-1]
    assert (last.cause, last.reserved_delta) == ("hold", 3)  # read from the change itself
    found = eng.audit().violations
    assert [(v.check, v.expected, v.found) for v in found] == [
        ("reserved_matches_holds", "reserved = 2", "reserved = 5")
    ]


def psql(dsn: str, script: str) -> str:
    """Runs the statements one by one (Citus sends a distributed table's DDL on with the
    text of its query, which must hold that one command), and returns what they print."""
    return subprocess.run(
        [str(find_bindir() / "psql"), "-X", "-qAt", "-v", "ON_ERROR_STOP=1", dsn],
        input=script, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


# Each written on schema {s}; on Citus a row names its shard key ({k}: the column, {v}: a
# value), and a trigger of a distributed table is changed under citus.enable_unsafe_triggers.
CORRUPTIONS = {
    "reserved_matches_holds": "UPDATE {s}.stock SET reserved = reserved + 1 WHERE sku = 'a'",
    "hold_not_expired": "UPDATE {s}.reservation SET expires_at = now() - interval '1 hour'"
    " WHERE id = (SELECT id FROM {s}.reservation WHERE state = 'held' LIMIT 1)",
    "limit_matches_holds": "UPDATE {s}.buyer_allowance SET held = 0",
    "slot_row_has_sku": "INSERT INTO {s}.stock (sku, location, slot, on_hand{k})"
    " VALUES ('ghost', 'default', 2, 0{v})",
    "key_has_reservations": "DELETE FROM {s}.reservation WHERE state = 'confirmed'",
    "journal_chain": "DELETE FROM {s}.movement WHERE id = (SELECT min(id) + 1 FROM"
    " {s}.movement WHERE sku = 'a')",
    "journal_matches_row": "{unsafe}ALTER TABLE {s}.stock DISABLE TRIGGER stock_journal;"
    " UPDATE {s}.stock SET on_hand = on_hand + 1, version = version + 1 WHERE sku = 'a';"
    " ALTER TABLE {s}.stock ENABLE TRIGGER stock_journal",
}


def corruption(check: str, schema: str, citus: bool) -> str:
    unsafe = "SET citus.enable_unsafe_triggers = on; " if citus else ""
    k, v = (", shard_key", ", 1") if citus else ("", "")
    return CORRUPTIONS[check].format(s=schema, k=k, v=v, unsafe=unsafe)


@on_both_layouts
@pytest.mark.parametrize("check", sorted(CORRUPTIONS))
def test_the_audit_finds_each_kind_of_corruption(on_sql: OnSql, check: str) -> None:
    eng = on_sql.engine
    eng.restock("a", 20)
    eng.set_purchase_limit("drop", 10, ["a"])
    eng.reserve("a", 2, buyer="ann", idempotency_key="k1")
    eng.confirm(eng.reserve("a", 1, buyer="bob", idempotency_key="k2").id)
    assert eng.audit(expiry_lag=60).ok
    psql(on_sql.admin_dsn, corruption(check, on_sql.schema, on_sql.citus))
    report = eng.audit(expiry_lag=60)
    assert check in {v.check for v in report.violations}, report.violations
    assert eng._core.last_audit_violations == len(report.violations)
    # The command line says so too, and fails.
    where = ["--dsn", on_sql.admin_dsn, "--schema", on_sql.schema, "--layout",
             "citus" if on_sql.citus else "plain"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "stockade", "audit", *where, "--json"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert check in {v["check"] for v in json.loads(out.stdout)["violations"]}


@on_both_layouts
def test_an_audit_with_the_journal_off_fails_unless_told_to_accept_it(on_sql: OnSql) -> None:
    # Goal: with the journal's trigger disabled, a row changed by SQL cannot be checked
    # against the journal; the audit must not pass that as clean. Method: disable the
    # trigger, change a row, audit from Python and from the command line.
    eng = on_sql.engine
    eng.restock("a", 10)
    unsafe = "SET citus.enable_unsafe_triggers = on; " if on_sql.citus else ""
    psql(
        on_sql.admin_dsn,
        f"{unsafe}ALTER TABLE {on_sql.schema}.stock DISABLE TRIGGER stock_journal;"
        f" UPDATE {on_sql.schema}.stock SET on_hand = 99, version = version + 1 WHERE sku = 'a'",
    )
    report = eng.audit()
    assert report.ok and not report.journal_checked and not report.complete
    assert {u.check for u in report.unchecked} == {
        "journal_chain", "journal_adds_up", "journal_matches_row"
    }  # fmt: skip
    assert all("journal is off" in u.reason for u in report.unchecked)
    assert not {"journal_chain", "journal_adds_up", "journal_matches_row"} & set(report.checks)
    where = ["--dsn", on_sql.admin_dsn, "--schema", on_sql.schema, "--layout",
             "citus" if on_sql.citus else "plain"]  # fmt: skip

    def cli(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "stockade", "audit", *where, *extra],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    plain = cli()
    assert plain.returncode == 3, (plain.stdout, plain.stderr)
    assert "not checked: journal_matches_row: the journal is off" in plain.stdout
    as_json = cli("--json")
    assert as_json.returncode == 3
    document = json.loads(as_json.stdout)
    assert document["ok"] is True and document["complete"] is False
    assert {u["check"] for u in document["unchecked"]} >= {"journal_matches_row"}
    accepted = cli("--allow-unchecked")
    assert accepted.returncode == 0, (accepted.stdout, accepted.stderr)
    assert "not checked: journal_matches_row" in accepted.stdout  # still listed


@pytest.mark.parametrize("backend", ["citus"])
def test_the_feed_reads_every_node_of_a_citus_cluster_in_version_order_per_row(
    on_sql: OnSql,
) -> None:
    eng = on_sql.engine
    skus = [f"s{i}" for i in range(12)]
    feed = eng.feed("nodes")
    for round_ in range(3):
        for sku in skus:
            eng.restock(sku, 1 + round_)
    got = feed.poll()
    table = f"{on_sql.schema}.movement"
    keys = psql(on_sql.admin_dsn, f"SELECT string_agg(DISTINCT shard_key::text, ',') FROM {table}")
    nodes = psql(
        on_sql.admin_dsn,
        f"SELECT count(DISTINCT nodeport) FROM citus_shards WHERE shardid IN (SELECT"
        f" get_shard_id_for_distribution_column('{table}', k) FROM unnest('{{{keys}}}'::int[]) k)",
    )
    assert nodes == "2"  # the entries lie on both workers, each counting its own xids
    assert len(got) == 36 and feed.poll() == []
    for sku in skus:
        assert [c.version for c in got if c.sku == sku] == [1, 2, 3]
    feed.commit()
    eng.restock("s0", 1)
    assert [(c.sku, c.version) for c in eng.feed("nodes").poll()] == [("s0", 4)]


@pytest.fixture
def memory_only() -> Iterator[stockade.Engine]:
    with stockade.Engine.memory(journal_max=0) as eng:
        yield eng


def test_a_memory_store_without_a_journal_journals_nothing(memory_only: stockade.Engine) -> None:
    memory_only.restock("a", 1)
    assert memory_only.movements() == []
    report = memory_only.audit()
    assert report.ok and not report.journal_checked and not report.complete
    assert {u.check for u in report.unchecked} == {
        "journal_chain", "journal_adds_up", "journal_matches_row"
    }  # fmt: skip
    assert "journal_chain" not in report.checks


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_feed_commit_whose_connection_is_cut_stores_its_position_by_itself(
    proxy: CommitCuttingProxy, stockade_database: str, pooled: bool, cut: str
) -> None:
    # Goal: storing a feed position is idempotent, so a commit cut before or after its
    # COMMIT reached the server runs once more by itself instead of telling the caller
    # InDoubt (issue 45). Method: the proxy cuts the feed commit's COMMIT; commit() must
    # return, and a fresh engine's consumer must resume past every change polled.
    if pooled:
        pytest.skip("the proxy stands in front of the server, not of the pooler")
    with stockade.Engine.postgres(
        proxy.dsn(field(stockade_database, "dbname")), sweeper=False
    ) as eng:
        for i in range(5):
            eng.restock(f"f-{i}", 1)
        feed = eng.feed("cut")
        assert len(feed.poll(limit=100, timeout=0)) == 5
        proxy.arm(cut)
        feed.commit()
        assert proxy.cuts == 1
    with stockade.Engine.postgres(stockade_database) as eng:
        assert eng.feed("cut").poll(limit=100, timeout=0) == []
