"""A small shop on stockade's asyncio API: reserve, confirm, release, and stock with
ETags. Run it with uvicorn (the database from STOCKADE_DSN or libpq's PG* variables):

    STOCKADE_DSN="host=127.0.0.1 dbname=shop" uvicorn app:app --app-dir examples/fastapi_shop

    POST /skus/{sku}/reservations   {"qty": 1, "ttl_seconds": 600}   Idempotency-Key: <key>
        201 and the reservation (ETag: its version); 409 out of stock; a repeated key
        replays the first answer; the same key for another request is a 422
    POST /reservations/{id}/confirm  If-Match: the reservation's ETag (optional)
    POST /reservations/{id}/release  If-Match: the reservation's ETag (optional)
        200 and the reservation; 412 when If-Match is stale; 410 when the hold lapsed
    GET  /skus/{sku}                 If-None-Match: 304 when the stock has not changed
    PUT  /skus/{sku}                 {"on_hand": 50}  If-Match: 412 when someone else wrote
    GET  /metrics                    Prometheus (when prometheus_client is installed)

Every error is an RFC 9457 problem+json body (stockade.http.problem), with Retry-After
where a retry can help. The whole service fits in this file; `make_app(engine)` takes an
engine of your own (the tests give it one over a throwaway database).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, AsyncIterator, Dict, Optional

from fastapi import FastAPI, Header, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

import stockade
import stockade.http


class ReserveBody(BaseModel):
    qty: int = Field(gt=0, le=stockade.QUANTITY_MAX)
    ttl_seconds: float = Field(default=600, gt=0, le=86_400)


class StockBody(BaseModel):
    on_hand: int = Field(ge=0, le=stockade.QUANTITY_MAX)


def reservation_json(r: stockade.Reservation) -> Dict[str, Any]:
    return {
        "id": str(r.id),
        "sku": r.sku,
        "qty": r.qty,
        "state": r.state.value,
        "version": r.version,
        "expires_at": r.expires_at.isoformat(),
    }


def stock_json(level: stockade.StockLevel) -> Dict[str, Any]:
    return {
        "sku": level.sku,
        "on_hand": level.on_hand,
        "reserved": level.reserved,
        "available": level.available,
        "version": level.version,
    }


def start_metrics(app: FastAPI) -> Any:
    """The app's metrics collector, made once per process (None without prometheus_client).
    Under gunicorn with several workers, set PROMETHEUS_MULTIPROC_DIR: each scrape then
    answers for every worker (see stockade.prometheus and gunicorn.conf.py)."""
    if getattr(app.state, "collector", None) is None:
        try:
            import prometheus_client

            from stockade.prometheus import StockadeCollector
        except ImportError:
            return None
        app.state.registry = prometheus_client.CollectorRegistry()
        app.state.collector = StockadeCollector(app.state.engine).register(app.state.registry)
    return app.state.collector


def make_app(engine: Optional[stockade.Engine] = None) -> FastAPI:
    """The shop over `engine`, or over an engine from the environment (opened and closed
    with the app)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if engine is not None:
            yield
            return
        async with await stockade.Engine.connect_from_env() as eng:
            app.state.engine = eng
            collector = start_metrics(app)  # each worker publishes from its start
            try:
                yield
            finally:
                if collector is not None:
                    collector.close()  # its last figures, before the engine closes

    app = FastAPI(title="stockade shop", lifespan=lifespan)
    if engine is not None:
        app.state.engine = engine  # ready without a lifespan (httpx's ASGI transport runs none)

    @app.exception_handler(stockade.StockadeError)
    async def stockade_error(request: Request, exc: stockade.StockadeError) -> JSONResponse:
        status, headers, body = stockade.http.problem(exc, instance=request.url.path)
        return JSONResponse(body, status_code=status, headers=headers)

    def eng(request: Request) -> stockade.Engine:
        return request.app.state.engine  # type: ignore[no-any-return]

    @app.post("/skus/{sku}/reservations", status_code=201)
    async def reserve(
        sku: str,
        body: ReserveBody,
        request: Request,
        response: Response,
        # The library's own cap (UTF-8 bytes; a longer key in characters gets its 400 from
        # the engine's InvalidArgument).
        idempotency_key: Optional[str] = Header(
            default=None, max_length=stockade.IDEMPOTENCY_KEY_BYTES_MAX
        ),
    ) -> Dict[str, Any]:
        r = await eng(request).reserve_async(
            sku, body.qty, ttl=timedelta(seconds=body.ttl_seconds), idempotency_key=idempotency_key
        )
        response.headers["ETag"] = r.etag
        response.headers["Location"] = f"/reservations/{r.id}"
        return reservation_json(r)

    async def transition(
        request: Request,
        response: Response,
        reservation_id: str,
        if_match: Optional[str],
        kind: str,
    ) -> Dict[str, Any]:
        expected = stockade.http.expected_version(if_match)
        call = eng(request).confirm_async if kind == "confirm" else eng(request).release_async
        r = await call(reservation_id, expected_version=expected)
        response.headers["ETag"] = r.etag
        return reservation_json(r)

    @app.post("/reservations/{reservation_id}/confirm")
    async def confirm(
        reservation_id: str,
        request: Request,
        response: Response,
        if_match: Optional[str] = Header(default=None),
    ) -> Dict[str, Any]:
        return await transition(request, response, reservation_id, if_match, "confirm")

    @app.post("/reservations/{reservation_id}/release")
    async def release(
        reservation_id: str,
        request: Request,
        response: Response,
        if_match: Optional[str] = Header(default=None),
    ) -> Dict[str, Any]:
        return await transition(request, response, reservation_id, if_match, "release")

    @app.get("/skus/{sku}")
    async def stock(
        sku: str, request: Request, if_none_match: Optional[str] = Header(default=None)
    ) -> Response:
        level = await eng(request).stock_async(sku)
        headers = {"ETag": level.etag}
        if if_none_match is not None and not stockade.http.if_none_match(if_none_match, level.etag):
            return Response(status_code=304, headers=headers)
        return JSONResponse(stock_json(level), headers=headers)

    @app.put("/skus/{sku}")
    async def set_stock(
        sku: str,
        body: StockBody,
        request: Request,
        response: Response,
        if_match: Optional[str] = Header(default=None),
    ) -> Dict[str, Any]:
        level = await eng(request).set_on_hand_async(
            sku, body.on_hand, expected_version=stockade.http.expected_version(if_match)
        )
        response.headers["ETag"] = level.etag
        return stock_json(level)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if start_metrics(request.app) is None:
            return Response("prometheus_client is not installed\n", status_code=501)
        import prometheus_client

        return Response(
            prometheus_client.generate_latest(request.app.state.registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    return app


app = make_app()
