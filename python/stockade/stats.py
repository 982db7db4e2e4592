"""The shapes of ``Engine.stats()``, ``Engine.row_counts()`` and ``Engine.metrics()``, as
``TypedDict``s, so that ``mypy --strict`` checks the code that reads them."""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict

__all__ = [
    "BatcherStats",
    "CallSeries",
    "EngineStats",
    "HotSku",
    "Metrics",
    "PoolStats",
    "RowCounts",
    "StrategyStats",
    "SweeperStats",
]


class StrategyStats(TypedDict):
    """One strategy's counters in this process."""

    requests: int  # reserve, reserve_order and sell calls
    granted: int
    refused: int  # OutOfStock
    failed: int  # any other error
    conflicts: int  # compare-and-set attempts that lost a race
    retries: int  # optimistic retries
    version_conflicts: int
    lock_waits: int
    lock_wait_us: int
    lock_not_available: int
    lock_timeouts: int


class HotSku(TypedDict):
    """One of the SKUs with the most requests in this process."""

    sku: str
    location: str
    requests: int
    refused: int
    conflicts: int
    lock_waits: int
    mode: str  # what auto runs it as right now
    in_flight: int
    peak_in_flight: int
    # requests in flight on the row across every process, estimated from the versions
    # this process's atomic writes left (PostgreSQL; 0 when not measured lately)
    row_queue: int
    slots: int  # rows its units are spread over, as this engine knows (1: not slotted)


class SweeperStats(TypedDict):
    enabled: bool
    leader: bool  # this engine holds the database's sweeper election
    runs: int
    expired: int
    errors: int
    last_error: str
    purged_reservations: int  # by purge() or retention, in this engine
    purged_keys: int
    freed_on_refusal: int  # lapsed holds a refused request expired before it was refused
    round_seconds: float  # time spent in the rounds it ran as leader, in all
    last_round_seconds: float  # the last such round's


class BatcherStats(TypedDict):
    started: bool
    shards: int
    batches: int
    requests: int
    failed_batches: int
    batch_size_max: int
    shared_row_batches: int  # their row was changed by another writer since the last one
    lingered_batches: int  # their flusher waited batch_linger on such a row
    gathered_batches: int  # their flusher waited for its last batch's callers to come back
    batch_size_mean: float
    queued: int


class SlotDecision(TypedDict):
    """One of the last decisions of ``auto`` about a SKU's hot-row slots."""

    sku: str
    location: str
    slots: int  # what it has now
    split: bool  # True: this engine split it; False: learned another's split, kept, merged
    merged: bool  # True: this engine merged its slots back into one row (it had cooled)
    why: str
    age_s: float


class SlotStats(TypedDict):
    """What ``auto`` did about hot-row slots (docs/hot-row.md, "Automatic slots")."""

    auto_slots_max: int
    auto_splits: int  # SKUs this engine split
    learned: int  # splits of other engines this one found
    kept: int  # SKUs kept on one row: set_slots refused them
    auto_merges: int  # slotted SKUs this engine merged back into one row when they cooled
    recent: List[SlotDecision]  # the last 16, most recent last


class RoutingStats(TypedDict):
    """Direct routing on Citus (``citus_routing``, docs/scaling-out.md)."""

    mode: str  # "coordinator" or "direct"
    nodes: int  # workers the shard map routes to
    routed: int  # calls sent straight to a worker
    misses: int  # of those, calls that ran on another node (a stale map, then read again)
    fallbacks: int  # calls whose worker was out of reach, run through the coordinator
    reloads: int  # times the shard map was read from the coordinator


class PoolStats(TypedDict):
    size: int
    in_use: int
    idle: int
    waiting: int
    pooled: bool  # connections run without session state (a transaction-mode pooler)
    routines: bool  # pooled: the newest connection calls the statement routines (migrate())
    server: str  # direct: "<system identifier>/<timeline>" of the newest connection's server
    server_changes: int  # new connections that reached another server (a failover)
    routing: RoutingStats


class EngineStats(TypedDict):
    """``Engine.stats()``."""

    backend: str
    strategies: Dict[str, StrategyStats]
    hottest_skus: List[HotSku]
    sku_count: int
    reservation_count: int
    held_count: int
    counts_exact: bool  # False on PostgreSQL: the counts are estimates
    sweeper: SweeperStats
    pool: PoolStats
    batcher: BatcherStats
    slots: SlotStats


class RowCounts(TypedDict):
    """``Engine.row_counts()``: exact."""

    sku_count: int
    reservation_count: int
    held_count: int


class CallSeries(TypedDict):
    """Calls of one operation under one strategy (None: it takes none)."""

    op: str
    strategy: Optional[str]
    outcomes: Dict[str, int]  # "ok", or an error code
    latency_buckets: List[int]  # per bucket of Metrics.latency_bounds_seconds, then +Inf
    latency_sum_seconds: float
    count: int


class Metrics(TypedDict):
    """``Engine.metrics()``."""

    calls: List[CallSeries]
    latency_bounds_seconds: List[float]
    batch_size_bounds: List[int]
    batch_size_buckets: List[int]  # per bucket of batch_size_bounds, then +Inf
    batch_size_sum: int
    batch_count: int
