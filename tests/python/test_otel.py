"""OpenTelemetry spans (stockade.otel), read back with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from typing import Iterator, List

import pytest

import stockade
import stockade.tools.hooks
from public_api import (
    ENGINE_CALLS,
    FEED_CALLS,
    LIFECYCLE,
    World,
    arguments_of,
    invoke,
    ordered,
    public_calls,
)
from stockade.testing import race
from stockade.tools.pytest_plugin import PostgresForTests

pytest.importorskip("opentelemetry.sdk")
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

import stockade.otel


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


@pytest.fixture
def traced(engine: stockade.Engine, provider: TracerProvider) -> Iterator[stockade.Engine]:
    stockade.otel.instrument(engine, tracer_provider=provider)
    yield engine
    stockade.otel.uninstrument(engine)


def spans(exporter: InMemorySpanExporter, name: str) -> List[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_each_call_is_a_client_span_with_database_attributes(
    traced: stockade.Engine, exporter: InMemorySpanExporter, backend: str
) -> None:
    traced.restock("s", 1)
    r = traced.reserve("s", 1, strategy="atomic", idempotency_key="key-secret", buyer=None)
    traced.confirm(r.id)
    with pytest.raises(stockade.OutOfStock):
        traced.reserve("s", 1, strategy="pessimistic")
    (restock,) = spans(exporter, "restock")
    ok, refused = spans(exporter, "reserve")
    (confirm,) = spans(exporter, "confirm")
    system = "postgresql" if backend in ("postgres", "citus") else "stockade.memory"
    assert restock.kind == SpanKind.CLIENT
    assert restock.attributes is not None and ok.attributes is not None
    assert restock.attributes["db.system.name"] == system
    assert restock.attributes["db.operation.name"] == "restock"
    assert dict(ok.attributes) == {
        "db.system.name": system,
        "db.operation.name": "reserve",
        "stockade.strategy": "atomic",
        "stockade.sku": "s",
        "stockade.outcome": "ok",
    }
    assert ok.status.status_code == StatusCode.UNSET
    # The stock's answer is an outcome, not a fault: no ERROR status.
    assert refused.attributes is not None
    assert refused.attributes["stockade.outcome"] == "out_of_stock"
    assert refused.attributes["error.type"] == "out_of_stock"
    assert refused.attributes["stockade.strategy"] == "pessimistic"
    assert refused.status.status_code == StatusCode.UNSET
    assert confirm.attributes is not None and confirm.attributes["stockade.outcome"] == "ok"
    for span in exporter.get_finished_spans():
        assert "key-secret" not in str(span.attributes)


def test_spans_nest_under_the_callers_span_also_for_the_async_twins(
    traced: stockade.Engine, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    tracer = trace.get_tracer("test", tracer_provider=provider)
    traced.restock("s", 5)

    async def order() -> None:
        with tracer.start_as_current_span("checkout"):
            r = await traced.reserve_async("s", 2, strategy="batched")
            await traced.release_async(r.id)
            await traced.stock_async("s")

    asyncio.run(order())
    (checkout,) = spans(exporter, "checkout")
    children = [s for s in exporter.get_finished_spans() if s.parent is not None]
    assert {s.name for s in children} == {"reserve", "release", "stock"}
    assert checkout.context is not None
    assert all(s.parent.span_id == checkout.context.span_id for s in children)  # type: ignore[union-attr]
    (reserve,) = spans(exporter, "reserve")
    assert reserve.attributes is not None and reserve.attributes["stockade.outcome"] == "ok"


def test_batched_calls_carry_their_batch_size(
    traced: stockade.Engine, exporter: InMemorySpanExporter
) -> None:
    traced.restock("hot", 10_000)

    def buyer() -> None:
        for _ in range(20):
            traced.reserve("hot", 1, strategy="batched")

    out = race(16, lambda _: buyer())
    assert not any(out.errors), out.errors
    sizes = [
        s.attributes["db.operation.batch.size"]
        for s in spans(exporter, "reserve")
        if s.attributes is not None
    ]
    assert len(sizes) == 320 and all(1 <= n <= 16 for n in sizes)  # type: ignore[operator]
    assert max(sizes) > 1  # type: ignore[type-var]
    traced.reserve("hot", 1, strategy="atomic")
    last = spans(exporter, "reserve")[-1]
    assert last.attributes is not None and "db.operation.batch.size" not in last.attributes


def test_a_fault_sets_the_error_status_and_nothing_secret_is_recorded(
    stockade_postgres: PostgresForTests, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    name = stockade_postgres.new_database(migrated=False)
    try:
        dsn = stockade_postgres.dsn(name)
        with stockade.Engine.postgres(dsn) as eng:
            stockade.otel.instrument(eng, tracer_provider=provider)
            stockade.otel.instrument(eng, tracer_provider=provider)  # idempotent
            with pytest.raises(stockade.SchemaNotMigrated):
                eng.stock("x" * 200)
            (span,) = exporter.get_finished_spans()
            assert span.status.status_code == StatusCode.ERROR
            assert span.attributes is not None
            assert span.attributes["error.type"] == "schema_not_migrated"
            assert span.attributes["stockade.sku"] == "x" * stockade.otel.SKU_ATTRIBUTE_MAX
            assert dsn not in str(span.attributes) and name not in str(span.attributes)
            stockade.otel.uninstrument(eng)
            with pytest.raises(stockade.SchemaNotMigrated):
                eng.stock("x")
            assert len(exporter.get_finished_spans()) == 1  # no span once uninstrumented
    finally:
        stockade_postgres.drop_database(name)


def test_the_test_hooks_still_reach_the_compiled_engine(
    traced: stockade.Engine, exporter: InMemorySpanExporter
) -> None:
    traced.restock("s", 3)
    r = stockade.tools.hooks.naive_reserve(traced, "s", 1)
    assert traced.reservation(r.id).qty == 1
    with pytest.raises(stockade.InvalidType):
        stockade.otel.instrument("engine")  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["memory", "postgres"], indirect=True)
def test_every_public_call_of_the_engine_and_of_its_feeds_is_a_span(
    traced: stockade.Engine, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    # Goal: no call escapes tracing, a call added later included. Method: every public
    # method of Engine and Feed, found by introspection (public_api), called once; each
    # must finish at least one span. An error the store answers is a span too.
    world = World.made(traced)
    silent: List[str] = []
    targets = [(stockade.Feed, FEED_CALLS), (stockade.Engine, ENGINE_CALLS)]
    for cls, table in targets:
        for name in ordered(public_calls(cls)):
            target: object = world.feed if cls is stockade.Feed else traced
            if name in LIFECYCLE:  # each on an engine of its own, to close it
                target = stockade.Engine.memory()
                stockade.otel.instrument(target, tracer_provider=provider)  # type: ignore[arg-type]
            before = len(exporter.get_finished_spans())
            args, kwargs = arguments_of(name, table, world)
            try:
                invoke(target, name, args, kwargs)
            except stockade.StockadeError:
                pass
            if len(exporter.get_finished_spans()) == before:
                silent.append(f"{cls.__name__}.{name}")
    assert silent == []
    names = {s.name for s in exporter.get_finished_spans()}
    assert {"movements", "audit", "stats", "feed_poll", "feed_commit", "feed_drop"} <= names
