"""HTTP semantics: every error's status, retryability and Retry-After; RFC 9110 If-Match
and If-None-Match; RFC 9457 problem+json. And the split that motivated it: a stale
If-Match is VersionConflict (412), optimistic retries running out is RetriesExhausted
(503), never the other way round."""

from __future__ import annotations

import json

import pytest

import stockade
import stockade.http as http
from stockade import errors
from stockade.http import ETag
from stockade.testing import race


def test_every_error_class_has_an_http_status_and_retryability() -> None:
    for cls in errors._BY_CODE.values():
        assert 400 <= cls.http_status <= 599, cls
        if cls.retryable:
            assert cls.retry_after_default is not None and cls.http_status in (409, 503), cls
        else:
            assert cls.retry_after_default is None, cls
    assert stockade.VersionConflict.http_status == 412
    assert stockade.OutOfStock.http_status == 409 and not stockade.OutOfStock.retryable
    assert stockade.ReservationExpired.http_status == 410
    assert stockade.RetriesExhausted.http_status == 503 and stockade.RetriesExhausted.retryable
    assert stockade.InvalidType.http_status == 400


def test_a_stale_version_is_version_conflict(engine: stockade.Engine) -> None:
    level = engine.restock("s", 5)
    with pytest.raises(stockade.VersionConflict) as info:
        engine.restock("s", 1, expected_version=level.version - 1)
    assert info.value.http_status == 412 and info.value.retry_after is None


def test_optimistic_retries_running_out_is_retries_exhausted_not_version_conflict(
    stockade_database: str,
) -> None:
    # 32 threads on one PostgreSQL row and no retries allowed: compare-and-sets must lose
    # (the memory store's compare-and-set is too quick to lose reliably from Python; its
    # C++ races check the same code). None of the callers sent a version, so none may
    # hear VersionConflict (a 412 to a client that sent no If-Match).
    engine = stockade.Engine.postgres(stockade_database, retries_max=0, pool_size=16)
    lost: list[BaseException] = []

    def buyer() -> None:
        for _ in range(40):
            try:
                engine.reserve("hot", 1, strategy="optimistic")
            except stockade.StockadeError as e:
                lost.append(e)

    with engine:
        engine.restock("hot", 1_000_000)
        out = race(32, lambda _: buyer(), timeout=60)
    assert not any(out.errors), out.errors
    assert lost, "no compare-and-set lost: the race did not happen"
    assert all(isinstance(e, stockade.RetriesExhausted) for e in lost), lost[:3]
    for e in lost:
        assert e.http_status == 503 and e.retryable and e.retry_after == 1.0


# --- If-Match / If-None-Match ---


def test_parse_etags_reads_star_lists_weak_tags_and_empty_elements() -> None:
    assert http.parse_etags("*") == "*"
    assert http.parse_etags(' "a" , W/"b",,"c,d" ') == [
        ETag("a"),
        ETag("b", weak=True),
        ETag("c,d"),
    ]
    assert http.parse_etags("") == []


@pytest.mark.parametrize(
    "field", ['"a" "b"', "a", '"a', 'W/ "a"', '"a"x', '"a\\"b"', 'w/"a"', '*, "a"', "x" * 9000]
)
def test_parse_etags_refuses_what_is_not_a_list_of_entity_tags(field: str) -> None:
    with pytest.raises(stockade.InvalidArgument) as info:
        http.parse_etags(field)
    assert len(str(info.value)) < 200


def test_if_match_uses_strong_comparison_and_if_none_match_weak() -> None:
    assert http.if_match('"7"', '"7"')
    assert not http.if_match('W/"7"', '"7"')
    assert not http.if_match('"7"', 'W/"7"')
    assert http.if_match('"6", "7"', '"7"')
    assert http.if_match("*", '"7"') and not http.if_match("*", None)
    assert not http.if_none_match('W/"7"', '"7"')
    assert not http.if_none_match('"7"', 'W/"7"')
    assert http.if_none_match('"6"', '"7"')
    assert http.if_none_match("*", None) and not http.if_none_match("*", '"7"')


def test_expected_version_from_if_match(engine: stockade.Engine) -> None:
    level = engine.restock("s", 5)
    assert http.expected_version(None) is None
    assert http.expected_version("*") is None
    assert http.expected_version(level.etag) == level.version
    for field in ('W/"3"', '"3", "4"', '"abc"'):
        with pytest.raises(stockade.InvalidArgument):
            http.expected_version(field)
    # The round trip a service makes: ETag out, If-Match in, 412 on a stale one.
    engine.restock("s", 1, expected_version=http.expected_version(level.etag))
    with pytest.raises(stockade.VersionConflict):
        engine.restock("s", 1, expected_version=http.expected_version(level.etag))


# --- problem+json ---


def test_problem_renders_rfc_9457_with_retry_after(engine: stockade.Engine) -> None:
    engine.restock("s", 1)
    with pytest.raises(stockade.OutOfStock) as info:
        engine.reserve("s", 2)
    status, headers, body = http.problem(info.value, instance="/skus/s/reservations")
    assert status == 409 and headers == {"Content-Type": "application/problem+json"}
    assert body["type"] == "urn:stockade:error:out_of_stock" and body["status"] == 409
    assert body["title"] == "Conflict" and body["sku"] == "s" and body["retryable"] is False
    assert body["instance"] == "/skus/s/reservations"
    json.dumps(body)  # serializable as is

    busy = stockade.RetriesExhausted("optimistic write lost the race 6 times")
    status, headers, body = http.problem(busy)
    assert status == 503 and headers["Retry-After"] == "1" and body["retryable"] is True


def test_problem_never_echoes_a_hostile_value_raw(engine: stockade.Engine) -> None:
    with pytest.raises(stockade.NotFound) as info:
        engine.stock("x\n" + "y" * 250)
    _, _, body = http.problem(info.value)
    assert "\n" not in body["detail"] and len(body["detail"]) < 300
    # A path that repeats a 10 kB SKU does not become a 10 kB response.
    with pytest.raises(stockade.InvalidArgument) as long_sku:
        engine.stock("y" * 10240)
    path = "/skus/" + "y" * 10240
    _, _, body = http.problem(long_sku.value, instance=path)
    assert len(body["instance"]) == http.PROBLEM_TEXT_MAX and body["instance"].endswith("...")
    assert body["instance"].startswith("/skus/yyy") and len(body["detail"]) < 300
    assert "SKU_BYTES_MAX" in body["detail"]


# What a server's message may hold: a host, a port, the DSN's parts, the server's own text.
INTERNALS = ["10.20.30.40", "55432", "db.internal", "dbname=", "hunter2", "Is the server"]
SERVER_TEXT = (
    'cannot connect to PostgreSQL: connection to server at "10.20.30.40", port 55432 failed: '
    "Connection refused. Is the server running? (host=db.internal dbname=shop "
    "password=hunter2)"
)


def every_error_class() -> list[type[stockade.StockadeError]]:
    classes = [getattr(errors, name) for name in errors.__all__]
    return [c for c in classes if isinstance(c, type) and issubclass(c, stockade.StockadeError)]


@pytest.mark.parametrize("cls", every_error_class(), ids=lambda c: c.__name__)
def test_a_problem_body_carries_no_server_internals(
    cls: type[stockade.StockadeError], caplog: pytest.LogCaptureFixture
) -> None:
    # Goal: a 5xx body (or one for an error the database raised) never shows a host, a
    # port, a DSN part or a server message, yet says what happened (a plain title and
    # detail, the code) and whether to retry; the full text goes to the log. A 4xx the
    # engine raised about the caller's input keeps its message.
    with caplog.at_level("INFO", logger="stockade.http"):
        status, headers, body = http.problem(cls(SERVER_TEXT), instance="/skus/tee")
        _, _, from_server = http.problem(cls(SERVER_TEXT, sqlstate="08006"))
    text = json.dumps(body)
    assert body["code"] == cls.code and body["title"] and body["detail"]
    assert body["status"] == status == cls.http_status
    if status >= 500:
        for internal in INTERNALS:
            assert internal not in text, (cls.__name__, internal, body)
        if cls.retryable:
            assert body["retry_after"] == 1 and headers["Retry-After"] == "1"
            assert "Retry in 1 s." in body["detail"]
        else:
            assert "Retrying will not help" in body["detail"] and "retry_after" not in body
        assert SERVER_TEXT in caplog.text and "/skus/tee" in caplog.text
    else:
        assert body["detail"] == SERVER_TEXT  # the caller's own input, as the engine said it
    for internal in INTERNALS:  # from the database, any status: plain words only
        assert internal not in json.dumps(from_server), (cls.__name__, internal, from_server)
    assert "SQLSTATE 08006" in caplog.text
