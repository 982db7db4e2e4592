"""Writes the notebooks of this directory from the cells below (run it after editing).

The notebooks are kept as plain cell lists here so that changes review as code; `make
notebooks` rewrites the .ipynb files and executes them in place, so the committed copies
carry their outputs. Every notebook reads STOCKADE_NB_SCALE: "full" (the default) for
the figures worth looking at, "small" for CI, which executes all of them.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """import os
SMALL = os.environ.get("STOCKADE_NB_SCALE", "full") == "small"
# One colour and one marker per strategy, the same in every panel of every notebook.
STYLE = {
    "atomic": {"color": "#1f77b4", "marker": "o", "linestyle": "-"},
    "pessimistic": {"color": "#d62728", "marker": "s", "linestyle": "-"},
    "advisory": {"color": "#9467bd", "marker": "D", "linestyle": "-"},
    "optimistic": {"color": "#ff7f0e", "marker": "^", "linestyle": "-"},
    "batched": {"color": "#2ca02c", "marker": "v", "linestyle": "--"},
    "auto": {"color": "#8c564b", "marker": "P", "linestyle": ":"},
}"""

QUICKSTART = [
    new_markdown_cell("""# stockade quickstart

Stock, reservations and their lifecycle, and the errors a caller handles, on the embedded
memory store (the same calls run on PostgreSQL with `stockade.Engine.postgres(dsn)`).
A `ManualClock` lets us move time to watch a hold expire, without sleeping."""),
    new_code_cell("""from datetime import datetime, timedelta, timezone
import stockade

clock = stockade.ManualClock(datetime(2027, 1, 1, 12, 0, tzinfo=timezone.utc))
eng = stockade.Engine.memory(clock=clock)
eng.restock("tshirt-m", 10)"""),
    new_markdown_cell("""## Reserve, confirm, release

A reservation holds units for a TTL. Confirming sells them; releasing returns them.
`available` is what is left to reserve."""),
    new_code_cell("""r = eng.reserve("tshirt-m", 3, ttl=timedelta(minutes=10))
print(r.state, r.qty, r.expires_at, "etag", r.etag)
print(eng.stock("tshirt-m"))
sold = eng.confirm(r.id, expected_version=r.version)
print(sold.state, eng.stock("tshirt-m"))
other = eng.reserve("tshirt-m", 2)
print(eng.release(other.id).state, eng.stock("tshirt-m").available)"""),
    new_markdown_cell("""## A hold that lapses

Past its `expires_at` a hold counts as expired: confirming it raises
`ReservationExpired` and its units come back. `expire_due` sweeps the rest."""),
    new_code_cell("""late = eng.reserve("tshirt-m", 4, ttl=timedelta(minutes=5))
clock.advance(timedelta(minutes=6))
try:
    eng.confirm(late.id)
except stockade.ReservationExpired as e:
    print("ReservationExpired:", e)
print(eng.reservation(late.id).state, eng.stock("tshirt-m").available)
eng.reserve("tshirt-m", 1, ttl=60)
clock.advance(120)
print("expired by the sweep:", eng.expire_due())"""),
    new_markdown_cell("""## Errors a caller handles

Every error derives from `stockade.StockadeError` and says what it is about."""),
    new_code_cell("""level = eng.stock("tshirt-m")
for attempt in (
    lambda: eng.reserve("tshirt-m", 1_000),                                  # OutOfStock
    lambda: eng.set_on_hand("tshirt-m", 3, expected_version=level.version - 1),  # VersionConflict
    lambda: eng.reserve("no-such-sku", 1),                                   # NotFound
    lambda: eng.reserve("tshirt-m", 0),                                      # InvalidArgument
):
    try:
        attempt()
    except stockade.StockadeError as e:
        print(f"{type(e).__name__:>16}: {e}")"""),
    new_markdown_cell("""## The journal: a SKU's level from its movements

Every change of a stock row is journaled with its cause (docs/journal.md), so a SKU's
history can be replayed and plotted: here a day of deliveries, holds, sales and a stock
count, then `on_hand` and `available` read back from `movements()`. The alerts mark the
changes that crossed the low-stock line or sold the SKU out."""),
    new_code_cell("""import random
import matplotlib.pyplot as plt

eng.restock("teapot", 40, reason="delivery", actor="dock-1")
eng.set_low_stock("teapot", 10)
rng = random.Random(7)
holds = []
for step in range(24 * 4):  # a day, a quarter of an hour at a time
    clock.advance(timedelta(minutes=15))
    eng.expire_due()  # what a sweeper does
    try:
        if rng.random() < 0.6:
            holds.append(eng.reserve("teapot", rng.randint(1, 3), ttl=timedelta(hours=2)))
        if holds and rng.random() < 0.45:
            eng.confirm(holds.pop().id)  # the newest checks out
        elif holds and rng.random() < 0.1:
            eng.release(holds.pop().id)
        if step % 32 == 31:
            eng.restock("teapot", 30, reason="delivery", actor="dock-1")
        if step == 60:
            level = eng.stock("teapot")
            eng.set_on_hand("teapot", max(level.reserved, level.on_hand - 2), reason="count")
    except stockade.StockadeError:
        pass  # sold out, or a hold that lapsed before its confirm
moves = eng.movements("teapot")
fig, ax = plt.subplots(figsize=(8, 3.5), layout="constrained")
ax.step([m.at for m in moves], [m.on_hand for m in moves], where="post", label="on_hand")
ax.step([m.at for m in moves], [m.available for m in moves], where="post", label="available")
alerts = [m for m in moves if m.alerts & {"low_stock", "sold_out"}]
ax.scatter([m.at for m in alerts], [m.available for m in alerts], color="red", zorder=3,
           label="low stock / sold out")
ax.axhline(10, color="grey", linestyle=":", linewidth=1)
ax.set_ylabel("units"); ax.legend(loc="upper right"); ax.set_title("teapot, from its journal")
ax.tick_params(axis="x", labelrotation=30)
fig.suptitle("A SKU's level, replayed from the movement journal")
plt.show()
from collections import Counter
print(Counter(m.cause for m in moves))
print(eng.audit())"""),
    new_markdown_cell("""## Idempotency keys

Retrying a request with the same key returns the same reservation, so a client that lost
its answer (a timeout, `InDoubt`) can simply retry. A different request under the same
key is refused."""),
    new_code_cell("""first = eng.reserve("tshirt-m", 1, idempotency_key="order-77")
again = eng.reserve("tshirt-m", 1, idempotency_key="order-77")
print(first.id == again.id, eng.stock("tshirt-m").reserved)
try:
    eng.reserve("tshirt-m", 2, idempotency_key="order-77")
except stockade.IdempotencyConflict as e:
    print("IdempotencyConflict:", e)"""),
    new_markdown_cell("""## Orders and the strategies

`reserve_order` holds every line or none. Every call that decides availability takes a
`strategy`; the default, `auto`, runs `atomic` on cold SKUs and batches hot ones."""),
    new_code_cell("""eng.restock("mug", 5)
lines = eng.reserve_order({"tshirt-m": 1, "mug": 2})
print([(r.sku, r.qty) for r in lines])
for strategy in ["atomic", "pessimistic", "advisory", "optimistic", "batched", "auto"]:
    eng.reserve("mug", 1, strategy=strategy) if eng.stock("mug").available else None
print(eng.stats()["strategies"]["auto"])
eng.recommend("mug")  # a table: the strategy, and the answer to each question"""),
    new_markdown_cell("""## Backorders and preorders

A row may promise `backorder_limit` units beyond on_hand (default 0). `available` counts
them; `backordered` says how many units are promised beyond what is on the shelf.
Confirming them takes on_hand below zero: units sold but owed until the next restock."""),
    new_code_cell("""eng.restock("console", 2)
eng.set_backorder_limit("console", 3)
pre = [eng.reserve("console", 1) for _ in range(5)]
print(eng.stock("console"))
try:
    eng.reserve("console", 1)
except stockade.OutOfStock as e:
    print("OutOfStock:", e)
for r in pre:
    eng.confirm(r.id)
level = eng.stock("console")
print("on_hand", level.on_hand, "backordered", level.backordered)"""),
    new_markdown_cell("""## Changed, deleted, never existed

`discontinue` keeps the row as a tombstone and refuses new writes with `Discontinued`
(HTTP 410), while holds that exist can still be confirmed or released. A conditional
write tells the three cases apart, each with its HTTP status."""),
    new_code_cell("""old = eng.restock("poster", 5)
eng.restock("poster", 1)                       # the row changed since `old`
keep = eng.reserve("poster", 1)
eng.discontinue("poster")
for attempt in (
    lambda: eng.reserve("mug", 1, expected_version=1),          # changed: 412
    lambda: eng.reserve("poster", 1, expected_version=old.version),  # deleted: 410
    lambda: eng.reserve("never-was", 1, expected_version=1),    # never existed: 404
):
    try:
        attempt()
    except stockade.StockadeError as e:
        print(f"{type(e).__name__:>16} {e.http_status}")
print(eng.confirm(keep.id).state, eng.stock("poster").discontinued)
print(eng.reinstate("poster").discontinued)"""),
    new_markdown_cell("""## Leases with fencing tokens

A lease is the lock for work longer than a transaction: a cycle count, a re-import.
While it is live, writes need its token. A holder that paused past its TTL while someone
else acquired finds its late write refused: the row remembers the newest token."""),
    new_code_cell("""first = eng.acquire_lease("mug", timedelta(minutes=5), owner="counter-1")
try:
    eng.restock("mug", 1)
except stockade.LeaseHeld as e:
    print("LeaseHeld:", e)
clock.advance(timedelta(minutes=6))            # counter-1 pauses past its lease
second = eng.acquire_lease("mug", timedelta(minutes=5), owner="counter-2")
try:
    eng.set_on_hand("mug", 99, fencing_token=first.token)   # the late write
except stockade.FencingTokenStale as e:
    print("FencingTokenStale:", e)
print(eng.set_on_hand("mug", 7, fencing_token=second.token).on_hand)
eng.release_lease(second)"""),
    new_markdown_cell("""## Purchase limits without write skew

"At most 2 per customer across these SKUs." The naive check (sum the buyer's holds, then
insert) lets a buyer racing on two SKUs past the limit: write skew. stockade counts each
buyer in a parent row that both requests meet on. Eight threads of one buyer, each on
its own SKU of the group, race both ways:"""),
    new_code_cell("""from stockade.testing import limited_reserve_by_check, race

drop = [f"drop-{i}" for i in range(8)]
for sku in drop:
    eng.restock(sku, 100)
eng.set_purchase_limit("drop", per_buyer=2, skus=drop)


def granted(call):
    out = race(8, call)
    return sum(1 for e in out.errors if e is None)


naive = granted(lambda i: limited_reserve_by_check(
    eng, drop[i], 1, buyer="naive-buyer", window=timedelta(milliseconds=20)))
safe = granted(lambda i: eng.reserve(drop[i], 1, buyer="careful-buyer"))
print(f"naive check-then-insert granted {naive} (limit 2); stockade granted {safe}")"""),
]

CLAIM_TEST = [
    new_markdown_cell("""# The Claim Test, measured

Which answer to the lost update fits depends on the odds that writes collide. Here 32
clients reserve against fewer or more SKUs on a throwaway PostgreSQL (fsync on): with
one SKU every write collides, with 1,024 almost none do. For each strategy we measure
throughput and the work wasted on collisions: optimistic's retries and lost races,
pessimistic's and advisory's lock waits. Then we plot where the lines cross."""),
    new_code_cell(
        SETUP
        + """
import stockade
from stockade.tools import drive_load
from stockade.tools.pgserver import TemporaryPostgres

SECONDS = 0.3 if SMALL else 2.0
CLIENTS = 8 if SMALL else 32
SKU_COUNTS = [1, 16, 256] if SMALL else [1, 4, 16, 64, 256, 1024]
STRATEGIES = ["optimistic", "pessimistic", "atomic", "batched"]

server = TemporaryPostgres().start()
eng = stockade.Engine.postgres(server.dsn(), pool_size=CLIENTS)
eng.migrate()"""
    ),
    new_code_cell("""def measure(strategy, skus, run):
    names = [f"{strategy}-{skus}-{run}-{i}" for i in range(skus)]
    for name in names:
        eng.restock(name, 1_000_000_000)
    before = eng.stats(sku_limit=0)["strategies"][strategy]
    r = drive_load(eng, names, clients=CLIENTS, seconds=SECONDS, ttl=60, strategy=strategy)
    after = eng.stats(sku_limit=0)["strategies"][strategy]
    wasted = (after["retries"] - before["retries"]) + (after["lock_waits"] - before["lock_waits"]) \\
        + r.failed
    return {"strategy": strategy, "skus": skus, "rate": r.per_second,
            "p50_ms": r.p50_us / 1000, "wasted_per_request": wasted / max(r.requests, 1)}

rows = [measure(s, n, i) for i, (s, n) in enumerate((s, n) for n in SKU_COUNTS for s in STRATEGIES)]
for row in rows:
    print(f"{row['strategy']:>12} {row['skus']:>5} SKUs {row['rate']:>9,.0f}/s "
          f"p50 {row['p50_ms']:6.2f} ms  wasted/request {row['wasted_per_request']:.2f}")"""),
    new_code_cell("""import matplotlib.pyplot as plt

fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
for s in STRATEGIES:
    mine = [r for r in rows if r["strategy"] == s]
    skus = [r["skus"] for r in mine]
    # Lines that coincide stay visible: each strategy has its own marker and dash.
    left.plot(skus, [r["rate"] for r in mine], label=s, alpha=0.85, **STYLE[s])
    right.plot(skus, [r["wasted_per_request"] for r in mine], label=s, alpha=0.85, **STYLE[s])
for ax in (left, right):
    ax.set_xscale("log")
    ax.set_xlabel("SKUs the clients spread over (fewer = more collisions)")
    ax.legend(title="strategy")
left.set_yscale("log")
left.set_title("Throughput")
left.set_ylabel("reservations/s (log)")
right.set_title("Work wasted on collisions")
right.set_ylabel("retries + lock waits + lost races, per request")
fig.suptitle(f"The Claim Test measured: {CLIENTS} clients, PostgreSQL with fsync on")"""),
    new_markdown_cell("""**Reading it.** Under heavy collision (few SKUs) optimistic wastes most of its work on
retries and pessimistic and advisory on lock waits, while batched folds the queue into
shared transactions. As the odds of collision fall, the per-request strategies recover
and the waste disappears: that is where the Claim Test's "odds" question sends low-
contention writes to optimistic or atomic. `eng.recommend(sku)` reads the same odds off
the live counters."""),
    new_code_cell("""advice = eng.recommend(rows[0]["strategy"] + "-1-0-0")
eng.close()
server.stop()
advice  # a table: the strategy, and the answer to each question"""),
]

BATCHING = [
    new_markdown_cell("""# Hot-row batching

One hot SKU, PostgreSQL with fsync on, and more and more clients. Per-request `atomic`
serializes on the row lock and pays one commit per request; `batched` gathers the
requests that arrive while a batch commits into the next one. We look at throughput,
batch sizes and the latency distribution against the number of clients."""),
    new_code_cell(
        SETUP
        + """
import stockade
from stockade.tools import drive_load
from stockade.tools.pgserver import TemporaryPostgres

SECONDS = 0.3 if SMALL else 2.0
CLIENT_COUNTS = [1, 8, 64] if SMALL else [1, 4, 16, 64, 256]

server = TemporaryPostgres().start()
eng = stockade.Engine.postgres(server.dsn(), pool_size=64)
eng.migrate()"""
    ),
    new_code_cell("""def run(strategy, clients):
    sku = f"hot-{strategy}-{clients}"
    eng.restock(sku, 1_000_000_000)
    before = eng.stats(sku_limit=0)["batcher"]
    r = drive_load(eng, [sku], clients=clients, seconds=SECONDS, ttl=60, strategy=strategy)
    after = eng.stats(sku_limit=0)["batcher"]
    batches = after["batches"] - before["batches"]
    return {"strategy": strategy, "clients": clients, "rate": r.per_second,
            "batch": (after["requests"] - before["requests"]) / batches if batches else 0,
            **{k: getattr(r, k) / 1000 for k in ("p50_us", "p90_us", "p99_us", "p999_us")}}

rows = [run(s, c) for c in CLIENT_COUNTS for s in ("atomic", "batched")]
for row in rows:
    print(f"{row['strategy']:>8} {row['clients']:>4} clients {row['rate']:>9,.0f}/s "
          f"batch {row['batch']:6.1f}  p50 {row['p50_us']:.2f} p99 {row['p99_us']:.2f} ms")"""),
    new_code_cell("""import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
for s in ("atomic", "batched"):
    mine = [r for r in rows if r["strategy"] == s]
    clients = [r["clients"] for r in mine]
    style = STYLE[s]
    axes[0].plot(clients, [r["rate"] for r in mine], label=s, **style)
    axes[2].plot(clients, [r["p99_us"] for r in mine], label=f"{s} p99", color=style["color"],
                 marker=style["marker"], linestyle="-")
    axes[2].plot(clients, [r["p50_us"] for r in mine], label=f"{s} p50", color=style["color"],
                 marker=style["marker"], linestyle=":", alpha=0.7)
batched = [r for r in rows if r["strategy"] == "batched"]
axes[1].plot([r["clients"] for r in batched], [r["batch"] for r in batched], label="batched",
             **STYLE["batched"])
axes[0].set_title("Throughput"); axes[0].set_ylabel("reservations/s (log)")
axes[0].set_yscale("log")
axes[1].set_title("Batch size"); axes[1].set_ylabel("mean requests per transaction")
axes[2].set_title("Latency"); axes[2].set_ylabel("ms (log)"); axes[2].set_yscale("log")
for ax in axes:
    ax.set_xscale("log"); ax.set_xlabel("clients on one SKU")
    ax.legend(fontsize=8)
fig.suptitle("One hot SKU, PostgreSQL with fsync on: atomic against batched")"""),
    new_code_cell("""# The latency distribution of batched at the largest client count.
top = [r for r in rows if r["strategy"] == "batched"][-1]
for q in ("p50_us", "p90_us", "p99_us", "p999_us"):
    print(f"{q[:-3]:>5}: {top[q]:.2f} ms")
eng.close()
server.stop()"""),
    new_markdown_cell("""**Reading it.** With one client a batch holds one request and costs what `atomic`
costs: nothing waits for company. As clients grow, batches grow with them (requests
gather while the previous batch commits), so throughput climbs while latency stays near
one commit; `atomic` stays flat at the row lock's pace and its latency grows with the
queue."""),
]


NOTEBOOKS = {
    "01_quickstart.ipynb": QUICKSTART,
    "02_claim_test_measured.ipynb": CLAIM_TEST,
    "03_hot_row_batching.ipynb": BATCHING,
}


def write(name: str, cells: list) -> Path:  # type: ignore[type-arg]
    nb = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
    )
    path = HERE / name
    nbformat.write(nb, path)
    return path


def execute(path: Path, out: Path, *, small: bool, timeout: int = 600) -> float:
    """Runs the notebook at ``path`` top to bottom and writes it, with its outputs, to
    ``out``; returns the seconds it took. A failing cell raises."""
    import os
    import time

    from nbclient import NotebookClient

    os.environ["STOCKADE_NB_SCALE"] = "small" if small else "full"
    nb = nbformat.read(path, as_version=4)
    start = time.monotonic()
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    nbformat.write(nb, out)
    return time.monotonic() - start


if __name__ == "__main__":
    import sys

    for name, cells in NOTEBOOKS.items():
        written = write(name, cells)
        if "--execute" in sys.argv:
            took = execute(written, written, small="--small" in sys.argv)
            print(f"{name}: executed in {took:.0f} s")
