"""The Citus layout (layout='citus') on a real three-node cluster: a coordinator and two
workers on loopback, started from the prebuilt Citus beside the project
(stockade.tools.citus). Where that build does not fit the machine (install.sh exits 3,
for example another PostgreSQL version) the module is skipped with install.sh's reason.

Each test gets a schema of its own on the cluster's one database: Citus needs its
extension and the node registration in a database, so the suite's database-per-test
templates do not carry over. The contract tests run here too, through the `engine`
fixture's "citus" backend (conftest); this module holds what is particular to the
layout."""

from __future__ import annotations

import contextlib
import itertools
import random
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, Dict, Iterator, List, Tuple

import pytest

import stockade
from pgproxy import CommitCuttingProxy
from stockade import OutOfStock, _core
from stockade.grants import runtime_grants
from stockade.testing import race
from stockade.tools import drive_load
from stockade.tools.citus import NODES, CitusSchemas, TemporaryCitus, drop_citus_schema
from stockade.tools.pgserver import run_sql, run_sql_with_messages
from support import ALL_STRATEGIES as STRATEGIES
from support import assert_audit_clean, wait_for

pytestmark = pytest.mark.citus

_schemas = itertools.count(1)


@pytest.fixture
def dsn(stockade_citus_dsn: str) -> str:
    """The coordinator of the session's cluster (conftest: stockade_citus)."""
    return stockade_citus_dsn


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A schema name for a test that opens its own engines; dropped after the test."""
    name = f"citus_own_{next(_schemas)}"
    yield name
    drop_citus_schema(dsn, name)


@pytest.fixture
def engine(stockade_citus_engine: stockade.Engine) -> stockade.Engine:
    return stockade_citus_engine


def test_migrate_distributes_the_tables_co_located(
    engine: stockade.Engine, stockade_citus: TemporaryCitus, dsn: str
) -> None:
    assert engine.migration_plan() == []  # everything applied, the citus/ files too
    schema = engine._schema
    # Citus's metadata: seven tables hash-distributed on shard_key, in one co-location
    # group; the purchase-limit groups and their SKUs are reference tables.
    tables = run_sql(
        stockade_citus.dsn(),
        "SELECT logicalrelid::text || ' ' || partmethod::text || ' ' || colocationid || ' ' ||"
        " coalesce(column_to_column_name(logicalrelid, partkey), '-') FROM pg_dist_partition"
        f" WHERE logicalrelid::text LIKE '{schema}.%' ORDER BY 1",
    ).splitlines()
    by_table = {t.split()[0].split(".")[1]: t.split()[1:] for t in tables}
    distributed = [
        "buyer_allowance", "feed_clock", "idempotency", "movement", "reservation", "stock",
        "transfer",
    ]  # fmt: skip
    assert sorted(by_table) == sorted([*distributed, "purchase_limit", "purchase_limit_sku"])
    assert {by_table[t][0] for t in distributed} == {"h"}
    assert len({by_table[t][1] for t in distributed}) == 1
    assert {by_table[t][2] for t in distributed} == {"shard_key"}
    assert {by_table[t][0] for t in ("purchase_limit", "purchase_limit_sku")} == {"n"}
    # A SKU's row, its reservation, its key and its journal lie on shards of one placement.
    engine.restock("tee", 3)
    engine.reserve("tee", 1, idempotency_key="k")
    nodes = run_sql(
        stockade_citus.dsn(),
        "SELECT count(DISTINCT pl.groupid) || ' ' || count(*) FROM (SELECT"
        " get_shard_id_for_distribution_column(t::regclass, k.shard_key) AS shardid FROM"
        f" unnest(ARRAY['{schema}.stock', '{schema}.reservation', '{schema}.idempotency',"
        f" '{schema}.movement']) t,"
        f" (SELECT shard_key FROM {schema}.stock WHERE sku = 'tee') k) x"
        " JOIN pg_dist_placement pl USING (shardid)",
    )
    assert nodes == "1 4", nodes  # four shards (one per table), on one node
    # A plain engine on that schema is told which layout it has, before anything runs.
    with stockade.Engine.postgres(dsn, schema=engine._schema, pool_size=1) as plain:
        with pytest.raises(stockade.InvalidState, match="layout='citus'"):
            plain.migrate()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_reserves_and_settles(engine: stockade.Engine, strategy: str) -> None:
    engine.restock("tee", 10)
    held = engine.reserve("tee", 3, strategy=strategy)
    assert engine.stock("tee").reserved == 3
    confirmed = engine.confirm(held.id)
    assert confirmed.state.value == "confirmed"
    other = engine.reserve("tee", 2, strategy=strategy)
    engine.release(other.id)
    level = engine.stock("tee")
    assert (level.on_hand, level.reserved, level.available) == (7, 0, 7)
    with pytest.raises(OutOfStock):
        engine.reserve("tee", 8, strategy=strategy)
    sold = engine.sell("tee", 7, strategy=strategy)
    assert sold.on_hand == 0


def test_idempotent_replay_and_conflict(engine: stockade.Engine) -> None:
    engine.restock("cap", 5)
    first = engine.reserve("cap", 1, idempotency_key="k-1")
    again = engine.reserve("cap", 1, idempotency_key="k-1")
    assert again.id == first.id
    assert engine.stock("cap").reserved == 1
    with pytest.raises(stockade.IdempotencyConflict):
        engine.reserve("cap", 2, idempotency_key="k-1")
    batched = engine.reserve("cap", 1, idempotency_key="k-2", strategy="batched")
    assert engine.reserve("cap", 1, idempotency_key="k-2", strategy="batched").id == batched.id
    assert engine.stock("cap").reserved == 2


def test_row_patterns_on_one_shard(engine: stockade.Engine) -> None:
    engine.restock("mug", 4)
    lease = engine.acquire_lease("mug", owner="importer", ttl=timedelta(seconds=30))
    with pytest.raises(stockade.LeaseHeld):
        engine.restock("mug", 1)
    engine.restock("mug", 1, fencing_token=lease.token)
    engine.release_lease(lease)
    engine.set_backorder_limit("mug", 2)
    engine.reserve("mug", 7)
    assert engine.stock("mug").backordered == 2
    engine.discontinue("mug")
    with pytest.raises(stockade.Discontinued):
        engine.reserve("mug", 1)
    engine.reinstate("mug")
    assert not engine.stock("mug").discontinued


def test_the_sweeper_expires_holds_shard_by_shard(dsn: str, schema: str) -> None:
    with stockade.Engine.postgres(
        dsn,
        layout="citus",
        schema=schema,
        sweeper=True,
        sweep_interval=timedelta(milliseconds=100),
    ) as eng:
        eng.migrate()
        skus = [f"sock-{i}" for i in range(12)]  # several shard keys, on both workers
        for s in skus:
            eng.restock(s, 3)
        holds = [eng.reserve(s, 2, ttl=timedelta(milliseconds=200)) for s in skus]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if all(eng.reservation(h.id).state.value == "expired" for h in holds):
                break
            time.sleep(0.2)
        assert [eng.reservation(h.id).state.value for h in holds] == ["expired"] * len(holds)
        assert all(eng.stock(s).reserved == 0 for s in skus)


def test_the_sweeper_purges_shard_by_shard_with_retention(dsn: str, schema: str) -> None:
    # Keyed and keyless reservations on a dozen shard keys, an order whose key and lines
    # lie on different shards, and a hold: retention takes everything but the hold, and
    # the order's key only once every line of it is terminal.
    long = timedelta(hours=1)
    with stockade.Engine.postgres(
        dsn,
        layout="citus",
        schema=schema,
        sweeper=True,
        sweep_interval=timedelta(milliseconds=50),
        retention=timedelta(milliseconds=300),
        purge_batch=5,
    ) as eng:
        eng.migrate()
        skus = [f"sock-{i}" for i in range(12)]
        for s in skus:
            eng.restock(s, 10)
        for n, s in enumerate(skus):
            eng.confirm(eng.reserve(s, 1, ttl=long, idempotency_key=f"k{n}").id)
            eng.release(eng.reserve(s, 1, ttl=long).id)
        for s in ("a", "b", "c"):  # three shard keys (test_an_order_across_shards...)
            eng.restock(s, 5)
        order = eng.reserve_order({"a": 1, "b": 1, "c": 1}, ttl=long, idempotency_key="cart")
        by_sku = {r.sku: r for r in order}
        eng.confirm(by_sku["a"].id)
        eng.confirm(by_sku["b"].id)
        hold = eng.reserve("sock-0", 1, ttl=long, idempotency_key="held")
        assert wait_for(lambda: eng.row_counts()["reservation_count"] == 4)
        time.sleep(0.5)  # past the window again: the order's key still waits for its hold
        assert eng.row_counts()["reservation_count"] == 4
        again = eng.reserve_order({"a": 1, "b": 1, "c": 1}, ttl=long, idempotency_key="cart")
        assert sorted(r.id for r in again) == sorted(r.id for r in order)
        eng.release(by_sku["c"].id)
        assert wait_for(lambda: eng.row_counts()["reservation_count"] == 1)
        assert eng.reservation(hold.id) == hold
        assert eng.reserve("sock-0", 1, ttl=long, idempotency_key="held").id == hold.id
        assert wait_for(lambda: eng.stats()["sweeper"]["purged_keys"] == 13)
        assert eng.stats()["sweeper"]["purged_reservations"] == 27
        assert [eng.stock(s).on_hand for s in ("a", "b", "c")] == [4, 4, 5]


def test_purge_walks_every_old_entry_past_one_read(engine: stockade.Engine) -> None:
    # More old entries than one step reads (256) across many shard keys, and an order
    # whose 20 lines (and their shared time) spread over shard keys: one purge takes all,
    # a limit stops it exactly, and a second purge finishes.
    long = timedelta(hours=1)
    skus = [f"sock-{i}" for i in range(30)]
    for s in skus:
        engine.restock(s, 100)
    for n in range(300):
        engine.release(engine.reserve(skus[n % 30], 1, ttl=long).id)
    order = engine.reserve_order({s: 1 for s in skus[:20]}, ttl=long, idempotency_key="cart")
    for r in order:
        engine.confirm(r.id)
    time.sleep(0.01)
    # The limit counts keys and keyless reservations; a key's reservations go with it.
    assert engine.purge(timedelta(0), limit=250) == 1 + 20 + 249
    assert engine.purge(timedelta(0)) == 51
    assert engine.row_counts()["reservation_count"] == 0
    assert [engine.stock(s).on_hand for s in skus] == [99] * 20 + [100] * 10


def shard_key_of(reservation_id: str) -> int:
    """The shard key a reservation id carries (Uuid::shard_key)."""
    b = uuid.UUID(str(reservation_id)).bytes
    return (((b[8] & 0x3F) << 16) | (b[9] << 8) | b[10]) >> 6


def purge_shard_call(
    dsn: str, schema: str, shard_key: int, keys: bool, in_transaction: bool = False
) -> List[str]:
    """One purge_shard call (migration citus/108) on the node of `dsn`, of everything old
    in the shard of `shard_key`: its keys, reservations, here and leftover columns. In a
    transaction, Citus does not delegate it: it runs on that node."""
    columns = "keys, reservations, here, leftover"
    call = f"SELECT {columns} FROM {schema}.purge_shard({keys}, 0, 100, 0, {shard_key})"
    if in_transaction:
        call = f"BEGIN; {call}; COMMIT"
    return run_sql(dsn, call).split("|")


def test_purge_runs_in_each_shard_on_its_worker(dsn: str, schema: str) -> None:
    # Migration citus/108: purge() first calls purge_shard in each Citus shard with old
    # entries, on the worker that holds it. One call deletes what lies in its shard alone (a keyed
    # reservation with its key, a keyless one) and leaves a key whose order has lines on
    # other shards, and a hold, to what runs after it.
    long = timedelta(hours=1)
    with stockade.Engine.postgres(
        dsn, layout="citus", schema=schema, pool_size=2, citus_routing="direct"
    ) as eng:
        eng.migrate()
        for s in ("solo", "a", "b", "c"):  # a, b, c: three shard keys (test_an_order...)
            eng.restock(s, 10)
        keyed = eng.reserve("solo", 1, ttl=long, idempotency_key="one")
        eng.confirm(keyed.id)
        eng.release(eng.reserve("solo", 1, ttl=long).id)
        held = eng.reserve("solo", 1, ttl=long)
        order = eng.reserve_order({"a": 1, "b": 1, "c": 1}, ttl=long, idempotency_key="cart")
        for r in order:
            eng.confirm(r.id)
        by_sku = {r.sku: r for r in order}
        time.sleep(0.01)

        def purge_shard_of(
            reservation_id: str, keys: bool, in_transaction: bool = False
        ) -> List[str]:
            key = shard_key_of(reservation_id)
            return purge_shard_call(dsn, schema, key, keys, in_transaction=in_transaction)

        # As the coordinator delegates it: the keyed reservation goes with its key, then
        # the keyless one; the hold stays, and nothing is left to the statement form.
        assert purge_shard_of(keyed.id, keys=True) == ["1", "1", "t", "f"]
        assert purge_shard_of(keyed.id, keys=False) == ["0", "1", "t", "f"]
        assert purge_shard_of(keyed.id, keys=False) == ["0", "0", "t", "f"]
        # The order's key: its lines lie on other Citus shards than its own, so no
        # shard's call takes it, nor the lines it keeps.
        keys = ", ".join(str(shard_key_of(r.id)) for r in order)
        shards = run_sql(
            dsn,
            f"SELECT count(DISTINCT get_shard_id_for_distribution_column('{schema}.stock', k))"
            f" FROM unnest(ARRAY[{keys}]) AS k",
        )
        assert int(shards) > 1
        calls = [purge_shard_of(r.id, keys=k) for r in order for k in (True, False)]
        assert all(call[:3] == ["0", "0", "t"] for call in calls)
        # The key lies with its first line in key order, a: that shard leaves the key.
        assert purge_shard_of(by_sku["a"].id, keys=True) == ["0", "0", "t", "t"]
        # In a transaction Citus does not delegate the call: on the coordinator, which
        # holds no shard, it deletes nothing and leaves everything to the statement form.
        assert purge_shard_of(keyed.id, keys=False, in_transaction=True) == [
            "0",
            "0",
            "f",
            "t",
        ]
        assert eng.row_counts()["reservation_count"] == 4
        routed = eng.stats()["pool"]["routing"]["routed"]
        assert eng.purge(timedelta(0)) == 1 + 3  # the order's key and lines, after the calls
        routing = eng.stats()["pool"]["routing"]
        # The keys phase called the key's shard on its worker, where the map said; the
        # statement form then took the key with its lines, and no reservation was left old.
        assert routing["routed"] == routed + 1 and routing["misses"] == 0
        assert [eng.reservation(held.id)] == [held]
        assert eng.row_counts()["reservation_count"] == 1
        assert eng.purge(timedelta(0)) == 0  # nothing old: no shard is called
        assert eng.stats()["pool"]["routing"]["routed"] == routing["routed"]
        assert eng.reserve("solo", 1, idempotency_key="one").id != keyed.id  # purged


def test_a_runtime_role_purges_by_the_statement_form(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A least-privilege runtime role (stockade.grants) does not own the tables, and Citus
    # lets only an owner take a shard's metadata lock: purge_shard then does nothing and
    # says so, and purge() takes the statement form, which needs no more than the grants.
    # The steps of a hold (whose delegated form needs that lock) run as transactions, as
    # the engine says once.
    caplog.set_level("INFO", logger="stockade")
    role = f"stockade_rt_{uuid.uuid4().hex[:8]}"
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema) as owner:
        owner.migrate()
    run_sql(dsn, f"CREATE ROLE {role} LOGIN")
    try:
        for statement in runtime_grants(role, schema=schema):
            # Citus grants on the reference tables over one connection per node.
            run_sql(dsn, "SET citus.multi_shard_modify_mode TO 'sequential'; " + statement)
        as_role = dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
        with stockade.Engine.postgres(
            as_role, layout="citus", schema=schema, pool_size=2, citus_routing="direct"
        ) as eng:
            eng.restock("solo", 10)
            keyed = eng.reserve("solo", 1, idempotency_key="one")
            eng.confirm(keyed.id)
            eng.release(eng.reserve("solo", 1).id)
            said = [r for r in caplog.records if "not as delegated calls" in r.getMessage()]
            assert len(said) == 1, said
            assert eng.stock("solo").on_hand == 9 and eng.stock("solo").reserved == 0
            time.sleep(0.01)
            call = purge_shard_call(as_role, schema, shard_key_of(keyed.id), keys=True)
            assert call == ["0", "0", "f", "t"]  # delegated, on the worker, as the role
            assert eng.purge(timedelta(0)) == 3  # the key, its reservation, the keyless one
            assert eng.row_counts()["reservation_count"] == 0
    finally:
        run_sql(dsn, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_repeatable_read_sessions_purge_by_the_statement_form(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # purge_shard (citus/108) checks its shard's placement after the shard lock; under
    # REPEATABLE READ that check could read a snapshot from before a move switched the
    # placement. So sessions that are not READ COMMITTED purge by the statement form, as
    # the engine says once; what is purged is the same.
    caplog.set_level("INFO", logger="stockade")
    repeatable = (
        dsn + "%20-c%20default_transaction_isolation%3Drepeatable%5C%20read"
        "%20-c%20citus.log_remote_commands%3Don%20-c%20log_min_messages%3Dnotice"
    )
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema) as owner:
        owner.migrate()
    with stockade.Engine.postgres(repeatable, layout="citus", schema=schema, pool_size=2) as eng:
        eng.restock("solo", 10)
        keyed = eng.reserve("solo", 1, idempotency_key="one")
        eng.confirm(keyed.id)
        eng.release(eng.reserve("solo", 1).id)
        time.sleep(0.01)
        lines = remote_commands(stockade_citus, eng, "rr-purge", lambda: eng.purge(timedelta(0)))
        assert not any(".purge_shard(" in line for line in lines), lines
        said = [r for r in caplog.records if "not as delegated calls" in r.getMessage()]
        assert len(said) == 1 and "purges as statements" in said[0].getMessage(), said
        assert eng.row_counts()["reservation_count"] == 0
        assert eng.reserve("solo", 1, idempotency_key="one").id != keyed.id  # the key went


def test_stats_estimates_sum_the_workers_shards(
    stockade_citus_engine_factory: Callable[..., stockade.Engine],
) -> None:
    # The coordinator's statistics see none of the workers' rows: stats() sums the shards'
    # live-tuple figures, which a worker flushes within about ten seconds of a commit.
    # They are estimates: a reused schema's shards, emptied by DELETE, draw autovacuum,
    # whose VACUUM or ANALYZE sets the figure to what it saw and can leave it off by the
    # rows that committed meanwhile. A new schema's few rows stay below autovacuum's
    # thresholds, so here the figures are exact once flushed.
    engine = stockade_citus_engine_factory(schema=f"citus_stats_{uuid.uuid4().hex[:8]}")
    for n in range(12):
        engine.restock(f"sock-{n}", 5)
        engine.reserve(f"sock-{n}", 1)
    engine.confirm(engine.reserve("sock-0", 1).id)
    seen: List[Tuple[int, int]] = []

    def counted() -> bool:
        stats = engine.stats()
        seen.append((stats["sku_count"], stats["reservation_count"]))
        return seen[-1] == (12, 13)

    assert wait_for(counted, seconds=30), f"stats() saw {seen[-1]} at the end"
    stats = engine.stats()
    assert (stats["held_count"], stats["counts_exact"]) == (12, False)


def test_an_order_across_shards_is_all_or_nothing_and_replays(engine: stockade.Engine) -> None:
    # a, b and c lie on different shard keys: one transaction across shards (two-phase
    # commit), its rows locked one statement each, in key order.
    for sku in ("a", "b", "c"):
        engine.restock(sku, 2)
    with pytest.raises(OutOfStock):
        engine.reserve_order({"a": 1, "b": 1, "c": 3})
    assert [engine.stock(s).reserved for s in ("a", "b", "c")] == [0, 0, 0]
    held = engine.reserve_order({"c": 2, "a": 1, "b": 2}, idempotency_key="order-1")
    assert [r.sku for r in held] == ["c", "a", "b"]
    again = engine.reserve_order({"b": 2, "c": 2, "a": 1}, idempotency_key="order-1")
    assert sorted(r.id for r in again) == sorted(r.id for r in held)
    assert [engine.stock(s).reserved for s in ("a", "b", "c")] == [1, 2, 2]
    for r in held:
        engine.confirm(r.id)
    assert [engine.stock(s).on_hand for s in ("a", "b", "c")] == [1, 0, 0]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_racing_threads_sell_out_exactly(engine: stockade.Engine, strategy: str) -> None:
    units = 60
    engine.restock("hot", units)
    granted: List[str] = []
    refused = [0]
    lock = threading.Lock()

    def buyer() -> None:
        # Until sold out; an optimistic attempt that lost every race tries again.
        for _ in range(200):
            try:
                r = engine.reserve("hot", 1, strategy=strategy)
            except OutOfStock:
                with lock:
                    refused[0] += 1
                return
            except stockade.RetriesExhausted:
                continue
            with lock:
                granted.append(str(r.id))

    out = race(8, lambda _: buyer())
    assert not any(out.errors), out.errors
    level = engine.stock("hot")
    assert len(granted) == len(set(granted)) == units
    assert refused[0] == 8  # each buyer stopped at OutOfStock
    assert (level.on_hand, level.reserved, level.available) == (units, units, 0)


def test_two_engines_and_the_batcher_sell_out_exactly(dsn: str, schema: str) -> None:
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=16) as one:
        one.migrate()
        skus = [f"drop-{i}" for i in range(6)]
        for s in skus:
            one.restock(s, 50)
        with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=16) as two:
            engines = (one, two)
            out = race(
                2,
                lambda i: drive_load(engines[i], skus, clients=8, seconds=2.0, strategy="auto"),
            )
        assert not any(out.errors), out.errors
        results = out.succeeded()
        assert sum(r.failed for r in results) == 0
        assert sum(r.granted for r in results) == 6 * 50
        for s in skus:
            level = one.stock(s)
            assert (level.reserved, level.available) == (50, 0)


def test_the_layout_option_is_checked_before_connecting() -> None:
    # Nothing listens on port 1: each refusal comes before any connection is tried.
    with pytest.raises(stockade.InvalidArgument, match="layout must be 'plain' or 'citus'"):
        stockade.Engine.postgres("postgresql://127.0.0.1:1/x", layout="sharded")
    with pytest.raises(stockade.InvalidArgument, match="'coordinator' or 'direct'"):
        stockade.Engine.postgres("postgresql://127.0.0.1:1/x", layout="citus", citus_routing="x")
    with pytest.raises(stockade.InvalidArgument, match="citus_routing='direct' needs layout"):
        stockade.Engine.postgres("postgresql://127.0.0.1:1/x", citus_routing="direct")


@contextlib.contextmanager
def logging_engine(dsn: str, schema: str) -> Iterator[stockade.Engine]:
    """An engine of one connection whose coordinator logs each command it sends to a
    worker, with the worker's address (citus.log_remote_commands); migrated, with 100
    units of "solo". No sweeper: its rounds would add commands between a test's marks."""
    logged = dsn + "%20-c%20citus.log_remote_commands%3Don%20-c%20log_min_messages%3Dnotice"
    with stockade.Engine.postgres(
        logged, layout="citus", schema=schema, pool_size=1, sweeper=False
    ) as eng:
        eng.migrate()
        eng.restock("solo", 100)
        yield eng


def remote_commands(
    cluster: TemporaryCitus, eng: stockade.Engine, name: str, call: Callable[[], object]
) -> List[str]:
    """The coordinator's log lines (citus.log_remote_commands) of `call`: between two marks,
    reads of SKUs that do not exist, from after the start mark's own read (its DETAIL line
    names its worker)."""
    start, end = f"mark-{name}-start", f"mark-{name}-end"
    with pytest.raises(stockade.NotFound):
        eng.stock(start)
    call()
    with pytest.raises(stockade.NotFound):
        eng.stock(end)
    text = cluster.log_text()
    # up to the line that names the end mark (its read), without it
    lines = text[text.index(start) : text.rindex("\n", 0, text.index(end))].splitlines()
    return lines[next(i for i, line in enumerate(lines) if "on server " in line) + 1 :]


@contextlib.contextmanager
def proxied_engine(
    cluster: TemporaryCitus, schema: str, stock: int
) -> Iterator[Tuple[CommitCuttingProxy, stockade.Engine]]:
    """An engine (2 connections, no sweeper) through a proxy in front of the coordinator
    that can cut or hold its statements (pgproxy.py); migrated, with `stock` units of
    "solo"."""
    proxy = CommitCuttingProxy("127.0.0.1", cluster.node_port("coordinator"))
    try:
        with stockade.Engine.postgres(
            proxy.dsn("postgres"), layout="citus", schema=schema, pool_size=2, sweeper=False
        ) as eng:
            eng.migrate()
            eng.restock("solo", stock)
            yield proxy, eng
    finally:
        proxy.close()


def test_a_write_for_one_sku_runs_on_one_worker_with_a_plain_commit(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # citus.log_remote_commands makes the coordinator log each command it sends to a
    # worker, with the worker's address: between two marks (reads of SKUs that do not
    # exist), every command of a reserve and its confirm goes to one worker, and none
    # is a PREPARE TRANSACTION (no two-phase commit). An atomic, auto or batched reserve
    # and a confirm are delegated calls (citus/105, 107, 111); the other strategies
    # reserve in a transaction.
    with logging_engine(dsn, schema) as eng:
        for strategy in STRATEGIES:
            lines = remote_commands(
                stockade_citus,
                eng,
                strategy,
                lambda s=strategy: eng.confirm(eng.reserve("solo", 1, strategy=s).id),
            )
            issued = [line for line in lines if "issuing" in line]
            details = [line for line in lines if "on server " in line]
            servers = {line.split("on server ")[1].split()[0] for line in details}
            assert len(servers) == 1, (strategy, servers)
            assert not any("PREPARE TRANSACTION" in line for line in issued), strategy
            assert len([line for line in issued if ".step_one(" in line]) == 1, issued
            if strategy in ("atomic", "auto", "batched"):  # auto: atomic on a cold SKU
                calls = [
                    line for line in issued if ".reserve_one(" in line or ".batch_one(" in line
                ]
                assert len(calls) == 1, (strategy, issued)
                continue
            assert any("UPDATE" in line for line in issued), strategy
            # SET LOCAL lock_timeout reaches the worker without a BEGIN inside its
            # transaction (which the worker would log as a warning each time)
            assert any("SET LOCAL lock_timeout" in line for line in issued), strategy
            assert not any("already a transaction in progress" in line for line in lines)


def test_a_buyers_count_and_reservation_commit_together(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # A buyer's count in a group lies on the shard of its own shard key (group, buyer):
    # when that shard is on another worker than the SKU's row, the reserve commits in two
    # phases (PREPARE TRANSACTION on both), so the count and the reservation land together
    # or not at all; on the same worker it is a plain commit there.
    from stockade import _core

    def node(table: str, shard_key: int) -> str:
        return run_sql(
            stockade_citus.dsn(),
            "SELECT nodeport FROM citus_shards WHERE shardid ="
            f" get_shard_id_for_distribution_column('{schema}.{table}', {shard_key})",
        )

    with logging_engine(dsn, schema) as eng:
        eng.set_purchase_limit("g", per_buyer=5, skus=["solo"])
        row_node = node("stock", _core.shard_key_of("solo", "default"))
        buyers = [f"buyer-{i}" for i in range(64)]
        by_node = {b: node("buyer_allowance", _core.shard_key_of("g", b)) for b in buyers}
        apart = next(b for b in buyers if by_node[b] != row_node)
        together = next(b for b in buyers if by_node[b] == row_node)
        for buyer, two_phase in ((apart, True), (together, False)):
            for strategy in ("atomic", "pessimistic", "batched"):
                start, end = f"mark-{buyer}-{strategy}-start", f"mark-{buyer}-{strategy}-end"
                with pytest.raises(stockade.NotFound):
                    eng.stock(start)
                eng.reserve("solo", 1, buyer=buyer, strategy=strategy)
                with pytest.raises(stockade.NotFound):
                    eng.stock(end)
                text = stockade_citus.log_text()
                issued = [
                    line
                    for line in text[text.index(start) : text.index(end)].splitlines()
                    if "issuing" in line
                ]
                prepared = any("PREPARE TRANSACTION" in line for line in issued)
                assert prepared is two_phase, (buyer, strategy)
        assert eng.buyer_held("g", apart) == 3 and eng.buyer_held("g", together) == 3
        assert eng.stock("solo").reserved == 6


@pytest.mark.parametrize(
    "strategy, function", [("atomic", ".reserve_one("), ("batched", ".batch_one(")]
)
def test_a_reserve_is_one_call_delegated_to_the_rows_worker(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, strategy: str, function: str
) -> None:
    # A keyless and a keyed atomic reserve (migration citus/105), and the batcher's
    # one-row fast path (citus/107): the coordinator sends one command to one worker, the
    # function call itself, with no BEGIN, no COMMIT and no PREPARE TRANSACTION there: the
    # worker runs it and commits it on its own. A replay changes nothing in the call, and
    # the statement path (the batch's full path) answers it with the first reservation.
    with logging_engine(dsn, schema) as eng:
        made: List[stockade.Reservation] = []
        for name, key in (("keyless", None), ("keyed", "k-1"), ("replay", "k-1")):
            lines = remote_commands(
                stockade_citus,
                eng,
                f"{strategy}-{name}",
                lambda k=key: made.append(
                    eng.reserve("solo", 1, strategy=strategy, idempotency_key=k)
                ),
            )
            issued = [line for line in lines if "issuing" in line]
            assert len([line for line in issued if function in line]) == 1, (name, issued)
            if name != "replay":
                assert len(issued) == 1, (name, issued)
            assert not any("PREPARE" in line for line in issued), (name, issued)
        assert [r.idempotency_key for r in made] == [None, "k-1", "k-1"]
        assert made[2].id == made[1].id and made[0].id != made[1].id
        assert eng.stock("solo").reserved == 2  # the replay made nothing
        with pytest.raises(stockade.IdempotencyConflict):
            eng.reserve("solo", 2, strategy=strategy, idempotency_key="k-1")
        with pytest.raises(OutOfStock):  # no room: nothing moves, and a refusal keeps no key
            eng.reserve("solo", 1000, strategy=strategy, idempotency_key="k-2")
        assert eng.stock("solo").reserved == 2
        assert eng.reserve("solo", 1, strategy=strategy, idempotency_key="k-2").qty == 1


def test_the_batchs_statement_forms_write_by_delegated_calls_in_one_transaction(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The batch's full path (a reserve with a buyer, a keyed confirm) and the one-row
    # statement form (a keyed sell) write their reservations and keys through citus/113's
    # calls, which Citus delegates inside the transaction (force_delegation) over the
    # connection that holds its locks: one worker, one plain COMMIT there, no two phases,
    # and no reservation or key inserted as SQL text.
    logged = dsn + "%20-c%20citus.log_remote_commands%3Don%20-c%20log_min_messages%3Dnotice"
    with stockade.Engine.postgres(
        logged, layout="citus", schema=schema, pool_size=1, strategy="batched", sweeper=False
    ) as eng:
        eng.migrate()
        eng.restock("solo", 100)
        eng.set_purchase_limit("g", per_buyer=50, skus=["solo"])
        # a buyer whose count lies on the row's worker (elsewhere it commits in two phases)
        on_node = "SELECT nodeport FROM citus_shards WHERE shardid ="
        row_node = run_sql(
            dsn,
            f"{on_node} get_shard_id_for_distribution_column('{schema}.stock',"
            f" {_core.shard_key_of('solo', 'default')})",
        )
        buyer = next(
            b
            for b in (f"b-{i}" for i in range(64))
            if run_sql(
                dsn,
                f"{on_node} get_shard_id_for_distribution_column('{schema}.buyer_allowance',"
                f" {_core.shard_key_of('g', b)})",
            )
            == row_node
        )
        held: List[stockade.Reservation] = []
        calls: Dict[str, Tuple[Callable[[], object], List[str]]] = {
            "buyer": (
                lambda: held.append(eng.reserve("solo", 4, buyer=buyer, ref="line-1")),
                [".batch_holds("],
            ),
            "sell": (
                lambda: eng.sell("solo", 2, idempotency_key="s-1"),
                [".batch_keys("],
            ),
            "confirm": (
                lambda: eng.confirm(held[0].id, qty=3, idempotency_key="c-1"),
                [".batch_keys(", ".batch_key_outcomes("],
            ),
        }
        for name, (call, functions) in calls.items():
            lines = remote_commands(stockade_citus, eng, f"full-{name}", call)
            issued = [line for line in lines if "issuing" in line]
            servers = {
                line.split("on server ")[1].split()[0] for line in lines if "on server " in line
            }
            assert len(servers) == 1, (name, servers)
            for function in functions:
                assert len([line for line in issued if function in line]) == 1, (name, issued)
            written = [
                line.split("INSERT INTO ")[1].split()[0] for line in issued if "INSERT" in line
            ]
            assert not any(".reservation" in t or ".idempotency" in t for t in written), issued
            assert not any("PREPARE" in line for line in issued), (name, issued)
            assert len([line for line in issued if line.endswith("issuing COMMIT")]) == 1, issued
        assert eng.sell("solo", 2, idempotency_key="s-1").on_hand == 98  # replayed
        again = eng.confirm(held[0].id, qty=3, idempotency_key="c-1")
        assert (again.confirmed, again.held, again.ref) == (3, 1, "line-1")
        assert eng.buyer_held("g", buyer) == 4
        level = eng.stock("solo")
        assert (level.on_hand, level.reserved) == (95, 1), level
        # Where the node cannot take the shard tables' path (here: REPEATABLE READ), each
        # function writes row by row through Citus instead, with the same outcome.
        out = run_sql(
            dsn,
            "BEGIN ISOLATION LEVEL REPEATABLE READ;"
            f" SELECT * FROM {schema}.batch_keys(ARRAY['k-2', 'k-1'], ARRAY['p2', 'p1'],"
            " ARRAY['', '00000000-0000-4000-8000-000000000001'], ARRAY['', 'o1'], true, 7);"
            f" SELECT * FROM {schema}.batch_keys(ARRAY['k-1', 'k-3'], ARRAY['p1', 'p3'],"
            " ARRAY['', ''], ARRAY[]::text[], true, 7);"
            f" SELECT * FROM {schema}.batch_key_outcomes(ARRAY['k-2', 'k-9'], ARRAY['o2', 'x'], 7);"
            f" SELECT * FROM {schema}.batch_holds(1000000,"
            " ARRAY['00000000-0000-4000-8000-0000000000aa'::uuid], ARRAY['x'], ARRAY['main'],"
            " ARRAY[0::bigint], ARRAY[1::bigint], ARRAY[60000000::bigint], ARRAY[''], ARRAY['b'],"
            " ARRAY[]::text[], ARRAY[''], ARRAY['r'], ARRAY['{\"a\": 1}'], 7);"
            f" SELECT string_agg(key || '=' || coalesce(outcome, '-') || '/' ||"
            f" cardinality(reservation_ids), ',' ORDER BY key) FROM {schema}.idempotency"
            " WHERE shard_key = 7;"
            f" SELECT buyer || ref || metadata::text || (expires_at - created_at)::text"
            f" FROM {schema}.reservation WHERE shard_key = 7; ROLLBACK",
        )
        assert out.splitlines() == [
            "k-1",  # the first call's keys, sorted
            "k-2",
            "k-3",  # the second's: k-1 was taken
            "1",  # k-2's outcome; k-9 is no key
            "1",  # the hold
            "k-1=o1/1,k-2=o2/0,k-3=-/0",
            'br{"a": 1}00:01:00',  # its buyer, ref, metadata and TTL
        ], out
        # A function gone after the engine found them (42883): the batch runs again with
        # the SQL text, and the engine says so once and keeps to the text.
        run_sql(dsn, f"DROP FUNCTION {schema}.batch_keys")
        assert eng.sell("solo", 1, idempotency_key="s-2").on_hand == 94
        assert eng.sell("solo", 1, idempotency_key="s-3").on_hand == 93
        gone = [r for r in caplog.records if "lacks the batch writes" in r.getMessage()]
        assert len(gone) == 1, gone
        assert_audit_clean(eng)


def test_a_sell_is_one_call_delegated_to_the_rows_worker(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # An atomic sell (migration citus/111): the coordinator sends one command to one
    # worker, the call itself, with no BEGIN, no COMMIT and no PREPARE TRANSACTION there.
    # It answers the row as the statement path does, journals a sale, and refuses as that
    # path does (why: one read after the call), changing nothing. A sell with a key or a
    # ref keeps the statement path, which carries them.
    with logging_engine(dsn, schema) as eng:
        levels: List[stockade.StockLevel] = []
        lines = remote_commands(
            stockade_citus,
            eng,
            "sell",
            lambda: levels.append(eng.sell("solo", 3, strategy="atomic")),
        )
        issued = [line for line in lines if "issuing" in line]
        assert len(issued) == 1 and ".sell_one(" in issued[0], issued
        read = eng.stock("solo")
        assert levels[0] == read and read.on_hand == 97, (levels[0], read)
        (entry,) = eng.movements("solo", after=eng.movements("solo")[-2].position)
        assert (entry.cause, entry.on_hand_delta, entry.on_hand) == ("sell", -3, 97), entry
        with pytest.raises(OutOfStock):
            eng.sell("solo", 98, strategy="atomic")
        with pytest.raises(stockade.VersionConflict):
            eng.sell("solo", 1, strategy="atomic", expected_version=read.version - 1)
        assert eng.sell("solo", 1, strategy="atomic", expected_version=read.version).on_hand == 96
        lease = eng.acquire_lease("solo", timedelta(minutes=1))
        token = lease.token
        with pytest.raises(stockade.LeaseHeld):
            eng.sell("solo", 1, strategy="atomic")
        assert eng.sell("solo", 1, strategy="atomic", fencing_token=token).on_hand == 95
        with pytest.raises(stockade.FencingTokenStale):
            eng.sell("solo", 1, strategy="atomic", fencing_token=token + 1)
        eng.release_lease(lease)
        eng.discontinue("solo")
        with pytest.raises(stockade.Discontinued):
            eng.sell("solo", 1, strategy="atomic")
        eng.reinstate("solo")
        assert eng.stock("solo").on_hand == 95  # the refusals changed nothing
        for name, kw in (("keyed", {"idempotency_key": "s-1"}), ("ref", {"ref": "line-1"})):
            lines = remote_commands(
                stockade_citus, eng, f"sell-{name}", lambda kw=kw: eng.sell("solo", 1, **kw)
            )
            issued = [line for line in lines if "issuing" in line]
            assert not any(".sell_one(" in line for line in issued), (name, issued)
            assert any("UPDATE" in line for line in issued), (name, issued)
        assert eng.sell("solo", 1, idempotency_key="s-1").on_hand == 94  # replayed
        assert eng.stock("solo").on_hand == 93
        assert_audit_clean(eng)


def test_a_step_of_a_hold_is_a_read_and_one_call_delegated_to_the_rows_worker(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # A confirm (whole, in part, releasing the rest), a release and an extend (migration
    # citus/111): the engine reads the reservation and decides the step; the coordinator
    # sends the worker that read and one call, step_one, which applies the step if the
    # reservation is still as read and settles the row, with no BEGIN, COMMIT or PREPARE
    # TRANSACTION. The journal names each step, with its reservation. A refusal decided on
    # the read changes nothing; a keyed step, or one whose reservation moved on after the
    # read, takes the transaction.
    with logging_engine(dsn, schema) as eng:

        def one_call(name: str, step: Callable[[], object]) -> None:
            issued = [
                line
                for line in remote_commands(stockade_citus, eng, name, step)
                if "issuing" in line
            ]
            calls = [line for line in issued if ".step_one(" in line]
            assert len(calls) == 1 and len(issued) == 2, (name, issued)
            assert not any(w in line for line in issued for w in ("BEGIN", "COMMIT", "PREPARE"))

        a, b, c = (eng.reserve("solo", 3, strategy="atomic") for _ in range(3))
        one_call("confirm-part", lambda: eng.confirm(a.id, qty=1))
        one_call("confirm-rest", lambda: eng.confirm(a.id))
        one_call("release", lambda: eng.release(b.id, qty=2))
        one_call("extend", lambda: eng.extend(b.id, ttl=timedelta(minutes=30)))
        one_call("confirm-release-rest", lambda: eng.confirm(c.id, qty=2, release_rest=True))
        got = [eng.reservation(r.id) for r in (a, b, c)]
        assert [(r.state, r.held, r.confirmed, r.released) for r in got] == [
            ("confirmed", 0, 3, 0),
            ("held", 1, 0, 2),
            ("confirmed", 0, 2, 1),
        ], got
        assert [r.version for r in got] == [3, 3, 2], got
        assert got[1].expires_at > datetime.now(timezone.utc) + timedelta(minutes=29)
        level = eng.stock("solo")
        assert (level.on_hand, level.reserved) == (95, 1), level
        steps = [(m.cause, m.on_hand_delta, m.reserved_delta, m.ref) for m in eng.movements("solo")]
        assert steps[4:] == [  # as the memory store journals them (after restock and holds)
            ("confirm", -1, -1, str(a.id)),
            ("confirm", -2, -2, str(a.id)),
            ("release", 0, -2, str(b.id)),
            ("confirm", -2, -3, str(c.id)),
        ], steps
        # Refusals decided on the read: nothing moves.
        with pytest.raises(stockade.VersionConflict):
            eng.confirm(b.id, expected_version=2)
        with pytest.raises(stockade.InvalidState):
            eng.confirm(b.id, qty=2)
        with pytest.raises(stockade.InvalidState):
            eng.release(a.id)
        assert eng.reservation(b.id).version == 3 and eng.stock("solo") == level
        # A keyed step takes the transaction, which claims its key.
        issued = [
            line
            for line in remote_commands(
                stockade_citus, eng, "keyed", lambda: eng.release(b.id, idempotency_key="r-b")
            )
            if "issuing" in line
        ]
        assert not any(".step_one(" in line for line in issued) and issued, issued
        assert eng.release(b.id, idempotency_key="r-b").state == "released"  # replayed
        assert eng.stock("solo").reserved == 0
        assert_audit_clean(eng)


@pytest.mark.parametrize("change", ["release", "lapse"])
def test_a_delegated_step_whose_hold_moved_on_after_the_read_is_decided_in_a_transaction(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, change: str
) -> None:
    # A delegated step reads its hold, decides the step on it, and step_one writes that
    # decision only if the hold is still as read (its version, not lapsed). Here the call is
    # held at a proxy in front of the coordinator while another engine releases 3 of the
    # hold's 4 units, or the hold's time runs out: step_one must write nothing, and the
    # engine then decides in a transaction, under the hold's lock, on the hold as it now
    # is. A step_one that wrote its decision would undo the release (3 held again) or
    # confirm a lapsed hold.
    with proxied_engine(stockade_citus, schema, 10) as (proxy, eng):
        hold = eng.reserve("solo", 4, strategy="atomic")
        told: list = []

        def confirm() -> None:
            try:
                told.append(eng.confirm(hold.id, qty=1))
            except stockade.StockadeError as e:
                told.append(e)

        proxy.arm("held", query=".step_one(")
        step = threading.Thread(target=confirm, daemon=True)
        step.start()
        assert wait_for(lambda: proxy.cuts == 1)  # read, decided, its call held
        if change == "release":
            with stockade.Engine.postgres(
                dsn, layout="citus", schema=schema, pool_size=1, sweeper=False
            ) as other:
                other.release(hold.id, qty=3)
        else:
            run_sql(
                dsn,
                f"UPDATE {schema}.reservation SET expires_at = now() - interval '1 second'"
                f" WHERE id = '{hold.id}'",
            )
        proxy.release()
        step.join(30)
        assert len(told) == 1, told
        level = eng.stock("solo")
        if change == "release":
            done = told[0]
            assert isinstance(done, stockade.Reservation), done
            assert (done.confirmed, done.released, done.held) == (1, 3, 0)
            assert (done.state, done.version) == ("confirmed", hold.version + 2)
            assert (level.on_hand, level.reserved) == (9, 0)
        else:
            assert isinstance(told[0], stockade.ReservationExpired), told[0]
            assert eng.reservation(hold.id).expired == 4
            assert (level.on_hand, level.reserved) == (10, 0)
        assert_audit_clean(eng)


@pytest.mark.parametrize("cut", ["before", "after"])
def test_a_delegated_call_cut_is_answered_by_what_the_fence_proves(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, cut: str
) -> None:
    # A delegated call runs in autocommit: the worker commits it as it returns, whatever
    # becomes of the client's connection. A proxy in front of the coordinator cuts the
    # connection of a call `cut` it: "after" once the server has answered (it committed),
    # "before" without sending it (nothing ran). The engine cannot tell the two apart, and
    # the Citus layout keeps no server session it could end to settle the outcome. So a
    # reserve is looked up by its id: found (after), it is the answer; not found (before),
    # the write might still land, and the answer is InDoubt. A keyless sell, or a step of a
    # hold, leaves nothing to look for: InDoubt either way. The rows show which really
    # happened.
    with proxied_engine(stockade_citus, schema, 100) as (proxy, eng):
        proxy.arm(cut, query=".reserve_one(")
        if cut == "after":
            hold = eng.reserve("solo", 2, strategy="atomic")
            assert eng.reservation(hold.id).state == "held"
        else:
            with pytest.raises(stockade.InDoubt):
                eng.reserve("solo", 2, strategy="atomic")
        proxy.arm(cut, query=".sell_one(")
        with pytest.raises(stockade.InDoubt):
            eng.sell("solo", 3, strategy="atomic")
        other = eng.reserve("solo", 4, strategy="atomic")
        proxy.arm(cut, query=".step_one(")
        with pytest.raises(stockade.InDoubt):
            eng.confirm(other.id, qty=1)
        assert proxy.cuts == 3
        level = eng.stock("solo")
        landed = cut == "after"
        # after: 2 held, 3 sold, then 1 of the 4 confirmed; before: only the 4 held
        assert (level.reserved, level.on_hand) == ((5, 96) if landed else (4, 100)), level
        assert eng.reservation(other.id).confirmed == (1 if landed else 0)
        assert_audit_clean(eng)


@pytest.mark.parametrize("routing", ["coordinator", "direct"])
def test_delegated_calls_keep_the_workers_sessions_flat(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, routing: str
) -> None:
    # Citus 13.2 adds a plan to a worker session's local plan cache on every execution of
    # a generic plan of a statement on a distributed table inside a function (citus
    # issues 8371 and 8783): about 90 kB a call. The delegated functions (citus/109) run
    # their statements as dynamic SQL on the shard tables, planned for the call and cached
    # nowhere, so they no longer force custom plans; what a worker session caches is the
    # journal trigger's plan, once. On either route (the coordinator's sessions on the
    # workers, or the engine's own with direct routing) a worker's sessions stay flat.
    sessions_of = "citus_internal%" if routing == "coordinator" else "stockade-flat"
    with stockade.Engine.postgres(
        dsn,
        layout="citus",
        schema=schema,
        pool_size=1,
        citus_routing=routing,
        application_name="stockade-flat",
    ) as eng:
        eng.migrate()
        eng.restock("solo", 1_000_000)
        for node in ("coordinator", "worker1", "worker2"):
            made = run_sql(
                stockade_citus.node_dsn(node),
                "SELECT string_agg(p.proname || ':' || (p.prosrc LIKE '%shard_tables(p_shard)%')"
                " || ':' || coalesce(array_to_string(p.proconfig, ','), ''), ' '"
                " ORDER BY p.proname) FROM pg_proc p JOIN pg_namespace n ON n.oid ="
                f" p.pronamespace WHERE n.nspname = '{schema}'"
                " AND p.proname IN ('reserve_one', 'batch_one', 'reserve_routed',"
                " 'reserve_local')",
            )
            # Each on every node, none with a SET (reserve_one and reserve_routed call
            # reserve_local).
            assert made == (
                "batch_one:true: reserve_local:true: reserve_one:false: reserve_routed:false:"
            ), (node, made)

        def worker_sessions_kb() -> int:
            total, sessions = stockade_citus.workers_sessions_kib(sessions_of)
            assert sessions > 0, f"no worker session ({sessions_of}) found"
            return total

        for i in range(200):  # the sessions' caches and the shard's pages settle first
            strategy = "batched" if i % 3 == 0 else "atomic"
            eng.reserve(
                "solo", 1, strategy=strategy, idempotency_key=f"warm-{i}" if i % 2 else None
            )
        before = worker_sessions_kb()
        for i in range(2000):  # one-row batches (citus/107) too
            strategy = "batched" if i % 3 == 0 else "atomic"
            eng.reserve("solo", 1, strategy=strategy, idempotency_key=f"k-{i}" if i % 2 else None)
        grown = worker_sessions_kb() - before
        if routing == "direct":  # the engine's own sessions did run them
            routed = eng.stats()["pool"]["routing"]
            assert routed["routed"] >= 1300 and routed["misses"] == 0, routed
        # With generic plans of statements on the distributed tables this grew by about
        # 180 MB (2,000 calls at 90 kB).
        assert grown < 20_000, f"the workers' sessions grew by {grown} kB over 2,000 calls"
        assert eng.audit().ok


def test_a_delegated_call_writes_the_shard_tables_only_where_the_shard_is(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # shard_tables (citus/109) names a row's shard tables only on the node whose placement
    # holds them, under the shard's metadata lock; anywhere else (the coordinator, the
    # other worker) the distributed tables, which Citus routes. reserve_one called there
    # (inside a transaction, which Citus does not delegate) still reserves, through them.
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1) as eng:
        eng.migrate()
        eng.restock("here", 10)
        shard_key = run_sql(dsn, f"SELECT shard_key FROM {schema}.stock WHERE sku = 'here'")
        shard = run_sql(
            dsn, f"SELECT get_shard_id_for_distribution_column('{schema}.stock', {shard_key})"
        )
        holder = int(
            run_sql(
                dsn,
                "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n"
                f" USING (groupid) WHERE p.shardid = {shard}",
            )
        )
        for node in ("coordinator", "worker1", "worker2"):
            port = stockade_citus.node_port(node)
            tables = run_sql(
                stockade_citus.node_dsn(node),
                f"SELECT stock || ' ' || reservation || ' ' || idempotency || ' ' || here"
                f" FROM {schema}.shard_tables({shard_key})",
            ).split()
            if port == holder:
                assert tables[0] == f"{schema}.stock_{shard}" and tables[3] == "true", tables
                # Not under REPEATABLE READ: a snapshot taken before the lock wait could
                # show a placement a move has since switched.
                repeatable = run_sql(
                    stockade_citus.node_dsn(node),
                    "BEGIN ISOLATION LEVEL REPEATABLE READ;"
                    f" SELECT here FROM {schema}.shard_tables({shard_key}); COMMIT",
                )
                assert repeatable == "f", repeatable
                assert [t.rsplit("_", 1)[0] for t in tables[1:3]] == [
                    f"{schema}.reservation",
                    f"{schema}.idempotency",
                ], tables
            else:
                assert tables == [
                    f"{schema}.stock",
                    f"{schema}.reservation",
                    f"{schema}.idempotency",
                    "false",
                ], (node, tables)
            # A call here: on the holder it writes the shards, elsewhere it goes through
            # Citus; either way the row and its hold are the cluster's.
            hold = uuid.UUID(bytes=_core.make_uuid_v7(int(time.time() * 1000), int(shard_key)))
            made = run_sql(
                stockade_citus.node_dsn(node),
                f"BEGIN; SELECT outcome FROM {schema}.reserve_one('here', 'default', 0::smallint,"
                f" 1, -1, '{hold}', 60000000, '5s', NULL, NULL, {shard_key}); COMMIT",
            )
            assert eng.reservation(str(hold)).state == "held"
            assert made.split() == ["made"], (node, made)
        assert eng.stock("here").reserved == 3
        assert_audit_clean(eng)


def test_a_delegated_call_journals_into_its_own_shard_where_it_is(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # citus/110: shard_tables notes the stock shard it found here and its co-located
    # journal shard, and the journal trigger writes that shard directly when it fires on
    # that very stock shard. A change to another shard's row in the same transaction
    # journals through Citus as before: each entry lands in its own row's shard.
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1) as eng:
        eng.migrate()

        def placed(sku: str) -> Tuple[int, int, int]:  # shard key, stock shard, its port
            key = _core.shard_key_of(sku, "default")
            shard = int(
                run_sql(
                    dsn, f"SELECT get_shard_id_for_distribution_column('{schema}.stock', {key})"
                )
            )
            port = run_sql(
                dsn,
                "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n"
                f" USING (groupid) WHERE p.shardid = {shard}",
            )
            return key, shard, int(port)

        a, first = "j-0", placed("j-0")
        b, other = next(
            (sku, p)
            for sku, p in ((f"j-{i}", placed(f"j-{i}")) for i in range(1, 200))
            if p[2] == first[2] and p[1] != first[1]
        )
        eng.restock(a, 10)
        eng.restock(b, 10)
        worker = next(
            stockade_citus.node_dsn(n) for n in NODES if stockade_citus.node_port(n) == first[2]
        )
        journal_shard = int(
            run_sql(
                dsn,
                f"SELECT get_shard_id_for_distribution_column('{schema}.movement', {first[0]})",
            )
        )
        hold = uuid.UUID(bytes=_core.make_uuid_v7(int(time.time() * 1000), first[0]))
        # Citus logs each statement it runs on a shard through local execution: the
        # trigger's INSERT through Citus shows there, the direct one does not.
        out, messages = run_sql_with_messages(
            worker,
            "BEGIN; SET LOCAL citus.log_local_commands = on;"
            " SET LOCAL client_min_messages = log;"
            f" SELECT outcome FROM {schema}.reserve_one('{a}', 'default', 0::smallint,"
            f" 1, -1, '{hold}', 60000000, '5s', NULL, NULL, {first[0]});"
            " SELECT current_setting('stockade.local_journal') ="
            f" '{schema}.stock_{first[1]}'::regclass::oid::text;"
            f" UPDATE {schema}.stock SET low_stock = 3 WHERE shard_key = {other[0]};"
            f" UPDATE {schema}.stock SET low_stock = 4 WHERE shard_key = {first[0]}; COMMIT",
        )
        assert out.split()[:2] == ["made", "t"], out
        inserts = [line for line in messages.splitlines() if "INSERT INTO" in line]
        assert not [line for line in inserts if f"movement_{journal_shard}" in line], inserts
        assert len([line for line in inserts if f"'{b}'" in line and ".movement_" in line]) == 1
        assert len([line for line in messages.splitlines() if "UPDATE" in line]) == 2
        for sku, key in ((a, first[0]), (b, other[0])):
            causes = run_sql(
                dsn,
                f"SELECT string_agg(cause, ',' ORDER BY version_after) FROM {schema}.movement"
                f" WHERE shard_key = {key} AND sku = '{sku}'",
            )
            assert causes == ("restock,hold,low_stock" if sku == a else "restock,low_stock")
        # The journal shard of the reserved row holds its entries only.
        assert (
            run_sql(
                worker,
                f"SELECT count(*) FILTER (WHERE sku = '{a}') || ' ' || count(*) FILTER"
                f" (WHERE sku = '{b}') FROM {schema}.movement_{journal_shard}",
            )
            == "3 0"
        )
        assert eng.reservation(str(hold)).state == "held"
        assert_audit_clean(eng)


def test_direct_routing_sends_each_one_row_call_straight_to_the_rows_worker(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # citus_routing="direct": the engine reads the shard map once and sends each call on
    # one row to the worker that holds it: an atomic reserve, keyless or keyed (migration
    # citus/106), a one-row batch (citus/107), a sell, a confirm, a release and an extend
    # (citus/111) as delegated calls; a keyed restock and a read of the row as
    # transactions of statements, which Citus executes locally there. And one with a
    # buyer's count on another shard: that transaction is distributed from the worker.
    # The coordinator sends no command for any of them
    # (citus.log_remote_commands; the marks are read through the coordinator by another
    # engine), and each delegated call ran on the node its route named: the map places
    # keys where Citus does (no miss).
    logged = dsn + "%20-c%20citus.log_remote_commands%3Don%20-c%20log_min_messages%3Dnotice"
    with (
        stockade.Engine.postgres(
            logged,
            layout="citus",
            schema=schema,
            pool_size=2,
            citus_routing="direct",
            sweeper=False,
        ) as eng,
        stockade.Engine.postgres(
            logged, layout="citus", schema=schema, pool_size=1, sweeper=False
        ) as marks,
    ):
        eng.migrate()
        skus = [f"d-{i}" for i in range(40)]
        for sku in skus:
            eng.restock(sku, 10)

        keyed: Dict[str, stockade.Reservation] = {}

        def one_row_calls() -> None:
            for sku in skus:
                eng.reserve(sku, 1, strategy="atomic")
                keyed[sku] = eng.reserve(sku, 2, strategy="atomic", idempotency_key=f"k-{sku}")
                eng.reserve(sku, 1, strategy="batched")
                eng.sell(sku, 1, strategy="atomic")
                eng.restock(sku, 1, idempotency_key=f"r-{sku}")
                hold = eng.reserve(sku, 2, strategy="atomic")
                eng.extend(hold.id, ttl=timedelta(minutes=5))
                eng.confirm(hold.id, qty=1)
                eng.release(hold.id)
                limited = eng.reserve(sku, 2, strategy="atomic", buyer="b-1")
                eng.release(limited.id, qty=1)  # one unit back to the buyer's count
                eng.release(limited.id)
                assert eng.stock(sku).on_hand == 9

        eng.set_purchase_limit("g", 1_000, skus)
        lines = remote_commands(stockade_citus, marks, "direct", one_row_calls)
        assert not [line for line in lines if "issuing" in line], lines[:5]
        routing = eng.stats()["pool"]["routing"]
        assert routing["mode"] == "direct" and routing["nodes"] == 2, routing
        # 40 restocks before, then 13 calls for each SKU (and the engine's own reads of a
        # SKU's rows, which go the same way)
        assert routing["routed"] >= 40 + 13 * 40, routing
        assert (routing["misses"], routing["fallbacks"]) == (0, 0), routing
        # A replay, a conflict and a refusal answer as through the coordinator.
        replay = eng.reserve("d-0", 2, strategy="atomic", idempotency_key="k-d-0")
        assert replay.id == keyed["d-0"].id
        with pytest.raises(stockade.IdempotencyConflict):
            eng.reserve("d-0", 1, strategy="atomic", idempotency_key="k-d-0")
        with pytest.raises(OutOfStock):
            eng.reserve("d-1", 100, strategy="atomic")
        with pytest.raises(OutOfStock):
            eng.sell("d-1", 100, strategy="atomic")
        assert eng.restock("d-0", 1, idempotency_key="r-d-0").on_hand == 10  # replayed
        assert [eng.stock(sku).reserved for sku in skus] == [4] * len(skus)
        assert eng.buyer_held("g", "b-1") == 0
        assert_audit_clean(eng)
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1) as eng:
        assert eng.stats()["pool"]["routing"]["mode"] == "coordinator"


def shard_move(
    cluster: TemporaryCitus, dsn: str, schema: str, sku: str
) -> Tuple[Callable[[], None], List[str], int]:
    """A move of `sku`'s shard to the other worker (block_writes), to call; the SKUs of
    `schema` on that shard; and the port of the worker it leaves."""
    shard_of = f"get_shard_id_for_distribution_column('{schema}.stock', shard_key)"
    shard = run_sql(dsn, f"SELECT {shard_of} FROM {schema}.stock WHERE sku = '{sku}'")
    moving = run_sql(
        dsn, f"SELECT string_agg(sku, ' ') FROM {schema}.stock WHERE {shard_of} = {shard}"
    ).split()
    source = int(
        run_sql(
            dsn,
            "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n"
            f" USING (groupid) WHERE p.shardid = {shard}",
        )
    )
    (target,) = {cluster.node_port(w) for w in ("worker1", "worker2")} - {source}

    def move() -> None:
        run_sql(
            dsn,
            f"SELECT citus_move_shard_placement({shard}, '127.0.0.1', {source},"
            f" '127.0.0.1', {target}, shard_transfer_mode => 'block_writes')",
        )

    return move, moving, source


def move_under(
    move: Callable[[], None], threads: List[threading.Thread], stop: threading.Event
) -> None:
    """Starts `threads`, moves the shard a second later, and 1.5 s after the move sets
    `stop` and joins them."""
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        move()
        time.sleep(1.5)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)


def test_a_shard_move_under_load_refreshes_the_direct_routes(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # citus_move_shard_placement moves the shard of m-0 (and of the SKUs that hash there)
    # to the other worker while 8 threads work straight on the workers, half of the calls
    # on that shard: reserves (atomic and batched), sells, and confirms and releases of
    # their own holds, as delegated calls, and keyed sells and releases, as transactions
    # of statements on the worker. A call routed by the old map reaches the old node,
    # which forwards it to the new one (a delegated call's miss is counted); the engine
    # then reads the map again, and calls hit again. No call fails, and every row holds
    # exactly what was acknowledged.
    with stockade.Engine.postgres(
        dsn, layout="citus", schema=schema, pool_size=8, citus_routing="direct"
    ) as eng:
        eng.migrate()
        skus = [f"m-{i}" for i in range(32)]
        for sku in skus:
            eng.restock(sku, 1_000_000)
        move, moving, _ = shard_move(stockade_citus, dsn, schema, "m-0")
        reserved: Dict[str, int] = {sku: 0 for sku in skus}
        sold: Dict[str, int] = {sku: 0 for sku in skus}
        errors: List[BaseException] = []
        stop = threading.Event()
        lock = threading.Lock()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            holds: List[stockade.Reservation] = []
            while not stop.is_set():
                sku = rng.choice(moving if rng.random() < 0.5 else skus)
                step = rng.random()
                try:
                    key = f"{seed}-{rng.random()}" if rng.random() < 0.3 else None
                    if step < 0.2:
                        eng.sell(sku, 1, strategy="atomic", idempotency_key=key)
                        changes = [(sku, 0, 1)]
                    elif step < 0.4 and holds:
                        hold = holds.pop()
                        if rng.random() < 0.5:
                            eng.confirm(hold.id, qty=1)  # the other unit stays held
                            changes = [(hold.sku, -1, 1)]
                        else:
                            eng.release(hold.id, idempotency_key=key)
                            changes = [(hold.sku, -2, 0)]
                    else:
                        holds.append(
                            eng.reserve(sku, 2, strategy=rng.choice(("atomic", "batched")))
                        )
                        changes = [(sku, 2, 0)]
                except stockade.StockadeError as e:
                    errors.append(e)
                    continue
                with lock:
                    for at, held, out in changes:
                        reserved[at] += held
                        sold[at] += out

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        move_under(move, threads, stop)
        assert not errors, errors[:3]
        routing = eng.stats()["pool"]["routing"]
        assert routing["misses"] >= 1 and routing["reloads"] >= 2, routing
        for sku in moving:  # the map is fresh: these run where the shard is now
            eng.reserve(sku, 1, strategy="atomic")
            reserved[sku] += 1
        after = eng.stats()["pool"]["routing"]
        assert after["misses"] == routing["misses"], (routing, after)
        levels = {sku: eng.stock(sku) for sku in skus}
        assert {sku: level.reserved for sku, level in levels.items()} == reserved
        assert {sku: 1_000_000 - level.on_hand for sku, level in levels.items()} == sold
        assert sum(sold.values()) > 0
        assert_audit_clean(eng)


def test_a_schema_is_handed_on_emptied_unless_the_test_changed_its_shape(
    dsn: str, schema: str
) -> None:
    schemas = CitusSchemas(dsn)
    try:
        with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1) as eng:
            eng.migrate()
            schemas.made(schema)
            eng.restock("s", 5)
            eng.reserve("s", 2, idempotency_key="k")
        schemas.give_back(schema)
        assert schemas.take() == schema
        with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1) as eng:
            counts = eng.row_counts()
            assert (counts["sku_count"], counts["reservation_count"]) == (0, 0), counts
            eng.restock("s", 1)
            assert eng.reserve("s", 1, idempotency_key="k").qty == 1  # the key is gone
        # A changed grant, or a migration's record, and it is dropped.
        for change in (
            f"GRANT SELECT ON {schema}.stock TO PUBLIC",
            f"UPDATE {schema}.schema_migrations SET checksum = 'edited' WHERE version = 1",
        ):
            if not schemas.owns(schema):
                with stockade.Engine.postgres(
                    dsn, layout="citus", schema=schema, pool_size=1, sweeper=False
                ) as eng:
                    eng.migrate()
                schemas.made(schema)
            run_sql(dsn, change)
            schemas.give_back(schema)
            assert not schemas.owns(schema) and schemas.take() is None
            gone = f"SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"
            assert run_sql(dsn, gone) == "0"
    finally:
        schemas.close()


def test_a_row_moved_to_a_lower_range_node_keeps_its_journal_in_order(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # Each node hands out journal positions from its own range of the sequence (a higher
    # group, a higher range). A row whose shard moves to the node of the lower range gets
    # lower positions than it had: the audit then orders the row's entries by version,
    # and finds the chain whole and the last entry equal to the row.
    with stockade.Engine.postgres(dsn, layout="citus", schema=schema, pool_size=2) as eng:
        eng.migrate()
        skus = [f"j-{i}" for i in range(16)]
        for sku in skus:
            eng.restock(sku, 10)
        shards = dict(
            line.split("|")
            for line in run_sql(
                dsn,
                f"SELECT sku, get_shard_id_for_distribution_column('{schema}.stock', shard_key)"
                f" FROM {schema}.stock",
            ).split()
        )
        groups = dict(
            line.split("|")
            for line in run_sql(
                dsn,
                "SELECT shardid, groupid FROM pg_dist_placement WHERE shardid IN"
                f" ({', '.join(set(shards.values()))})",
            ).split()
        )
        high = max(groups.values(), key=int)
        sku = min(s for s, shard in shards.items() if groups[shard] == high)
        eng.reserve(sku, 2)
        move, moving, _ = shard_move(stockade_citus, dsn, schema, sku)
        move()
        for moved in moving:
            eng.release(eng.reserve(moved, 3).id)
            eng.sell(moved, 1)
        by_version = {m.version_before: m for m in eng.movements(sku)}
        assert by_version[2].position < by_version[1].position  # the lower range
        assert eng.stock(sku).on_hand == 9
        assert_audit_clean(eng)


def test_purges_racing_a_shard_move_count_exactly_what_went(
    stockade_citus: TemporaryCitus, dsn: str, schema: str
) -> None:
    # purge() runs again and again (10 entries a call) while 4 threads make keyed,
    # confirmed reservations and keyless, released ones, half of them on a shard that
    # citus_move_shard_placement moves to the other worker. A purge_shard call holds the
    # shard's metadata lock, so the move waits for it, and a call after the move finds
    # the shard gone and leaves it to the statement form: whatever the timing, the purges
    # together report every row they deleted and no other, and a last purge leaves none.
    with stockade.Engine.postgres(
        dsn,
        layout="citus",
        schema=schema,
        pool_size=8,
        citus_routing="direct",
        purge_batch=10,
    ) as eng:
        eng.migrate()
        skus = [f"m-{i}" for i in range(32)]
        for sku in skus:
            eng.restock(sku, 1_000_000)
        move, moving, source = shard_move(stockade_citus, dsn, schema, "m-0")
        made = [0]  # rows: a keyed reservation and its key, or a keyless reservation
        purged = [0]
        errors: List[BaseException] = []
        stop = threading.Event()
        lock = threading.Lock()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            for n in itertools.count():
                if stop.is_set():
                    return
                sku = rng.choice(moving if rng.random() < 0.5 else skus)
                try:
                    if n % 2:
                        eng.confirm(eng.reserve(sku, 1, idempotency_key=f"c{seed}-{n}").id)
                        rows = 2
                    else:
                        eng.release(eng.reserve(sku, 1).id)
                        rows = 1
                except stockade.StockadeError as e:
                    errors.append(e)
                    continue
                with lock:
                    made[0] += rows

        def purger() -> None:
            while not stop.is_set():
                try:
                    purged[0] += eng.purge(timedelta(0))
                except stockade.StockadeError as e:
                    errors.append(e)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        threads.append(threading.Thread(target=purger))
        move_under(move, threads, stop)
        assert not errors, errors[:3]
        # On the worker it left, in a transaction (not delegated on), a call finds the
        # shard's placement gone, deletes nothing and leaves it to the statement form.
        on_source = dsn.replace(f":{stockade_citus.port}/", f":{source}/")
        key = run_sql(dsn, f"SELECT shard_key FROM {schema}.stock WHERE sku = 'm-0'")
        for keys in (True, False):
            call = purge_shard_call(on_source, schema, int(key), keys, in_transaction=True)
            assert call == ["0", "0", "f", "t"]
        time.sleep(0.01)
        purged[0] += eng.purge(timedelta(0))
        assert eng.row_counts()["reservation_count"] == 0
        assert purged[0] == made[0] > 0
        assert_audit_clean(eng)


def test_a_schema_without_the_delegated_functions_takes_the_statement_path(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An engine of this release on a schema an older release migrated (without citus/105
    # to 109): a reserve and a batch find no function (42883), each kind says so once, and
    # takes the statement path, which needs none; nothing ran. migrate() then makes them,
    # and the engine delegates again.
    with stockade.Engine.postgres(
        dsn, layout="citus", schema=schema, pool_size=2, citus_routing="direct"
    ) as eng:
        eng.migrate()
        eng.restock("solo", 100)
        run_sql(
            dsn,
            f"DROP FUNCTION {schema}.reserve_routed; DROP FUNCTION {schema}.reserve_one;"
            f" DROP FUNCTION {schema}.batch_one; DROP FUNCTION {schema}.purge_shard;"
            f" DROP FUNCTION {schema}.shard_tables; DROP FUNCTION {schema}.sell_one;"
            f" DROP FUNCTION {schema}.step_one; DROP FUNCTION {schema}.reserve_local;"
            f" DROP FUNCTION {schema}.batch_holds; DROP FUNCTION {schema}.batch_keys;"
            f" DROP FUNCTION {schema}.batch_key_outcomes;"
            f" DELETE FROM {schema}.schema_migrations WHERE version >= 105",
        )
        for strategy in ("atomic", "batched", "atomic"):
            eng.reserve("solo", 1, strategy=strategy, idempotency_key=f"k-{strategy}")
            eng.reserve("solo", 1, strategy=strategy)
        assert eng.stock("solo").reserved == 5  # the keyed replay made nothing
        missing = [r for r in caplog.records if "lacks this release's delegated" in r.getMessage()]
        assert len(missing) == 2, missing  # reserves, and one-row batches
        assert "so reserves take" in missing[0].getMessage()
        assert "so one-row batches take" in missing[1].getMessage()
        assert eng.migrate() == [
            "citus/105_delegated_reserve.sql",
            "citus/106_routed_reserve.sql",
            "citus/107_delegated_batch.sql",
            "citus/108_delegated_purge.sql",
            "citus/109_local_shards.sql",
            "citus/110_local_journal.sql",
            "citus/111_delegated_writes.sql",
            "citus/112_local_reserve.sql",
            "citus/113_delegated_batch_writes.sql",
        ]
        eng.reserve("solo", 1, strategy="atomic")
        eng.reserve("solo", 1, strategy="batched")
        assert eng.stock("solo").reserved == 7
        # It delegates again: with the functions gone once more, the next reserve finds
        # none and says so a second time.
        run_sql(dsn, f"DROP FUNCTION {schema}.reserve_routed; DROP FUNCTION {schema}.reserve_one")
        eng.reserve("solo", 1, strategy="atomic")
        missing = [r for r in caplog.records if "lacks this release's delegated" in r.getMessage()]
        assert len(missing) == 3, missing
        assert eng.stock("solo").reserved == 8


def test_a_schema_without_the_sells_functions_still_delegates_its_reserves(
    stockade_citus: TemporaryCitus, dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A schema migrated before citus/111 lacks sell_one and step_one alone: a sell finds no
    # function, says so for sells and steps only, and takes the statement path, as do the
    # steps; reserves and one-row batches stay delegated calls.
    with logging_engine(dsn, schema) as eng:
        run_sql(
            dsn,
            f"DROP FUNCTION {schema}.sell_one; DROP FUNCTION {schema}.step_one;"
            f" DELETE FROM {schema}.schema_migrations WHERE version = 111",
        )
        eng.sell("solo", 1)
        held = eng.reserve("solo", 2)
        assert eng.confirm(held.id, qty=1).confirmed == 1
        missing = [r for r in caplog.records if "lacks this release's delegated" in r.getMessage()]
        assert len(missing) == 1 and "so sells and steps take" in missing[0].getMessage()
        for strategy, function in (("atomic", ".reserve_one("), ("batched", ".batch_one(")):
            lines = remote_commands(
                stockade_citus, eng, strategy, lambda s=strategy: eng.reserve("solo", 1, strategy=s)
            )
            assert any(function in line for line in lines), (strategy, lines)
        assert eng.stock("solo").reserved == 3 and eng.stock("solo").on_hand == 98
        assert eng.migrate() == ["citus/111_delegated_writes.sql"]
