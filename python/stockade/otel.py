"""OpenTelemetry spans, one per engine call: ``pip install 'stockade[otel]'``.

The extra installs the OpenTelemetry API only, as a library's should: the application
picks the SDK. Spans are recorded once it installs ``opentelemetry-sdk`` (and an exporter,
such as ``opentelemetry-exporter-otlp``) and sets a TracerProvider; with the API alone
every span is a no-op that costs little.

    import stockade.otel

    stockade.otel.instrument(engine)               # the global TracerProvider
    stockade.otel.instrument(engine, tracer_provider=provider)
    stockade.otel.uninstrument(engine)

Each call of an instrumented engine (blocking, or its ``*_async`` twin) and of its feeds is
a span of kind CLIENT named after the core's operation (``reserve``, ``confirm``,
``stock``, ``movements``, ``audit``, ``stats``; ``set_discontinued`` for discontinue and
reinstate, ``get_reservation``, ``feed_open``, ``feed_commit``, ``feed_drop``; a
``Feed.poll`` is a ``feed_poll`` span per look and a ``feed_wait`` span per wait between
them), a child of the caller's current span, with OpenTelemetry's database attributes:

- ``db.system.name``: ``postgresql``, or ``stockade.memory`` for the memory store;
- ``db.operation.name``: the operation;
- ``db.operation.batch.size``: for a blocking call that ran through the hot-row batcher,
  the number of requests in its batch (the ``*_async`` twins do not report it);
- ``stockade.strategy``: the strategy asked for (the engine's default if none);
- ``stockade.sku``: the SKU, cut to 64 characters (``stockade.sku_count`` for an order);
- ``stockade.outcome``: ``ok`` or the error code; a failure also sets ``error.type`` to
  the code. The span's status is ERROR only for faults (an error whose ``http_status`` is
  5xx: InDoubt, Unavailable, Overloaded, ...), not for the stock's answers (OutOfStock,
  VersionConflict, ...).

Never the DSN, a password, an idempotency key or a buyer. An engine that is not
instrumented runs no tracing code at all, and without the extra installed this module is
the only one that imports OpenTelemetry.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

try:
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("stockade.otel needs opentelemetry-api: pip install 'stockade[otel]'") from e

from . import _core
from .engine import Engine
from .errors import InvalidType, StockadeError

__all__ = ["instrument", "uninstrument"]

SKU_ATTRIBUTE_MAX = 64
T = TypeVar("T")

# The core's calls that are not spans of their own: the queued ones (submit_*), whose span
# the bridges make (it ends when the outcome reaches the event loop).
_QUEUED_PREFIX = "submit_"


def _operations() -> Tuple[str, ...]:
    """Every call of the compiled engine, each a span: its public methods, found on the
    class, so that a call added to the core is traced without a list to keep (properties
    and the constructors are not calls of an engine)."""
    kind = _core.Engine
    return tuple(
        name
        for name in dir(kind)
        if not name.startswith(("_", _QUEUED_PREFIX))
        and callable(getattr(kind, name))
        and not isinstance(inspect.getattr_static(kind, name), (staticmethod, property))
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stockade")
    except PackageNotFoundError:  # pragma: no cover - a source tree without metadata
        return "0"


class _Spans:
    """Starts and ends the spans of one engine's calls."""

    def __init__(self, engine: Engine, tracer: Tracer) -> None:
        self.tracer = tracer
        self.system = "postgresql" if engine.backend == "postgres" else "stockade.memory"
        self.default_strategy = engine.strategy.value

    def attributes(self, op: str, arguments: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {"db.system.name": self.system, "db.operation.name": op}
        strategy = arguments.get("strategy")
        if op in ("reserve", "reserve_order", "sell"):
            out["stockade.strategy"] = strategy or self.default_strategy
        sku = arguments.get("sku")
        if isinstance(sku, str):
            out["stockade.sku"] = sku[:SKU_ATTRIBUTE_MAX]
        lines = arguments.get("lines")
        if isinstance(lines, list):
            out["stockade.sku_count"] = len(lines)
        return out

    def finish(self, span: Any, error: Optional[BaseException], batch_size: int = 0) -> None:
        """Records the outcome (one set_attributes call: each takes the span's lock) and
        ends the span."""
        if not span.is_recording():  # sampled out: nothing to record
            span.end()
            return
        attributes: Dict[str, Any] = {"stockade.outcome": "ok"}
        if batch_size:
            attributes["db.operation.batch.size"] = batch_size
        if error is not None:
            code = error.code if isinstance(error, StockadeError) else type(error).__name__
            attributes["stockade.outcome"] = attributes["error.type"] = code
            if not isinstance(error, StockadeError) or error.http_status >= 500:
                span.set_status(Status(StatusCode.ERROR, code))
        span.set_attributes(attributes)
        span.end()

    def start(self, op: str, arguments: Dict[str, Any]) -> Tuple[Any, object]:
        """A span made current: (span, the token that detaches it). start_span and attach
        by hand cost less than start_as_current_span's context manager."""
        span = self.tracer.start_span(
            op, kind=SpanKind.CLIENT, attributes=self.attributes(op, arguments)
        )
        return span, context.attach(trace.set_span_in_context(span))

    def blocking(self, op: str, call: Callable[..., T]) -> Callable[..., T]:
        take_last_batch_size = _core.take_last_batch_size

        def traced(*args: Any, **arguments: Any) -> T:
            span, token = self.start(op, arguments)
            take_last_batch_size()
            error: Optional[BaseException] = None
            try:
                return call(*args, **arguments)
            except BaseException as e:
                error = e
                raise
            finally:
                context.detach(token)  # type: ignore[arg-type]
                self.finish(span, error, take_last_batch_size())

        return traced


class _TracedCore:
    """The engine's core with its operations wrapped in spans; everything else is the
    core's own attribute."""

    def __init__(self, core: Any, spans: _Spans) -> None:
        self.__wrapped__ = core  # Engine._native() unwraps it for the C++ test hooks
        for name in _operations():  # made once: the calls find them as attributes
            setattr(self, name, spans.blocking(name, getattr(core, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__wrapped__, name)


class _TracedBridges:
    """The engine's asyncio bridges with each queued call (submit_*) in a span that ends
    when its outcome reaches the event loop."""

    def __init__(self, bridges: Any, spans: _Spans) -> None:
        self._stockade_bridges = bridges
        self._stockade_spans = spans

    async def call(
        self, submit: Callable[..., None], convert: Callable[[Any], T], /, **arguments: Any
    ) -> T:
        spans = self._stockade_spans
        op = getattr(submit, "__name__", "call").removeprefix("submit_")
        span, token = spans.start(op, arguments)
        error: Optional[BaseException] = None
        try:
            result: T = await self._stockade_bridges.call(submit, convert, **arguments)
            return result
        except BaseException as e:
            error = e
            raise
        finally:
            context.detach(token)  # type: ignore[arg-type]
            spans.finish(span, error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stockade_bridges, name)


def instrument(engine: Engine, *, tracer_provider: Optional[TracerProvider] = None) -> None:
    """Makes every call of ``engine`` a span (see the module). Idempotent."""
    if not isinstance(engine, Engine):
        raise InvalidType(f"engine must be a stockade.Engine, not {type(engine).__name__}")
    if isinstance(engine._core, _TracedCore):
        return
    tracer = trace.get_tracer("stockade", _version(), tracer_provider=tracer_provider)
    spans = _Spans(engine, tracer)
    engine._core = _TracedCore(engine._core, spans)  # type: ignore[assignment]
    engine._bridges = _TracedBridges(engine._bridges, spans)  # type: ignore[assignment]


def uninstrument(engine: Engine) -> None:
    """Stops making spans of ``engine``'s calls. Idempotent."""
    if not isinstance(engine, Engine):
        raise InvalidType(f"engine must be a stockade.Engine, not {type(engine).__name__}")
    core = engine._core
    if isinstance(core, _TracedCore):
        engine._core = core.__wrapped__
    bridges = engine._bridges
    if isinstance(bridges, _TracedBridges):
        engine._bridges = bridges._stockade_bridges
