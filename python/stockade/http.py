"""HTTP semantics for services built on stockade: conditional requests and errors.

Conditional requests (RFC 9110, section 13.1): :func:`parse_etags` reads an ``If-Match``
or ``If-None-Match`` field (``*``, or a list of strong and weak entity tags);
:func:`if_match` and :func:`if_none_match` evaluate one against the current ETag (strong
comparison for If-Match, weak for If-None-Match); :func:`expected_version` turns an
If-Match into the ``expected_version`` stockade checks atomically with the write.

Errors (RFC 9457): :func:`problem` turns a :class:`~stockade.StockadeError` into a status,
headers (``Content-Type: application/problem+json``, and ``Retry-After`` when a retry can
help) and a JSON body, from the error's ``http_status``, ``retryable`` and
``retry_after``. A 5xx body never carries the error's message (it may quote the server: a
host, a port, a part of the DSN, the server's own text): it says what happened in plain
words, with the code and a retry hint, and the message goes to the ``stockade.http``
logger instead::

    try:
        r = engine.reserve(sku, qty, idempotency_key=key)
    except stockade.StockadeError as e:
        status, headers, body = stockade.http.problem(e)
        return JSONResponse(body, status_code=status, headers=headers)
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from .errors import InvalidArgument, StockadeError
from .values import shown, version_from_etag

__all__ = [
    "ETag",
    "expected_version",
    "if_match",
    "if_none_match",
    "parse_etags",
    "problem",
]

# Header fields longer than this are refused rather than parsed (a hostile client).
FIELD_BYTES_MAX = 8192
# The longest `instance` or `detail` a problem carries: a request path that repeats a 10 kB
# SKU does not become a 10 kB response.
PROBLEM_TEXT_MAX = 1024

# entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE; etagc = %x21 / %x23-7E / obs-text (0x80-0xFF)
_ENTITY_TAG = re.compile(r'(W/)?"([\x21\x23-\x7e\x80-\xff]*)"')
_OWS = " \t"


@dataclass(frozen=True)
class ETag:
    """One entity tag: its opaque text (without quotes) and whether it is weak."""

    opaque: str
    weak: bool = False

    def __str__(self) -> str:
        return ('W/"' if self.weak else '"') + self.opaque + '"'

    @classmethod
    def parse(cls, text: str) -> ETag:
        """One entity tag, such as ``"12"`` or ``W/"12"``; InvalidArgument otherwise."""
        match = _ENTITY_TAG.fullmatch(text.strip(_OWS))
        if match is None:
            raise InvalidArgument(f"not an entity tag: {shown(text)}")
        return cls(match.group(2), weak=match.group(1) is not None)


def parse_etags(field: str) -> Union[Literal["*"], List[ETag]]:
    """An ``If-Match`` or ``If-None-Match`` field value: ``"*"``, or its entity tags in
    order. Empty list elements are ignored, as RFC 9110's list rule asks; anything else
    that is not an entity tag raises InvalidArgument (answer 400)."""
    if not isinstance(field, str):
        raise InvalidArgument(f"a header field is a str, not {type(field).__name__}")
    if len(field) > FIELD_BYTES_MAX:
        raise InvalidArgument(f"the header field is longer than {FIELD_BYTES_MAX} characters")
    text = field.strip(_OWS)
    if text == "*":
        return "*"
    tags: List[ETag] = []
    at = 0
    while at < len(text):
        while at < len(text) and text[at] in _OWS + ",":
            at += 1
        if at >= len(text):
            break
        match = _ENTITY_TAG.match(text, at)
        if match is None:
            raise InvalidArgument(f"not a list of entity tags: {shown(field)}")
        tags.append(ETag(match.group(2), weak=match.group(1) is not None))
        at = match.end()
        while at < len(text) and text[at] in _OWS:
            at += 1
        if at < len(text) and text[at] != ",":
            raise InvalidArgument(f"not a list of entity tags: {shown(field)}")
    return tags


def _as_etag(current: Union[str, ETag, None]) -> Optional[ETag]:
    if current is None or isinstance(current, ETag):
        return current
    return ETag.parse(current)


def if_match(field: str, current: Union[str, ETag, None]) -> bool:
    """Whether an ``If-Match`` precondition holds for a resource whose ETag is ``current``
    (None: the resource does not exist). Strong comparison: a weak tag never matches.
    False means: answer 412 and change nothing."""
    tags = parse_etags(field)
    now = _as_etag(current)
    if tags == "*":
        return now is not None
    if now is None or now.weak:
        return False
    return any(not t.weak and t.opaque == now.opaque for t in tags)


def if_none_match(field: str, current: Union[str, ETag, None]) -> bool:
    """Whether an ``If-None-Match`` precondition holds (weak comparison). False means:
    for GET and HEAD answer 304 Not Modified, for other methods 412."""
    tags = parse_etags(field)
    now = _as_etag(current)
    if tags == "*":
        return now is None
    if now is None:
        return True
    return not any(t.opaque == now.opaque for t in tags)


def expected_version(if_match_field: Optional[str]) -> Optional[int]:
    """The ``expected_version`` to pass to a stockade write for an ``If-Match`` field:
    None when the field is absent or ``*`` (any current version), else the version of its
    one strong stockade ETag. A weak tag can never match under If-Match, and several tags
    cannot be checked atomically as one version: both raise InvalidArgument."""
    if if_match_field is None:
        return None
    tags = parse_etags(if_match_field)
    if tags == "*":
        return None
    if len(tags) != 1 or tags[0].weak:
        raise InvalidArgument(
            "If-Match must name exactly one strong ETag (or *) for a conditional write, "
            f"got {shown(if_match_field)}"
        )
    return version_from_etag(str(tags[0]))


_TITLES = {
    400: "Bad Request",
    404: "Not Found",
    409: "Conflict",
    410: "Gone",
    412: "Precondition Failed",
    422: "Unprocessable Content",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

# What a body says, by code, where the error's message cannot be shown: every 5xx, and a
# 4xx the server raised (its message quotes the server's text). Plain words for the caller;
# the message itself goes to the log.
_PLAIN = {
    "retries_exhausted": "Too many requests changed this item at once; nothing was changed.",
    "lock_not_available": "Another request holds this item's lock; nothing was changed.",
    "lock_timeout": "Another request held this item's lock too long; nothing was changed.",
    "idempotency_conflict": "The idempotency key was already used for another request.",
    "in_doubt": "The outcome is unknown: the change may or may not have been made.",
    "overloaded": "The service is busy; nothing was changed.",
    "invalid_argument": "A value of the request is out of range; nothing was changed.",
    "not_supported": "The service does not support this request.",
    "invariant_violation": "The service refused a change that would break its stock; "
    "nothing was changed.",
    "unavailable": "The service cannot reach its database right now; nothing was changed.",
    "schema_not_migrated": "The service's database is not set up yet.",
    "misconfigured": "The service's database connection is misconfigured.",
    "deadline_exceeded": "The database did not answer in time; nothing was changed.",
    "database_error": "The database failed to answer the request.",
}
_PLAIN_OTHER = "The service failed to answer the request."

_LOG = logging.getLogger("stockade.http")


def _cut(text: str) -> str:
    return text if len(text) <= PROBLEM_TEXT_MAX else text[: PROBLEM_TEXT_MAX - 3] + "..."


def _shows_message(error: StockadeError) -> bool:
    """Whether the body may carry the error's message: a 4xx the engine raised about the
    caller's own input. A 5xx, or an error the server raised (it has a SQLSTATE), is told
    in plain words instead."""
    return error.http_status < 500 and error.sqlstate is None


# How a caller learns an in-doubt outcome, by what the call was about (the engine's own
# hint names its API, not the service's).
_IN_DOUBT_RESERVATION = " Read the reservation back before changing it again."
_IN_DOUBT_ROW = (
    " A request sent with an Idempotency-Key tells which when sent again with the same key;"
    " for any other change, read the item back before changing it again."
)


def _plain_detail(error: StockadeError, retry_after: Optional[int]) -> str:
    text = _PLAIN.get(error.code, _PLAIN_OTHER)
    if error.code == "in_doubt":
        text += _IN_DOUBT_RESERVATION if error.reservation_id is not None else _IN_DOUBT_ROW
    if retry_after is not None:
        return f"{text} Retry in {retry_after} s."
    if error.http_status >= 500:
        return f"{text} Retrying will not help; the service's log has the details."
    return text


def _log_withheld(error: StockadeError, status: int, instance: Optional[str]) -> None:
    """The message a body left out, on ``stockade.http``: ERROR for a 5xx a retry does not
    fix (an operator must act), INFO otherwise (a transient fault the core logs itself, or
    an ``InvariantViolation``, logged at ERROR once, as it was raised)."""
    level = logging.ERROR if status >= 500 and not error.retryable else logging.INFO
    if error.code == "invariant_violation":
        level = logging.INFO  # already logged at ERROR as it was raised (stockade.errors)
    where = f" for {shown(instance)}" if instance is not None else ""
    state = f" (SQLSTATE {error.sqlstate})" if error.sqlstate else ""
    _LOG.log(level, "answered %d %s%s: %s%s", status, error.code, where, error.message, state)


def problem(
    error: StockadeError, *, instance: Optional[str] = None
) -> Tuple[int, Dict[str, str], Dict[str, Any]]:
    """The HTTP response for ``error``, as RFC 9457 problem details: ``(status, headers,
    body)``. ``type`` is ``urn:stockade:error:<code>``; the body also carries ``code``,
    ``retryable``, ``retry_after`` (whole seconds, rounded up, when a retry can help; the
    ``Retry-After`` header too) and, where known, ``sku``, ``location``,
    ``reservation_id``, ``expected_version``, ``actual_version`` and an allocation's
    ``pool`` (each location's free units).

    ``detail`` is the error's message (bounded, with the caller's values escaped) only for
    a 4xx about the caller's own input. A 5xx, or an error the database raised (one with a
    ``sqlstate``), gets a plain sentence for its code and a retry hint instead: never a
    host, a port, a part of the DSN or the server's text. The message is logged on
    ``stockade.http`` (ERROR for a 5xx a retry does not fix, INFO otherwise). ``instance``
    and ``detail`` are cut to ``PROBLEM_TEXT_MAX`` (1024) characters, the cut marked with
    ``...``."""
    if not isinstance(error, StockadeError):
        raise InvalidArgument(f"problem() takes a StockadeError, not {type(error).__name__}")
    status = error.http_status
    retry_after = None if error.retry_after is None else max(0, math.ceil(error.retry_after))
    if _shows_message(error):
        detail = error.message
    else:
        detail = _plain_detail(error, retry_after)
        _log_withheld(error, status, instance)
    body: Dict[str, Any] = {
        "type": f"urn:stockade:error:{error.code}",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": _cut(detail),
        "code": error.code,
        "retryable": error.retryable,
    }
    if retry_after is not None:
        body["retry_after"] = retry_after
    if instance is not None:
        body["instance"] = _cut(instance)
    for name in ("sku", "location", "expected_version", "actual_version", "state"):
        value = getattr(error, name)
        if value not in (None, ""):
            body[name] = value
    if error.reservation_id is not None:
        body["reservation_id"] = str(error.reservation_id)
    if error.pool:  # an allocation's refusal: the caller's own locations, bounded in number
        body["pool"] = dict(error.pool)
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return status, headers, body
