"""What the calls of a closed engine meet: :class:`ClosedCore`.

:meth:`Engine.close` puts it in place of the engine's core before it drains, so every call
made after that (blocking, awaitable, a feed's, on either store) raises ``Unavailable``
("the engine is closed", HTTP 503) at once, instead of reaching a store that is gone.
A call already inside the core when close() began completes; if close() came first, the
core says the same (the batcher, the async workers and the PostgreSQL pool raise
``Unavailable`` once closed).
"""

from __future__ import annotations

from typing import Any, NoReturn

from .errors import Unavailable

__all__ = ["CLOSED_MESSAGE", "ClosedCore"]

CLOSED_MESSAGE = "the engine is closed: make a new one to go on"


def _refuse(*_args: Any, **_kwargs: Any) -> NoReturn:
    raise Unavailable(CLOSED_MESSAGE)


class ClosedCore:
    """A closed engine's core: its calls raise ``Unavailable``; its properties
    (``backend``, ``default_strategy``, ...) still read; closing again does nothing."""

    def __init__(self, core: Any) -> None:
        self._stockade_closed = core
        # Engine._native() unwraps a wrapper to the compiled engine (for the C++ hooks).
        self.__wrapped__ = getattr(core, "__wrapped__", core)

    def close(self) -> None:
        """Closing twice is harmless."""

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._stockade_closed, name)
        return _refuse if callable(value) else value
