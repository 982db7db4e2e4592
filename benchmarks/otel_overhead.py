"""Benchmark: what stockade.otel's spans cost on the hot path, side by side in one run.

One hot SKU, on the memory store (where the engine, not a disk, sets the pace, so a
span's cost shows in full) and on a throwaway PostgreSQL, driven from Python: --threads
blocking callers of reserve(batched), then --tasks asyncio tasks awaiting
reserve_async(batched). Each driver runs four ways:

  off   the engine not instrumented (no tracing code runs at all);
  noop  instrumented, with OpenTelemetry's API and no SDK (its no-op tracer);
  sdk   instrumented, with the SDK, a BatchSpanProcessor and an exporter that drops
        every span (the cost of making and ending real spans, not of shipping them);
  1%    the same SDK sampling 1% of traces (ParentBased(TraceIdRatioBased(0.01))), as a
        service with a hot path would.

Prints calls/s and each ratio to "off". The machines are shared and noisy: compare the
ratios of one run.

    python benchmarks/otel_overhead.py --seconds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from typing import Callable, Dict, Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import NoOpTracerProvider

import stockade
import stockade.otel
from stockade.tools.pgserver import TemporaryPostgres


class Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def threads(eng: stockade.Engine, n: int, seconds: float) -> float:
    stop = time.monotonic() + seconds
    counts = [0] * n

    def run(i: int) -> None:
        while time.monotonic() < stop:
            eng.reserve("hot", 1, strategy="batched")
            counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / seconds


def tasks(eng: stockade.Engine, n: int, seconds: float) -> float:
    async def main() -> int:
        stop = time.monotonic() + seconds
        done = 0

        async def run() -> None:
            nonlocal done
            while time.monotonic() < stop:
                await eng.reserve_async("hot", 1, strategy="batched")
                done += 1

        await asyncio.gather(*(run() for _ in range(n)))
        return done

    return asyncio.run(main()) / seconds


def measure(
    open_engine: Callable[[], stockade.Engine],
    drive: Callable[[stockade.Engine, int, float], float],
    n: int,
    seconds: float,
    provider: Optional[object],
) -> float:
    with open_engine() as eng:
        eng.restock("hot", 10**12)
        if provider is not None:
            stockade.otel.instrument(eng, tracer_provider=provider)  # type: ignore[arg-type]
        drive(eng, n, min(seconds, 0.3))  # warm up
        return drive(eng, n, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    sdk = TracerProvider()
    sdk.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    sampled = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    sampled.add_span_processor(BatchSpanProcessor(Drop(), max_queue_size=65536))
    providers: Dict[str, Optional[object]] = {
        "off": None,
        "noop": NoOpTracerProvider(),
        "sdk": sdk,
        "1%": sampled,
    }
    figures: Dict[str, Dict[str, float]] = {}
    print(f"stockade.otel overhead: one hot SKU, {args.seconds} s per case")
    with TemporaryPostgres() as server:
        dsn = server.create_database("bench")
        with stockade.Engine.postgres(dsn, pool_size=1) as eng:
            eng.migrate()
        stores: Dict[str, Callable[[], stockade.Engine]] = {
            "memory": stockade.Engine.memory,
            "postgres (fsync on)": lambda: stockade.Engine.postgres(dsn, pool_size=8),
        }
        for store, open_engine in stores.items():
            for label, drive, n in [
                (f"{args.threads} threads, reserve(batched)", threads, args.threads),
                (f"{args.tasks} asyncio tasks, reserve_async(batched)", tasks, args.tasks),
            ]:
                rates = {
                    name: measure(open_engine, drive, n, args.seconds, p)
                    for name, p in providers.items()
                }
                figures[f"{store}: {label}"] = rates
                print(f"  {store}, {label}:")
                for name, rate in rates.items():
                    ratio = rate / rates["off"]
                    print(f"    {name:>4}: {rate:>10,.0f} calls/s  ({ratio:.2f}x off)")
    sdk.shutdown()
    sampled.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
