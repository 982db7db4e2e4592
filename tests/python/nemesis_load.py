"""The nemesis test's workload: a seeded random mix of calls, each recorded in a history.

Imported by test_nemesis.py for its threads, and run as a script for its second process:

    python nemesis_load.py DSN SEED SECONDS PREFIX HISTORY_FILE

Each call's request and outcome become one record (a dict, JSON-able): what was asked
(``op``, ``sku``, ``qty``, ``key``, ``strategy``; ``target`` and ``part`` for a step of a
reservation, ``order`` and ``ids`` for a step of an order) and what the caller was told
(``out``: "ok" or the error class's name; ``id`` and ``state`` of a reservation it got;
``ids`` of an order's or an allocation's, and an allocation's ``parts``, each id's units;
``units`` per reservation a step answered with; a transfer's ``id`` and ``counts``,
received, rejected and cancelled, as each of its steps answered). The history is checked
afterwards by test_nemesis.py's checker, which knows nothing of how the engine decides.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, Union

import stockade
from support import ALL_STRATEGIES as STRATEGIES
from support import PER_REQUEST_STRATEGIES

SKUS = ["n-0", "n-1", "n-2", "n-3"]
# Allocations take from this pool, in this order (priority); every other call from the
# default location. The annex holds a few units of each SKU (ANNEX), so that allocations
# drain it, then pass it over or split; the checker sums a SKU's rows over locations.
POOL = ["annex", "default"]
ANNEX = 40
LEASED = "lease-0"  # leases and fenced restocks (of one unit each) go to this SKU only
LIMITED = ["n-2", "n-3"]  # one purchase-limit group, "drop", of PER_BUYER units per buyer
PER_BUYER = 6
BUYERS = 8
RESTOCK = 1000  # every restock adds this many: in-doubt restocks are then countable
# Keyed and keyless restocks and sells each move their own size, so that the checker counts
# each class apart: a keyed write applied twice cannot hide in a keyless one's doubt.
STOCK_MOVES = {("restock", True): 1000, ("restock", False): 100_000, ("sell", True): 1}
STOCK_MOVES[("sell", False)] = 10
SHORT_TTL = 1  # seconds: some holds lapse and expire during the run
LONG_TTL = 86400  # seconds: the others outlive any run

Record = Dict[str, Any]
# The steps of a reservation or an order that _step makes.
STEP_OPS = ("confirm", "release", "extend", "resize", "return", "confirm_order", "release_order")
# Transfers go from the default location to the annex (POOL[0]); their steps (receive one
# unit, sometimes rejecting one, or cancel the rest) come from the thread that made them.
TRANSFER_OPS = ("transfer", "receive", "cancel_transfer")


@dataclass
class Mine:
    """What one thread may step besides its holds: reservations with sold units not yet
    returned, and the orders it made (id, line ids)."""

    sold: List[str] = field(default_factory=list)
    orders: List[Tuple[str, List[str]]] = field(default_factory=list)
    transfers: List[str] = field(default_factory=list)  # ids with units in transit

    def forget(self, ids: List[str], held: List[str]) -> None:
        """Steps no more of `ids`, nor of an order with one of them: an in-doubt step's
        targets (a keyed one's retry, in check(), must come after every step made of
        them)."""
        held[:] = [h for h in held if h not in ids]
        self.sold[:] = [s for s in self.sold if s not in ids]
        self.orders[:] = [o for o in self.orders if not set(o[1]) & set(ids)]


def units_of(r: stockade.Reservation) -> List[int]:
    """A reservation's units as the checker models them: qty, held, confirmed, released,
    expired, returned."""
    return [r.qty, r.held, r.confirmed, r.released, r.expired, r.returned]


def engine(dsn: str) -> stockade.Engine:
    return stockade.Engine.postgres(
        dsn,
        pool_size=6,
        lock_timeout=1,
        call_timeout=3,
        cancel_grace=0.5,
        resolve_timeout=2,
        # Holds expire by the workload's own expire_due calls, which the history records;
        # a sweeper's expiries would be changes no call made.
        sweeper=False,
    )


class Workload:
    """Threads that call `eng` at random until stopped; `history` holds every call."""

    def __init__(self, eng: stockade.Engine, seed: int, prefix: str, threads: int) -> None:
        self.eng = eng
        self.seed = seed
        self.prefix = prefix
        self.history: List[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)
        ]

    def start(self) -> Workload:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        assert not any(t.is_alive() for t in self._threads), "a caller never returned"

    def _run(self, t: int) -> None:
        rng = random.Random(f"{self.seed}-{self.prefix}-{t}")
        held: List[str] = []  # ids this thread was told it holds
        mine = Mine()
        for i in range(10**9):
            if self._stop.is_set():
                return
            record = self._one(rng, f"{self.prefix}-{t}-{i}", held, mine)
            with self._lock:
                self.history.append(record)
            if record["out"] not in ("ok", "OutOfStock"):
                time.sleep(0.01)  # the server may be down: do not spin

    def _one(self, rng: random.Random, name: str, held: List[str], mine: Mine) -> Record:
        roll = rng.random()
        sku = rng.choice(SKUS)
        if roll < 0.55 or not held:
            keyed = rng.random() < 0.8
            record: Record = {
                "op": "reserve",
                "sku": sku,
                "qty": rng.randint(1, 3),
                "key": name if keyed else None,
                "strategy": rng.choice(STRATEGIES),
                "ttl": SHORT_TTL if rng.random() < 0.1 else LONG_TTL,
            }
            if sku in LIMITED and rng.random() < 0.5:
                record["buyer"] = f"b-{rng.randrange(BUYERS)}"
        elif roll < 0.62:
            a, b = rng.sample([x for x in SKUS if x not in LIMITED] + LIMITED[:1], 2)
            record = {
                "op": "order",
                "lines": {a: rng.randint(1, 2), b: rng.randint(1, 2)},
                "key": name,
                "strategy": rng.choice(PER_REQUEST_STRATEGIES),
            }
        elif roll < 0.67:
            keyed = rng.random() < 0.5  # a keyed one runs on the locked pool, never batched
            record = {
                "op": "allocate",
                "sku": rng.choice([x for x in SKUS if x not in LIMITED]),
                "qty": rng.randint(1, 4),
                "key": name if keyed else None,
                "strategy": rng.choice(STRATEGIES),
                "policy": rng.choice(["priority", "most_available"]),
            }
        elif roll < 0.85:
            record = self._step(rng, held, mine)
        elif roll < 0.89:
            keyed = rng.random() < 0.5
            record = {"op": "restock", "sku": sku, "key": name if keyed else None}
            record["qty"] = STOCK_MOVES[("restock", keyed)]
        elif roll < 0.93:
            keyed = rng.random() < 0.7
            record = {
                "op": "sell",
                "sku": sku,
                "key": name if keyed else None,
                "strategy": rng.choice(STRATEGIES),
                "qty": STOCK_MOVES[("sell", keyed)],
            }
        elif roll < 0.95:
            return self._leased(name)
        elif roll < 0.98:
            record = self._transfer_op(rng, name, mine)
        else:
            record = {"op": "expire_due"}
        record["t0"] = time.monotonic()
        try:
            result = self._call(record)
            record["out"] = "ok"
            if isinstance(result, stockade.Reservation):
                record["id"], record["state"] = str(result.id), result.state.value
                if record["op"] == "reserve":
                    held.append(record["id"])
                else:
                    self._stepped(record, [result], held, mine)
            if isinstance(result, stockade.Order) and record["op"] in ("order", "allocate"):
                record["ids"] = [str(r.id) for r in result]  # in line order
                if record["op"] == "allocate":  # each location's part of the quantity
                    record["parts"] = {str(r.id): r.qty for r in result}
                held.extend(record["ids"])
                mine.orders.append((str(result.id), record["ids"]))
            elif isinstance(result, stockade.Order):
                self._stepped(record, list(result), held, mine)
            if isinstance(result, stockade.Transfer):
                record["id"] = str(result.id)
                record["counts"] = [result.received, result.rejected, result.cancelled]
                if result.in_transit > 0:
                    mine.transfers.append(record["id"])
        except stockade.StockadeError as e:
            record["out"] = type(e).__name__
            if isinstance(e, stockade.InDoubt) and record["op"] in STEP_OPS:
                mine.forget(record.get("ids") or [record["target"]], held)
        record["t1"] = time.monotonic()
        return record

    @staticmethod
    def _step(rng: random.Random, held: List[str], mine: Mine) -> Record:
        """A step of a hold this thread has (whole or a part, a resize), a return of units
        it sold, or a step of a whole order it made. The target leaves the thread's lists
        until an answer says what it still has (an in-doubt step's target is dropped)."""
        kinds = ["confirm", "release", "extend", "confirm_part", "release_part", "resize"]
        kinds += ["return"] * bool(mine.sold) + ["confirm_order", "release_order"] * bool(
            mine.orders
        )
        op = rng.choice(kinds)
        # Half the steps carry a key: an in-doubt one is settled by its retry (check()).
        key = f"step-{uuid.uuid4().hex}" if rng.random() < 0.5 else None
        if op == "return":
            target = mine.sold.pop(rng.randrange(len(mine.sold)))
            return {"op": op, "target": target, "qty": 1, "key": key}
        if op.endswith("_order"):
            order, ids = mine.orders.pop(rng.randrange(len(mine.orders)))
            held[:] = [h for h in held if h not in ids]
            return {"op": op, "order": order, "ids": ids, "key": key}
        record: Record = {
            "op": op.removesuffix("_part"),
            "target": held.pop(rng.randrange(len(held))),
            "key": key,
        }
        if op.endswith("_part"):
            record["part"] = 1
        if op == "resize":
            record["qty"] = rng.randint(1, 4)
        return record

    @staticmethod
    def _transfer_op(rng: random.Random, name: str, mine: Mine) -> Record:
        """A transfer of 1 to 3 units to the annex, or a step of one this thread made (it
        leaves the list until an answer says units are still in transit)."""
        key = name if rng.random() < 0.5 else None
        if not mine.transfers or rng.random() < 0.5:
            sku = rng.choice([x for x in SKUS if x not in LIMITED])
            return {"op": "transfer", "sku": sku, "qty": rng.randint(1, 3), "key": key}
        target = mine.transfers.pop(rng.randrange(len(mine.transfers)))
        if rng.random() < 0.3:
            return {"op": "cancel_transfer", "target": target, "key": key}
        return {"op": "receive", "target": target, "rejected": int(rng.random() < 0.3), "key": key}

    @staticmethod
    def _stepped(
        record: Record, now: List[stockade.Reservation], held: List[str], mine: Mine
    ) -> None:
        """An acknowledged step: its answer's units per reservation, for the checker, and
        what the thread may step next."""
        record["units"] = {str(r.id): units_of(r) for r in now}
        for r in now:
            rid = str(r.id)
            if r.held > 0 and rid not in held:
                held.append(rid)
            if r.confirmed > r.returned and rid not in mine.sold:
                mine.sold.append(rid)

    def _leased(self, name: str) -> Record:
        """A short lease on LEASED, then a restock fenced with its token: one record with
        both outcomes (``out`` the lease's, ``write`` the fenced restock's)."""
        record: Record = {"op": "lease", "owner": name, "t0": time.monotonic()}
        try:
            lease = self.eng.acquire_lease(LEASED, 0.5, owner=name)
            record["out"], record["token"] = "ok", lease.token
        except stockade.StockadeError as e:
            record["out"] = type(e).__name__
        record["t1"] = record["w0"] = time.monotonic()
        if "token" in record:
            try:
                self.eng.restock(LEASED, 1, fencing_token=record["token"])
                record["write"] = "ok"
            except stockade.StockadeError as e:
                record["write"] = type(e).__name__
        record["w1"] = time.monotonic()
        return record

    def _call(self, r: Record) -> object:
        return send(self.eng, r)


def send(eng: stockade.Engine, r: Record) -> object:
    """Makes the call `r` asks for (a retry of it, too)."""
    if r["op"] == "reserve":
        return eng.reserve(
            r["sku"],
            r["qty"],
            idempotency_key=r["key"],
            strategy=r["strategy"],
            ttl=r["ttl"],
            buyer=r.get("buyer"),
        )
    if r["op"] == "order":
        return eng.reserve_order(
            r["lines"], ttl=LONG_TTL, idempotency_key=r["key"], strategy=r["strategy"]
        )
    if r["op"] == "allocate":
        return eng.allocate(
            r["sku"],
            r["qty"],
            locations=POOL,
            policy=r["policy"],
            ttl=LONG_TTL,
            idempotency_key=r["key"],
            strategy=r["strategy"],
        )
    key = r.get("key")
    if r["op"] == "transfer":
        return eng.transfer(
            r["sku"], r["qty"], source="default", destination=POOL[0], idempotency_key=key
        )
    if r["op"] == "receive":
        return eng.receive(r["target"], accepted=1, rejected=r["rejected"], idempotency_key=key)
    if r["op"] == "cancel_transfer":
        return eng.cancel_transfer(r["target"], idempotency_key=key)
    if r["op"] == "confirm":
        return eng.confirm(r["target"], qty=r.get("part"), idempotency_key=key)
    if r["op"] == "release":
        return eng.release(r["target"], qty=r.get("part"), idempotency_key=key)
    if r["op"] == "resize":
        return eng.resize(r["target"], r["qty"], idempotency_key=key)
    if r["op"] == "return":
        return eng.return_units(r["target"], r["qty"], idempotency_key=key)
    if r["op"] == "confirm_order":
        return eng.confirm_order(r["order"], idempotency_key=key)
    if r["op"] == "release_order":
        return eng.release_order(r["order"], idempotency_key=key)
    if r["op"] == "extend":
        return eng.extend(r["target"], ttl=LONG_TTL, idempotency_key=key)
    if r["op"] == "restock":
        return eng.restock(r["sku"], r["qty"], idempotency_key=r["key"])
    if r["op"] == "sell":
        return eng.sell(r["sku"], r["qty"], idempotency_key=r["key"], strategy=r["strategy"])
    return eng.expire_due(limit=100)


def opened(dsn: str, seconds: float = 20.0) -> stockade.Engine:
    """engine(dsn), tried again while the server is down: the nemesis may be restarting it
    when this process starts. Within `seconds`, then the last error."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return engine(dsn)
        except stockade.Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: List[str]) -> None:
    dsn, seed, seconds, prefix, path = argv[1], int(argv[2]), float(argv[3]), argv[4], argv[5]
    with opened(dsn) as eng:
        load = Workload(eng, seed, prefix, threads=4).start()
        time.sleep(seconds)
        load.stop()
    with open(path, "w", encoding="utf-8") as out:
        for record in load.history:
            out.write(json.dumps(record) + "\n")


def read_history(path: str) -> List[Record]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Errors a retry waits out: the server is still settling.
TRANSIENT = (
    stockade.InDoubt,
    stockade.Unavailable,
    stockade.DeadlineExceeded,
    stockade.LockTimeout,
    stockade.Overloaded,
)


def settle(eng: stockade.Engine, record: Record) -> Union[object, str, None]:
    """Retries an in-doubt keyed call with its request until it settles: its answer, or
    the name of the definite error it settles to (the first call did not land, and the
    request is refused now); None if it never settles."""
    for _ in range(50):
        try:
            return send(eng, record)
        except TRANSIENT:
            time.sleep(0.1)
        except stockade.StockadeError as e:
            return type(e).__name__
    return None


def resolve(eng: stockade.Engine, record: Record) -> Union[List[str], str, None]:
    """An in-doubt keyed reserve, order, allocation, restock or sell settled (settle()): the ids a
    reserve or order settles to ([] for a keyed restock or sell, which has now taken
    effect exactly once), or the definite error (as a buyer whose limit filled up
    meanwhile is told); None if it never settles."""
    made = settle(eng, record)
    if made is None or isinstance(made, str):
        return made
    if isinstance(made, (stockade.StockLevel, stockade.Transfer)):
        return []
    return [str(r.id) for r in (made if isinstance(made, stockade.Order) else [made])]  # type: ignore[union-attr]


def resolve_step(eng: stockade.Engine, record: Record) -> Union[Dict[str, List[int]], str, None]:
    """An in-doubt keyed step settled (settle()): the units its answer gives each
    reservation (the first call's, if it landed: a replay; else the step, made now), or
    the definite error; None if it never settles."""
    made = settle(eng, record)
    if made is None or isinstance(made, str):
        return made
    lines = made if isinstance(made, stockade.Order) else [made]
    return {str(r.id): units_of(r) for r in lines}  # type: ignore[union-attr]


if __name__ == "__main__":
    main(sys.argv)
