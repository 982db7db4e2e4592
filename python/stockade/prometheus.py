"""Prometheus metrics for an engine: ``pip install stockade[prometheus]``.

    from prometheus_client import REGISTRY, start_http_server
    from stockade.prometheus import StockadeCollector

    StockadeCollector(engine).register(REGISTRY)
    start_http_server(9100)

Everything is read at scrape time from the engine's telemetry (``Engine.metrics()`` and
``Engine.stats()``), the one place stockade keeps its figures; nothing is counted twice.
Figures are per process: sum them over replicas in your queries. Under a pre-fork server
(gunicorn with several workers), where each scrape reaches one worker, set
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory the workers share, emptied at each
service start) and each scrape answers for every worker of the service::

    collector = StockadeCollector(engine)  # in each worker, once, after its engine
    registry = CollectorRegistry()         # once; serve generate_latest(registry)
    collector.register(registry)
    ...
    collector.close()                      # before the engine closes

    # gunicorn.conf.py: keep the directory to one file per live worker
    def child_exit(server, worker):
        stockade.prometheus.mark_process_dead(worker.pid)

Each worker then writes its figures to that directory every ``publish_interval`` seconds
(and at each scrape it answers); counters and histograms are summed over every worker that
ever ran, so totals never go down, and gauges over the live ones (``stockade_rows`` and
``stockade_sweeper_leader``: the largest; ``stockade_up``: the smallest). Figures of other
workers are at most ``publish_interval`` old. Names start with
``stockade_``; counters end in ``_total`` and durations are in seconds. Label values are
bounded: operations, strategies and error codes are fixed lists, and SKUs appear only in
the ``stockade_hot_sku_*`` gauges, for the ``hottest_skus`` SKUs with the most requests.

A scrape of a PostgreSQL engine reads the database once (``stats()``: statistics
estimates, no ``count(*)``). If that fails, ``stockade_up`` is 0 and the figures kept in
memory are still exported.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import (
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector, CollectorRegistry
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "stockade.prometheus needs prometheus_client: pip install 'stockade[prometheus]'"
    ) from e

from . import _prom_files
from .engine import Engine
from .errors import InvalidArgument, InvalidType, StockadeError
from .stats import EngineStats, Metrics

__all__ = ["StockadeCollector", "mark_process_dead"]

PathLike = Union[str, "os.PathLike[str]"]


def _multiprocess_dir(given: Optional[PathLike]) -> Optional[Path]:
    value = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "") if given is None else os.fspath(given)
    if not value:
        return None
    directory = Path(value)
    if not directory.is_dir():
        raise InvalidArgument(
            "the multiprocess directory (PROMETHEUS_MULTIPROC_DIR) must be an existing "
            "directory the workers share"
        )
    return directory


def mark_process_dead(pid: int, multiprocess_dir: Optional[PathLike] = None) -> None:
    """Folds a dead worker's counters and histograms into the directory's archive and
    removes its file: call it from gunicorn's ``child_exit`` hook. ``multiprocess_dir``
    defaults to ``PROMETHEUS_MULTIPROC_DIR``; without either it does nothing."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise InvalidType("pid must be an int")
    directory = _multiprocess_dir(multiprocess_dir)
    if directory is not None:
        _prom_files.mark_process_dead(pid, directory)


_STRATEGY_FIGURES = [
    ("conflicts", "stockade_cas_conflicts_total", "compare-and-set attempts that lost a race"),
    ("retries", "stockade_retries_total", "optimistic retries after a version conflict"),
    ("lock_waits", "stockade_lock_waits_total", "lock acquisitions that had to wait"),
    ("lock_timeouts", "stockade_lock_timeouts_total", "lock waits that ran past lock_timeout"),
    (
        "lock_not_available",
        "stockade_lock_not_available_total",
        "NOWAIT attempts that found the lock taken",
    ),
]


def _buckets(bounds: Sequence[float], counts: Sequence[int]) -> List[Tuple[str, float]]:
    """Per-bucket counts (the last is +Inf) as Prometheus's cumulative buckets."""
    out: List[Tuple[str, float]] = []
    total = 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        total += count
        out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(total)))
    return out


class StockadeCollector(Collector):
    """Exports one engine's figures. ``engine_label`` (optional) is added to every series
    as ``engine="..."``, for a process with several engines.

    ``multiprocess_dir`` (default: ``PROMETHEUS_MULTIPROC_DIR``; ``""`` for none) makes a
    scrape answer for every process of a pre-fork service, as the module says; the
    collector then writes this process's figures there every ``publish_interval``
    seconds, from a thread of its own, until :meth:`close`."""

    def __init__(
        self,
        engine: Engine,
        *,
        hottest_skus: int = 10,
        engine_label: Optional[str] = None,
        multiprocess_dir: Optional[PathLike] = None,
        publish_interval: float = 2.0,
    ) -> None:
        if not isinstance(engine, Engine):
            raise InvalidType(f"engine must be a stockade.Engine, not {type(engine).__name__}")
        if isinstance(hottest_skus, bool) or not isinstance(hottest_skus, int):
            raise InvalidType("hottest_skus must be an int")
        if not 0 <= hottest_skus <= 100:
            raise InvalidArgument(f"hottest_skus must be between 0 and 100, got {hottest_skus}")
        if engine_label is not None and not isinstance(engine_label, str):
            raise InvalidType("engine_label must be a str")
        if isinstance(publish_interval, bool) or not isinstance(publish_interval, (int, float)):
            raise InvalidType("publish_interval must be a number of seconds")
        if not 0.05 <= publish_interval <= 3600:
            raise InvalidArgument("publish_interval must be between 0.05 and 3600 seconds")
        self._engine = engine
        self._hottest = hottest_skus
        self._extra: Dict[str, str] = {} if engine_label is None else {"engine": engine_label}
        self._directory = _multiprocess_dir(multiprocess_dir)
        self._stop = threading.Event()
        self._writing = threading.Lock()  # the publisher and a scrape write one file
        self._publisher: Optional[threading.Thread] = None
        if self._directory is not None:
            self._file = _prom_files.new_path(self._directory)
            self._publish()
            self._publisher = threading.Thread(
                target=self._publish_every,
                args=(float(publish_interval),),
                name="stockade-metrics-publisher",
                daemon=True,
            )
            self._publisher.start()

    def close(self) -> None:
        """Stops publishing, after writing this process's figures one last time (so that
        none of its counts is lost to the service's totals). Idempotent."""
        if self._publisher is None or self._stop.is_set():
            return
        self._stop.set()
        self._publisher.join()
        self._publish(gauges=False)

    def __enter__(self) -> StockadeCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _publish(self, gauges: bool = True) -> None:
        with self._writing:
            _prom_files.write(self._file, self._collect_local(), gauges=gauges)

    def _publish_every(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self._publish()
            except (OSError, StockadeError):
                continue  # the next round tries again; a scrape publishes too

    def register(self, registry: CollectorRegistry) -> StockadeCollector:
        """Registers with ``registry``; returns self."""
        registry.register(self)
        return self

    def describe(self) -> Iterable[Metric]:
        return []  # collected at scrape time; nothing to check at registration

    # --- collection ---

    def _counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        return CounterMetricFamily(
            name[: -len("_total")], doc, labels=list(self._extra) + list(labels)
        )

    def _gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=list(self._extra) + list(labels))

    def _values(self, *values: str) -> List[str]:
        return list(self._extra.values()) + list(values)

    def collect(self) -> Iterator[Metric]:
        if self._directory is None:
            yield from self._collect_local()
            return
        if not self._stop.is_set():
            self._publish()
        yield from _prom_files.merged(self._directory)

    def _collect_local(self) -> Iterator[Metric]:
        stats: Optional[EngineStats]
        try:
            stats = self._engine.stats(sku_limit=self._hottest)
        except StockadeError:
            stats = None
        # The figures in memory, read from the compiled engine itself: a closed engine's
        # calls raise Unavailable, and its last figures still export.
        metrics = cast(Metrics, self._engine._native().metrics())
        up = self._gauge("stockade_up", "1 if the last scrape could read the engine's stats")
        up.add_metric(self._values(), 1.0 if stats is not None else 0.0)
        yield up
        audit = self._gauge(
            "stockade_audit_violations",
            "violations the engine's last audit() found (-1: none ran; docs/journal.md)",
        )
        audit.add_metric(self._values(), float(self._engine._core.last_audit_violations))
        yield audit
        yield from self._calls(metrics)
        yield from self._batches(metrics)
        if stats is not None:
            yield from self._strategies(stats)
            yield from self._pool(stats)
            yield from self._sweeper(stats)
            yield from self._slots(stats)
            yield from self._rows(stats)
            yield from self._hot_skus(stats)

    def _calls(self, m: Metrics) -> Iterator[Metric]:
        calls = self._counter(
            "stockade_calls_total",
            "calls that reached the store, by operation, strategy (none: it takes none) and "
            "outcome (ok, or the error code)",
            ["op", "strategy", "outcome"],
        )
        latency = HistogramMetricFamily(
            "stockade_call_duration_seconds",
            "latency of calls, by operation and strategy (batched and async calls: from the "
            "call to its outcome)",
            labels=[*self._extra, "op", "strategy"],
        )
        bounds = m["latency_bounds_seconds"]
        for series in m["calls"]:
            strategy = series["strategy"] or "none"
            for outcome, count in series["outcomes"].items():
                calls.add_metric(self._values(series["op"], strategy, outcome), float(count))
            latency.add_metric(
                self._values(series["op"], strategy),
                _buckets(bounds, series["latency_buckets"]),
                float(series["latency_sum_seconds"]),
            )
        yield calls
        yield latency

    def _batches(self, m: Metrics) -> Iterator[Metric]:
        sizes = HistogramMetricFamily(
            "stockade_batch_size",
            "requests per batch of the hot-row layer",
            labels=list(self._extra),
        )
        sizes.add_metric(
            self._values(),
            _buckets(m["batch_size_bounds"], m["batch_size_buckets"]),
            float(m["batch_size_sum"]),
        )
        yield sizes

    def _strategies(self, stats: EngineStats) -> Iterator[Metric]:
        for key, name, doc in _STRATEGY_FIGURES:
            family = self._counter(name, doc, ["strategy"])
            for strategy, figures in stats["strategies"].items():
                counts = cast(Mapping[str, int], figures)
                family.add_metric(self._values(strategy), float(counts[key]))
            yield family
        waited = self._counter(
            "stockade_lock_wait_seconds_total", "time spent waiting for locks", ["strategy"]
        )
        for strategy, figures in stats["strategies"].items():
            waited.add_metric(self._values(strategy), figures["lock_wait_us"] / 1e6)
        yield waited
        batcher = stats["batcher"]
        failed = self._counter(
            "stockade_batch_failures_total", "batches whose transaction failed as a whole", []
        )
        failed.add_metric(self._values(), float(batcher["failed_batches"]))
        yield failed
        shared = self._counter(
            "stockade_batch_shared_row_total",
            "batches whose row another writer changed since this engine's previous batch on it",
            [],
        )
        shared.add_metric(self._values(), float(batcher["shared_row_batches"]))
        yield shared
        lingered = self._counter(
            "stockade_batch_lingered_total",
            "batches whose flusher waited batch_linger for more requests on a shared row",
            [],
        )
        lingered.add_metric(self._values(), float(batcher["lingered_batches"]))
        yield lingered
        gathered = self._counter(
            "stockade_batch_gathered_total",
            "batches whose flusher waited for the callers of its row's last batch to come back",
            [],
        )
        gathered.add_metric(self._values(), float(batcher["gathered_batches"]))
        yield gathered
        queued = self._gauge(
            "stockade_batch_queued", "requests waiting in the hot-row layer or being applied"
        )
        queued.add_metric(self._values(), float(batcher["queued"]))
        yield queued

    def _pool(self, stats: EngineStats) -> Iterator[Metric]:
        pool = stats["pool"]
        size = self._gauge("stockade_pool_size", "connections the pool may open")
        size.add_metric(self._values(), float(pool["size"]))
        yield size
        conns = self._gauge("stockade_pool_connections", "pooled connections by state", ["state"])
        conns.add_metric(self._values("in_use"), float(pool["in_use"]))
        conns.add_metric(self._values("idle"), float(pool["idle"]))
        yield conns
        waiting = self._gauge("stockade_pool_waiting", "callers waiting for a connection")
        waiting.add_metric(self._values(), float(pool["waiting"]))
        yield waiting
        changes = self._counter(
            "stockade_server_changes_total",
            "new connections that reached another server than the one before (a failover)",
            [],
        )
        changes.add_metric(self._values(), float(pool["server_changes"]))
        yield changes

    def _slots(self, stats: EngineStats) -> Iterator[Metric]:
        slots = stats["slots"]
        decided = self._counter(
            "stockade_auto_slots_total",
            "what auto did about hot-row slots: SKUs it split, splits of other engines it "
            "learned, SKUs it kept on one row, SKUs it merged back when they cooled",
            ["outcome"],
        )
        decided.add_metric(self._values("split"), float(slots["auto_splits"]))
        decided.add_metric(self._values("learned"), float(slots["learned"]))
        decided.add_metric(self._values("kept"), float(slots["kept"]))
        decided.add_metric(self._values("merged"), float(slots["auto_merges"]))
        yield decided

    def _sweeper(self, stats: EngineStats) -> Iterator[Metric]:
        s = stats["sweeper"]
        leader = self._gauge(
            "stockade_sweeper_leader", "1 if this engine is the database's elected sweeper"
        )
        leader.add_metric(self._values(), 1.0 if s["leader"] else 0.0)
        yield leader
        for value, name, doc in [
            (s["runs"], "stockade_sweeper_runs_total", "sweeper rounds run as leader"),
            (s["expired"], "stockade_sweeper_expired_total", "holds the sweeper expired"),
            (s["errors"], "stockade_sweeper_errors_total", "sweeper rounds that failed"),
            (
                s["freed_on_refusal"],
                "stockade_sweeper_freed_on_refusal_total",
                "lapsed holds a refused request expired before its refusal stood",
            ),
            (
                s["round_seconds"],
                "stockade_sweeper_round_seconds_total",
                "time the sweeper spent in the rounds it ran as leader",
            ),
        ]:
            family = self._counter(name, doc, [])
            family.add_metric(self._values(), float(value))
            yield family
        purged = self._counter(
            "stockade_purged_total", "rows retention purged (purge() and the sweeper)", ["kind"]
        )
        purged.add_metric(self._values("reservation"), float(s["purged_reservations"]))
        purged.add_metric(self._values("idempotency_key"), float(s["purged_keys"]))
        yield purged

    def _rows(self, stats: EngineStats) -> Iterator[Metric]:
        rows = self._gauge(
            "stockade_rows",
            "rows in the store by kind (on PostgreSQL: statistics estimates; holds are "
            "counted up to 10,000)",
            ["kind"],
        )
        rows.add_metric(self._values("sku"), float(stats["sku_count"]))
        rows.add_metric(self._values("reservation"), float(stats["reservation_count"]))
        rows.add_metric(self._values("held"), float(stats["held_count"]))
        yield rows

    def _hot_skus(self, stats: EngineStats) -> Iterator[Metric]:
        requests = self._gauge(
            "stockade_hot_sku_requests",
            "requests for the hottest SKUs in this process (since each took its slot)",
            ["sku", "location"],
        )
        in_flight = self._gauge(
            "stockade_hot_sku_in_flight",
            "requests in flight for the hottest SKUs in this process",
            ["sku", "location"],
        )
        row_queue = self._gauge(
            "stockade_hot_sku_row_queue",
            "requests in flight on the row across every process, estimated from its version "
            "(PostgreSQL; 0 when not measured lately)",
            ["sku", "location"],
        )
        for entry in stats["hottest_skus"]:
            labels = self._values(str(entry["sku"])[:64], str(entry["location"])[:64])
            requests.add_metric(labels, float(entry["requests"]))
            in_flight.add_metric(labels, float(entry["in_flight"]))
            row_queue.add_metric(labels, float(entry["row_queue"]))
        yield requests
        yield in_flight
        yield row_queue
