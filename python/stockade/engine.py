"""The public Engine: a typed, keyword-friendly facade over ``stockade._core.Engine``.

Python checks types and converts units (``timedelta`` to microseconds, ``uuid.UUID`` to
bytes); the C++ core checks values and does the work with the GIL released, so Python
threads run it in parallel.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import socket
from datetime import datetime, timedelta, timezone
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
    TypeVar,
    Union,
    cast,
)

from . import _core, logs
from .aio import Bridges
from .claim import ClaimAdvice
from .env import dsn_from_environment, options_from_environment
from .errors import InvalidArgument, InvalidType
from .stats import EngineStats, Metrics, RowCounts
from .values import (
    Lease,
    Reservation,
    ReservationId,
    StockLevel,
    Strategy,
    StrategyLike,
    TtlLike,
    check_bool,
    check_int,
    check_optional_int,
    check_optional_str,
    check_str,
    duration_ms,
    duration_us,
    optional_duration_ms,
    optional_duration_us,
    reservation_id_bytes,
    shown,
    strategy_name,
)

__all__ = ["Engine", "ManualClock"]

OrderKey = Union[str, Tuple[str, str]]
DEFAULT_LOCATION = "default"


class ManualClock:
    """A clock for the memory store that moves only when told to.

    Pass it to :meth:`Engine.memory` to test TTLs and expiry without sleeping.
    """

    def __init__(self, start: Optional[datetime] = None) -> None:
        start = start or datetime.now(timezone.utc)
        self._core = _core.ManualClock(self._us(start))

    @staticmethod
    def _us(when: datetime) -> int:
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise InvalidType("the clock needs a timezone-aware datetime")
        delta = when - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds

    def now(self) -> datetime:
        """The clock's current time (UTC)."""
        us = self._core.now_us()
        return datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)

    def set(self, when: datetime) -> None:
        """Sets the clock to ``when``."""
        self._core.set_us(self._us(when))

    def advance(self, delta: TtlLike) -> datetime:
        """Moves the clock by ``delta`` (timedelta or seconds); returns the new time."""
        self._core.advance_us(duration_us("delta", delta))
        return self.now()


_UINT64_MAX = 2**64 - 1


def _where(dsn: str) -> str:
    """host, port, database and user of a DSN, for a log line: never its password."""
    fields = dict(_core.parse_conninfo(dsn))
    parts = [f"{k}={shown(fields[k])}" for k in ("host", "port", "dbname", "user") if fields.get(k)]
    return " ".join(parts) or "libpq defaults"


def _migration_number(to: object) -> int:
    """``migrate(to=...)``: None (all, 0 to the core) or a migration number, 1 or more."""
    if to is None:
        return 0
    number = check_int("to", to)
    if number < 1:
        raise InvalidArgument(f"to must be a migration number (1 or more), got {number}")
    return number


def _retention_us(retention: object) -> int:
    """``None`` (no retention, 0) or a positive duration in microseconds."""
    if retention is None:
        return 0
    us = duration_us("retention", retention)
    if us <= 0:
        raise InvalidArgument("retention must be positive (None: nothing is purged by itself)")
    return us


def _positive(name: str, value: object) -> int:
    """A count option: an int from 1 to its limit in the core (_core.OPTION_LIMITS)."""
    return _counted(name, value, 1)


def _counted(name: str, value: object, low: int) -> int:
    number = check_int(name, value)
    high = _core.OPTION_LIMITS[name]
    if not low <= number <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, got {number}")
    return number


def _order_lines(items: object, location: str) -> List[Tuple[str, str, int]]:
    if not isinstance(items, Mapping):
        raise InvalidType(f"items must be a mapping of sku to qty, not {type(items).__name__}")
    lines: List[Tuple[str, str, int]] = []
    for key, qty in items.items():
        if isinstance(key, tuple) and len(key) == 2:
            sku, loc = check_str("sku", key[0]), check_str("location", key[1])
        else:
            sku, loc = check_str("sku", key), location
        lines.append((sku, loc, check_int("qty", qty)))
    return lines


def _reservations(made: List[_core.Reservation]) -> List[Reservation]:
    return [Reservation._from_core(r) for r in made]


# --- arguments for the core, in the order of its signatures (see _core.pyi) ---
#
# Each blocking call and its awaitable twin check and convert their arguments through one
# of these, so the two cannot drift; mypy checks each tuple against the stub.


def _sell_args(
    sku: str,
    qty: int,
    location: str,
    strategy: Optional[StrategyLike],
    expected_version: Optional[int],
    nowait: bool,
    lock_timeout: Optional[TtlLike],
    fencing_token: Optional[int] = None,
) -> Tuple[str, str, int, Optional[str], bool, Optional[int], Optional[int], Optional[int]]:
    return (
        check_str("sku", sku),
        check_str("location", location),
        check_int("qty", qty),
        strategy_name(strategy),
        check_bool("nowait", nowait),
        optional_duration_ms("lock_timeout", lock_timeout),
        check_optional_int("expected_version", expected_version),
        check_optional_int("fencing_token", fencing_token),
    )


def _check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidType(f"lease must be a stockade.Lease, got {type(lease).__name__}")
    return lease


def _default_owner() -> str:
    """Who holds a lease when the caller does not say: host and process id."""
    return f"{socket.gethostname()[:200]}:{os.getpid()}"


def _reserve_args(
    sku: str,
    qty: int,
    ttl: Optional[TtlLike],
    idempotency_key: Optional[str],
    location: str,
    strategy: Optional[StrategyLike],
    expected_version: Optional[int],
    nowait: bool,
    lock_timeout: Optional[TtlLike],
    buyer: Optional[str] = None,
) -> Tuple[
    str,
    str,
    int,
    Optional[int],
    Optional[str],
    Optional[str],
    bool,
    Optional[int],
    Optional[int],
    Optional[str],
]:
    return (
        check_str("sku", sku),
        check_str("location", location),
        check_int("qty", qty),
        optional_duration_us("ttl", ttl),
        check_optional_str("idempotency_key", idempotency_key),
        strategy_name(strategy),
        check_bool("nowait", nowait),
        optional_duration_ms("lock_timeout", lock_timeout),
        check_optional_int("expected_version", expected_version),
        check_optional_str("buyer", buyer),
    )


def _order_args(
    items: Mapping[OrderKey, int],
    ttl: Optional[TtlLike],
    idempotency_key: Optional[str],
    location: str,
    strategy: Optional[StrategyLike],
    nowait: bool,
    lock_timeout: Optional[TtlLike],
    buyer: Optional[str] = None,
) -> Tuple[
    List[Tuple[str, str, int]],
    Optional[int],
    Optional[str],
    Optional[str],
    bool,
    Optional[int],
    Optional[str],
]:
    return (
        _order_lines(items, check_str("location", location)),
        optional_duration_us("ttl", ttl),
        check_optional_str("idempotency_key", idempotency_key),
        strategy_name(strategy),
        check_bool("nowait", nowait),
        optional_duration_ms("lock_timeout", lock_timeout),
        check_optional_str("buyer", buyer),
    )


def _transition_args(
    id: ReservationId,
    expected_version: Optional[int],
) -> Tuple[bytes, Optional[int]]:
    return (reservation_id_bytes(id), check_optional_int("expected_version", expected_version))


def _extend_args(
    id: ReservationId,
    ttl: TtlLike,
    expected_version: Optional[int],
) -> Tuple[bytes, int, Optional[int]]:
    return (
        reservation_id_bytes(id),
        duration_us("ttl", ttl),
        check_optional_int("expected_version", expected_version),
    )


class Engine:
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
        self._schema: Optional[str] = None  # PostgreSQL: the schema it was opened with
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
    ) -> Engine:
        """An engine over the embedded in-process store: real semantics, no durability.

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
        count; ``slot_directory`` bounds how many slotted SKUs it remembers."""
        if clock is not None and not isinstance(clock, ManualClock):
            raise InvalidType(f"clock must be a ManualClock, not {type(clock).__name__}")
        core = _core.Engine.memory(
            strategy=strategy_name(strategy) or Strategy.AUTO.value,
            retries_max=_counted("retries_max", retries_max, 0),
            lock_timeout_ms=duration_ms("lock_timeout", lock_timeout),
            default_ttl_us=duration_us("default_ttl", default_ttl),
            clock=clock._core if clock is not None else None,
            retention_us=_retention_us(retention),
            **_layer_options(
                batch_max,
                batch_shards,
                batch_lock_slice,
                batch_linger,
                async_workers,
                home_slot,
                slot_directory,
            ),
        )
        return cls(core)

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
        application_name: str = "stockade",
        pooler: str = "auto",
        layout: str = "plain",
        sweeper: bool = False,
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
    ) -> Engine:
        """An engine over PostgreSQL: the durable store.

        ``dsn`` is a libpq connection string or URI. The engine connects at once
        (``Unavailable`` if it cannot) and keeps at most ``pool_size`` connections; a call
        that waits longer than ``pool_timeout`` for one raises ``Overloaded``. When a
        connection is lost during a commit, the engine ends that server session (so the
        write cannot commit later) and looks for what it wrote, spending at most
        ``resolve_timeout`` on it before it raises ``InDoubt`` (see docs/strategies.md,
        "Guarantees"). Every connection carries ``application_name`` (unless the DSN or
        ``PGAPPNAME`` sets one), so that operators find them in ``pg_stat_activity``.
        ``pooler`` says whether a connection pooler in transaction mode (PgBouncer's
        ``pool_mode = transaction``) may stand in between: ``"pgbouncer-transaction"``
        runs without session state (unnamed statements, ``SET LOCAL lock_timeout``, the
        sweeper elected per transaction), and a commit whose connection is lost stays
        ``InDoubt``, since no server session can be ended to settle it; ``"none"`` keeps
        session state (direct, or a pooler in session mode); ``"auto"`` (the default)
        decides per connection, and takes a pooler to be there when the cancel key's PID
        differs from the server's. ``layout="citus"`` is for a Citus coordinator:
        :meth:`migrate` then distributes the tables on a shard key and every statement
        names the shard key it touches (connections run without session state, as for
        ``"pgbouncer-transaction"``, since Citus carries no session ``SET`` to its
        workers). See
        docs/scaling-out.md. Call
        :meth:`migrate` once to create the schema. With ``sweeper=True`` a background
        thread expires due holds every ``sweep_interval``, ``sweep_batch`` per transaction;
        of all engines on one database, one sweeps at a time. With ``retention`` set (it
        needs ``sweeper=True``) the sweeper also purges what is older than ``retention``
        each round, ``purge_batch`` rows per transaction (see :meth:`purge`); without it
        nothing is ever purged unless you call :meth:`purge`. ``batch_max``,
        ``batch_shards``, ``batch_lock_slice``, ``batch_linger``, ``async_workers``,
        ``home_slot`` and ``slot_directory`` are as for :meth:`memory`; each batch
        flusher holds one pooled connection while it applies a batch.
        """
        logs.start()  # first, so that what the core logs while connecting is delivered
        core = _core.Engine.postgres(
            dsn=check_str("dsn", dsn),
            schema=check_str("schema", schema),
            pool_size=_positive("pool_size", pool_size),
            pool_timeout_ms=duration_ms("pool_timeout", pool_timeout),
            resolve_timeout_ms=duration_ms("resolve_timeout", resolve_timeout),
            application_name=check_str("application_name", application_name),
            pooler=check_str("pooler", pooler),
            layout=check_str("layout", layout),
            sweeper=check_bool("sweeper", sweeper),
            sweep_interval_ms=duration_ms("sweep_interval", sweep_interval),
            sweep_batch=_positive("sweep_batch", sweep_batch),
            retention_ms=-(-_retention_us(retention) // 1000),
            purge_batch=_positive("purge_batch", purge_batch),
            strategy=strategy_name(strategy) or Strategy.AUTO.value,
            retries_max=_counted("retries_max", retries_max, 0),
            lock_timeout_ms=duration_ms("lock_timeout", lock_timeout),
            default_ttl_us=duration_us("default_ttl", default_ttl),
            **_layer_options(
                batch_max,
                batch_shards,
                batch_lock_slice,
                batch_linger,
                async_workers,
                home_slot,
                slot_directory,
            ),
        )
        logs.LOGGER.info(
            "connected to PostgreSQL (%s), schema %s, pool_size %d",
            _where(dsn),
            schema,
            pool_size,
        )
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
        return await _off_loop(functools.partial(cls.postgres, dsn, **options))

    @classmethod
    async def connect_from_env(cls, **overrides: Any) -> Engine:
        """:meth:`from_env` as an awaitable: connects off the event loop."""
        return await _off_loop(functools.partial(cls.from_env, **overrides))

    # --- properties and lifecycle ---

    @property
    def backend(self) -> str:
        """``"memory"`` or ``"postgres"``."""
        return self._core.backend

    @property
    def strategy(self) -> Strategy:
        """The default strategy of this engine."""
        return Strategy(self._core.default_strategy)

    def migrate(self, *, to: Optional[int] = None) -> List[str]:
        """Creates or upgrades the schema; returns the names of the migrations applied.
        With every migration applied, it also makes this release's statement routines
        that are missing (see docs/postgres.md, PgBouncer); they are not in the list.

        ``to`` stops after the migration with that number (default: apply all). Idempotent,
        and safe when several processes run it at once. The memory store has no schema, so
        there it applies nothing."""
        return self._core.migrate(_migration_number(to))

    def migration_plan(self, *, to: Optional[int] = None) -> List[Tuple[str, str]]:
        """What :meth:`migrate` would run now, without running it: ``(name, SQL)`` pairs,
        first ``"(create schema)"`` if the schema does not exist yet, or ``"(bookkeeping)"``
        if it exists without a migration table, then each missing migration
        with the schema name filled in, then ``"(statement routines)"`` (the names of the
        PL/pgSQL functions that connections behind a transaction pooler call, which
        :meth:`migrate` makes once every migration is applied) if any are missing.
        ``InvalidState`` if an applied migration differs from this build's. Empty on the
        memory store."""
        plan = self._core.migration_plan(_migration_number(to))
        return [(str(name), str(sql)) for name, sql in plan]

    def drop_schema(self, *, confirm: str) -> None:
        """Drops this engine's schema and everything in it (``DROP SCHEMA ... CASCADE``):
        for demos and tests. ``confirm`` must repeat the schema's name. Nothing happens on
        the memory store."""
        check_str("confirm", confirm)
        if self._schema is None:
            return
        if confirm != self._schema:
            raise InvalidArgument("confirm must repeat the name of the schema to drop")
        self._core.drop_schema()

    def close(self) -> None:
        """Completes every queued request (batched or async), then stops the batch
        flushers, the async workers, the sweeper and the database connections.

        Later batched and async calls raise ``InvalidState``, and on PostgreSQL every call
        does; the memory store stays usable for synchronous per-request calls. Closing
        twice is harmless. Completions of async calls still reach their event loops."""
        self._core.close()

    async def migrate_async(self, *, to: Optional[int] = None) -> List[str]:
        """:meth:`migrate` as an awaitable."""
        return await _off_loop(functools.partial(self.migrate, to=to))

    async def aclose(self) -> None:
        """:meth:`close` as an awaitable: drains queued requests off the event loop."""
        await _off_loop(self.close)

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

    # --- stock ---

    def restock(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Adds ``qty`` units to on_hand, creating the row if it does not exist.

        Raises ``Discontinued`` on a discontinued row, and ``LeaseHeld`` while another
        holder's lease is live unless ``fencing_token`` is that lease's token."""
        return StockLevel._from_core(
            self._core.restock(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                qty=check_int("qty", qty),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def set_on_hand(
        self,
        sku: str,
        on_hand: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Sets on_hand (a stock count). What is reserved must stay covered by
        ``on_hand + backorder_limit`` (else ``InvalidState``)."""
        return StockLevel._from_core(
            self._core.set_on_hand(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                on_hand=check_int("on_hand", on_hand),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def set_backorder_limit(
        self,
        sku: str,
        limit: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Lets up to ``limit`` units be held or sold beyond on_hand (backorders and
        preorders); 0, the default of every row, allows none.

        The row keeps ``0 <= reserved <= on_hand + backorder_limit`` (a CHECK constraint
        on PostgreSQL). Lowering the limit below what is already promised beyond on_hand
        raises ``InvalidState``."""
        return StockLevel._from_core(
            self._core.set_backorder_limit(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                limit=check_int("limit", limit),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def discontinue(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Soft-deletes the stock row: it stays as a tombstone (``discontinued=True``).

        Afterwards ``reserve``, ``reserve_order``, ``sell``, ``restock`` and
        ``set_on_hand`` raise ``Discontinued`` (HTTP 410), while holds that exist can still
        be confirmed, released or extended, and expire as usual. Discontinuing a
        discontinued row changes nothing. ``NotFound`` if the row never existed. A SKU
        with hot-row slots is discontinued on all of its rows in one transaction."""
        return self._set_discontinued(sku, True, location, expected_version, fencing_token)

    def reinstate(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Undoes :meth:`discontinue`; on a row that is not discontinued, changes nothing."""
        return self._set_discontinued(sku, False, location, expected_version, fencing_token)

    def _set_discontinued(
        self,
        sku: str,
        discontinued: bool,
        location: str,
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel:
        return StockLevel._from_core(
            self._core.set_discontinued(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                discontinued=discontinued,
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    # --- purchase limits ---

    def set_purchase_limit(self, group: str, per_buyer: int, skus: Iterable[str]) -> None:
        """At most ``per_buyer`` units per buyer across ``skus`` (at every location): a
        flash sale's "2 per customer across these 5 SKUs".

        Creates the group or replaces its limit and SKU set. ``reserve`` and
        ``reserve_order`` with ``buyer=`` count against it and raise ``LimitExceeded``
        past the limit; releases and expiries give units back, confirmations keep
        counting. It holds under every strategy, ``batched`` included, and without write
        skew: each (group, buyer) has a parent row, locked before any stock row, that two
        concurrent requests by one buyer meet on. A SKU belongs to one group at most
        (``InvalidState`` otherwise, changing nothing). A call without ``buyer`` is not
        limited."""
        if isinstance(skus, (str, bytes)) or not isinstance(skus, Iterable):
            raise InvalidType(f"skus must be an iterable of str, not {type(skus).__name__}")
        # Read one past the bound at most: an endless iterable is refused, not consumed.
        bounded = list(itertools.islice(skus, _core.LIMIT_GROUP_SKUS_MAX + 1))
        if len(bounded) > _core.LIMIT_GROUP_SKUS_MAX:
            raise InvalidArgument(
                f"a purchase limit names at most {_core.LIMIT_GROUP_SKUS_MAX} skus"
            )
        self._core.set_purchase_limit(
            group=check_str("group", group),
            per_buyer=check_int("per_buyer", per_buyer),
            skus=[check_str("sku", sku) for sku in bounded],
        )

    def remove_purchase_limit(self, group: str) -> bool:
        """Drops the group and its buyers' counts; returns whether it existed."""
        return bool(self._core.remove_purchase_limit(group=check_str("group", group)))

    def buyer_held(self, group: str, buyer: str) -> int:
        """The units ``buyer`` holds or bought in ``group`` (what its limit counts)."""
        return int(
            self._core.buyer_held(group=check_str("group", group), buyer=check_str("buyer", buyer))
        )

    async def set_purchase_limit_async(
        self, group: str, per_buyer: int, skus: Iterable[str]
    ) -> None:
        """:meth:`set_purchase_limit` as an awaitable."""
        await _off_loop(functools.partial(self.set_purchase_limit, group, per_buyer, skus))

    async def remove_purchase_limit_async(self, group: str) -> bool:
        """:meth:`remove_purchase_limit` as an awaitable."""
        return await _off_loop(functools.partial(self.remove_purchase_limit, group))

    async def buyer_held_async(self, group: str, buyer: str) -> int:
        """:meth:`buyer_held` as an awaitable."""
        return await _off_loop(functools.partial(self.buyer_held, group, buyer))

    # --- leases ---

    def acquire_lease(
        self,
        resource: str,
        ttl: TtlLike,
        *,
        location: str = DEFAULT_LOCATION,
        owner: Optional[str] = None,
    ) -> Lease:
        """Takes the lease on the stock row of SKU ``resource`` for ``ttl``: the offline
        lock for work longer than a transaction (a cycle count, a re-import, an admin
        editing stock levels).

        While it is live, writes to the row (``restock``, ``set_on_hand``, ``sell``,
        ``set_backorder_limit``, ``discontinue``, ``reinstate``) need its ``token`` as
        ``fencing_token``, and ``reserve`` raises ``LeaseHeld``; holds that exist can
        still be confirmed or released. A holder that paused past ``ttl`` loses it: once
        someone else acquires, its token is refused with ``FencingTokenStale``. Expiry runs
        on the database clock. Raises ``LeaseHeld`` while another lease is live. Creates
        the row at zero units if it does not exist. ``owner`` (default: host and process
        id) is shown in the lease, for people."""
        return Lease._from_core(
            self._core.acquire_lease(
                sku=check_str("resource", resource),
                location=check_str("location", location),
                ttl_us=duration_us("ttl", ttl),
                owner=_default_owner() if owner is None else check_str("owner", owner),
            )
        )

    def renew_lease(self, lease: Lease, ttl: TtlLike) -> Lease:
        """Extends a live lease to ``ttl`` from now. ``FencingTokenStale`` if it lapsed or
        a newer lease superseded it: then acquire a new one."""
        lease = _check_lease(lease)
        return Lease._from_core(
            self._core.renew_lease(
                sku=lease.resource,
                location=lease.location,
                token=lease.token,
                ttl_us=duration_us("ttl", ttl),
            )
        )

    def release_lease(self, lease: Lease) -> bool:
        """Ends the lease if it is still live and the row's; returns whether it did
        (False: it had lapsed, or a newer lease superseded it, which stays)."""
        lease = _check_lease(lease)
        return bool(
            self._core.release_lease(sku=lease.resource, location=lease.location, token=lease.token)
        )

    async def set_backorder_limit_async(
        self,
        sku: str,
        limit: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`set_backorder_limit` as an awaitable."""
        call = functools.partial(
            self.set_backorder_limit,
            sku,
            limit,
            location=location,
            expected_version=expected_version,
            fencing_token=fencing_token,
        )
        return await _off_loop(call)

    async def discontinue_async(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`discontinue` as an awaitable."""
        call = functools.partial(
            self.discontinue,
            sku,
            location=location,
            expected_version=expected_version,
            fencing_token=fencing_token,
        )
        return await _off_loop(call)

    async def reinstate_async(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`reinstate` as an awaitable."""
        call = functools.partial(
            self.reinstate,
            sku,
            location=location,
            expected_version=expected_version,
            fencing_token=fencing_token,
        )
        return await _off_loop(call)

    async def acquire_lease_async(
        self,
        resource: str,
        ttl: TtlLike,
        *,
        location: str = DEFAULT_LOCATION,
        owner: Optional[str] = None,
    ) -> Lease:
        """:meth:`acquire_lease` as an awaitable."""
        call = functools.partial(self.acquire_lease, resource, ttl, location=location, owner=owner)
        return await _off_loop(call)

    async def renew_lease_async(self, lease: Lease, ttl: TtlLike) -> Lease:
        """:meth:`renew_lease` as an awaitable."""
        return await _off_loop(functools.partial(self.renew_lease, lease, ttl))

    async def release_lease_async(self, lease: Lease) -> bool:
        """:meth:`release_lease` as an awaitable."""
        return await _off_loop(functools.partial(self.release_lease, lease))

    def stock(self, sku: str, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """The committed stock row (``NotFound`` if there is none). For a SKU with
        hot-row slots, its rows summed from one snapshot; ``version`` is the sum of their
        versions, which every write moves."""
        return StockLevel._from_core(
            self._core.stock(sku=check_str("sku", sku), location=check_str("location", location))
        )

    def set_slots(self, sku: str, slots: int, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """Spreads the SKU's free units over ``slots`` rows (hot-row slots, 1 to 64), so
        that as many batches, one per replica, can each hold a row lock and commit at
        once. Reserves and sells then go to the engine's ``home_slot``; a slot without
        room takes free units from the others (every row locked, in order) before it
        refuses, so ``OutOfStock`` still means the SKU as a whole is short. ``stock()``
        sums the rows; ``restock`` and ``set_on_hand`` spread over them; If-Match
        (``expected_version``) names the summed version. Slots only grow (fewer raises
        ``InvalidArgument``). A SKU with a live lease or a backorder limit cannot take
        slots (``InvalidState``); leases, fencing tokens and backorder limits raise
        ``NotSupported`` on a slotted SKU (``discontinue`` and ``reinstate`` set every
        row at once). Returns the SKU's summed level. They pay where
        several processes send one SKU batches and a commit flush is slow against CPU;
        see docs/scaling-out.md for what they measured."""
        return StockLevel._from_core(
            self._core.set_slots(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                slots=check_int("slots", slots),
            )
        )

    def slot_count(self, sku: str, *, location: str = DEFAULT_LOCATION) -> int:
        """How many rows the SKU's units are spread over: 1 without slots, 0 if the SKU
        has no row."""
        return int(
            self._core.slot_count(
                sku=check_str("sku", sku), location=check_str("location", location)
            )
        )

    async def set_slots_async(
        self, sku: str, slots: int, *, location: str = DEFAULT_LOCATION
    ) -> StockLevel:
        """:meth:`set_slots` as an awaitable."""
        return await _off_loop(functools.partial(self.set_slots, sku, slots, location=location))

    async def slot_count_async(self, sku: str, *, location: str = DEFAULT_LOCATION) -> int:
        """:meth:`slot_count` as an awaitable."""
        return await _off_loop(functools.partial(self.slot_count, sku, location=location))

    async def restock_async(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`restock` as an awaitable."""
        call = functools.partial(
            self.restock,
            sku,
            qty,
            location=location,
            expected_version=expected_version,
            fencing_token=fencing_token,
        )
        return await _off_loop(call)

    async def set_on_hand_async(
        self,
        sku: str,
        on_hand: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`set_on_hand` as an awaitable."""
        call = functools.partial(
            self.set_on_hand,
            sku,
            on_hand,
            location=location,
            expected_version=expected_version,
            fencing_token=fencing_token,
        )
        return await _off_loop(call)

    async def stock_async(self, sku: str, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """:meth:`stock` as an awaitable."""
        return await _off_loop(functools.partial(self.stock, sku, location=location))

    def sell(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Sells ``qty`` units at once (no hold): on_hand falls if enough is available.

        With ``fencing_token`` (a lease's), it runs per request, like ``expected_version``."""
        args = _sell_args(
            sku, qty, location, strategy, expected_version, nowait, lock_timeout, fencing_token
        )
        return StockLevel._from_core(self._core.sell(*args))

    async def sell_async(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """:meth:`sell` as an awaitable."""
        args = _sell_args(
            sku, qty, location, strategy, expected_version, nowait, lock_timeout, fencing_token
        )
        return await self._bridges.call(self._core.submit_sell, StockLevel._from_core, args)

    # --- reservations ---

    def reserve(
        self,
        sku: str,
        qty: int,
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
    ) -> Reservation:
        """Holds ``qty`` units for ``ttl`` (default: the engine's ``default_ttl``).

        Raises ``OutOfStock`` if fewer are available. With an ``idempotency_key``, the same
        request returns the same reservation; a different one raises ``IdempotencyConflict``.
        On PostgreSQL, a connection lost during COMMIT raises ``InDoubt``: retry with the
        same ``idempotency_key`` to get the reservation if it committed, or make it if not.
        With a ``buyer``, the purchase limit of the SKU's group applies (``LimitExceeded``;
        see :meth:`set_purchase_limit`).
        """
        args = _reserve_args(
            sku,
            qty,
            ttl,
            idempotency_key,
            location,
            strategy,
            expected_version,
            nowait,
            lock_timeout,
            buyer,
        )
        return Reservation._from_core(self._core.reserve(*args))

    async def reserve_async(
        self,
        sku: str,
        qty: int,
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
    ) -> Reservation:
        """:meth:`reserve` as an awaitable."""
        args = _reserve_args(
            sku,
            qty,
            ttl,
            idempotency_key,
            location,
            strategy,
            expected_version,
            nowait,
            lock_timeout,
            buyer,
        )
        return await self._bridges.call(self._core.submit_reserve, Reservation._from_core, args)

    def reserve_order(
        self,
        items: Mapping[OrderKey, int],
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
    ) -> List[Reservation]:
        """Holds every line or none: ``{sku: qty}`` (or ``{(sku, location): qty}``).

        Rows are locked in sorted (sku, location) order, so concurrent orders cannot
        deadlock. Returns one reservation per line, in the order of ``items``. With a
        ``buyer``, every line counts against the purchase limit of its SKU's group.
        """
        args = _order_args(
            items, ttl, idempotency_key, location, strategy, nowait, lock_timeout, buyer
        )
        return _reservations(self._core.reserve_order(*args))

    async def reserve_order_async(
        self,
        items: Mapping[OrderKey, int],
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
    ) -> List[Reservation]:
        """:meth:`reserve_order` as an awaitable."""
        args = _order_args(
            items, ttl, idempotency_key, location, strategy, nowait, lock_timeout, buyer
        )
        return await self._bridges.call(self._core.submit_reserve_order, _reservations, args)

    def confirm(self, id: ReservationId, *, expected_version: Optional[int] = None) -> Reservation:
        """held -> confirmed: the units leave on_hand. ``ReservationExpired`` past expiry."""
        args = _transition_args(id, expected_version)
        return Reservation._from_core(self._core.confirm(*args))

    async def confirm_async(
        self,
        id: ReservationId,
        *,
        expected_version: Optional[int] = None,
    ) -> Reservation:
        """:meth:`confirm` as an awaitable."""
        args = _transition_args(id, expected_version)
        return await self._bridges.call(self._core.submit_confirm, Reservation._from_core, args)

    def release(self, id: ReservationId, *, expected_version: Optional[int] = None) -> Reservation:
        """held -> released: the units become available again."""
        args = _transition_args(id, expected_version)
        return Reservation._from_core(self._core.release(*args))

    async def release_async(
        self,
        id: ReservationId,
        *,
        expected_version: Optional[int] = None,
    ) -> Reservation:
        """:meth:`release` as an awaitable."""
        args = _transition_args(id, expected_version)
        return await self._bridges.call(self._core.submit_release, Reservation._from_core, args)

    def extend(
        self,
        id: ReservationId,
        *,
        ttl: TtlLike,
        expected_version: Optional[int] = None,
    ) -> Reservation:
        """Moves a live hold's expiry to now + ``ttl``."""
        args = _extend_args(id, ttl, expected_version)
        return Reservation._from_core(self._core.extend(*args))

    async def extend_async(
        self,
        id: ReservationId,
        *,
        ttl: TtlLike,
        expected_version: Optional[int] = None,
    ) -> Reservation:
        """:meth:`extend` as an awaitable."""
        args = _extend_args(id, ttl, expected_version)
        return await self._bridges.call(self._core.submit_extend, Reservation._from_core, args)

    def reservation(self, id: ReservationId) -> Reservation:
        """The reservation as committed (``NotFound`` if there is none)."""
        return Reservation._from_core(self._core.get_reservation(id=reservation_id_bytes(id)))

    get_reservation = reservation

    async def reservation_async(self, id: ReservationId) -> Reservation:
        """:meth:`reservation` as an awaitable."""
        return await _off_loop(functools.partial(self.reservation, id))

    get_reservation_async = reservation_async

    def expire_due(self, *, limit: int = 1000) -> int:
        """Expires up to ``limit`` holds past their expiry; returns how many."""
        limit = check_int("limit", limit)
        high = _core.OPTION_LIMITS["expire_limit"]
        if not 1 <= limit <= high:
            raise InvalidArgument(f"limit must be between 1 and {high}, got {limit}")
        return self._core.expire_due(limit=limit)

    async def expire_due_async(self, *, limit: int = 1000) -> int:
        """:meth:`expire_due` as an awaitable."""
        return await _off_loop(functools.partial(self.expire_due, limit=limit))

    def purge(self, older_than: TtlLike, *, limit: Optional[int] = None) -> int:
        """Deletes what is older than ``older_than`` and no longer needed; returns how many
        rows went (keys and reservations).

        Oldest first: each idempotency key made before the horizon goes together with its
        reservations, once every one of them is terminal (confirmed, released, expired)
        and last changed before the horizon; then terminal reservations without a key that
        last changed before it. So a key replays its reservations for at least
        ``older_than``, and a replay never finds them missing. Holds are never purged,
        whatever their age. ``limit`` (default: none) bounds the keys and keyless
        reservations one call takes (a key's reservations go with it). The work runs in
        statements of at most ``purge_batch`` rows (5000) that never lock a stock row
        and skip rows others hold. On PostgreSQL the horizon is on the database clock.
        ``retention=`` on :meth:`postgres` or :meth:`memory` purges in the background
        instead."""
        older_than_us = duration_us("older_than", older_than)
        if older_than_us < 0:
            raise InvalidArgument("older_than must not be negative")
        count = _UINT64_MAX if limit is None else check_int("limit", limit)
        if not 1 <= count <= _UINT64_MAX:
            raise InvalidArgument(f"limit must be at least 1, got {count}")
        return int(self._core.purge(older_than_us, count))

    async def purge_async(self, older_than: TtlLike, *, limit: Optional[int] = None) -> int:
        """:meth:`purge` as an awaitable."""
        return await _off_loop(functools.partial(self.purge, older_than, limit=limit))

    def row_counts(self) -> RowCounts:
        """Exact row counts: ``sku_count``, ``reservation_count`` and ``held_count``.

        On PostgreSQL this counts every row (``count(*)``: it costs time in proportion to
        the tables), so it is for tests and audits; :meth:`stats` reports cheap figures
        instead."""
        return cast(RowCounts, self._core.row_counts())

    def metrics(self) -> Metrics:
        """Raw figures of this process for exporters (``stockade.prometheus`` reads them):
        ``calls``, one entry per (operation, strategy) that saw a call, with its outcomes
        (``ok`` or an error code) and its latency histogram (per-bucket counts over
        ``latency_bounds_seconds``, the last bucket +Inf); and the batch size histogram.
        Fixed tables in memory: cheap, whatever the traffic. A batched or async call's
        latency runs from the call to its outcome, queueing included."""
        return cast(Metrics, self._core.metrics())

    async def row_counts_async(self) -> RowCounts:
        """:meth:`row_counts` as an awaitable."""
        return await _off_loop(self.row_counts)

    def stats(self, *, sku_limit: int = 20) -> EngineStats:
        """Counters per strategy, and the ``sku_limit`` hottest SKUs by requests.

        Its cost does not grow with the tables. ``sku_count``, ``reservation_count`` and
        ``held_count`` are exact on the memory store; on PostgreSQL
        (``counts_exact`` is False) the first two are the statistics collector's live-row
        estimates, and holds are counted up to 10,000 (more reads as 10,000). Use
        :meth:`row_counts` for exact figures."""
        sku_limit = check_int("sku_limit", sku_limit)
        if sku_limit < 0:
            raise InvalidArgument("sku_limit must not be negative")
        return cast(EngineStats, self._core.stats(sku_limit=sku_limit))

    async def stats_async(self, *, sku_limit: int = 20) -> EngineStats:
        """:meth:`stats` as an awaitable (on PostgreSQL it reads the database)."""
        return await _off_loop(functools.partial(self.stats, sku_limit=sku_limit))

    # --- advice ---

    def recommend(self, sku: str, *, location: str = DEFAULT_LOCATION) -> ClaimAdvice:
        """The strategy this SKU's measured contention points to, with the figures.

        Measured in this process: how many requests for the row arrived while another
        was in flight (the Claim Test's "odds", per row), and the peak in flight. This is
        what ``auto`` acts on. For a hot SKU it also says when hot-row slots
        (:meth:`set_slots`) would pay, and for a slotted SKU which slot this engine uses."""
        strategy, reasons = self._core.recommend(
            sku=check_str("sku", sku), location=check_str("location", location)
        )
        return ClaimAdvice(Strategy(strategy), tuple(reasons))


_T = TypeVar("_T")


async def _off_loop(call: Callable[[], _T]) -> _T:
    """Runs a blocking call on the running loop's default executor (a bounded thread
    pool), so that the event loop never waits on the network."""
    return await asyncio.get_running_loop().run_in_executor(None, call)


def _layer_options(
    batch_max: int,
    batch_shards: int,
    batch_lock_slice: TtlLike,
    batch_linger: TtlLike,
    async_workers: int,
    home_slot: Optional[int],
    slot_directory: int,
) -> Dict[str, int]:
    home = -1
    if home_slot is not None:
        home = check_int("home_slot", home_slot)
        if not 0 <= home < _core.OPTION_LIMITS["slots"]:
            raise InvalidArgument(
                f"home_slot must be None or between 0 and {_core.OPTION_LIMITS['slots'] - 1},"
                f" got {home}"
            )
    return {
        "batch_max": _positive("batch_max", batch_max),
        "batch_shards": _positive("batch_shards", batch_shards),
        "batch_lock_slice_ms": duration_ms("batch_lock_slice", batch_lock_slice),
        "batch_linger_us": duration_us("batch_linger", batch_linger),
        "async_workers": _positive("async_workers", async_workers),
        "home_slot": home,
        "slot_directory": _positive("slot_directory", slot_directory),
    }
