"""Every public call of Engine and Feed, found by introspection, with arguments that make
each one a valid call: for the tests that must reach every call (its span, its type
checks, its answer once the engine is closed). A public call without arguments here fails
those tests, so a new call cannot be missed. (Imported as a plain module.)"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, List, Tuple

import stockade

Arguments = Tuple[Tuple[Any, ...], Dict[str, Any]]
# Calls that end the engine: run last.
LIFECYCLE = ("close", "aclose")


def public_calls(cls: type) -> List[str]:
    """The public methods of ``cls``, by name: its callables without a leading underscore,
    neither its constructors (class and static methods) nor its properties."""
    names = []
    for name in dir(cls):
        raw = inspect.getattr_static(cls, name)
        if name.startswith("_") or isinstance(raw, (classmethod, staticmethod, property)):
            continue
        if callable(raw):
            names.append(name)
    return names


@dataclass
class World:
    """An engine with something of each kind to call on: rows, a hold, a lease, a
    purchase limit, a feed consumer."""

    engine: stockade.Engine
    held: stockade.Reservation
    lease: stockade.Lease
    feed: stockade.Feed
    sold: stockade.Reservation  # confirmed: its units can come back (return_units)
    order: stockade.Order  # with units enough on each line for a step in parts, many times
    transfer: stockade.Transfer  # with units enough in transit to receive in parts, many times

    @classmethod
    def made(cls, engine: stockade.Engine) -> World:
        for sku in ("sku-1", "sku-2", "old", "slotted", "limited"):
            engine.restock(sku, 1000)
        held = engine.reserve("sku-1", 1)
        sold = engine.confirm(engine.reserve("sku-2", 4).id)
        lease = engine.acquire_lease("leased", 60)
        engine.set_purchase_limit("drop", 5, ["limited"])
        order = engine.reserve_order({"sku-1": 20, "sku-2": 20}, idempotency_key="world")
        moving = engine.transfer("sku-1", 50, source="default", destination="annex")
        return cls(engine, held, lease, engine.feed("consumer"), sold, order, moving)

    def spare_transfer(self) -> stockade.Transfer:
        """A new transfer for a call that ends one (cancel_transfer); on a closed engine,
        whose every call refuses, the world's own."""
        try:
            return self.engine.transfer("sku-1", 1, source="default", destination="annex")
        except stockade.Unavailable:
            return self.transfer


def _none(w: World) -> Arguments:
    return (), {}


ENGINE_CALLS: Dict[str, Callable[[World], Arguments]] = {
    "migrate": _none,
    "migration_plan": _none,
    "drop_schema": lambda w: ((), {"confirm": w.engine._schema or "stockade"}),
    "restock": lambda w: (("sku-1", 1), {}),
    "set_on_hand": lambda w: (("sku-1", 500), {}),
    "set_backorder_limit": lambda w: (("sku-1", 0), {}),
    "set_safety_stock": lambda w: (("sku-1", 0), {}),
    "move_units": lambda w: (("sku-1", 1), {"to_state": "quality_control"}),
    "transfer": lambda w: (("sku-1", 1), {"source": "default", "destination": "annex"}),
    "receive": lambda w: ((w.transfer,), {"accepted": 1}),
    "cancel_transfer": lambda w: ((w.spare_transfer(),), {}),
    "get_transfer": lambda w: ((w.transfer,), {}),
    "transfers": lambda w: ((), {"sku": "sku-1"}),
    "discontinue": lambda w: (("old",), {}),
    "reinstate": lambda w: (("old",), {}),
    "stock": lambda w: (("sku-1",), {}),
    "set_slots": lambda w: (("slotted", 2), {}),
    "slot_count": lambda w: (("slotted",), {}),
    "sell": lambda w: (("sku-1", 1), {}),
    "set_purchase_limit": lambda w: (("drop", 5, ["limited"]), {}),
    "remove_purchase_limit": lambda w: (("drop",), {}),
    "buyer_held": lambda w: (("drop", "cust-7"), {}),
    "acquire_lease": lambda w: (("leased-too", 60), {}),
    "renew_lease": lambda w: ((w.lease, 60), {}),
    "release_lease": lambda w: ((w.lease,), {}),
    "reserve": lambda w: (("sku-1", 1), {}),
    "reserve_order": lambda w: (({"sku-1": 1, "sku-2": 1},), {}),
    "allocate": lambda w: (("sku-1", 1), {"locations": ["default"]}),
    "stock_by_location": lambda w: (("sku-1",), {}),
    "allocate_order": lambda w: (({"sku-1": 1, "sku-2": 1},), {"locations": ["default"]}),
    "confirm": lambda w: ((w.held.id,), {}),
    "return_units": lambda w: ((w.sold.id, 1), {}),
    "resize": lambda w: ((w.held.id, 2), {}),
    "release": lambda w: ((w.held.id,), {}),
    "extend": lambda w: ((w.held.id,), {"ttl": 60}),
    "confirm_order": lambda w: ((w.order,), {"qty": {"sku-1": 1}}),
    "release_order": lambda w: ((w.order.id,), {"qty": {"sku-2": 1}}),
    "extend_order": lambda w: ((w.order,), {"ttl": 60}),
    "order": lambda w: ((w.order.id,), {}),
    "reservations": lambda w: ((), {"order": w.order}),
    "reservation": lambda w: ((w.held.id,), {}),
    "get_reservation": lambda w: ((w.held.id,), {}),
    "expire_due": _none,
    "purge": lambda w: ((timedelta(days=1),), {}),
    "movements": _none,
    "feed": lambda w: (("consumer-too",), {}),
    "set_low_stock": lambda w: (("sku-1", 5), {}),
    "audit": _none,
    "purge_movements": lambda w: ((timedelta(days=1),), {}),
    "row_counts": _none,
    "metrics": _none,
    "stats": _none,
    "recommend": lambda w: (("sku-1",), {}),
    "close": _none,
    "aclose": _none,
}

FEED_CALLS: Dict[str, Callable[[World], Arguments]] = {
    "poll": lambda w: ((), {"limit": 10}),
    "commit": _none,
    "drop": _none,
}


def arguments_of(name: str, table: Dict[str, Callable[[World], Arguments]], w: World) -> Arguments:
    """The arguments of a call (an awaitable twin takes its blocking call's)."""
    blocking = name.removesuffix("_async")
    assert blocking in table, f"{name}: a public call the tests do not know: add it to public_api"
    return table[blocking](w)


def ordered(names: List[str]) -> List[str]:
    """The calls, those that end the engine or drop its schema last."""
    last = ("drop_schema", "drop_schema_async", *LIFECYCLE)
    return [n for n in names if n not in last] + [n for n in last if n in names]


def invoke(target: Any, name: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Calls ``target.name(*args, **kwargs)``, awaiting it if it is an awaitable twin."""
    method = getattr(target, name)
    if inspect.iscoroutinefunction(method):
        return asyncio.run(method(*args, **kwargs))
    return method(*args, **kwargs)
