"""The public Engine: a typed, keyword-friendly facade over ``stockade._core.Engine``.

Python checks types and converts units (``timedelta`` to microseconds, ``uuid.UUID`` to
bytes); the C++ core checks values and does the work with the GIL released, so Python
threads run it in parallel. The Engine is assembled from modules with one job each: the
blocking calls (``_calls``), their awaitable twins (``_twins``, generated from the calls),
argument checks (``_checks``), options (:mod:`stockade.options`), the clock (``_clock``);
this module adds construction and the lifecycle.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Optional, cast

from . import _core, logs
from ._checks import DEFAULT_LOCATION, OrderKey, where
from ._clock import ManualClock
from ._closed import ClosedCore
from ._twins import EngineTwins
from .aio import Bridges, off_loop
from .env import dsn_from_environment, options_from_environment
from .errors import InvalidArgument, InvalidType
from .options import memory_options, postgres_options
from .values import Strategy, StrategyLike, TtlLike

__all__ = ["DEFAULT_LOCATION", "Engine", "ManualClock", "OrderKey"]


def _keywords(given: dict[str, Any]) -> dict[str, Any]:
    """A constructor's keyword arguments, from its ``locals()`` on entry."""
    return {k: v for k, v in given.items() if k not in ("cls", "dsn")}


class Engine(EngineTwins):
    """Reserves and sells stock without ever overselling.

    Make one with :meth:`Engine.memory` (embedded) or :meth:`Engine.postgres`. Every call
    takes ``location="default"``; calls that decide availability also take ``strategy=``
    (a :class:`Strategy` or its name), ``nowait=`` and ``lock_timeout=``.

    Every call has an awaitable twin, ``<name>_async``, with the same parameters and
    checks, and the engine has an async constructor (:meth:`connect`), :meth:`aclose` and
    ``async with``: nothing on the event loop waits on the network. The twins of the
    decisions (reserve, reserve_order, sell, confirm, release, extend) queue their call in
    C++ (the hot-row batcher, or a small pool of C++ workers), and outcomes reach the event
    loop in bulk (see :mod:`stockade.aio`); the others (reads, restock, set_on_hand,
    expire_due, stats, migrate) run the blocking call on the loop's default executor.
    Cancelling the awaitable does not cancel the call: it may still commit (use an
    idempotency key to find out).
    """

    def __init__(self, core: _core.Engine) -> None:
        if not isinstance(core, _core.Engine):
            raise InvalidType("use Engine.memory() or Engine.postgres() to make an engine")
        self._core = core
        self._bridges = Bridges()
        self._schema = None
        logs.start()

    # --- construction ---

    @classmethod
    def memory(
        cls,
        *,
        strategy: StrategyLike = Strategy.AUTO,
        clock: Optional[ManualClock] = None,
        retries_max: int = 5,
        lock_timeout: TtlLike = timedelta(seconds=10),
        default_ttl: TtlLike = timedelta(minutes=15),
        batch_max: int = 4096,
        batch_shards: int = 4,
        batch_lock_slice: TtlLike = timedelta(milliseconds=50),
        batch_linger: TtlLike = timedelta(microseconds=300),
        async_workers: int = 8,
        retention: Optional[TtlLike] = None,
        home_slot: Optional[int] = None,
        slot_directory: int = 4096,
        auto_slots_max: int = 4,
        auto_slots_cool: Optional[TtlLike] = timedelta(seconds=60),
        journal_max: int = 100_000,
        journal_retention: Optional[TtlLike] = None,
        feed_lag_max: TtlLike = timedelta(days=7),
        sweeper: bool = True,
    ) -> Engine:
        """An engine over the embedded in-process store: real semantics, no durability.

        A hold lapses at its expiry by itself (``sweeper=True``, the default): stock reads,
        reserves, sells, orders and batches first expire the holds past their expiry (up
        to 1,024 per call; the store has no thread of its own), a refused
        request frees lapsed holds before its refusal stands, and :meth:`reservation`
        reports a lapsed hold as expired. ``sweeper=False`` keeps a lapsed hold's units
        until :meth:`expire_due` runs or a confirm, release or extend finds it lapsed: a
        buyer may be refused units that no one holds any more.

        ``batch_max`` bounds the requests one batch carries, ``batch_shards`` is the number
        of flusher threads of the hot-row layer, and ``async_workers`` the number of C++
        threads that run async calls which do not batch. A batched request waits for its
        row lock as long as its own ``lock_timeout`` allows, in slices of at most
        ``batch_lock_slice``; between slices its shard serves other rows, so a row locked
        elsewhere never holds up requests for other rows longer than one slice. When a
        batched row is written by someone else as well (another process, a replica of
        this service), its flusher waits ``batch_linger`` for more requests before each
        batch there that would carry several, so that each turn at the row lock carries
        more of them; alone on a row it never waits (the memory store has no commit to
        amortize, so it never does).

        With ``retention`` set, the store purges as it goes (see :meth:`purge`): every 64th
        reservation purges up to 256 rows older than ``retention``. Without it nothing is
        ever purged unless you call :meth:`purge`.

        ``home_slot`` is the slot this engine sends reserves and sells of a SKU with
        hot-row slots to (:meth:`set_slots`; ``None``: from the process id, so that
        replicas started one after another take different slots), modulo the SKU's slot
        count; ``slot_directory`` bounds how many slotted SKUs it remembers. When several
        processes batch one SKU's row (each finds it changed by another between its
        batches, for ``auto``'s 200 ms), ``auto`` splits the SKU into ``auto_slots_max``
        slots by itself (1: never; docs/hot-row.md, "Automatic slots"). The memory store
        reports no row versions, so it never does. Once none of a slotted SKU's requests
        that ``auto`` routes here has run batched for ``auto_slots_cool``, the engine takes
        its slots away again (``set_slots(sku, 1)``; ``None``: never).

        The movement journal (:meth:`movements`, :meth:`feed`) keeps at most
        ``journal_max`` entries (0: none), dropping the oldest; with ``journal_retention``
        set, entries older than that go as the store purges, once every feed consumer
        has read them or they are older than ``feed_lag_max`` (docs/journal.md)."""
        options, clock_core, memory = memory_options(_keywords(locals()))
        return cls(_core.Engine.memory(options=options, clock=clock_core, memory=memory))

    @classmethod
    def postgres(
        cls,
        dsn: str,
        *,
        pool_size: int = 8,
        strategy: StrategyLike = Strategy.AUTO,
        schema: str = "stockade",
        retries_max: int = 5,
        lock_timeout: TtlLike = timedelta(seconds=10),
        default_ttl: TtlLike = timedelta(minutes=15),
        pool_timeout: TtlLike = timedelta(seconds=5),
        resolve_timeout: TtlLike = timedelta(seconds=5),
        call_timeout: TtlLike = timedelta(seconds=30),
        cancel_grace: TtlLike = timedelta(seconds=1),
        application_name: str = "stockade",
        pooler: str = "auto",
        layout: str = "plain",
        citus_routing: str = "coordinator",
        sweeper: bool = True,
        sweep_interval: TtlLike = timedelta(seconds=1),
        sweep_batch: int = 1000,
        retention: Optional[TtlLike] = None,
        purge_batch: int = 5000,
        batch_max: int = 4096,
        batch_shards: int = 4,
        batch_lock_slice: TtlLike = timedelta(milliseconds=50),
        batch_linger: TtlLike = timedelta(microseconds=300),
        async_workers: int = 8,
        home_slot: Optional[int] = None,
        slot_directory: int = 4096,
        auto_slots_max: int = 4,
        auto_slots_cool: Optional[TtlLike] = timedelta(seconds=60),
        journal_retention: Optional[TtlLike] = None,
        feed_lag_max: TtlLike = timedelta(days=7),
        feed_notify: bool = True,
    ) -> Engine:
        """An engine over PostgreSQL: the durable store.

        ``dsn`` is a libpq connection string or URI. The engine connects at once
        (``Unavailable`` if it cannot) and keeps at most ``pool_size`` connections (the
        sweeper one more); a call that waits longer than ``pool_timeout`` for one raises
        ``Overloaded``. When a connection is lost during a commit, the engine ends that
        server session (so the write cannot commit later) and looks for what it wrote, at
        most ``resolve_timeout``, before it raises ``InDoubt`` (docs/strategies.md).
        ``call_timeout`` bounds each call's whole time, COMMIT included: past it the engine
        cancels the server's work (and cuts the connection ``cancel_grace`` later) and
        raises ``DeadlineExceeded``, or ``InDoubt`` if COMMIT was sent (docs/failover.md).
        Connections carry ``application_name`` (or the DSN's, or ``PGAPPNAME``).
        ``pooler``: ``"pgbouncer-transaction"`` (PgBouncer's ``pool_mode = transaction``
        may stand in between) keeps no session state, and a commit whose connection is lost
        stays ``InDoubt``; ``"none"`` keeps it (direct, or a session-mode pooler);
        ``"auto"`` decides per connection. ``layout="citus"`` is for a Citus coordinator;
        ``citus_routing="direct"`` then sends one-shard calls straight to the workers
        (docs/scaling-out.md). Call :meth:`migrate` once to create the schema. A hold
        lapses at its expiry by itself: the sweeper (``sweeper=True``) expires lapsed holds
        every ``sweep_interval``, and a refused request frees them first (``False``:
        docs/postgres.md). With ``retention`` the sweeper also purges what is older than it
        each round, ``purge_batch`` rows per transaction (see :meth:`purge`); without it
        nothing is purged unless you call :meth:`purge`. The batching and slot options,
        ``journal_retention`` and ``feed_lag_max`` are as for :meth:`memory` (each flusher
        holds one connection at a time); ``feed_notify`` wakes feed waiters with NOTIFY."""
        logs.start()  # first, so that what the core logs while connecting is delivered
        postgres, options = postgres_options(dsn, _keywords(locals()))
        core = _core.Engine.postgres(postgres=postgres, options=options)
        note = "connected to PostgreSQL (%s), schema %s, pool_size %d"
        logs.LOGGER.info(note, where(dsn), schema, pool_size)
        engine = cls(core)
        engine._schema = schema
        return engine

    @classmethod
    def from_env(cls, **overrides: Any) -> Engine:
        """An engine over PostgreSQL configured by the environment: the DSN from
        ``STOCKADE_DSN`` or libpq's ``PG*`` variables, and options from ``STOCKADE_*``
        variables (the table is in :mod:`stockade.env`); keyword arguments override
        them. ``InvalidArgument`` if no DSN is set, or a variable does not parse."""
        dsn = dsn_from_environment(None)
        if dsn is None:
            raise InvalidArgument(
                "no database in the environment: set STOCKADE_DSN, or libpq's PGHOST, "
                "PGDATABASE, PGUSER, ... (PGPASSWORD or ~/.pgpass for the password)"
            )
        return cls.postgres(dsn, **{**options_from_environment(), **overrides})

    @classmethod
    async def connect(cls, dsn: str, **options: Any) -> Engine:
        """:meth:`postgres` as an awaitable: connects (and checks the server) off the event
        loop. Takes the same keyword arguments."""
        return await off_loop(functools.partial(cls.postgres, dsn, **options))

    @classmethod
    async def connect_from_env(cls, **overrides: Any) -> Engine:
        """:meth:`from_env` as an awaitable: connects off the event loop."""
        return await off_loop(functools.partial(cls.from_env, **overrides))

    # --- lifecycle ---

    def _native(self) -> _core.Engine:
        """The compiled engine, for the C++ hooks that take it (under a wrapper such as
        stockade.otel's, the one it wraps)."""
        return cast(_core.Engine, getattr(self._core, "__wrapped__", self._core))

    def close(self) -> None:
        """Completes every queued request (batched or async), then stops the batch
        flushers, the async workers, the sweeper and the database connections.

        Every call made after close() began, on either store, raises ``Unavailable`` (HTTP
        503: "the engine is closed"); so do the calls of its feeds. Closing twice is
        harmless. Completions of async calls still reach their event loops."""
        core = self._core
        if isinstance(core, ClosedCore):
            return
        self._core = ClosedCore(core)  # type: ignore[assignment]
        core.close()

    async def aclose(self) -> None:
        """:meth:`close` as an awaitable: drains queued requests off the event loop."""
        await off_loop(self.close)

    def __enter__(self) -> Engine:
        return self

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<stockade.Engine backend={self.backend} strategy={self.strategy.value}>"
