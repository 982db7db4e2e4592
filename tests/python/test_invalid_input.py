"""Bad input gets a typed error and changes nothing.

Goal: every malformed argument raises InvalidArgument (a ValueError) or, for the wrong
Python type, InvalidType (also a TypeError), and leaves the stock row, its version and
the reservation table exactly as they were. Method: snapshot, call, compare.
"""

from __future__ import annotations

import inspect
import uuid
from datetime import timedelta
from typing import Any, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stockade
from public_api import ENGINE_CALLS, FEED_CALLS, World, arguments_of, invoke, ordered, public_calls

INT64_MAX = 2**63 - 1


def snapshot(engine: stockade.Engine) -> tuple[Any, ...]:
    counts = engine.row_counts()
    return (engine.stock("sku-1"), counts["reservation_count"], counts["sku_count"])


@pytest.fixture
def stocked(engine: stockade.Engine) -> stockade.Engine:
    engine.restock("sku-1", 10)
    engine.reserve("sku-1", 1)
    return engine


BAD_VALUES: list[tuple[str, Callable[[stockade.Engine], object]]] = [
    ("qty zero", lambda e: e.reserve("sku-1", 0)),
    ("qty negative", lambda e: e.reserve("sku-1", -3)),
    ("qty past int64", lambda e: e.reserve("sku-1", INT64_MAX + 1)),
    ("qty past quantity_max", lambda e: e.reserve("sku-1", 10**12 + 1)),
    ("restock past quantity_max", lambda e: e.restock("sku-1", INT64_MAX)),
    ("sell past quantity_max", lambda e: e.sell("sku-1", 10**12 + 1)),
    ("empty sku", lambda e: e.reserve("", 1)),
    ("sku over 256 bytes", lambda e: e.reserve("x" * 257, 1)),
    ("sku over 256 bytes in UTF-8", lambda e: e.reserve("é" * 129, 1)),
    ("NUL in sku", lambda e: e.reserve("sku-1\x00", 1)),
    ("NUL in location", lambda e: e.reserve("sku-1", 1, location="a\x00b")),
    ("empty location", lambda e: e.reserve("sku-1", 1, location="")),
    ("lone surrogate in sku", lambda e: e.reserve("sku-\ud800", 1)),
    ("negative ttl", lambda e: e.reserve("sku-1", 1, ttl=timedelta(seconds=-1))),
    ("zero ttl", lambda e: e.reserve("sku-1", 1, ttl=0)),
    ("ttl over a year", lambda e: e.reserve("sku-1", 1, ttl=timedelta(days=400))),
    ("nan ttl", lambda e: e.reserve("sku-1", 1, ttl=float("nan"))),
    ("huge ttl", lambda e: e.reserve("sku-1", 1, ttl=timedelta(days=999_999_999))),
    ("empty idempotency key", lambda e: e.reserve("sku-1", 1, idempotency_key="")),
    ("unknown strategy", lambda e: e.reserve("sku-1", 1, strategy="yolo")),
    ("nowait with atomic", lambda e: e.reserve("sku-1", 1, strategy="atomic", nowait=True)),
    ("zero lock_timeout", lambda e: e.reserve("sku-1", 1, lock_timeout=0)),
    ("negative expected_version", lambda e: e.reserve("sku-1", 1, expected_version=-1)),
    ("set_on_hand negative", lambda e: e.set_on_hand("sku-1", -1)),
    ("sell zero", lambda e: e.sell("sku-1", 0)),
    ("empty order", lambda e: e.reserve_order({})),
    ("order with zero qty", lambda e: e.reserve_order({"sku-1": 0})),
    ("order naming a row twice", lambda e: e.reserve_order({"sku-1": 1, ("sku-1", "default"): 1})),
    ("malformed reservation id", lambda e: e.confirm("not-a-uuid")),
    ("expire_due limit zero", lambda e: e.expire_due(limit=0)),
    ("extend with negative ttl", lambda e: e.extend(uuid.uuid4(), ttl=-5)),
]

BAD_TYPES: list[tuple[str, Callable[[stockade.Engine], object]]] = [
    ("qty as str", lambda e: e.reserve("sku-1", "1")),  # type: ignore[arg-type]
    ("qty as float", lambda e: e.reserve("sku-1", 1.0)),  # type: ignore[arg-type]
    ("qty as bool", lambda e: e.reserve("sku-1", True)),
    ("qty as None", lambda e: e.reserve("sku-1", None)),  # type: ignore[arg-type]
    ("sku as int", lambda e: e.reserve(42, 1)),  # type: ignore[arg-type]
    ("sku as bytes", lambda e: e.reserve(b"sku-1", 1)),  # type: ignore[arg-type]
    ("location as None", lambda e: e.reserve("sku-1", 1, location=None)),  # type: ignore[arg-type]
    ("ttl as str", lambda e: e.reserve("sku-1", 1, ttl="10m")),  # type: ignore[arg-type]
    ("strategy as int", lambda e: e.reserve("sku-1", 1, strategy=3)),  # type: ignore[arg-type]
    ("nowait as int", lambda e: e.reserve("sku-1", 1, strategy="pessimistic", nowait=1)),  # type: ignore[arg-type]
    ("idempotency key as int", lambda e: e.reserve("sku-1", 1, idempotency_key=7)),  # type: ignore[arg-type]
    ("expected_version as str", lambda e: e.sell("sku-1", 1, expected_version="2")),  # type: ignore[arg-type]
    ("reservation id as int", lambda e: e.confirm(12345)),  # type: ignore[arg-type]
    ("order as list", lambda e: e.reserve_order([("sku-1", 1)])),  # type: ignore[arg-type]
    ("restock qty as float", lambda e: e.restock("sku-1", 2.5)),  # type: ignore[arg-type]
]


@pytest.mark.parametrize("call", [c for _, c in BAD_VALUES], ids=[n for n, _ in BAD_VALUES])
def test_bad_values_raise_invalid_argument_and_change_nothing(
    stocked: stockade.Engine, call: Callable[[stockade.Engine], object]
) -> None:
    before = snapshot(stocked)
    with pytest.raises(stockade.InvalidArgument) as info:
        call(stocked)
    assert isinstance(info.value, ValueError) and isinstance(info.value, stockade.StockadeError)
    assert str(info.value)
    assert snapshot(stocked) == before


@pytest.mark.parametrize("call", [c for _, c in BAD_TYPES], ids=[n for n, _ in BAD_TYPES])
def test_wrong_python_types_raise_invalid_type_and_change_nothing(
    stocked: stockade.Engine, call: Callable[[stockade.Engine], object]
) -> None:
    before = snapshot(stocked)
    with pytest.raises(stockade.InvalidType) as info:
        call(stocked)
    assert isinstance(info.value, TypeError) and isinstance(info.value, stockade.InvalidArgument)
    assert snapshot(stocked) == before


@settings(max_examples=200, deadline=None)
@given(
    sku=st.one_of(st.text(max_size=300), st.binary(max_size=10), st.integers(), st.none()),
    qty=st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70), st.floats(), st.text(max_size=3)
    ),
)
def test_any_input_either_succeeds_or_raises_a_stockade_error(sku: Any, qty: Any) -> None:
    # Goal: no input crashes the core or escapes the error taxonomy, and a refused call
    # changes nothing. Method: arbitrary sku/qty values against a fresh engine.
    engine = stockade.Engine.memory()
    engine.restock("sku-1", 10)
    before = snapshot(engine)
    try:
        engine.reserve(sku, qty)
    except stockade.StockadeError:
        assert snapshot(engine) == before
    else:
        assert isinstance(qty, int) and 0 < qty <= 10 and sku == "sku-1"


def test_input_limits_are_exported_and_an_error_names_the_one_passed(
    stocked: stockade.Engine,
) -> None:
    """The limits a caller can reach are constants of the package, counted in UTF-8 bytes,
    and the InvalidArgument past one names it; a value at the limit is taken."""
    assert stockade.SKU_BYTES_MAX == stockade.LOCATION_BYTES_MAX == 256
    assert stockade.IDEMPOTENCY_KEY_BYTES_MAX == 256
    assert stockade.TTL_MAX == timedelta(days=366)
    at_limit = "s" * stockade.SKU_BYTES_MAX
    assert stocked.restock(at_limit, 1, location="l" * stockade.LOCATION_BYTES_MAX).on_hand == 1
    key = "k" * stockade.IDEMPOTENCY_KEY_BYTES_MAX
    assert stocked.reserve("sku-1", 1, idempotency_key=key).qty == 1
    before = snapshot(stocked)
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: stocked.reserve("s" * 10240, 1), "10240 bytes long.*SKU_BYTES_MAX"),
        (lambda: stocked.restock("é" * 256, 1), "512 bytes long .UTF-8.*SKU_BYTES_MAX"),
        (lambda: stocked.stock("sku-1", location="l" * 257), "LOCATION_BYTES_MAX"),
        (lambda: stocked.reserve("sku-1", 1, idempotency_key=key + "k"), "IDEMPOTENCY_KEY_BYTES"),
        (lambda: stocked.reserve("sku-1", stockade.QUANTITY_MAX + 1), "QUANTITY_MAX"),
        (lambda: stocked.reserve("sku-1", 1, ttl=stockade.TTL_MAX * 2), "TTL_MAX"),
        (
            lambda: stocked.reserve_order(
                {f"sku-{n}": 1 for n in range(stockade.ORDER_LINES_MAX + 1)}
            ),
            "ORDER_LINES_MAX",
        ),
    ]
    for call, named in cases:
        with pytest.raises(stockade.InvalidArgument, match=named):
            call()
    assert snapshot(stocked) == before


# --- every argument of every public call, found by introspection ---

WRONG_TYPE = object()  # no parameter takes it
# Values past what a parameter may hold: negative (for a C++ count), past 32 bits (for a
# C++ int), past 64 bits, empty, not a number.
PROBE_VALUES: list[object] = [
    -1,
    0,
    2**31,
    2**40,
    2**64,
    2**70,
    -(2**70),
    "",
    float("nan"),
    float("inf"),
]
# A DSN that nothing answers: an engine whose options pass fails fast with Unavailable.
NOWHERE = "host=127.0.0.1 port=1 connect_timeout=2"


def probes(method: Callable[..., object], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """(parameter, value, args, kwargs): the call with one argument replaced, for every
    parameter of ``method`` and every probe value."""
    signature = inspect.signature(method)
    for name, parameter in signature.parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        for value in [WRONG_TYPE, *PROBE_VALUES]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            bound.arguments[name] = value
            yield name, value, bound.args, bound.kwargs


def answer(run: Callable[[], object]) -> BaseException | None:
    """What the call raised (None: it returned); an engine it made is closed."""
    try:
        made = run()
    except Exception as e:
        return e
    if isinstance(made, stockade.Engine):
        made.close()
    return None


def misfits(where: str, value: object, raised: BaseException | None) -> list[str]:
    """What is wrong with the answer to a probe: a wrong type must raise InvalidType, and
    no probe may raise anything but a stockade error."""
    if value is WRONG_TYPE and not isinstance(raised, stockade.InvalidType):
        return [f"{where}: a wrong type gave {raised!r}, not InvalidType"]
    if raised is not None and not isinstance(raised, stockade.StockadeError):
        return [f"{where}={value!r}: {type(raised).__name__}: {raised}"]
    return []


def test_every_argument_of_every_public_call_gets_a_stockade_error(
    memory_engine: stockade.Engine,
) -> None:
    # Goal: no argument of any call, a call added later included, reaches the binding
    # with a type or a value it cannot take (pybind11's TypeError "incompatible function
    # arguments", an OverflowError, ...): each is InvalidType or InvalidArgument, or the
    # store's answer. Method: every public method of Engine and Feed and every awaitable
    # twin (public_api), each parameter in turn given a wrong type and bad values. The
    # binding converts alike on either store, so the memory store answers for both.
    world = World.made(memory_engine)
    found: list[str] = []
    for cls, table in ((stockade.Feed, FEED_CALLS), (stockade.Engine, ENGINE_CALLS)):
        target: Any = world.feed if cls is stockade.Feed else memory_engine
        for name in ordered(public_calls(cls)):
            args, kwargs = arguments_of(name, table, world)
            for parameter, value, a, k in probes(getattr(target, name), args, kwargs):
                raised = answer(lambda: invoke(target, name, a, k))  # noqa: B023
                found += misfits(f"{cls.__name__}.{name}({parameter}", value, raised)
    assert found == []


@pytest.mark.parametrize("factory", ["memory", "postgres"])
def test_every_keyword_of_the_constructors_gets_a_stockade_error(factory: str) -> None:
    # Goal: the constructors hold to the same rule. Method: each keyword in turn given a
    # wrong type and bad values (PostgreSQL: towards a port nothing answers on, so options
    # that pass end in Unavailable at once).
    make = getattr(stockade.Engine, factory)
    base: tuple[Any, ...] = () if factory == "memory" else (NOWHERE,)
    found: list[str] = []
    for parameter, value, a, k in probes(make, base, {}):
        if parameter == "dsn" and value is not WRONG_TYPE:
            continue  # a DSN's values: test_hostile_input (an empty one reads PG*)
        found += misfits(f"Engine.{factory}({parameter}", value, answer(lambda: make(*a, **k)))  # noqa: B023
    assert found == []
