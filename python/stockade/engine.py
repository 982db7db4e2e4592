"""The public Engine: a typed, keyword-friendly facade over ``stockade._core.Engine``.

Python checks types and converts units (``timedelta`` to microseconds, ``uuid.UUID`` to
bytes); the C++ core checks values and does the work with the GIL released, so Python
threads run it in parallel.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import weakref
from datetime import datetime, timedelta, timezone
from typing import (
    Any,
    Callable,
    Concatenate,
    Coroutine,
    Dict,
    List,
    Mapping,
    Optional,
    ParamSpec,
    Tuple,
    TypeVar,
    Union,
)

from . import _core
from .claim import ClaimAdvice
from .errors import InvalidArgument, InvalidType
from .values import (
    Reservation,
    ReservationId,
    StockLevel,
    Strategy,
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
    strategy_name,
)

__all__ = ["Engine", "ManualClock"]

T = TypeVar("T")
P = ParamSpec("P")
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


def _positive(name: str, value: object) -> int:
    number = check_int(name, value)
    if number <= 0:
        raise InvalidArgument(f"{name} must be positive, got {number}")
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


# True while an async twin runs its sync method's argument handling: the method then
# queues its call and returns a future instead of calling the core and blocking. Set and
# reset around one synchronous stretch of one task, so it never leaks between calls.
_SUBMITTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "stockade_submitting", default=False)


class _AsyncBridge:
    """Completions of one event loop's async calls, delivered in bulk.

    The loop watches the channel's eventfd. C++ threads (batch flushers, async workers)
    post outcomes there without the GIL; one readable event drains all that have
    arrived, however many, and resolves their futures. No Python thread runs per call.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # The loop is not referenced from here: Engine._bridges holds the bridge for as
        # long as the loop lives, and a strong reference back would keep both forever.
        self.channel = _core.AsyncChannel()
        self.futures: Dict[int, Tuple[asyncio.Future[Any], Callable[[Any], Any]]] = {}
        self.next_token = 0
        loop.add_reader(self.channel.fd, self.drain)

    def submit(
        self, submit: Callable[..., None], convert: Callable[[Any], T], args: List[Any],
    ) -> asyncio.Future[T]:
        token = self.next_token
        self.next_token += 1
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.futures[token] = (future, convert)
        try:
            submit(self.channel, token, *args)
        except BaseException:
            del self.futures[token]
            raise
        return future

    def drain(self) -> None:
        for token, value, error in self.channel.drain():
            future, convert = self.futures.pop(token)
            if future.done():  # cancelled by its caller; the call itself still ran
                continue
            if error is not None:
                future.set_exception(error)
                continue
            try:
                future.set_result(convert(value))
            except Exception as exc:  # a failed conversion must not strand the others
                future.set_exception(exc)


def _awaitable(
    call: Callable[Concatenate[Engine, P], T],
) -> Callable[Concatenate[Engine, P], Coroutine[Any, Any, T]]:
    """Makes the awaitable twin of a blocking Engine method: same parameters, same checks,
    queued in C++ (the hot-row batcher, or a small pool of C++ workers) and completed
    through the event loop's channel."""

    async def run(self: Engine, /, *args: P.args, **kwargs: P.kwargs) -> T:
        mark = _SUBMITTING.set(True)
        try:
            future = call(self, *args, **kwargs)
        finally:
            _SUBMITTING.reset(mark)
        return await future  # type: ignore[misc, no-any-return]

    run.__name__ = f"{call.__name__}_async"
    run.__qualname__ = f"Engine.{run.__name__}"
    run.__doc__ = (
        f":meth:`Engine.{call.__name__}` as an awaitable. The call is queued in C++ and its "
        "outcome reaches the event loop in bulk. Cancelling the awaitable does not cancel "
        "the call: it may still commit (use an idempotency key to find out)."
    )
    return run


def _reservations(made: List[_core.Reservation]) -> List[Reservation]:
    return [Reservation._from_core(r) for r in made]


class Engine:
    """Reserves and sells stock without ever overselling.

    Make one with :meth:`Engine.memory` (embedded) or :meth:`Engine.postgres`. Every call
    takes ``location="default"``; calls that decide availability also take ``strategy=``
    (a :class:`Strategy` or its name), ``nowait=`` and ``lock_timeout=``.
    """

    def __init__(self, core: _core.Engine) -> None:
        if not isinstance(core, _core.Engine):
            raise InvalidType("use Engine.memory() or Engine.postgres() to make an engine")
        self._core = core
        self._bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncBridge] = (
            weakref.WeakKeyDictionary())
        self._bridges_lock = threading.Lock()

    # --- construction ---

    @classmethod
    def memory(
        cls,
        *,
        strategy: Union[Strategy, str] = Strategy.AUTO,
        clock: Optional[ManualClock] = None,
        retries_max: int = 5,
        lock_timeout: TtlLike = timedelta(seconds=10),
        default_ttl: TtlLike = timedelta(minutes=15),
        batch_max: int = 4096,
        batch_shards: int = 4,
        async_workers: int = 8,
    ) -> Engine:
        """An engine over the embedded in-process store: real semantics, no durability.

        ``batch_max`` bounds the requests one batch carries, ``batch_shards`` is the number
        of flusher threads of the hot-row layer, and ``async_workers`` the number of C++
        threads that run async calls which do not batch."""
        if clock is not None and not isinstance(clock, ManualClock):
            raise InvalidType(f"clock must be a ManualClock, not {type(clock).__name__}")
        core = _core.Engine.memory(
            strategy=strategy_name(strategy) or Strategy.AUTO.value,
            retries_max=check_int("retries_max", retries_max),
            lock_timeout_ms=duration_ms("lock_timeout", lock_timeout),
            default_ttl_us=duration_us("default_ttl", default_ttl),
            clock=clock._core if clock is not None else None,
            **_layer_options(batch_max, batch_shards, async_workers),
        )
        return cls(core)

    @classmethod
    def postgres(
        cls,
        dsn: str,
        *,
        pool_size: int = 8,
        strategy: Union[Strategy, str] = Strategy.AUTO,
        schema: str = "stockade",
        retries_max: int = 5,
        lock_timeout: TtlLike = timedelta(seconds=10),
        default_ttl: TtlLike = timedelta(minutes=15),
        pool_timeout: TtlLike = timedelta(seconds=5),
        sweeper: bool = False,
        sweep_interval: TtlLike = timedelta(seconds=1),
        sweep_batch: int = 1000,
        batch_max: int = 4096,
        batch_shards: int = 4,
        async_workers: int = 8,
    ) -> Engine:
        """An engine over PostgreSQL: the durable store.

        ``dsn`` is a libpq connection string or URI. The engine connects at once
        (``Unavailable`` if it cannot) and keeps at most ``pool_size`` connections; a call
        that waits longer than ``pool_timeout`` for one raises ``Overloaded``. Call
        :meth:`migrate` once to create the schema. With ``sweeper=True`` a background
        thread expires due holds every ``sweep_interval``, ``sweep_batch`` per transaction;
        of all engines on one database, one sweeps at a time. ``batch_max``,
        ``batch_shards`` and ``async_workers`` are as for :meth:`memory`; each batch
        flusher holds one pooled connection while it applies a batch.
        """
        core = _core.Engine.postgres(
            dsn=check_str("dsn", dsn),
            schema=check_str("schema", schema),
            pool_size=_positive("pool_size", pool_size),
            pool_timeout_ms=duration_ms("pool_timeout", pool_timeout),
            sweeper=check_bool("sweeper", sweeper),
            sweep_interval_ms=duration_ms("sweep_interval", sweep_interval),
            sweep_batch=_positive("sweep_batch", sweep_batch),
            strategy=strategy_name(strategy) or Strategy.AUTO.value,
            retries_max=check_int("retries_max", retries_max),
            lock_timeout_ms=duration_ms("lock_timeout", lock_timeout),
            default_ttl_us=duration_us("default_ttl", default_ttl),
            **_layer_options(batch_max, batch_shards, async_workers),
        )
        return cls(core)

    # --- properties and lifecycle ---

    @property
    def backend(self) -> str:
        """``"memory"`` or ``"postgres"``."""
        return self._core.backend

    @property
    def strategy(self) -> Strategy:
        """The default strategy of this engine."""
        return Strategy(self._core.default_strategy)

    def migrate(self) -> List[str]:
        """Creates or upgrades the schema; returns the names of the migrations applied.

        Idempotent, and safe when several processes run it at once. The memory store has
        no schema, so there it applies nothing."""
        return self._core.migrate()

    def close(self) -> None:
        """Completes every queued request (batched or async), then stops the batch
        flushers, the async workers, the sweeper and the database connections.

        Later batched and async calls raise ``InvalidState``, and on PostgreSQL every call
        does; the memory store stays usable for synchronous per-request calls. Closing
        twice is harmless. Completions of async calls still reach their event loops."""
        self._core.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<stockade.Engine backend={self.backend} strategy={self.strategy.value}>"

    # --- stock ---

    def restock(
        self, sku: str, qty: int, *, location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
    ) -> StockLevel:
        """Adds ``qty`` units to on_hand, creating the row if it does not exist."""
        return StockLevel._from_core(self._core.restock(
            sku=check_str("sku", sku), location=check_str("location", location),
            qty=check_int("qty", qty),
            expected_version=check_optional_int("expected_version", expected_version),
        ))

    def set_on_hand(
        self, sku: str, on_hand: int, *, location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
    ) -> StockLevel:
        """Sets on_hand (a stock count); never below what is reserved (``InvalidState``)."""
        return StockLevel._from_core(self._core.set_on_hand(
            sku=check_str("sku", sku), location=check_str("location", location),
            on_hand=check_int("on_hand", on_hand),
            expected_version=check_optional_int("expected_version", expected_version),
        ))

    def stock(self, sku: str, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """The committed stock row (``NotFound`` if there is none)."""
        return StockLevel._from_core(self._core.stock(
            sku=check_str("sku", sku), location=check_str("location", location)))

    def sell(
        self, sku: str, qty: int, *, location: str = DEFAULT_LOCATION,
        strategy: Union[Strategy, str, None] = None, expected_version: Optional[int] = None,
        nowait: bool = False, lock_timeout: Optional[TtlLike] = None,
    ) -> StockLevel:
        """Sells ``qty`` units at once (no hold): on_hand falls if enough is available."""
        return self._call(
            "sell", StockLevel._from_core,
            sku=check_str("sku", sku), location=check_str("location", location),
            qty=check_int("qty", qty), strategy=strategy_name(strategy),
            nowait=check_bool("nowait", nowait),
            lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
            expected_version=check_optional_int("expected_version", expected_version),
        )

    # --- reservations ---

    def reserve(
        self, sku: str, qty: int, *, ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None, location: str = DEFAULT_LOCATION,
        strategy: Union[Strategy, str, None] = None, expected_version: Optional[int] = None,
        nowait: bool = False, lock_timeout: Optional[TtlLike] = None,
    ) -> Reservation:
        """Holds ``qty`` units for ``ttl`` (default: the engine's ``default_ttl``).

        Raises ``OutOfStock`` if fewer are available. With an ``idempotency_key``, the same
        request returns the same reservation; a different one raises ``IdempotencyConflict``.
        On PostgreSQL, a connection lost during COMMIT raises ``InDoubt``: retry with the
        same ``idempotency_key`` to get the reservation if it committed, or make it if not.
        """
        return self._call(
            "reserve", Reservation._from_core,
            sku=check_str("sku", sku), location=check_str("location", location),
            qty=check_int("qty", qty), ttl_us=optional_duration_us("ttl", ttl),
            idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            strategy=strategy_name(strategy), nowait=check_bool("nowait", nowait),
            lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
            expected_version=check_optional_int("expected_version", expected_version),
        )

    def reserve_order(
        self, items: Mapping[OrderKey, int], *, ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None, location: str = DEFAULT_LOCATION,
        strategy: Union[Strategy, str, None] = None, nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
    ) -> List[Reservation]:
        """Holds every line or none: ``{sku: qty}`` (or ``{(sku, location): qty}``).

        Rows are locked in sorted (sku, location) order, so concurrent orders cannot
        deadlock. Returns one reservation per line, in the order of ``items``.
        """
        lines = _order_lines(items, check_str("location", location))
        return self._call(
            "reserve_order", _reservations,
            lines=lines, ttl_us=optional_duration_us("ttl", ttl),
            idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            strategy=strategy_name(strategy), nowait=check_bool("nowait", nowait),
            lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
        )

    def confirm(self, id: ReservationId, *, expected_version: Optional[int] = None) -> Reservation:
        """held -> confirmed: the units leave on_hand. ``ReservationExpired`` past expiry."""
        return self._call(
            "confirm", Reservation._from_core, id=reservation_id_bytes(id),
            expected_version=check_optional_int("expected_version", expected_version))

    def release(self, id: ReservationId, *, expected_version: Optional[int] = None) -> Reservation:
        """held -> released: the units become available again."""
        return self._call(
            "release", Reservation._from_core, id=reservation_id_bytes(id),
            expected_version=check_optional_int("expected_version", expected_version))

    def extend(
        self, id: ReservationId, *, ttl: TtlLike, expected_version: Optional[int] = None,
    ) -> Reservation:
        """Moves a live hold's expiry to now + ``ttl``."""
        return self._call(
            "extend", Reservation._from_core, id=reservation_id_bytes(id),
            ttl_us=duration_us("ttl", ttl),
            expected_version=check_optional_int("expected_version", expected_version))

    def reservation(self, id: ReservationId) -> Reservation:
        """The reservation as committed (``NotFound`` if there is none)."""
        return Reservation._from_core(self._core.get_reservation(id=reservation_id_bytes(id)))

    get_reservation = reservation

    def expire_due(self, *, limit: int = 1000) -> int:
        """Expires up to ``limit`` holds past their expiry; returns how many."""
        limit = check_int("limit", limit)
        if limit <= 0:
            raise InvalidArgument(f"limit must be positive, got {limit}")
        return self._core.expire_due(limit=limit)

    def stats(self, *, sku_limit: int = 20) -> Dict[str, Any]:
        """Counters per strategy, and the ``sku_limit`` hottest SKUs by requests."""
        sku_limit = check_int("sku_limit", sku_limit)
        if sku_limit < 0:
            raise InvalidArgument("sku_limit must not be negative")
        return self._core.stats(sku_limit=sku_limit)

    # --- advice ---

    def recommend(self, sku: str, *, location: str = DEFAULT_LOCATION) -> ClaimAdvice:
        """The strategy this SKU's measured contention points to, with the figures.

        Measured in this process: how many requests for the row arrived while another
        was in flight (the Claim Test's "odds", per row), and the peak in flight. This is
        what ``auto`` acts on."""
        strategy, reasons = self._core.recommend(
            sku=check_str("sku", sku), location=check_str("location", location))
        return ClaimAdvice(Strategy(strategy), tuple(reasons))

    # --- asyncio ---

    def _call(self, name: str, convert: Callable[[Any], T], **kwargs: Any) -> T:
        """Runs core method ``name`` and converts its result; inside an async twin,
        queues ``submit_<name>`` instead and returns the future (see _SUBMITTING).

        Arguments are named here and passed by position to the core, in the order of its
        signature (_core_order): pybind11 parses keywords several microseconds slower."""
        args = [kwargs[p] for p in _core_order(name)]
        if _SUBMITTING.get():
            bridge = self._bridge(asyncio.get_running_loop())
            return bridge.submit(  # type: ignore[return-value]
                getattr(self._core, "submit_" + name), convert, args)
        return convert(getattr(self._core, name)(*args))

    def _bridge(self, loop: asyncio.AbstractEventLoop) -> _AsyncBridge:
        with self._bridges_lock:
            bridge = self._bridges.get(loop)
            if bridge is None:
                bridge = self._bridges[loop] = _AsyncBridge(loop)
            return bridge

    reserve_async = _awaitable(reserve)
    reserve_order_async = _awaitable(reserve_order)
    sell_async = _awaitable(sell)
    confirm_async = _awaitable(confirm)
    release_async = _awaitable(release)
    extend_async = _awaitable(extend)


@functools.lru_cache(maxsize=None)
def _core_order(name: str) -> Tuple[str, ...]:
    """The parameter names of core method ``name`` in order, read once from the signature
    pybind11 writes at the top of its docstring (``name(self: ..., sku: str, ...) -> ...``).
    The submit_ twins take (channel, token) and then the same parameters."""
    doc = getattr(_core.Engine, name).__doc__ or ""
    names: List[str] = []
    depth, start = 0, doc.index("(") + 1
    for i in range(start, len(doc)):
        char = doc[i]
        if char in "[(":
            depth += 1
        elif char in "])" and depth > 0:
            depth -= 1
        elif char in ",)" and depth == 0:  # a parameter ends (")" ends the list)
            names.append(doc[start:i].split(":")[0].strip())
            start = i + 1
            if char == ")":
                break
    return tuple(names[1:])  # without self


def _layer_options(batch_max: int, batch_shards: int, async_workers: int) -> Dict[str, int]:
    return {
        "batch_max": _positive("batch_max", batch_max),
        "batch_shards": _positive("batch_shards", batch_shards),
        "async_workers": _positive("async_workers", async_workers),
    }
