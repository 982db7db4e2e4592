"""The example service (examples/fastapi_shop) against a real PostgreSQL, through httpx's
ASGI transport: status codes, ETags, If-Match / If-None-Match, Idempotency-Key, problem
bodies, and no oversell under concurrent requests."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import AsyncIterator, Tuple

import pytest

import stockade

fastapi = pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

APP_FILE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_shop" / "app.py"


def load_app_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_shop_app", APP_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


shop = load_app_module()


@pytest.fixture
def client(stockade_database: str) -> "Tuple[stockade.Engine, object]":
    engine = stockade.Engine.postgres(stockade_database, pool_size=8)
    yield engine, shop.make_app(engine)
    engine.close()


@contextlib.asynccontextmanager
async def open_client(app: object) -> AsyncIterator["httpx.AsyncClient"]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://shop") as c:
        yield c


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_reserve_confirm_release_and_conditional_requests(client: Tuple) -> None:
    engine, app = client
    engine.restock("tee", 3)

    async def main() -> None:
        async with open_client(app) as c:
            r = await c.get("/skus/tee")
            assert r.status_code == 200 and r.json()["available"] == 3
            etag = r.headers["etag"]
            assert (await c.get("/skus/tee", headers={"If-None-Match": etag})).status_code == 304

            made = await c.post(
                "/skus/tee/reservations", json={"qty": 2}, headers={"Idempotency-Key": "k-1"}
            )
            assert made.status_code == 201 and made.json()["state"] == "held"
            assert made.headers["location"] == f"/reservations/{made.json()['id']}"
            again = await c.post(
                "/skus/tee/reservations", json={"qty": 2}, headers={"Idempotency-Key": "k-1"}
            )
            assert again.status_code == 201 and again.json()["id"] == made.json()["id"]
            other = await c.post(
                "/skus/tee/reservations", json={"qty": 1}, headers={"Idempotency-Key": "k-1"}
            )
            assert other.status_code == 422  # the key names another request (as Stripe)
            assert other.json()["code"] == "idempotency_conflict"
            assert other.headers["content-type"] == "application/problem+json"

            # The stock changed: the old ETag no longer matches.
            changed = await c.get("/skus/tee", headers={"If-None-Match": etag})
            assert changed.status_code == 200 and changed.json()["reserved"] == 2

            none_left = await c.post("/skus/tee/reservations", json={"qty": 2})
            assert none_left.status_code == 409 and none_left.json()["code"] == "out_of_stock"

            rid = made.json()["id"]
            stale = await c.post(f"/reservations/{rid}/confirm", headers={"If-Match": '"99"'})
            assert stale.status_code == 412 and stale.json()["code"] == "version_conflict"
            part = await c.post(
                f"/reservations/{rid}/confirm",
                json={"qty": 1},
                headers={"If-Match": made.headers["etag"]},
            )
            assert part.status_code == 200
            assert (part.json()["state"], part.json()["held"], part.json()["confirmed"]) == (
                "held",
                1,
                1,
            )
            too_many = await c.post(f"/reservations/{rid}/confirm", json={"qty": 5})
            assert too_many.status_code == 409 and too_many.json()["code"] == "invalid_state"
            ok = await c.post(
                f"/reservations/{rid}/confirm", headers={"If-Match": part.headers["etag"]}
            )
            assert ok.status_code == 200 and ok.json()["state"] == "confirmed"
            assert ok.json()["confirmed"] == 2
            twice = await c.post(f"/reservations/{rid}/release")
            assert twice.status_code == 409 and twice.json()["code"] == "invalid_state"

            missing = await c.post("/reservations/00000000-0000-7000-8000-000000000000/confirm")
            assert missing.status_code == 404
            bad = await c.post("/skus/tee/reservations", json={"qty": 0})
            assert bad.status_code == 422

            level = await c.get("/skus/tee")
            put = await c.put(
                "/skus/tee", json={"on_hand": 10}, headers={"If-Match": level.headers["etag"]}
            )
            assert put.status_code == 200 and put.json()["on_hand"] == 10
            lost = await c.put(
                "/skus/tee", json={"on_hand": 5}, headers={"If-Match": level.headers["etag"]}
            )
            assert lost.status_code == 412
            assert (await c.get("/skus/nope")).status_code == 404

    run(main())
    assert engine.stock("tee").on_hand == 10


def test_concurrent_requests_never_oversell(client: Tuple) -> None:
    engine, app = client
    engine.restock("drop", 50)

    async def main() -> Tuple[int, int]:
        async with open_client(app) as c:

            async def buy(n: int) -> int:
                headers = {"Idempotency-Key": f"buyer-{n}"} if n % 2 else {}
                r = await c.post("/skus/drop/reservations", json={"qty": 1}, headers=headers)
                return r.status_code

            codes = await asyncio.gather(*(buy(n) for n in range(300)))
            return codes.count(201), codes.count(409)

    created, conflicts = run(main())  # type: ignore[misc]
    assert (created, conflicts) == (50, 250)
    assert engine.stock("drop").reserved == 50
    assert engine.row_counts()["reservation_count"] == 50


def test_a_hold_lapses_at_its_ttl_with_no_setup(client: Tuple) -> None:
    # The shop runs no sweeper of its own: the engine's default one lets the hold lapse.
    engine, app = client
    engine.restock("cap", 5)

    async def main() -> None:
        async with open_client(app) as c:
            held = await c.post("/skus/cap/reservations", json={"qty": 4, "ttl_seconds": 1})
            assert held.status_code == 201
            for _ in range(40):  # sweep_interval is 1 s: back within about 2 s of the TTL
                if (await c.get("/skus/cap")).json()["available"] == 5:
                    break
                await asyncio.sleep(0.1)
            assert (await c.get("/skus/cap")).json()["available"] == 5
            assert engine.reservation(held.json()["id"]).state == "expired"
            all_of_it = await c.post("/skus/cap/reservations", json={"qty": 5})
            assert all_of_it.status_code == 201

    run(main())


def test_metrics_endpoint_speaks_prometheus(client: Tuple) -> None:
    pytest.importorskip("prometheus_client")
    engine, app = client
    engine.restock("m", 1)

    async def main() -> str:
        async with open_client(app) as c:
            await c.post("/skus/m/reservations", json={"qty": 1})
            r = await c.get("/metrics")
            assert r.status_code == 200
            return r.text

    text = run(main())
    assert 'stockade_calls_total{op="reserve"' in str(text)


@pytest.mark.postgres
def test_the_http_load_script_proves_no_oversell(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    import json
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            str(APP_FILE.parent / "load.py"),
            "--units",
            "20",
            "--buyers",
            "120",
            "--concurrency",
            "8",
            "--json",
            str(tmp_path / "load.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    results = json.loads((tmp_path / "load.json").read_text())
    assert [r["keyed"] for r in results] == [False, True]
    for r in results:
        assert r["exact"] and r["codes"] == {"201": 20, "409": 100}


# --- errors: problem+json everywhere, nothing internal ---

SERVER_TEXT = (
    'cannot connect to PostgreSQL: connection to server at "10.20.30.40", port 55432 failed: '
    "Connection refused. Is the server running?"
)


class BrokenEngine:
    """Stands in for an engine whose database went away, or that fails in a way of its own."""

    async def reserve_async(self, *args: object, **kwargs: object) -> None:
        raise stockade.Unavailable(SERVER_TEXT)

    async def stock_async(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug at 10.20.30.40:55432")


def answers(app: object, *calls: Tuple[str, str, dict]) -> list:
    async def main() -> list:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as c:
            return [await c.request(method, path, **kw) for method, path, kw in calls]

    return run(main())  # type: ignore[return-value]


def test_every_error_of_the_shop_is_a_problem_without_internals() -> None:
    # Goal: whatever goes wrong, the shop answers problem+json and never shows a host, a
    # port or a server's message; a value JSON cannot carry back (1e400 is inf) is a 422
    # that names the field, not a 500.
    app = shop.make_app(BrokenEngine())  # type: ignore[arg-type]
    body = b'{"qty": 1, "ttl_seconds": 1e400}'
    down, too_long, bug, nowhere, wrong_method = answers(
        app,
        ("POST", "/skus/tee/reservations", {"json": {"qty": 1}}),
        ("POST", "/skus/tee/reservations",
         {"content": body, "headers": {"Content-Type": "application/json"}}),
        ("GET", "/skus/tee", {}),
        ("GET", "/no/such/path", {}),
        ("DELETE", "/skus/tee/reservations", {}),
    )  # fmt: skip
    for r in (down, too_long, bug, nowhere, wrong_method):
        assert r.headers["content-type"] == "application/problem+json", (r.status_code, r.text)
        assert "10.20.30.40" not in r.text and "55432" not in r.text, r.text
        assert r.json()["status"] == r.status_code and r.json()["title"]
    assert down.status_code == 503 and down.json()["code"] == "unavailable"
    assert down.headers["retry-after"] == "1" and "Retry in 1 s." in down.json()["detail"]
    assert too_long.status_code == 422 and re.search(r"\binf\b", too_long.text) is None
    assert too_long.json()["detail"].startswith("body.ttl_seconds: "), too_long.text
    assert bug.status_code == 500 and nowhere.status_code == 404
    assert wrong_method.status_code == 405 and "allow" in wrong_method.headers


def test_the_gunicorn_config_names_a_worker_that_is_not_deprecated() -> None:
    # Goal: the shipped config's worker class imports without a DeprecationWarning, and
    # its package is in the example's requirements and the Makefile's tools.
    pytest.importorskip("gunicorn")
    conf = runpy.run_path(str(APP_FILE.parent / "gunicorn.conf.py"))
    module, _, name = conf["worker_class"].rpartition(".")
    sys.modules.pop(module, None)  # imported again, so that a warning shows again
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        worker = getattr(importlib.import_module(module), name)
    from gunicorn.workers.base import Worker

    assert issubclass(worker, Worker)
    [package] = importlib.metadata.packages_distributions()[module.split(".")[0]]
    requirements = (APP_FILE.parent / "requirements.txt").read_text()
    assert re.search(rf"^{re.escape(package)}\b", requirements, flags=re.M | re.I), package
    makefile = (APP_FILE.parents[2] / "Makefile").read_text()
    assert f'"{package}' in makefile, package


@pytest.mark.postgres
def test_the_readme_makes_the_database_the_shop_runs_in(stockade_postgres: object) -> None:
    # Goal: a newcomer's first steps work on a server without the shop's database: the
    # README's commands make it and migrate it. Method: run them (all but pip and the
    # server) against the suite's server, under a database name of this test's own.
    from stockade.tools.pgserver import find_bindir
    from stockade.tools.pytest_plugin import PostgresForTests
    from support import field

    assert isinstance(stockade_postgres, PostgresForTests)
    readme = (APP_FILE.parent / "README.md").read_text()
    block = readme.split("```sh\n")[1].split("```")[0]
    steps = [s for s in block.splitlines() if not s.startswith(("pip ", "uvicorn "))]
    script = "\n".join(steps)
    assert "PGHOST=127.0.0.1" in script and "PGDATABASE=shop" in script, script
    admin = stockade_postgres.admin_dsn("postgres")
    name = f"shop_readme_{os.getpid()}"
    script = script.replace("PGHOST=127.0.0.1", f"PGHOST={field(admin, 'host')}")
    script = script.replace("PGDATABASE=shop", f"PGDATABASE={name}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "STOCKADE_"))}
    env.update(PGPORT=field(admin, "port"), PGUSER=field(admin, "user"))
    if "password=" in admin:
        env["PGPASSWORD"] = field(admin, "password")
    env["PATH"] = os.pathsep.join(
        [str(find_bindir()), str(Path(sys.executable).parent), env["PATH"]]
    )
    stockade_postgres.drop_database(name)
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert "applied to schema stockade: 001_schema.sql" in done.stdout, done.stdout
    finally:
        stockade_postgres.drop_database(name)
