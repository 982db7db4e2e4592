"""The asyncio bridge: how an awaitable call reaches the C++ core and comes back.

An async twin (``Engine.reserve_async`` and its siblings) checks its arguments like the
blocking call, then queues the call in C++ (the hot-row batcher, or a small pool of C++
workers) with a token, and awaits a future. C++ threads post outcomes to the event loop's
:class:`_core.AsyncChannel` without taking the GIL; the loop watches the channel's eventfd,
and one readable event drains every outcome that has arrived, however many, and resolves
their futures. No Python thread runs per call.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from typing import Any, Callable, Dict, Tuple, TypeVar

from . import _core

__all__ = ["Bridges", "off_loop"]

T = TypeVar("T")


class _Bridge:
    """The completions of one event loop's async calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # The loop is not referenced from here: Bridges holds the bridge for as long as the
        # loop lives, and a strong reference back would keep both forever.
        self.channel = _core.AsyncChannel()
        self.futures: Dict[int, Tuple[asyncio.Future[Any], Callable[[Any], Any]]] = {}
        self.next_token = 0
        loop.add_reader(self.channel.fd, self.drain)

    def submit(
        self,
        submit: Callable[..., None],
        convert: Callable[[Any], T],
        arguments: Dict[str, Any],
    ) -> asyncio.Future[T]:
        token = self.next_token
        self.next_token += 1
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.futures[token] = (future, convert)
        try:
            submit(self.channel, token, **arguments)
        except BaseException:
            del self.futures[token]
            raise
        return future

    def drain(self) -> None:
        for token, value, error in self.channel.drain():
            future, convert = self.futures.pop(token)
            if future.done():  # cancelled by its caller; the call itself still ran
                continue
            if error is not None:
                future.set_exception(error)
                continue
            try:
                future.set_result(convert(value))
            except Exception as exc:  # a failed conversion must not strand the others
                future.set_exception(exc)


class Bridges:
    """One engine's bridges, one per event loop that has called it."""

    def __init__(self) -> None:
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Bridge] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    async def call(
        self,
        submit: Callable[..., None],
        convert: Callable[[Any], T],
        /,
        **arguments: Any,
    ) -> T:
        """Queues ``submit(channel, token, **arguments)`` in C++ and awaits its converted
        outcome.

        Bad input and a full queue raise here, before anything is queued. Cancelling the
        await does not cancel the call: it may still commit."""
        loop = asyncio.get_running_loop()
        with self._lock:
            bridge = self._by_loop.get(loop)
            if bridge is None:
                bridge = self._by_loop[loop] = _Bridge(loop)
        return await bridge.submit(submit, convert, arguments)


async def off_loop(call: Callable[[], T]) -> T:
    """Runs a blocking call on the running loop's default executor (a bounded thread
    pool), so that the event loop never waits on the network: the twin of every call
    that is not queued in C++. The call runs in the caller's context (contextvars), as
    with asyncio.to_thread, so that a tracing span or a request id follows it."""
    context = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(None, context.run, call)
