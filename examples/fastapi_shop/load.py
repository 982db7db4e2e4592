"""HTTP load on the example shop: proves no oversell over HTTP, with and without
Idempotency-Key, and prints requests/s and latency.

It starts a throwaway PostgreSQL (unless --dsn), the shop on loopback under uvicorn (one
worker process) or, with --workers N, under gunicorn with the shipped config, and
--concurrency httpx clients that each send reserve requests until --buyers requests were
sent for --units units. Then it checks the ledger: exactly min(units, buyers) 201s, the
rest 409, and a stock row that holds exactly the units granted; under gunicorn, also that
/metrics, summed over the workers, counts exactly the 201s. It stops the shop (by PID)
and the server it started.

    python examples/fastapi_shop/load.py [--units 1000] [--buyers 10000] [--concurrency 64]
                                         [--workers N] [--dsn DSN] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import httpx

import stockade
from stockade.tools.pgserver import TemporaryPostgres

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_shop(
    dsn: str, port: int, workers: int, metrics_dir: Optional[str]
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "STOCKADE_DSN": dsn, "STOCKADE_POOL_SIZE": "16"}
    if workers == 0:  # uvicorn, one process
        argv = ["uvicorn", "app:app", "--app-dir", str(HERE), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--log-level", "warning"]
    else:  # gunicorn with the shipped config, its metrics summed over the workers
        env.update(
            SHOP_BIND=f"127.0.0.1:{port}",
            SHOP_WORKERS=str(workers),
            STOCKADE_LOG_LEVEL="WARNING",
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        )
        argv = ["gunicorn", "-c", str(HERE / "gunicorn.conf.py"), "--chdir", str(HERE)]
        argv += ["app:app"]
    proc = subprocess.Popen([sys.executable, "-m", *argv], env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/skus/none", timeout=1.0)
            return proc
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("uvicorn exited before it served") from None
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("uvicorn did not start within 30 s")


async def sale(base: str, sku: str, buyers: int, concurrency: int, keyed: bool) -> Dict[str, Any]:
    latencies: List[float] = []
    codes: Dict[int, int] = {}
    next_buyer = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30.0) as client:

        async def worker() -> None:
            nonlocal next_buyer
            while next_buyer < buyers:
                n = next_buyer
                next_buyer += 1
                headers = {"Idempotency-Key": f"{sku}-buyer-{n}"} if keyed else {}
                start = time.perf_counter()
                r = await client.post(f"/skus/{sku}/reservations", json={"qty": 1}, headers=headers)
                latencies.append(time.perf_counter() - start)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "keyed": keyed,
        "requests": buyers,
        "seconds": elapsed,
        "requests_per_s": buyers / elapsed,
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "codes": {str(k): v for k, v in sorted(codes.items())},
    }


def reserve_ok(url: str) -> float:
    """stockade_calls_total of successful reserves, summed over its series."""
    pattern = r'^stockade_calls_total\{[^}]*op="reserve"[^}]*outcome="ok"[^}]*\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, httpx.get(url).text, flags=re.M))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--buyers", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--dsn", help="a server of yours (default: a throwaway one)")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="run the shop under gunicorn with this many workers (default: uvicorn alone)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    metrics_dir = tempfile.mkdtemp(prefix="shop-metrics-") if args.workers else None
    server = None if args.dsn else TemporaryPostgres().start()
    dsn = args.dsn or server.dsn()  # type: ignore[union-attr]
    shop = None
    results = []
    exact = True
    counted = 0.0  # successful reserves /metrics counted before this sale
    try:
        with stockade.Engine.postgres(dsn, pool_size=2) as eng:
            eng.migrate()
            port = free_port()
            shop = start_shop(dsn, port, args.workers, metrics_dir)
            for keyed in (False, True):
                sku = f"drop-{'keyed' if keyed else 'keyless'}-{int(time.time())}"
                eng.restock(sku, args.units)
                r = asyncio.run(
                    sale(f"http://127.0.0.1:{port}", sku, args.buyers, args.concurrency, keyed)
                )
                granted = r["codes"].get("201", 0)
                r["granted"] = granted
                r["reserved_in_db"] = eng.stock(sku).reserved
                r["exact"] = (
                    granted == min(args.units, args.buyers) == r["reserved_in_db"]
                    and r["codes"].get("409", 0) == args.buyers - granted
                )
                if args.workers:  # every worker's figures, however many answer scrapes
                    time.sleep(2.5)  # the publish interval
                    total = reserve_ok(f"http://127.0.0.1:{port}/metrics")
                    r["metrics_reserve_ok"] = total - counted
                    counted = total
                    r["exact"] = r["exact"] and r["metrics_reserve_ok"] == granted
                exact = exact and r["exact"]
                results.append(r)
                label = "with Idempotency-Key" if keyed else "without a key"
                print(
                    f"{label:>22}: {r['requests_per_s']:,.0f} requests/s, p50 "
                    f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, codes {r['codes']}, "
                    f"reserved in the database {r['reserved_in_db']}"
                    + (f", in /metrics {r['metrics_reserve_ok']:.0f}" if args.workers else "")
                    + f" ({'exact' if r['exact'] else 'NOT EXACT'})",
                    flush=True,
                )
    finally:
        if shop is not None:
            os.kill(shop.pid, signal.SIGTERM)
            try:
                shop.wait(timeout=10)
            except subprocess.TimeoutExpired:
                shop.kill()
                shop.wait()
        if server is not None:
            server.stop()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0 if exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
