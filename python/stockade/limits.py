"""The input limits a caller can reach, as constants: the core's own numbers.

The core checks each before anything changes, and the ``InvalidArgument`` for a value past
one names it (``sku is 10240 bytes long (UTF-8); the limit is 256 bytes (SKU_BYTES_MAX)``).
Texts are counted in UTF-8 bytes, not characters: a SKU of 256 ASCII characters fits, one
of 256 ``é`` (512 bytes) does not. A service that takes these values from its own callers
can check them at its edge with the same numbers (the example shop caps its
``Idempotency-Key`` header at ``IDEMPOTENCY_KEY_BYTES_MAX``).
"""

from __future__ import annotations

from datetime import timedelta

from . import _core

__all__ = [
    "ALLOCATE_LOCATIONS_MAX",
    "BUYER_BYTES_MAX",
    "IDEMPOTENCY_KEY_BYTES_MAX",
    "LEASE_OWNER_BYTES_MAX",
    "LIMIT_GROUP_BYTES_MAX",
    "LIMIT_GROUP_SKUS_MAX",
    "LOCATIONS_LIMIT_MAX",
    "LOCATION_BYTES_MAX",
    "METADATA_BYTES_MAX",
    "ON_HAND_MAX",
    "ORDER_LINES_MAX",
    "QUANTITY_MAX",
    "REF_BYTES_MAX",
    "RESERVATIONS_LIMIT_MAX",
    "SKU_BYTES_MAX",
    "SLOTS_MAX",
    "TRANSFERS_LIMIT_MAX",
    "TTL_MAX",
]

SKU_BYTES_MAX: int = _core.SKU_BYTES_MAX
LOCATION_BYTES_MAX: int = _core.LOCATION_BYTES_MAX
IDEMPOTENCY_KEY_BYTES_MAX: int = _core.IDEMPOTENCY_KEY_BYTES_MAX
LEASE_OWNER_BYTES_MAX: int = _core.LEASE_OWNER_BYTES_MAX  # acquire_lease(owner=...)
BUYER_BYTES_MAX: int = _core.BUYER_BYTES_MAX  # reserve(buyer=...), purchase limits
REF_BYTES_MAX: int = _core.REF_BYTES_MAX  # reserve(ref=...), reserve_order, sell
METADATA_BYTES_MAX: int = _core.METADATA_BYTES_MAX  # reserve(metadata=...): its JSON's bytes
RESERVATIONS_LIMIT_MAX: int = _core.RESERVATIONS_LIMIT_MAX  # reservations(limit=...)
LIMIT_GROUP_BYTES_MAX: int = _core.LIMIT_GROUP_BYTES_MAX  # a purchase limit's group name
LIMIT_GROUP_SKUS_MAX: int = _core.LIMIT_GROUP_SKUS_MAX  # SKUs one purchase limit names
ORDER_LINES_MAX: int = _core.ORDER_LINES_MAX  # lines of one reserve_order
ALLOCATE_LOCATIONS_MAX: int = _core.ALLOCATE_LOCATIONS_MAX  # locations of one allocation's pool
LOCATIONS_LIMIT_MAX: int = _core.LOCATIONS_LIMIT_MAX  # locations of one stock_by_location page
TRANSFERS_LIMIT_MAX: int = _core.TRANSFERS_LIMIT_MAX  # transfers of one transfers() page
# The largest quantity one request may ask for (10**12): it keeps every sum the engine
# forms, a batch's included, far from overflowing a 64-bit stock level.
QUANTITY_MAX: int = _core.QUANTITY_MAX
# The most units a row may have on hand (2**63 - 1 - QUANTITY_MAX): its room, on_hand plus
# a backorder limit, stays within 64 bits. set_on_hand, and a restock, return or transfer
# that would pass it, raise InvalidArgument.
ON_HAND_MAX: int = _core.ON_HAND_MAX
TTL_MAX: timedelta = timedelta(microseconds=_core.TTL_US_MAX)  # 366 days
SLOTS_MAX: int = _core.SLOTS_MAX  # hot-row slots of one SKU (set_slots, auto_slots_max)
