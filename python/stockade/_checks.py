"""Argument checks and conversions of the Engine's calls, beside the basic ones in
:mod:`stockade.values`: each turns what a caller passes into what the core takes, or raises
``InvalidType`` / ``InvalidArgument`` before anything runs. Range checks of options read
their bounds from the core (``_core.OPTION_LIMITS``), so that one number bounds both.
"""

from __future__ import annotations

import itertools
import os
import socket
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import _core
from .errors import InvalidArgument, InvalidType
from .values import (
    Lease,
    Reservation,
    check_bool,
    check_int,
    check_int32,
    check_optional_str,
    check_str,
    duration_ms,
    duration_us,
    metadata_text,
    optional_duration_ms,
    optional_duration_us,
    shown,
    strategy_name,
)

OrderKey = Union[str, Tuple[str, str]]
DEFAULT_LOCATION = "default"


def where(dsn: str) -> str:
    """host, port, database and user of a DSN, for a log line: never its password."""
    fields = dict(_core.parse_conninfo(dsn))
    parts = [f"{k}={shown(fields[k])}" for k in ("host", "port", "dbname", "user") if fields.get(k)]
    return " ".join(parts) or "libpq defaults"


def migration_number(to: object) -> int:
    """``migrate(to=...)``: None (all, 0 to the core) or a migration number, 1 or more."""
    if to is None:
        return 0
    number = check_int32("to", to)
    if number < 1:
        raise InvalidArgument(f"to must be a migration number (1 or more), got {number}")
    return number


def retention_us(retention: object) -> int:
    """``None`` (no retention, 0) or a positive duration in microseconds."""
    if retention is None:
        return 0
    us = duration_us("retention", retention)
    if us <= 0:
        raise InvalidArgument("retention must be positive (None: nothing is purged by itself)")
    return us


def positive(name: str, value: object) -> int:
    """A count option: an int from 1 to its limit in the core (_core.OPTION_LIMITS)."""
    return counted(name, value, 1)


def counted(name: str, value: object, low: int) -> int:
    """A count option from ``low`` to its limit in the core."""
    return in_range(name, value, low, _core.OPTION_LIMITS[name])


def auto_slots_max(value: object) -> int:
    """``auto_slots_max``: the rows ``auto`` splits a hot SKU into (1: never)."""
    slots = check_int("auto_slots_max", value)
    most = _core.OPTION_LIMITS["slots"]
    if not 1 <= slots <= most:
        raise InvalidArgument(
            f"auto_slots_max must be between 1 (no automatic slots) and {most}, got {slots}"
        )
    return slots


def auto_slots_cool_ms(value: object) -> int:
    """``auto_slots_cool``: how long a slotted SKU stays cool before ``auto`` merges it
    (None: never, which the core takes as 0)."""
    if value is None:
        return 0
    ms = duration_ms("auto_slots_cool", value)
    if ms <= 0:
        raise InvalidArgument(
            f"auto_slots_cool must be positive, or None (never merge), got {value}"
        )
    return ms


def home_slot(value: object) -> int:
    """``home_slot``: None (-1 to the core: from the process id) or a slot number."""
    if value is None:
        return -1
    home = check_int("home_slot", value)
    slots = _core.OPTION_LIMITS["slots"]
    if not 0 <= home < slots:
        raise InvalidArgument(f"home_slot must be None or between 0 and {slots - 1}, got {home}")
    return home


def in_range(name: str, value: object, low: int, high: int) -> int:
    """An int argument between ``low`` and ``high``, inclusive."""
    number = check_int(name, value)
    if not low <= number <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}, got {number}")
    return number


def order_lines(items: object, location: str) -> List[Tuple[str, str, int]]:
    """``{sku: qty}`` or ``{(sku, location): qty}`` as the core's (sku, location, qty)."""
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


def allocation_wants(items: object) -> List[Tuple[str, int]]:
    """``{sku: qty}`` as the core's (sku, qty) pairs."""
    if not isinstance(items, Mapping):
        raise InvalidType(f"items must be a mapping of sku to qty, not {type(items).__name__}")
    return [(check_str("sku", sku), check_int("qty", qty)) for sku, qty in items.items()]


def pool_locations(locations: object) -> List[str]:
    """An allocation's pool: an iterable of location names, in priority order, read one past
    the bound at most (the core refuses more, and duplicates)."""
    if isinstance(locations, (str, bytes)) or not isinstance(locations, Iterable):
        raise InvalidType(f"locations must be an iterable of str, not {type(locations).__name__}")
    bounded = list(itertools.islice(locations, _core.ALLOCATE_LOCATIONS_MAX + 1))
    if len(bounded) > _core.ALLOCATE_LOCATIONS_MAX:
        raise InvalidArgument(
            f"a pool names at most {_core.ALLOCATE_LOCATIONS_MAX} locations"
            " (ALLOCATE_LOCATIONS_MAX)"
        )
    return [check_str("location", location) for location in bounded]


def allocation_options(
    locations: object,
    policy: object,
    split: object,
    ttl: object,
    idempotency_key: object,
    strategy: object,
    nowait: object,
    lock_timeout: object,
    buyer: object,
    ref: object,
    metadata: object,
) -> Dict[str, Any]:
    """The core's arguments of allocate and allocate_order besides the wanted SKUs."""
    return {
        "locations": pool_locations(locations),
        "policy": check_str("policy", policy),
        "split": check_bool("split", split),
        "ttl_us": optional_duration_us("ttl", ttl),
        "idempotency_key": check_optional_str("idempotency_key", idempotency_key),
        "strategy": strategy_name(strategy),
        "nowait": check_bool("nowait", nowait),
        "lock_timeout_ms": optional_duration_ms("lock_timeout", lock_timeout),
        "buyer": check_optional_str("buyer", buyer),
        "ref": check_optional_str("ref", ref),
        "metadata": metadata_text(metadata),
    }


def limit_skus(skus: object) -> List[str]:
    """A purchase limit's SKUs: an iterable of str, read one past the bound at most, so
    that an endless iterable is refused, not consumed."""
    if isinstance(skus, (str, bytes)) or not isinstance(skus, Iterable):
        raise InvalidType(f"skus must be an iterable of str, not {type(skus).__name__}")
    bounded = list(itertools.islice(skus, _core.LIMIT_GROUP_SKUS_MAX + 1))
    if len(bounded) > _core.LIMIT_GROUP_SKUS_MAX:
        raise InvalidArgument(f"a purchase limit names at most {_core.LIMIT_GROUP_SKUS_MAX} skus")
    return [check_str("sku", sku) for sku in bounded]


def reservations(made: List[_core.Reservation]) -> List[Reservation]:
    return [Reservation._from_core(r) for r in made]


def lease(value: object) -> Lease:
    if not isinstance(value, Lease):
        raise InvalidType(f"lease must be a stockade.Lease, got {type(value).__name__}")
    return value


def lease_owner(owner: Optional[str]) -> str:
    """Who holds a lease: as given, else host and process id."""
    if owner is None:
        return f"{socket.gethostname()[:200]}:{os.getpid()}"
    return check_str("owner", owner)
