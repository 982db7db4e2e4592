"""A small shop on stockade's asyncio API: reserve, confirm, release, and stock with
ETags. Run it with uvicorn (the database from STOCKADE_DSN or libpq's PG* variables):

    STOCKADE_DSN="host=127.0.0.1 dbname=shop" uvicorn app:app --app-dir examples/fastapi_shop

    POST /skus/{sku}/reservations   {"qty": 1, "ttl_seconds": 600}   Idempotency-Key: <key>
        201 and the reservation (ETag: its version); 409 out of stock; a repeated key
        replays the first answer; the same key for another request is a 422
    POST /reservations/{id}/confirm  If-Match: the reservation's ETag (optional)
    POST /reservations/{id}/release  If-Match: the reservation's ETag (optional)
        an optional body {"qty": 2} takes that many of the held units (default: all);
        200 and the reservation; 412 when If-Match is stale; 410 when the hold lapsed;
        409 for more than is held
    GET  /skus/{sku}                 If-None-Match: 304 when the stock has not changed
    PUT  /skus/{sku}                 {"on_hand": 50}  If-Match: 412 when someone else wrote
    GET  /metrics                    Prometheus (when prometheus_client is installed)

The database must exist first (README.md: `createdb`, then `stockade migrate`).

Every error is an RFC 9457 problem+json body, with Retry-After where a retry can help:
stockade's errors through stockade.http.problem (a 5xx says what happened in plain words,
never a host, a port or the server's text, which go to the log), a request that fails
validation as a 422 that names each field and what is wrong with it (never the value
sent back), an unknown path or method as its 404 or 405, and anything else as a plain
500. The whole service fits in this file; `make_app(engine)` takes an engine of your own
(the tests give it one over a throwaway database).
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from datetime import timedelta
from http import HTTPStatus
from typing import Any, AsyncIterator, Dict, Mapping, Optional

from fastapi import FastAPI, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException

import stockade
import stockade.http


class ReserveBody(BaseModel):
    qty: int = Field(gt=0, le=stockade.QUANTITY_MAX)
    ttl_seconds: float = Field(default=600, gt=0, le=86_400)


class PartBody(BaseModel):
    qty: int = Field(gt=0, le=stockade.QUANTITY_MAX)


class StockBody(BaseModel):
    on_hand: int = Field(ge=0, le=stockade.QUANTITY_MAX)


def reservation_json(r: stockade.Reservation) -> Dict[str, Any]:
    return {
        "id": str(r.id),
        "sku": r.sku,
        "qty": r.qty,
        "held": r.held,
        "confirmed": r.confirmed,
        "released": r.released,
        "expired": r.expired,
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


PROBLEM = "application/problem+json"


def plain_problem(
    status: int, path: str, detail: str, headers: Optional[Mapping[str, str]] = None
) -> JSONResponse:
    """A problem+json answer for an error that is not stockade's (RFC 9457's about:blank
    type: the title is the status's own)."""
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
        "instance": path[: stockade.http.PROBLEM_TEXT_MAX],
    }
    return JSONResponse(
        body, status_code=status, headers={**(headers or {}), "Content-Type": PROBLEM}
    )


def what_is_invalid(exc: RequestValidationError) -> str:
    """Each field a request got wrong, with pydantic's plain message ("body.qty: Input
    should be greater than 0"), never the value sent: a value JSON cannot carry back
    (1e400 parses as inf) would turn the answer into a 500, and a long one into a long
    answer."""
    parts = []
    for error in exc.errors()[:10]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        parts.append(f"{where}: {error.get('msg', 'not valid')}")
    return "; ".join(parts) or "the request is not valid"


def add_error_handlers(app: FastAPI) -> None:
    """Every error the shop answers, as problem+json."""

    @app.exception_handler(stockade.StockadeError)
    async def stockade_error(request: Request, exc: stockade.StockadeError) -> JSONResponse:
        status, headers, body = stockade.http.problem(exc, instance=request.url.path)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return plain_problem(422, request.url.path, what_is_invalid(exc))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code < 400:
            return Response(status_code=exc.status_code, headers=exc.headers)
        phrase = HTTPStatus(exc.status_code).phrase
        return plain_problem(exc.status_code, request.url.path, phrase, exc.headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The server logs the exception with its traceback; the caller learns only this.
        return plain_problem(
            500, request.url.path, "The service failed to answer; retrying will not help."
        )


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

    add_error_handlers(app)

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
        body: Optional[PartBody],
    ) -> Dict[str, Any]:
        expected = stockade.http.expected_version(if_match)
        call = eng(request).confirm_async if kind == "confirm" else eng(request).release_async
        qty = body.qty if body is not None else None
        r = await call(reservation_id, qty=qty, expected_version=expected)
        response.headers["ETag"] = r.etag
        return reservation_json(r)

    @app.post("/reservations/{reservation_id}/confirm")
    async def confirm(
        reservation_id: str,
        request: Request,
        response: Response,
        if_match: Optional[str] = Header(default=None),
        body: Optional[PartBody] = None,
    ) -> Dict[str, Any]:
        return await transition(request, response, reservation_id, if_match, "confirm", body)

    @app.post("/reservations/{reservation_id}/release")
    async def release(
        reservation_id: str,
        request: Request,
        response: Response,
        if_match: Optional[str] = Header(default=None),
        body: Optional[PartBody] = None,
    ) -> Dict[str, Any]:
        return await transition(request, response, reservation_id, if_match, "release", body)

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
            return plain_problem(501, request.url.path, "prometheus_client is not installed")
        import prometheus_client

        return Response(
            prometheus_client.generate_latest(request.app.state.registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    return app


app = make_app()
