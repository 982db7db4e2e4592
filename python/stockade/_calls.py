"""The Engine's blocking calls: each checks and converts its arguments, calls the core by
keyword with the GIL released, and wraps what comes back.

:class:`stockade.Engine` adds construction and the lifecycle; the awaitable twins of these
calls are generated from this file into ``_twins.py`` (``tools/gen_twins.py``), so that a
twin's signature and checks are this call's.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union, cast

from . import _core
from ._checks import (
    DEFAULT_LOCATION,
    OrderKey,
    allocation_options,
    allocation_wants,
    in_range,
    lease_owner,
    limit_skus,
    migration_number,
    order_lines,
    reservations,
)
from ._checks import lease as check_lease
from ._clock import epoch_us
from .aio import Bridges
from .claim import ClaimAdvice
from .errors import InvalidArgument, InvalidType
from .journal import AuditReport, Feed, Movement
from .stats import EngineStats, Metrics, RowCounts
from .values import (
    Lease,
    LineRef,
    Order,
    OrderRef,
    Reservation,
    ReservationId,
    ReservationState,
    StockLevel,
    Strategy,
    StrategyLike,
    Transfer,
    TransferRef,
    TransferState,
    TtlLike,
    check_bool,
    check_count,
    check_int,
    check_int32,
    check_optional_int,
    check_optional_str,
    check_str,
    duration_us,
    metadata_text,
    optional_duration_ms,
    optional_duration_us,
    order_id_bytes,
    order_parts,
    reservation_id_bytes,
    state_value,
    strategy_name,
    transfer_id_bytes,
    transfer_state_value,
)

if TYPE_CHECKING:  # pragma: no cover
    from .engine import Engine

__all__ = ["EngineCalls"]


class EngineCalls:
    """The blocking calls of :class:`stockade.Engine` (see there)."""

    _core: _core.Engine
    _bridges: Bridges
    _schema: Optional[str]  # PostgreSQL: the schema it was opened with

    # --- properties and the schema ---

    @property
    def backend(self) -> str:
        """``"memory"`` or ``"postgres"``."""
        return self._core.backend

    @property
    def strategy(self) -> Strategy:
        """The default strategy of this engine."""
        return Strategy(self._core.default_strategy)

    def migrate(self, *, to: Optional[int] = None) -> List[str]:
        """Creates or upgrades the schema; returns the names of the migrations applied.
        With every migration applied, it also makes this release's statement routines
        that are missing (see docs/postgres.md, PgBouncer); they are not in the list.

        ``to`` stops after the migration with that number (default: apply all). Idempotent,
        and safe when several processes run it at once. The memory store has no schema, so
        there it applies nothing."""
        return self._core.migrate(up_to=migration_number(to))

    def migration_plan(self, *, to: Optional[int] = None) -> List[Tuple[str, str]]:
        """What :meth:`migrate` would run now, without running it: ``(name, SQL)`` pairs,
        first ``"(create schema)"`` if the schema does not exist yet, or ``"(bookkeeping)"``
        if it exists without a migration table, then each missing migration
        with the schema name filled in, then ``"(statement routines)"`` (the names of the
        PL/pgSQL functions that connections behind a transaction pooler call, which
        :meth:`migrate` makes once every migration is applied) if any are missing.
        ``InvalidState`` if an applied migration differs from this build's. Empty on the
        memory store."""
        plan = self._core.migration_plan(up_to=migration_number(to))
        return [(str(name), str(sql)) for name, sql in plan]

    def drop_schema(self, *, confirm: str) -> None:
        """Drops this engine's schema and everything in it (``DROP SCHEMA ... CASCADE``):
        for demos and tests. ``confirm`` must repeat the schema's name. Nothing happens on
        the memory store."""
        check_str("confirm", confirm)
        if self._schema is not None and confirm != self._schema:
            raise InvalidArgument("confirm must repeat the name of the schema to drop")
        self._core.drop_schema()  # the memory store's does nothing

    # --- stock ---

    def restock(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
        reason: Optional[str] = None,
        actor: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> StockLevel:
        """Adds ``qty`` units to on_hand, creating the row if it does not exist.

        Raises ``Discontinued`` on a discontinued row, and ``LeaseHeld`` while another
        holder's lease is live unless ``fencing_token`` is that lease's token. ``reason``
        and ``actor`` (each at most 200 bytes, e.g. ``reason="return"``,
        ``actor="pos-17"``) go into the change's journal entry (:meth:`movements`).

        ``idempotency_key``: the same key with the same request returns the first call's
        outcome without a second effect (also after a lost commit); with another request
        it raises ``IdempotencyConflict`` (the key rules of :meth:`reserve`)."""
        return StockLevel._from_core(
            self._core.restock(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                qty=check_int("qty", qty),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
                reason=check_optional_str("reason", reason) or "",
                actor=check_optional_str("actor", actor) or "",
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def set_on_hand(
        self,
        sku: str,
        on_hand: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
        reason: Optional[str] = None,
        actor: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> StockLevel:
        """Sets on_hand (a stock count). What is reserved must stay covered by
        ``on_hand + backorder_limit`` (else ``InvalidState``). ``reason``, ``actor`` and
        ``idempotency_key`` as with :meth:`restock` (a keyed one raises ``NotSupported``
        on a SKU with hot-row slots)."""
        return StockLevel._from_core(
            self._core.set_on_hand(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                on_hand=check_int("on_hand", on_hand),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
                reason=check_optional_str("reason", reason) or "",
                actor=check_optional_str("actor", actor) or "",
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def set_backorder_limit(
        self,
        sku: str,
        limit: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Lets up to ``limit`` units be held or sold beyond on_hand (backorders and
        preorders); 0, the default of every row, allows none.

        The row keeps ``0 <= reserved <= on_hand + backorder_limit`` (a CHECK constraint
        on PostgreSQL). Lowering the limit below what is already promised beyond on_hand
        raises ``InvalidState``."""
        return StockLevel._from_core(
            self._core.set_backorder_limit(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                limit=check_int("limit", limit),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def set_safety_stock(
        self,
        sku: str,
        units: int,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Keeps ``units`` on hand back from sale at the row (0, the default, keeps none).

        ``available`` becomes ``on_hand + backorder_limit - reserved - safety_stock -
        damaged - quality_control``, never below zero, and every strategy's holds and sells
        respect it, batched ones too. It is a floor, not a bucket: it may exceed what is
        free (``available`` is then 0), holds that exist keep their units, and restocks and
        counts are not refused by it. Not built for a SKU with hot-row slots
        (``NotSupported``); ``set_slots`` refuses a row that withholds units
        (``InvalidState``)."""
        return StockLevel._from_core(
            self._core.set_safety_stock(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                units=check_int("units", units),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def move_units(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        from_state: str = "available",
        to_state: str = "damaged",
        reason: Optional[str] = None,
        actor: Optional[str] = None,
        idempotency_key: Optional[str] = None,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Moves ``qty`` units on hand from one state to another, in one write under the
        row's lock.

        States: ``"available"`` (free units: on hand, neither held nor in another state),
        ``"damaged"`` and ``"quality_control"`` (on hand, never held or sold), and
        ``"written_off"``, a destination only: the units leave on_hand. Too few units in
        the source state raises ``OutOfStock`` (from available) or ``InvalidState``, and
        changes nothing. The safety stock is a floor on sales, not a state: units it keeps
        back are free units and can be moved. ``reason`` and ``actor`` go on the journal
        entry (cause ``move`` or ``write_off``); ``idempotency_key`` as with
        :meth:`restock`. Not built for a SKU with hot-row slots (``NotSupported``)."""
        return StockLevel._from_core(
            self._core.move_units(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                qty=check_int("qty", qty),
                from_state=check_str("from_state", from_state),
                to_state=check_str("to_state", to_state),
                reason=check_optional_str("reason", reason) or "",
                actor=check_optional_str("actor", actor) or "",
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def transfer(
        self,
        sku: str,
        qty: int,
        *,
        source: str,
        destination: str,
        reason: Optional[str] = None,
        actor: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Transfer:
        """Sends ``qty`` units of ``sku`` from ``source`` to ``destination``, in transit.

        In one transaction both rows are locked (in key order) and the units leave the
        source's on_hand at once: only its free units (on hand, neither held nor withheld
        from sale; never backorders), else ``OutOfStock`` and nothing moves. They show as
        ``incoming`` at the destination (its row is made if it has none) until
        :meth:`receive` or :meth:`cancel_transfer`. A discontinued source, or a live lease
        on either row, refuses it. ``reason`` and ``actor`` go on the journal entries
        (causes ``transfer_out`` and ``transfer_in``, the transfer's id as ``ref``).
        ``idempotency_key`` as with :meth:`restock`: without one, a COMMIT lost on the way
        answers ``InDoubt``; with one, a retry settles it."""
        return Transfer._from_core(
            self._core.transfer(
                sku=check_str("sku", sku),
                qty=check_int("qty", qty),
                source=check_str("source", source),
                destination=check_str("destination", destination),
                reason=check_optional_str("reason", reason),
                actor=check_optional_str("actor", actor),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def receive(
        self,
        transfer: TransferRef,
        *,
        accepted: int,
        rejected: int = 0,
        idempotency_key: Optional[str] = None,
    ) -> Transfer:
        """Receives units of a transfer at its destination, in one transaction: ``accepted``
        go on hand there, ``rejected`` are written off (journal causes ``receive`` and
        ``reject``). Both leave ``incoming``. In parts if need be: more than is still in
        transit raises ``InvalidState`` and changes nothing. A live lease on the
        destination refuses it (``LeaseHeld``)."""
        return Transfer._from_core(
            self._core.transfer_step(
                id=transfer_id_bytes(transfer),
                cancel=False,
                accepted=check_int("accepted", accepted),
                rejected=check_int("rejected", rejected),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def cancel_transfer(
        self, transfer: TransferRef, *, idempotency_key: Optional[str] = None
    ) -> Transfer:
        """Sends every unit of a transfer that is still in transit back on hand at its
        source, in one transaction (journal cause ``transfer_cancel`` on both rows).
        Nothing in transit raises ``InvalidState``."""
        return Transfer._from_core(
            self._core.transfer_step(
                id=transfer_id_bytes(transfer),
                cancel=True,
                accepted=0,
                rejected=0,
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def get_transfer(self, transfer: TransferRef) -> Transfer:
        """The transfer as committed; ``NotFound`` if there is none."""
        return Transfer._from_core(self._core.get_transfer(id=transfer_id_bytes(transfer)))

    def transfers(
        self,
        *,
        sku: Optional[str] = None,
        state: Optional[Union[TransferState, str]] = None,
        after: Optional[TransferRef] = None,
        limit: int = 100,
    ) -> List[Transfer]:
        """Transfers in id order (the order they were made in), optionally one SKU's or in
        one state; at most ``limit`` (1 to ``TRANSFERS_LIMIT_MAX``, 1000) past ``after``
        (pass the last one for the next page)."""
        made = self._core.transfers(
            sku=check_optional_str("sku", sku),
            state=None if state is None else transfer_state_value(state),
            after=None if after is None else transfer_id_bytes(after),
            limit=in_range("limit", limit, 1, _core.TRANSFERS_LIMIT_MAX),
        )
        return [Transfer._from_core(t) for t in made]

    def discontinue(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Soft-deletes the stock row: it stays as a tombstone (``discontinued=True``).

        Afterwards ``reserve``, ``reserve_order``, ``sell``, ``restock`` and
        ``set_on_hand`` raise ``Discontinued`` (HTTP 410), while holds that exist can still
        be confirmed, released or extended, and expire as usual. Discontinuing a
        discontinued row changes nothing. ``NotFound`` if the row never existed. A SKU
        with hot-row slots is discontinued on all of its rows in one transaction."""
        return self._set_discontinued(sku, True, location, expected_version, fencing_token)

    def reinstate(
        self,
        sku: str,
        *,
        location: str = DEFAULT_LOCATION,
        expected_version: Optional[int] = None,
        fencing_token: Optional[int] = None,
    ) -> StockLevel:
        """Undoes :meth:`discontinue`; on a row that is not discontinued, changes nothing."""
        return self._set_discontinued(sku, False, location, expected_version, fencing_token)

    def _set_discontinued(
        self,
        sku: str,
        discontinued: bool,
        location: str,
        expected_version: Optional[int],
        fencing_token: Optional[int],
    ) -> StockLevel:
        return StockLevel._from_core(
            self._core.set_discontinued(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                discontinued=discontinued,
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
            )
        )

    def stock(self, sku: str, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """The committed stock row (``NotFound`` if there is none). For a SKU with
        hot-row slots, its rows summed from one snapshot; ``version`` is the sum of their
        versions, which every write moves."""
        return StockLevel._from_core(
            self._core.stock(sku=check_str("sku", sku), location=check_str("location", location))
        )

    def stock_by_location(
        self, sku: str, *, after: Optional[str] = None, limit: int = 100
    ) -> Dict[str, StockLevel]:
        """The SKU at every location where it has a row, as :meth:`stock` gives each
        (hot-row slots summed): ``{location: StockLevel}`` in bytewise order of location.
        At most ``limit`` (1 to ``LOCATIONS_LIMIT_MAX``, 1000) at a time: pass the last
        location as ``after`` for the next page. Each location is read on its own, so the
        levels are not one snapshot; a pool's total is their sum."""
        levels = self._core.stock_by_location(
            sku=check_str("sku", sku),
            after=check_optional_str("after", after),
            limit=in_range("limit", limit, 1, _core.LOCATIONS_LIMIT_MAX),
        )
        return {level.location: StockLevel._from_core(level) for level in levels}

    def set_slots(self, sku: str, slots: int, *, location: str = DEFAULT_LOCATION) -> StockLevel:
        """Spreads the SKU's free units over ``slots`` rows (hot-row slots, 1 to 64), so
        that as many batches can each hold a row lock and commit at once. Reserves and
        sells then go to the engine's ``home_slot`` (batched ones to a row whose batcher
        is idle, so that one process's batches are in flight on several rows); a slot without
        room takes free units from the others (every row locked, in order) before it
        refuses, so ``OutOfStock`` still means the SKU as a whole is short. ``stock()``
        sums the rows; ``restock`` and ``set_on_hand`` spread over them; If-Match
        (``expected_version``) names the summed version. Fewer slots than the SKU has
        takes them away (``1``: one row again): the rows past ``slots`` retire, their free
        units move to the others at once, and the holds on them stay until confirmed,
        released or expired. A SKU with a live lease or a backorder limit cannot take
        slots (``InvalidState``); leases, fencing tokens and backorder limits raise
        ``NotSupported`` on a slotted SKU, or while a retired row still keeps units
        (``discontinue`` and ``reinstate`` set every row at once). Returns the SKU's
        summed level. They pay where several processes send one SKU batches and a commit
        flush is slow against CPU; see docs/scaling-out.md for what they measured.
        ``auto`` makes them by itself when it sees several processes batch one row
        (``auto_slots_max``), and merges them back once the SKU has cooled
        (``auto_slots_cool``; docs/hot-row.md, "Automatic slots")."""
        return StockLevel._from_core(
            self._core.set_slots(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                slots=check_int32("slots", slots),
            )
        )

    def slot_count(self, sku: str, *, location: str = DEFAULT_LOCATION) -> int:
        """How many of the SKU's rows take new reserves (its active hot-row slots): 1
        without slots or after they were taken away, 0 if the SKU has no row."""
        return int(
            self._core.slot_count(
                sku=check_str("sku", sku), location=check_str("location", location)
            )
        )

    def sell(
        self,
        sku: str,
        qty: int,
        *,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        fencing_token: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        ref: Optional[str] = None,
    ) -> StockLevel:
        """Sells ``qty`` units at once (no hold): on_hand falls if enough is available.

        With ``fencing_token`` (a lease's), it runs per request, like ``expected_version``.
        ``idempotency_key`` as with :meth:`restock`; under ``batched`` (or ``auto``) a keyed
        sell still batches: its batch claims the key and stores the sale's level with it, in
        the batch's transaction. ``ref`` (a short text: an
        order line's id) goes on the sale's journal entry; a sell with one runs per
        request (a batch cannot give each sale its own entry)."""
        return StockLevel._from_core(
            self._core.sell(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                qty=check_int("qty", qty),
                strategy=strategy_name(strategy),
                nowait=check_bool("nowait", nowait),
                lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
                expected_version=check_optional_int("expected_version", expected_version),
                fencing_token=check_optional_int("fencing_token", fencing_token),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
                ref=check_optional_str("ref", ref),
            )
        )

    # --- purchase limits ---

    def set_purchase_limit(self, group: str, per_buyer: int, skus: Iterable[str]) -> None:
        """At most ``per_buyer`` units per buyer across ``skus`` (at every location): a
        flash sale's "2 per customer across these 5 SKUs".

        Creates the group or replaces its limit and SKU set. ``reserve`` and
        ``reserve_order`` with ``buyer=`` count against it and raise ``LimitExceeded``
        past the limit; releases and expiries give units back, confirmations keep
        counting. It holds under every strategy, ``batched`` included, and without write
        skew: each (group, buyer) has a parent row, locked before any stock row, that two
        concurrent requests by one buyer meet on. A SKU belongs to one group at most
        (``InvalidState`` otherwise, changing nothing). A call without ``buyer`` is not
        limited."""
        skus_checked = limit_skus(skus)
        self._core.set_purchase_limit(
            group=check_str("group", group),
            per_buyer=check_int("per_buyer", per_buyer),
            skus=skus_checked,
        )

    def remove_purchase_limit(self, group: str) -> bool:
        """Drops the group and its buyers' counts; returns whether it existed."""
        return bool(self._core.remove_purchase_limit(group=check_str("group", group)))

    def buyer_held(self, group: str, buyer: str) -> int:
        """The units ``buyer`` holds or bought in ``group`` (what its limit counts)."""
        return int(
            self._core.buyer_held(group=check_str("group", group), buyer=check_str("buyer", buyer))
        )

    # --- leases ---

    def acquire_lease(
        self,
        resource: str,
        ttl: TtlLike,
        *,
        location: str = DEFAULT_LOCATION,
        owner: Optional[str] = None,
    ) -> Lease:
        """Takes the lease on the stock row of SKU ``resource`` for ``ttl``: the offline
        lock for work longer than a transaction (a cycle count, a re-import, an admin
        editing stock levels).

        While it is live, writes to the row (``restock``, ``set_on_hand``, ``sell``,
        ``set_backorder_limit``, ``discontinue``, ``reinstate``) need its ``token`` as
        ``fencing_token``, and ``reserve`` raises ``LeaseHeld``; holds that exist can
        still be confirmed or released. A holder that paused past ``ttl`` loses it: once
        someone else acquires, its token is refused with ``FencingTokenStale``. Expiry runs
        on the database clock. Raises ``LeaseHeld`` while another lease is live. Creates
        the row at zero units if it does not exist. ``owner`` (default: host and process
        id) is shown in the lease, for people."""
        return Lease._from_core(
            self._core.acquire_lease(
                sku=check_str("resource", resource),
                location=check_str("location", location),
                ttl_us=duration_us("ttl", ttl),
                owner=lease_owner(owner),
            )
        )

    def renew_lease(self, lease: Lease, ttl: TtlLike) -> Lease:
        """Extends a live lease to ``ttl`` from now. ``FencingTokenStale`` if it lapsed or
        a newer lease superseded it: then acquire a new one."""
        held = check_lease(lease)
        return Lease._from_core(
            self._core.renew_lease(
                sku=held.resource,
                location=held.location,
                token=held.token,
                ttl_us=duration_us("ttl", ttl),
            )
        )

    def release_lease(self, lease: Lease) -> bool:
        """Ends the lease if it is still live and the row's; returns whether it did
        (False: it had lapsed, or a newer lease superseded it, which stays)."""
        held = check_lease(lease)
        return bool(
            self._core.release_lease(sku=held.resource, location=held.location, token=held.token)
        )

    # --- reservations ---

    def reserve(
        self,
        sku: str,
        qty: int,
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        expected_version: Optional[int] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> Reservation:
        """Holds ``qty`` units for ``ttl`` (default: the engine's ``default_ttl``).

        Raises ``OutOfStock`` if fewer are available. With an ``idempotency_key``, the same
        request returns the same reservation; a different one raises ``IdempotencyConflict``.
        On PostgreSQL, a connection lost during COMMIT raises ``InDoubt``: retry with the
        same ``idempotency_key`` to get the reservation if it committed, or make it if not.
        With a ``buyer``, the purchase limit of the SKU's group applies (``LimitExceeded``;
        see :meth:`set_purchase_limit`). ``ref`` (a short text: an order line's id) and
        ``metadata`` (a dict that is a JSON object, at most ``METADATA_BYTES_MAX`` bytes)
        are kept with the reservation (batched or not), and :meth:`reservations` finds it
        by ``ref``.
        """
        return Reservation._from_core(
            self._core.reserve(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                qty=check_int("qty", qty),
                ttl_us=optional_duration_us("ttl", ttl),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
                strategy=strategy_name(strategy),
                nowait=check_bool("nowait", nowait),
                lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
                expected_version=check_optional_int("expected_version", expected_version),
                buyer=check_optional_str("buyer", buyer),
                ref=check_optional_str("ref", ref),
                metadata=metadata_text(metadata),
            )
        )

    def reserve_order(
        self,
        items: Mapping[OrderKey, int],
        *,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        location: str = DEFAULT_LOCATION,
        strategy: Optional[StrategyLike] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> Order:
        """Holds every line or none: ``{sku: qty}`` (or ``{(sku, location): qty}``).

        Rows are locked in sorted (sku, location) order, so concurrent orders cannot
        deadlock. Returns the :class:`Order`: its id and one reservation per line, in the
        order of ``items`` (it is a sequence of them). Step it whole with
        :meth:`confirm_order`, :meth:`release_order` and :meth:`extend_order`, or each
        line on its own. With a ``buyer``, every line counts against the purchase limit of
        its SKU's group. ``ref`` and ``metadata`` as with :meth:`reserve`, kept with every
        line.
        """
        return Order._from_lines(
            reservations(
                self._core.reserve_order(
                    lines=order_lines(items, check_str("location", location)),
                    ttl_us=optional_duration_us("ttl", ttl),
                    idempotency_key=check_optional_str("idempotency_key", idempotency_key),
                    strategy=strategy_name(strategy),
                    nowait=check_bool("nowait", nowait),
                    lock_timeout_ms=optional_duration_ms("lock_timeout", lock_timeout),
                    buyer=check_optional_str("buyer", buyer),
                    ref=check_optional_str("ref", ref),
                    metadata=metadata_text(metadata),
                )
            )
        )

    def allocate(
        self,
        sku: str,
        qty: int,
        *,
        locations: Iterable[str],
        policy: str = "priority",
        split: bool = True,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        strategy: Optional[StrategyLike] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> Order:
        """Holds ``qty`` of ``sku`` from a pool of ``locations``, all or nothing.

        The split is decided on the pool's rows, locked in key order, in the transaction
        that writes the holds: nothing read before the lock is trusted after it, so two
        buyers can never both be promised a location's last unit. ``policy="priority"``
        takes from the locations in the order given, as much as each has;
        ``"most_available"`` from the location with the most free units down.
        ``split=False`` takes the whole quantity from one location or refuses. Returns an
        :class:`Order`: one reservation per location used, in the pool's order, stepped
        whole with :meth:`confirm_order` and the like or line by line. A refusal raises
        ``OutOfStock`` whose ``pool`` maps each location to its free units, and changes
        nothing. ``idempotency_key``, ``buyer``, ``ref`` and ``metadata`` as with
        :meth:`reserve_order`. On a hot SKU (``batched``, or ``auto``) a ``priority``
        allocation without a key walks the pool through the hot-row batcher, a batched
        hold of the whole quantity per location; otherwise it runs per request. The
        manual's Locations page says what each guarantees."""
        return Order._from_lines(
            reservations(
                self._core.allocate(
                    wants=[(check_str("sku", sku), check_int("qty", qty))],
                    **allocation_options(
                        locations,
                        policy,
                        split,
                        ttl,
                        idempotency_key,
                        strategy,
                        nowait,
                        lock_timeout,
                        buyer,
                        ref,
                        metadata,
                    ),
                )
            )
        )

    def allocate_order(
        self,
        items: Mapping[str, int],
        *,
        locations: Iterable[str],
        policy: str = "priority",
        split: bool = True,
        ttl: Optional[TtlLike] = None,
        idempotency_key: Optional[str] = None,
        strategy: Optional[StrategyLike] = None,
        nowait: bool = False,
        lock_timeout: Optional[TtlLike] = None,
        buyer: Optional[str] = None,
        ref: Optional[str] = None,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> Order:
        """Holds every line of ``{sku: qty}`` from a pool of ``locations``, all or nothing.

        One location that can fill the whole order is preferred (fewest shipments: the
        first in the pool's order, or with ``most_available`` the one with the most free
        units of the order's SKUs). If none can, ``split=True`` allocates each line as
        :meth:`allocate` does, and ``split=False`` refuses. Decided on the locked rows, in
        one transaction, like :meth:`allocate`; returns the :class:`Order`, its lines in
        the order of ``items``, then the pool's."""
        return Order._from_lines(
            reservations(
                self._core.allocate(
                    wants=allocation_wants(items),
                    **allocation_options(
                        locations,
                        policy,
                        split,
                        ttl,
                        idempotency_key,
                        strategy,
                        nowait,
                        lock_timeout,
                        buyer,
                        ref,
                        metadata,
                    ),
                )
            )
        )

    def confirm(
        self,
        id: ReservationId,
        *,
        qty: Optional[int] = None,
        release_rest: bool = False,
        expected_version: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation:
        """Sells ``qty`` of the held units (default: all of them): they leave on_hand.

        A part leaves the rest held, with its expiry; ``release_rest=True`` releases the
        rest in the same step instead (ship 2 of 3 and cancel the third: one call, one
        transaction). The state becomes ``confirmed`` once nothing is held. More than is
        held raises ``InvalidState`` and changes nothing; ``ReservationExpired`` past
        expiry. With ``idempotency_key``, a retry returns the reservation as the first call
        left it, without a second step (batched or not: the batch stores the outcome with
        the key)."""
        return Reservation._from_core(
            self._core.confirm(
                id=reservation_id_bytes(id),
                expected_version=check_optional_int("expected_version", expected_version),
                qty=check_optional_int("qty", qty),
                release_rest=check_bool("release_rest", release_rest),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def release(
        self,
        id: ReservationId,
        *,
        qty: Optional[int] = None,
        expected_version: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation:
        """Gives back ``qty`` of the held units (default: all of them): they become
        available again. A part leaves the rest held; once nothing is held the state
        is ``confirmed`` if any unit was sold, else ``released``. ``idempotency_key`` as
        with :meth:`confirm`."""
        return Reservation._from_core(
            self._core.release(
                id=reservation_id_bytes(id),
                expected_version=check_optional_int("expected_version", expected_version),
                qty=check_optional_int("qty", qty),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def extend(
        self,
        id: ReservationId,
        *,
        ttl: TtlLike,
        expected_version: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation:
        """Moves a live hold's expiry to now + ``ttl``. ``idempotency_key`` as with
        :meth:`confirm`."""
        return Reservation._from_core(
            self._core.extend(
                id=reservation_id_bytes(id),
                ttl_us=duration_us("ttl", ttl),
                expected_version=check_optional_int("expected_version", expected_version),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def resize(
        self,
        id: ReservationId,
        qty: int,
        *,
        expected_version: Optional[int] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation:
        """Sets how many units a live hold holds: ``qty`` from now on, its expiry as it
        was (an order line that grows or shrinks before it ships).

        Growing passes the guards of a new hold, in one transaction with the hold: the
        units must be free on the hold's row (on a SKU with hot-row slots, free units of
        its other rows move there first), the row open, and the buyer's purchase limit
        must allow them. A refusal (``OutOfStock``, ``LimitExceeded``, ...) changes
        nothing. Shrinking gives units back at once; they count as ``released``. The
        argument sets ``held``: on a growth the ``qty`` field goes up by the difference,
        on a shrink it stays as it was (so a growth that would take it past
        ``QUANTITY_MAX`` raises ``InvalidState``). ``idempotency_key`` as with
        :meth:`confirm`."""
        return Reservation._from_core(
            self._core.resize(
                id=reservation_id_bytes(id),
                qty=check_int("qty", qty),
                expected_version=check_optional_int("expected_version", expected_version),
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    def return_units(
        self,
        id: ReservationId,
        qty: int,
        *,
        restock: bool = True,
        location: Optional[str] = None,
        expected_version: Optional[int] = None,
        reason: Optional[str] = None,
        actor: Optional[str] = None,
        idempotency_key: Optional[str] = None,
    ) -> Reservation:
        """Takes back ``qty`` sold units of a reservation (a return), in one transaction
        under the reservation's lock: never more than it confirmed and has not returned
        yet (``OverReturn``, an ``InvalidState``; nothing changed), whatever races it.

        ``restock=True`` puts them back on hand, sellable, at the SKU's own row of
        ``location`` (default: the reservation's), creating that row if needed;
        ``restock=False`` records the return on the reservation only (damaged units).
        The buyer's purchase-limit count drops by ``qty``. With ``restock=True`` the
        change is journaled as cause ``return``, with ``reason`` and ``actor``;
        ``restock=False`` moves no stock row and writes no journal entry. A return may
        come while part of the hold is still held. A reservation purged by retention is
        ``NotFound``. ``idempotency_key`` as with :meth:`confirm`: a retried return is
        taken once."""
        return Reservation._from_core(
            self._core.return_units(
                id=reservation_id_bytes(id),
                qty=check_int("qty", qty),
                restock=check_bool("restock", restock),
                location=check_optional_str("location", location),
                expected_version=check_optional_int("expected_version", expected_version),
                reason=check_optional_str("reason", reason) or "",
                actor=check_optional_str("actor", actor) or "",
                idempotency_key=check_optional_str("idempotency_key", idempotency_key),
            )
        )

    # --- orders as one handle ---

    def _order_parts(
        self, order: OrderRef, qty: Optional[Mapping[LineRef, int]]
    ) -> List[Tuple[bytes, int]]:
        if qty is None:
            return []
        named = any(isinstance(k, (str, tuple)) for k in qty) if isinstance(qty, Mapping) else False
        # A line named by its sku needs the order's lines (which never change): the Order
        # given, or the order read back.
        if isinstance(order, Order):
            return order_parts(order.lines, qty)
        return order_parts(self.order(order).lines if named else (), qty)

    def confirm_order(
        self,
        order: OrderRef,
        *,
        qty: Optional[Mapping[LineRef, int]] = None,
        release_rest: bool = False,
        idempotency_key: Optional[str] = None,
    ) -> Order:
        """Sells what every line of ``order`` holds, in one transaction: the whole order
        as it stands, or nothing.

        ``qty`` confirms parts instead: ``{line: units}``, each line named by its
        :class:`Reservation`, its id, its sku, or ``(sku, location)``; the lines not named
        stay as they are, or with ``release_rest=True`` are released (ship these, cancel
        the rest: every unit not confirmed here is released). Lines that no longer hold
        units are left alone. A line whose hold expired fails a confirm of the whole order
        with ``ReservationExpired``: its expiry is written (as the sweeper would), nothing
        else changes, and a confirm that names the other lines in ``qty`` goes on with
        them. More than a line holds raises ``InvalidState`` and changes nothing; so does
        an order with no line left holding units. Returns the order as written, its lines
        sorted by (sku, location). ``idempotency_key`` as with :meth:`confirm`."""
        return self._order_step(
            "confirm", order, self._order_parts(order, qty), 0, release_rest, idempotency_key
        )

    def release_order(
        self,
        order: OrderRef,
        *,
        qty: Optional[Mapping[LineRef, int]] = None,
        idempotency_key: Optional[str] = None,
    ) -> Order:
        """Gives back what every line of ``order`` holds (or ``qty``'s parts, named as
        with :meth:`confirm_order`), in one transaction. A line whose hold lapsed is
        expired there, and the others are released all the same (but a part that names a
        lapsed line raises ``ReservationExpired``, its expiry written, as with
        :meth:`confirm_order`). Returns the order as written. ``idempotency_key`` as with
        :meth:`confirm`."""
        return self._order_step(
            "release", order, self._order_parts(order, qty), 0, False, idempotency_key
        )

    def extend_order(
        self, order: OrderRef, *, ttl: TtlLike, idempotency_key: Optional[str] = None
    ) -> Order:
        """Moves the expiry of every line of ``order`` that holds units to now + ``ttl``,
        in one transaction: the whole order, or nothing if a line has expired
        (``ReservationExpired``, as with :meth:`confirm_order`). ``idempotency_key`` as
        with :meth:`confirm`."""
        return self._order_step(
            "extend", order, [], duration_us("ttl", ttl), False, idempotency_key
        )

    def _order_step(
        self,
        kind: str,
        order: OrderRef,
        parts: List[Tuple[bytes, int]],
        ttl_us: int,
        release_rest: bool,
        idempotency_key: Optional[str],
    ) -> Order:
        return Order._from_lines(
            reservations(
                self._core.order_step(
                    kind=kind,
                    order_id=order_id_bytes(order),
                    parts=parts,
                    ttl_us=ttl_us,
                    release_rest=check_bool("release_rest", release_rest),
                    idempotency_key=check_optional_str("idempotency_key", idempotency_key),
                )
            )
        )

    def order(
        self, id: Optional[OrderRef] = None, *, idempotency_key: Optional[str] = None
    ) -> Order:
        """The order as committed, by its id (or :class:`Order`) or by the key
        ``reserve_order`` was called with (exactly one of the two); its lines sorted by
        (sku, location). ``NotFound`` if there is none, or retention purged its lines."""
        key = check_optional_str("idempotency_key", idempotency_key)
        order_id = None if id is None else order_id_bytes(id)
        if key is not None and order_id is None:
            made = self._core.order_by_key(idempotency_key=key)
        elif order_id is not None and key is None:
            made = self._core.get_order(order_id=order_id)
        else:
            raise InvalidArgument("order() takes an order id or an idempotency_key (one of them)")
        return Order._from_lines(reservations(made))

    def reservations(
        self,
        *,
        ref: Optional[str] = None,
        order: Optional[OrderRef] = None,
        buyer: Optional[str] = None,
        sku: Optional[str] = None,
        location: Optional[str] = None,
        state: Optional[Union[ReservationState, str]] = None,
        after: Optional[ReservationId] = None,
        limit: int = 100,
    ) -> List[Reservation]:
        """The reservations with ``ref``, of ``order``, or of ``buyer`` (at least one of
        the three, each found through an index), narrowed by the other arguments given; in
        id order (ids are UUIDv7: the order they were made in, to the millisecond). At
        most ``limit`` (1 to ``RESERVATIONS_LIMIT_MAX``, 1000) come back: pass the last
        one's id as ``after`` for the next page."""
        return reservations(
            self._core.find_reservations(
                ref=check_optional_str("ref", ref),
                order_id=None if order is None else order_id_bytes(order),
                buyer=check_optional_str("buyer", buyer),
                sku=check_optional_str("sku", sku),
                location=check_optional_str("location", location),
                state=None if state is None else state_value(state),
                after=None if after is None else reservation_id_bytes(after),
                limit=check_count("limit", limit),
            )
        )

    def reservation(self, id: ReservationId) -> Reservation:
        """The reservation as committed (``NotFound`` if there is none)."""
        return Reservation._from_core(self._core.get_reservation(id=reservation_id_bytes(id)))

    get_reservation = reservation

    def expire_due(self, *, limit: int = 1000) -> int:
        """Expires up to ``limit`` holds past their expiry; returns how many."""
        return self._core.expire_due(
            limit=in_range("limit", limit, 1, _core.OPTION_LIMITS["expire_limit"])
        )

    def purge(self, older_than: TtlLike, *, limit: Optional[int] = None) -> int:
        """Deletes what is older than ``older_than`` and no longer needed; returns how many
        rows went (keys, reservations and finished transfers).

        Oldest first: each idempotency key made before the horizon goes together with its
        reservations, once every one of them is terminal (confirmed, released, expired)
        and last changed before the horizon; then terminal reservations without a key that
        last changed before it; then, within what ``limit`` leaves, finished transfers
        (received or cancelled) last changed before it (one batch per call: a transfer in
        transit is never purged). So a key replays its reservations for at least
        ``older_than``, and a replay never finds them missing. Holds are never purged,
        whatever their age. ``limit`` (default: none) bounds the keys and keyless
        reservations one call takes (a key's reservations go with it). The work runs in
        statements of at most ``purge_batch`` rows (5000) that never lock a stock row
        and skip rows others hold. On PostgreSQL the horizon is on the database clock.
        ``retention=`` on :meth:`postgres` or :meth:`memory` purges in the background
        instead."""
        return int(
            self._core.purge(
                older_than_us=duration_us("older_than", older_than),
                limit=check_optional_int("limit", limit),
            )
        )

    # --- the movement journal, the change feed, stock alerts, the audit ---

    def movements(
        self,
        sku: Optional[str] = None,
        *,
        location: Optional[str] = None,
        since: Optional[datetime] = None,
        after: int = 0,
        limit: int = 1000,
    ) -> List[Movement]:
        """The journal: one entry per change of a stock row, oldest first (docs/journal.md).

        ``sku`` (and ``location``) narrow it to a SKU's rows; ``since`` to entries made at
        or after that time; ``after`` to entries past that ``position`` (to page on:
        pass the last one's). At most ``limit`` (1..100000) entries."""
        since_us = 0
        if since is not None:
            if not isinstance(since, datetime):
                raise InvalidType(f"since must be a datetime, not {type(since).__name__}")
            if since.tzinfo is None:
                raise InvalidArgument("since must be a timezone-aware datetime")
            since_us = epoch_us(since)
        return [
            Movement._from_core(m)
            for m in self._core.movements(
                sku=check_optional_str("sku", sku),
                location=check_optional_str("location", location),
                after=check_int("after", after),
                since_us=since_us,
                limit=check_count("limit", limit),
            )
        ]

    def feed(self, consumer: str, *, start: str = "earliest") -> Feed:
        """Opens the change feed's consumer named ``consumer``, made on first use, and
        returns it at its last committed position (:class:`stockade.Feed`).

        A new consumer starts at the oldest change the journal holds (``start=
        "earliest"``) or at the next one (``"latest"``). Raises ``FeedOverrun`` if
        retention dropped changes it had not committed (see ``feed_lag_max``)."""
        if check_str("start", start) not in ("earliest", "latest"):
            raise InvalidArgument(f"start must be 'earliest' or 'latest', got {start!r}")
        name = check_str("consumer", consumer)
        position = self._core.feed_open(consumer=name, from_start=start == "earliest")
        return Feed(cast("Engine", self), name, position)

    def set_low_stock(
        self, sku: str, threshold: Optional[int], *, location: str = DEFAULT_LOCATION
    ) -> StockLevel:
        """Sets the row's low-stock threshold: the feed marks a change that takes
        ``available`` below it (``low_stock``) or back to it (``recovered``); ``None``
        takes it away. Sold-out and back-in-stock marks need no threshold. Moves the
        row's version. ``NotSupported`` on a SKU with hot-row slots."""
        return StockLevel._from_core(
            self._core.set_low_stock(
                sku=check_str("sku", sku),
                location=check_str("location", location),
                threshold=check_optional_int("threshold", threshold),
            )
        )

    def audit(
        self,
        *,
        sku: Optional[str] = None,
        limit: int = 1000,
        expiry_lag: TtlLike = 300,
    ) -> AuditReport:
        """Checks the invariants from the data itself and lists every violation (at most
        ``limit``), with the row and what was expected (docs/journal.md, "The audit"):
        each row's ``reserved`` equals the sum of its holds; no hold outlived its expiry by
        more than ``expiry_lag`` (PostgreSQL; the sweeper's lag); purchase-limit counts
        cover their buyers' holds; slot rows have their SKU; keys point to reservations;
        the journal's entries chain and add up to each row. Holds no row lock.
        ``report.ok`` proves them only where the audit looked: ``report.unchecked`` lists
        each part a check did not cover, and why (the journal off, rows whose entries were
        purged, the checks that span every SKU when ``sku`` is given), and
        ``report.complete`` is true only when it is empty."""
        started = time.monotonic()
        report = self._core.audit(
            sku=check_optional_str("sku", sku),
            limit=check_count("limit", limit),
            expiry_lag_us=duration_us("expiry_lag", expiry_lag),
        )
        return AuditReport._from_core(report, time.monotonic() - started)

    def purge_movements(self, older_than: TtlLike, *, limit: Optional[int] = None) -> int:
        """Drops journal entries older than ``older_than`` that every feed consumer has
        committed past (or older than ``feed_lag_max``, whatever the consumers: those it
        passes get ``FeedOverrun``); returns how many went. ``journal_retention=`` does
        it in the background."""
        return int(
            self._core.purge_movements(
                older_than_us=duration_us("older_than", older_than),
                limit=check_optional_int("limit", limit),
            )
        )

    # --- figures and advice ---

    def row_counts(self) -> RowCounts:
        """Exact row counts: ``sku_count``, ``reservation_count`` and ``held_count``.

        On PostgreSQL this counts every row (``count(*)``: it costs time in proportion to
        the tables), so it is for tests and audits; :meth:`stats` reports cheap figures
        instead."""
        return cast(RowCounts, self._core.row_counts())

    def metrics(self) -> Metrics:
        """Raw figures of this process for exporters (``stockade.prometheus`` reads them):
        ``calls``, one entry per (operation, strategy) that saw a call, with its outcomes
        (``ok`` or an error code) and its latency histogram (per-bucket counts over
        ``latency_bounds_seconds``, the last bucket +Inf); and the batch size histogram.
        Fixed tables in memory: cheap, whatever the traffic. A batched or async call's
        latency runs from the call to its outcome, queueing included."""
        return cast(Metrics, self._core.metrics())

    def stats(self, *, sku_limit: int = 20) -> EngineStats:
        """Counters per strategy, and the ``sku_limit`` hottest SKUs by requests.

        Its cost does not grow with the tables. ``sku_count``, ``reservation_count`` and
        ``held_count`` are exact on the memory store; on PostgreSQL
        (``counts_exact`` is False) the first two are the statistics collector's live-row
        estimates, and holds are counted up to 10,000 (more reads as 10,000). Use
        :meth:`row_counts` for exact figures."""
        limit = check_count("sku_limit", sku_limit)
        return cast(EngineStats, self._core.stats(sku_limit=limit))

    def recommend(self, sku: str, *, location: str = DEFAULT_LOCATION) -> ClaimAdvice:
        """The strategy this SKU's measured contention points to, with the figures.

        Measured in this process: how many requests for the row arrived while another
        was in flight (the Claim Test's "odds", per row), and the peak in flight. This is
        what ``auto`` acts on. For a hot SKU it also says when hot-row slots
        (:meth:`set_slots`) would pay, and for a slotted SKU which slot this engine uses."""
        strategy, reasons = self._core.recommend(
            sku=check_str("sku", sku), location=check_str("location", location)
        )
        return ClaimAdvice(Strategy(strategy), tuple(reasons))
