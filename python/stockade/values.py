"""Value objects and enums of the public API, and the conversions to and from the core."""

from __future__ import annotations

import enum
import json
import math
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Iterator, Literal, Optional, Sequence, Tuple, Union, overload

from . import _core
from .errors import InvalidArgument, InvalidType
from .limits import QUANTITY_MAX

__all__ = [
    "QUANTITY_MAX",
    "Lease",
    "Order",
    "Reservation",
    "ReservationState",
    "StockLevel",
    "Strategy",
    "StrategyLike",
    "StrategyName",
    "Transfer",
    "TransferState",
    "version_from_etag",
]

INT64_MAX = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

TtlLike = Union[timedelta, int, float]
ReservationId = Union[uuid.UUID, str]
# An order: its Order, or its id.
OrderRef = Union["Order", uuid.UUID, str]
# A transfer: its Transfer, or its id.
TransferRef = Union["Transfer", uuid.UUID, str]
# A line of an order in confirm_order's and release_order's qty=: its Reservation, its id,
# its sku, or (sku, location).
LineRef = Union["Reservation", uuid.UUID, str, Tuple[str, str]]


# The strategies' names, for type checkers: strategy="atomc" is an error under mypy, while
# a Strategy member or one of these names is accepted wherever a strategy is.
StrategyName = Literal["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]


class Strategy(str, enum.Enum):
    """How a write protects itself from the lost update (docs/design.md, section 1).

    Every ``strategy=`` parameter accepts a member or its string name.
    """

    ATOMIC = "atomic"
    PESSIMISTIC = "pessimistic"
    ADVISORY = "advisory"
    OPTIMISTIC = "optimistic"
    BATCHED = "batched"
    AUTO = "auto"

    def __str__(self) -> str:
        return self.value


StrategyLike = Union[Strategy, StrategyName]


class ReservationState(str, enum.Enum):
    """The lifecycle of a hold: held, then confirmed, released or expired."""

    HELD = "held"
    CONFIRMED = "confirmed"
    RELEASED = "released"
    EXPIRED = "expired"

    def __str__(self) -> str:
        return self.value


class TransferState(str, enum.Enum):
    """A transfer's lifecycle: in transit, then received (some units arrived or were
    rejected) or cancelled (all of them went back)."""

    IN_TRANSIT = "in_transit"
    RECEIVED = "received"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value


# Lookups on the conversion path of every result (an enum call costs more than a dict hit).
_STATES = {state.value: state for state in ReservationState}
_TRANSFER_STATES = {state.value: state for state in TransferState}


def _etag(version: int) -> str:
    return f'"{version}"'


_ETAG_DIGITS_MAX = 19  # a version is a positive int64


def shown(value: str, limit: int = 64) -> str:
    """``value`` as it may appear in a message or a log line: quoted, with control and
    non-ASCII characters escaped (a newline cannot forge a log line), and cut to ``limit``
    characters with the full length noted (a 1 MB input does not become a 1 MB message)."""
    if len(value) <= limit:
        return ascii(value)
    return f"{value[:limit]!a}... ({len(value)} characters)"


def version_from_etag(etag: str) -> int:
    """The version inside an ETag made by stockade (for HTTP ``If-Match``): ``"12"`` or
    ``W/"12"``, ASCII digits only, at most 19 of them."""
    if not isinstance(etag, str):
        raise InvalidType(f"etag must be a str, not {type(etag).__name__}")
    text = etag[2:] if etag.startswith("W/") else etag
    digits = text[1:-1]
    if (
        len(text) < 3
        or len(digits) > _ETAG_DIGITS_MAX
        or text[0] != '"'
        or text[-1] != '"'
        or not digits.isascii()
        or not digits.isdigit()
    ):
        raise InvalidArgument(f"not a stockade etag: {shown(etag)}")
    version = int(digits)
    if version > INT64_MAX:
        raise InvalidArgument(f"not a stockade etag (version out of range): {shown(etag)}")
    return version


def _datetime(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


@dataclass(frozen=True, slots=True)
class StockLevel:
    """A stock row as committed.

    ``available`` is ``on_hand + backorder_limit - reserved - safety_stock - damaged -
    quality_control``, never below zero: what new holds and sells may take. ``on_hand``
    counts every unit at the location, including those ``damaged`` or in
    ``quality_control`` (:meth:`Engine.move_units`); ``safety_stock`` is a floor kept back
    from sale (:meth:`Engine.set_safety_stock`); ``incoming`` is in transit to the location
    (:meth:`Engine.transfer`), not on hand. With a ``backorder_limit``
    (default 0), holds may pass on_hand and sells may take on_hand below zero (units
    owed); ``backordered`` is how many units are promised beyond on_hand. A
    ``discontinued`` row is a tombstone (soft-deleted): new holds, sells and restocks raise
    ``Discontinued``. ``leased`` says a lease is live on the row (``acquire_lease``) until
    ``lease_expires_at``. ``low_stock`` is the row's low-stock threshold for the change
    feed's alerts (:meth:`Engine.set_low_stock`), or None.
    """

    sku: str
    location: str
    on_hand: int
    reserved: int
    available: int
    version: int
    updated_at: datetime
    backorder_limit: int = 0
    backordered: int = 0
    discontinued: bool = False
    leased: bool = False
    lease_expires_at: Optional[datetime] = None
    low_stock: Optional[int] = None
    safety_stock: int = 0
    damaged: int = 0
    quality_control: int = 0
    incoming: int = 0

    @property
    def etag(self) -> str:
        """Strong ETag of this version of the row."""
        return _etag(self.version)

    @classmethod
    def _from_core(cls, s: _core.StockLevel) -> StockLevel:
        return cls(
            s.sku,
            s.location,
            s.on_hand,
            s.reserved,
            s.available,
            s.version,
            _datetime(s.updated_at_us),
            s.backorder_limit,
            s.backordered,
            s.discontinued,
            s.leased,
            _datetime(s.lease_expires_at_us) if s.leased else None,
            s.low_stock,
            s.safety_stock,
            s.damaged,
            s.quality_control,
            s.incoming,
        )


@dataclass(frozen=True, slots=True)
class Transfer:
    """A transfer of a SKU's units between two locations (:meth:`Engine.transfer`).

    ``qty`` left ``source``'s on_hand when it was made; of those, ``received`` went on hand
    at ``destination``, ``rejected`` were written off there, ``cancelled`` went back to the
    source, and ``in_transit`` are still on the way (the destination's ``incoming``).
    ``state`` is ``in_transit`` while any unit is, then ``received`` if any unit was
    received or rejected, else ``cancelled``.
    """

    id: uuid.UUID
    sku: str
    source: str
    destination: str
    qty: int
    received: int
    rejected: int
    cancelled: int
    in_transit: int
    state: TransferState
    version: int
    created_at: datetime
    updated_at: datetime
    reason: Optional[str] = None
    actor: Optional[str] = None

    @classmethod
    def _from_core(cls, t: _core.Transfer) -> Transfer:
        return cls(
            uuid.UUID(bytes=t.id),
            t.sku,
            t.source,
            t.destination,
            t.qty,
            t.received,
            t.rejected,
            t.cancelled,
            t.in_transit,
            _TRANSFER_STATES[t.state],
            t.version,
            _datetime(t.created_at_us),
            _datetime(t.updated_at_us),
            t.reason,
            t.actor,
        )


def transfer_id_bytes(value: object) -> bytes:
    """A transfer as the core takes it: its id's 16 bytes."""
    if isinstance(value, Transfer):
        return value.id.bytes
    got = _uuid_bytes(value, "a transfer id")
    if got is None:
        raise InvalidType(f"transfer id must be a uuid.UUID or str, not {type(value).__name__}")
    return got


def transfer_state_value(value: object) -> str:
    """A transfer state, as a TransferState or its name."""
    if isinstance(value, TransferState):
        return value.value
    if not isinstance(value, str):
        raise InvalidType(f"state must be a TransferState or str, not {type(value).__name__}")
    if value in _TRANSFER_STATES:
        return value
    raise InvalidArgument(f"state must be in_transit, received or cancelled, not {shown(value)}")


@dataclass(frozen=True, slots=True)
class Lease:
    """A lease on one stock row (the offline lock), from :meth:`Engine.acquire_lease`.

    ``token`` is its fencing token: tokens come from one database sequence and strictly
    increase across every holder. Pass it as ``fencing_token=`` to ``restock``,
    ``set_on_hand``, ``sell``, ``set_backorder_limit``, ``discontinue`` and ``reinstate``
    while the lease is yours; once a newer lease exists, the store refuses it with
    ``FencingTokenStale``. ``expires_at`` is on the store's clock (the database's).
    """

    resource: str
    location: str
    owner: str
    token: int
    expires_at: datetime

    @property
    def sku(self) -> str:
        """The leased SKU (the same as ``resource``)."""
        return self.resource

    @classmethod
    def _from_core(cls, lease: _core.Lease) -> Lease:
        return cls(
            lease.sku, lease.location, lease.owner, lease.token, _datetime(lease.expires_at_us)
        )


@dataclass(frozen=True, slots=True)
class Reservation:
    """A reservation (a hold on stock) as committed. ``buyer`` is the buyer whose
    purchase limits it counts against, if it was made with one.

    ``qty`` is what was asked for (plus any growth by ``resize``); ``confirmed``,
    ``released`` and ``expired`` say where
    units went, and ``held`` is the rest: ``held + confirmed + released + expired ==
    qty``. ``returned`` counts confirmed units that came back. The state stays ``held``
    while any unit is held (a partial confirm or release leaves the rest held), then says
    how the hold ended: ``confirmed`` if any unit was sold, else ``released`` or
    ``expired``.

    ``order_id`` is the order it is a line of (``reserve_order``), ``ref`` and ``metadata``
    what the caller told of it (``reserve(ref=..., metadata=...)``)."""

    id: uuid.UUID
    sku: str
    location: str
    qty: int
    state: ReservationState
    version: int
    expires_at: datetime
    created_at: datetime
    updated_at: datetime
    idempotency_key: Optional[str]
    buyer: Optional[str] = None
    confirmed: int = 0
    released: int = 0
    expired: int = 0
    returned: int = 0
    order_id: Optional[uuid.UUID] = None
    ref: Optional[str] = None
    # A dict is not hashable: a Reservation hashes without it (and compares with it).
    metadata: Optional[Dict[str, Any]] = field(default=None, hash=False)

    @property
    def held(self) -> int:
        """Units still held: reserved on the stock row until confirmed, released or expired."""
        return self.qty - self.confirmed - self.released - self.expired

    @property
    def etag(self) -> str:
        """Strong ETag of this version of the reservation."""
        return _etag(self.version)

    @classmethod
    def _from_core(cls, r: _core.Reservation) -> Reservation:
        created_us, updated_us = r.created_at_us, r.updated_at_us
        created = _datetime(created_us)
        return cls(
            uuid.UUID(bytes=r.id),
            r.sku,
            r.location,
            r.qty,
            _STATES[r.state],
            r.version,
            _datetime(r.expires_at_us),
            created,
            created if updated_us == created_us else _datetime(updated_us),
            r.idempotency_key,
            r.buyer,
            r.confirmed,
            r.released,
            r.expired,
            r.returned,
            None if r.order_id is None else uuid.UUID(bytes=r.order_id),
            r.ref,
            None if r.metadata is None else json.loads(r.metadata),
        )


@dataclass(frozen=True)
class Order(Sequence[Reservation]):
    """An order: the reservations ``reserve_order`` made, one per line, as one handle.

    ``id`` is the order's id (every line carries it as ``order_id``; None only for an order
    made before schema version 12), ``idempotency_key`` the key it was made with. It is a
    sequence of its lines: ``order[0]``, ``len(order)``, ``for line in order``. Lines come
    in the caller's order from :meth:`Engine.reserve_order`, and sorted by (sku, location)
    from :meth:`Engine.order` and the order steps (:meth:`Engine.confirm_order`,
    :meth:`Engine.release_order`, :meth:`Engine.extend_order`)."""

    id: Optional[uuid.UUID]
    idempotency_key: Optional[str]
    lines: Tuple[Reservation, ...]

    @overload
    def __getitem__(self, index: int) -> Reservation: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Reservation]: ...
    def __getitem__(self, index: Union[int, slice]) -> Union[Reservation, Sequence[Reservation]]:
        return self.lines[index]

    def __len__(self) -> int:
        return len(self.lines)

    def __iter__(self) -> Iterator[Reservation]:
        return iter(self.lines)

    @property
    def held(self) -> int:
        """Units its lines still hold."""
        return sum(line.held for line in self.lines)

    @property
    def live(self) -> bool:
        """Whether any line still holds units."""
        return any(line.state is ReservationState.HELD for line in self.lines)

    def line(self, sku: str, location: Optional[str] = None) -> Reservation:
        """The line of ``sku`` (at ``location``, when the order has that SKU at several)."""
        return _line_of(self.lines, sku, location)

    @classmethod
    def _from_lines(cls, lines: Sequence[Reservation]) -> Order:
        first = lines[0] if lines else None
        return cls(
            None if first is None else first.order_id,
            None if first is None else first.idempotency_key,
            tuple(lines),
        )


# --- argument checks and conversions, shared by the engine and the test helpers ---


def check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidType(f"{name} must be a str, not {type(value).__name__}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"{name} must be valid Unicode (no lone surrogates)") from None
    return value


def check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidType(f"{name} must be an int, not {type(value).__name__}")
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise InvalidArgument(f"{name} {value} does not fit in a 64-bit integer")
    return value


INT32_MAX = 2**31 - 1


def check_int32(name: str, value: object) -> int:
    """An int the core takes as a C++ ``int``: a 32-bit integer (its range is checked there)."""
    number = check_int(name, value)
    if not -INT32_MAX - 1 <= number <= INT32_MAX:
        raise InvalidArgument(f"{name} {number} does not fit in a 32-bit integer")
    return number


def check_count(name: str, value: object) -> int:
    """An int the core takes as a count (unsigned, ``std::size_t``): 0 or more, within 64
    bits (its range is checked there)."""
    number = check_int(name, value)
    if number < 0:
        raise InvalidArgument(f"{name} must not be negative, got {number}")
    return number


def check_optional_int(name: str, value: object) -> Optional[int]:
    return None if value is None else check_int(name, value)


def check_optional_str(name: str, value: object) -> Optional[str]:
    return None if value is None else check_str(name, value)


def check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidType(f"{name} must be a bool, not {type(value).__name__}")
    return value


def duration_us(name: str, value: object) -> int:
    """A timedelta, or a number of seconds, as whole microseconds (range checked in C++)."""
    if isinstance(value, timedelta):
        us = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidType(f"{name} must be a timedelta or seconds, not {type(value).__name__}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{name} must be finite, got {value}")
    else:
        if abs(value) > INT64_MAX / 1_000_000:
            raise InvalidArgument(f"{name} of {value} seconds is out of range")
        us = round(value * 1_000_000)
    if not -INT64_MAX - 1 <= us <= INT64_MAX:
        raise InvalidArgument(f"{name} is out of range")
    return us


def optional_duration_us(name: str, value: object) -> Optional[int]:
    return None if value is None else duration_us(name, value)


def duration_ms(name: str, value: object) -> int:
    """A timedelta or seconds as whole milliseconds, rounded up so a wait is never shorter."""
    us = duration_us(name, value)
    return -((-us) // 1000)


def optional_duration_ms(name: str, value: object) -> Optional[int]:
    return None if value is None else duration_ms(name, value)


def strategy_name(value: object) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, Strategy):
        return value.value
    if isinstance(value, str):
        try:
            return Strategy(value).value
        except ValueError:
            names = ", ".join(s.value for s in Strategy)
            raise InvalidArgument(
                f"unknown strategy {shown(value)}; expected one of {names}"
            ) from None
    raise InvalidType(f"strategy must be a Strategy or str, not {type(value).__name__}")


def _uuid_bytes(value: object, what: str) -> Optional[bytes]:
    """A uuid.UUID, or its text, as its 16 bytes (text that is not one: InvalidArgument,
    naming `what`); None for a value of any other type."""
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, str):
        try:
            return uuid.UUID(value).bytes
        except ValueError:
            raise InvalidArgument(f"not {what}: {shown(value)}") from None
    return None


def reservation_id_bytes(value: object) -> bytes:
    if isinstance(value, Reservation):
        return value.id.bytes
    got = _uuid_bytes(value, "a reservation id")
    if got is None:
        raise InvalidType(f"reservation id must be a uuid.UUID or str, not {type(value).__name__}")
    return got


def state_value(value: object) -> str:
    """A reservation state, as a ReservationState or its name."""
    if isinstance(value, ReservationState):
        return value.value
    if not isinstance(value, str):
        raise InvalidType(f"state must be a ReservationState or str, not {type(value).__name__}")
    try:
        return ReservationState(value).value
    except ValueError:
        raise InvalidArgument(
            f"state must be held, confirmed, released or expired, not {shown(value)}"
        ) from None


def metadata_text(value: object) -> Optional[str]:
    """``metadata=``: a JSON object (a mapping of str to JSON values) as its compact text,
    which the core checks (METADATA_BYTES_MAX)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidType(f"metadata must be a dict (a JSON object), not {type(value).__name__}")
    _str_keys(value, 0)
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    except TypeError as e:
        raise InvalidType(f"metadata must hold JSON values only: {shown(str(e))}") from None
    except (ValueError, RecursionError) as e:  # NaN, an infinity, a cycle
        raise InvalidArgument(f"metadata is not JSON: {shown(str(e))}") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("metadata must be valid Unicode (no lone surrogates)") from None
    return text


def _str_keys(value: object, depth: int) -> None:
    """Every object key in `value` is a str (json.dumps would turn 1 into "1" silently)."""
    if depth > 64:
        return  # deeper than the core allows: it refuses the text
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidType(f"metadata keys must be str, not {type(key).__name__}")
            _str_keys(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _str_keys(item, depth + 1)


def order_id_bytes(value: object) -> bytes:
    """An order as the core takes it: its id's 16 bytes."""
    if isinstance(value, Order):
        if value.id is None:
            raise InvalidArgument(
                "this order has no id (it was made before schema version 12): "
                "step its lines one by one"
            )
        return value.id.bytes
    got = _uuid_bytes(value, "an order id")
    if got is None:
        raise InvalidType(
            f"order must be a stockade.Order, uuid.UUID or str, not {type(value).__name__}"
        )
    return got


def order_parts(lines: Sequence[Reservation], qty: object) -> list[tuple[bytes, int]]:
    """confirm_order's and release_order's ``qty=``: each line named (by its Reservation,
    its id, its sku, or (sku, location)) with its units, as the core's (id, units)."""
    from collections.abc import Mapping

    if not isinstance(qty, Mapping):
        raise InvalidType(f"qty must be a mapping of line to units, not {type(qty).__name__}")
    if not qty:  # not "every line": a caller whose parts came out empty asked for none
        raise InvalidArgument("qty names no line: leave it out to step every line")
    parts: list[tuple[bytes, int]] = []
    for ref, units in qty.items():
        if isinstance(ref, Reservation):
            line_id = ref.id
        elif isinstance(ref, uuid.UUID):
            line_id = ref
        elif isinstance(ref, tuple) and len(ref) == 2:
            line_id = _line_of(lines, check_str("sku", ref[0]), check_str("location", ref[1])).id
        elif isinstance(ref, str):
            try:
                line_id = uuid.UUID(ref)
            except ValueError:
                line_id = _line_of(lines, ref, None).id
        else:
            raise InvalidType(
                "a line in qty must be a Reservation, uuid.UUID, sku or (sku, location), "
                f"not {type(ref).__name__}"
            )
        parts.append((line_id.bytes, check_int("qty", units)))
    return parts


def _line_of(lines: Sequence[Reservation], sku: str, location: Optional[str]) -> Reservation:
    found = [r for r in lines if r.sku == sku and location in (None, r.location)]
    if len(found) != 1:
        where = "" if location is None else f" at {shown(location)}"
        if not found:
            raise InvalidArgument(f"the order has no line of sku {shown(sku)}{where}")
        raise InvalidArgument(
            f"the order has several lines of sku {shown(sku)}: name one as (sku, location)"
        )
    return found[0]
