"""The error taxonomy is written once, in C++ (STOCKADE_ERROR_CODES in errors.hpp); these
tests check that the Python exception classes match it exactly, in both directions."""

from __future__ import annotations

from pathlib import Path

import stockade
from stockade import _core, errors


def _classes() -> list[type[stockade.StockadeError]]:
    return [
        cls
        for name in stockade.__all__
        if isinstance(cls := getattr(stockade, name), type)
        and issubclass(cls, stockade.StockadeError)
        and cls is not stockade.StockadeError
    ]


def test_every_core_error_code_has_exactly_one_exception_class() -> None:
    assert len(_core.ERROR_CODES) == len(set(_core.ERROR_CODES))
    assert set(errors._BY_CODE) == set(_core.ERROR_CODES)
    for code, cls in errors._BY_CODE.items():
        assert cls.code == code


def test_every_exported_exception_class_names_a_core_code() -> None:
    # InvalidType is the one refinement: an InvalidArgument that is also a TypeError.
    codes = {cls.code for cls in _classes()}
    assert codes == set(_core.ERROR_CODES)
    assert issubclass(stockade.InvalidType, stockade.InvalidArgument)


def test_an_error_from_the_core_becomes_its_class() -> None:
    eng = stockade.Engine.memory()
    eng.restock("sku-1", 1)
    try:
        eng.reserve("sku-1", 2)
    except stockade.OutOfStock as exc:
        assert exc.code == "out_of_stock"
        assert exc.sku == "sku-1"
    else:
        raise AssertionError("reserving more than exists must raise OutOfStock")


def test_the_package_and_its_core_share_one_version() -> None:
    assert stockade.__version__ == _core.__version__
    assert stockade.__version__.count(".") >= 2


def test_a_message_from_libpq_is_one_line() -> None:
    """libpq ends its texts in a newline and breaks them with a newline and a tab; an
    exception's message is one line, with nothing trailing."""
    try:
        stockade.Engine.postgres("host=127.0.0.1 port=1 connect_timeout=2")
    except stockade.Unavailable as e:
        message = str(e)
    else:  # pragma: no cover - nothing listens on port 1 of loopback
        raise AssertionError("connected to port 1")
    assert message.startswith("cannot connect to PostgreSQL: ")
    assert "\n" not in message and "\t" not in message and message == message.strip()
    # A line that ended a sentence without its full stop keeps one where lines join:
    # "Connection refused. Is the server running", never "refused Is the server".
    assert "Is the server running" in message, message  # libpq's second line
    assert ". Is the server running" in message, message


def test_the_tour_names_every_error() -> None:
    # The tour's list of errors is where a newcomer meets them: it names every class.
    tour = (Path(__file__).resolve().parents[2] / "docs" / "tour.md").read_text()
    missing = [cls.__name__ for cls in _classes() if f"`{cls.__name__}`" not in tour]
    assert not missing, missing
