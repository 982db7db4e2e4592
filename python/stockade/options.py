"""The engine's options: the keywords of :meth:`Engine.memory` and :meth:`Engine.postgres`
filled into the core's option structs.

The structs are the C++ ones (``EngineOptions`` with its ``BatcherOptions``,
``MemoryOptions``, ``PostgresOptions``), bound as they are in ``stockade._core``. Here each
keyword is checked for its type and converted to the core's unit (a ``timedelta`` to
milliseconds or microseconds), and counts are checked against the core's bounds; the core
validates the whole struct again when the engine is made.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

from . import _core
from ._checks import (
    auto_slots_cool_ms,
    auto_slots_max,
    counted,
    home_slot,
    in_range,
    positive,
    retention_us,
)
from ._clock import ManualClock
from .errors import InvalidType
from .values import Strategy, check_bool, check_str, duration_ms, duration_us, strategy_name

__all__ = ["engine_options", "memory_options", "postgres_options"]


def engine_options(given: Mapping[str, Any]) -> _core.EngineOptions:
    """The options every engine takes, whatever its store (engine.hpp: EngineOptions)."""
    out = _core.EngineOptions()
    out.default_strategy = strategy_name(given["strategy"]) or Strategy.AUTO.value
    out.retries_max = counted("retries_max", given["retries_max"], 0)
    out.lock_timeout_ms = duration_ms("lock_timeout", given["lock_timeout"])
    out.default_ttl_us = duration_us("default_ttl", given["default_ttl"])
    batcher = out.batcher  # a reference into `out` (batcher.hpp: BatcherOptions)
    batcher.batch_max = positive("batch_max", given["batch_max"])
    batcher.shards = positive("batch_shards", given["batch_shards"])
    batcher.queue_capacity = max(batcher.queue_capacity, batcher.batch_max)
    batcher.lock_slice_ms = duration_ms("batch_lock_slice", given["batch_lock_slice"])
    batcher.contended_linger_us = duration_us("batch_linger", given["batch_linger"])
    out.async_workers = positive("async_workers", given["async_workers"])
    out.home_slot = home_slot(given["home_slot"])
    out.slot_directory = positive("slot_directory", given["slot_directory"])
    out.auto_slots_max = auto_slots_max(given["auto_slots_max"])
    out.auto_slots_cool_ms = auto_slots_cool_ms(given["auto_slots_cool"])
    return out


def memory_options(
    given: Mapping[str, Any],
) -> Tuple[_core.EngineOptions, Optional[_core.Clock], _core.MemoryOptions]:
    """What ``_core.Engine.memory`` takes, from the keywords of :meth:`Engine.memory`."""
    clock = given["clock"]
    if clock is not None and not isinstance(clock, ManualClock):
        raise InvalidType(f"clock must be a ManualClock, not {type(clock).__name__}")
    memory = _core.MemoryOptions()
    memory.retention_us = retention_us(given["retention"])
    memory.journal_max = in_range("journal_max", given["journal_max"], 0, 10_000_000)
    memory.journal_retention_us = retention_us(given["journal_retention"])
    memory.feed_lag_max_us = duration_us("feed_lag_max", given["feed_lag_max"])
    memory.expire_lapsed = check_bool("sweeper", given["sweeper"])
    return engine_options(given), (clock._core if clock is not None else None), memory


def postgres_options(
    dsn: str, given: Mapping[str, Any]
) -> Tuple[_core.PostgresOptions, _core.EngineOptions]:
    """What ``_core.Engine.postgres`` takes, from the keywords of :meth:`Engine.postgres`."""
    out = _core.PostgresOptions()
    out.dsn = check_str("dsn", dsn)
    out.schema = check_str("schema", given["schema"])
    out.pool_size = positive("pool_size", given["pool_size"])
    out.pool_timeout_ms = duration_ms("pool_timeout", given["pool_timeout"])
    out.resolve_timeout_ms = duration_ms("resolve_timeout", given["resolve_timeout"])
    out.call_timeout_ms = duration_ms("call_timeout", given["call_timeout"])
    out.cancel_grace_ms = duration_ms("cancel_grace", given["cancel_grace"])
    out.application_name = check_str("application_name", given["application_name"])
    out.pooler = check_str("pooler", given["pooler"])  # the core parses the name
    out.layout = check_str("layout", given["layout"])
    out.citus_routing = check_str("citus_routing", given["citus_routing"])
    out.sweeper = check_bool("sweeper", given["sweeper"])
    out.sweep_interval_ms = duration_ms("sweep_interval", given["sweep_interval"])
    out.sweep_batch = positive("sweep_batch", given["sweep_batch"])
    out.retention_ms = -(-retention_us(given["retention"]) // 1000)  # rounded up
    out.purge_batch = positive("purge_batch", given["purge_batch"])
    out.journal_retention_ms = -(-retention_us(given["journal_retention"]) // 1000)
    out.feed_lag_max_ms = duration_ms("feed_lag_max", given["feed_lag_max"])
    out.feed_notify = check_bool("feed_notify", given["feed_notify"])
    return out, engine_options(given)
