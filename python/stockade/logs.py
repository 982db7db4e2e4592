"""stockade's logging: stdlib loggers under ``stockade``, fed by the C++ core.

The core keeps its records (reconnects, lost commits and how they were resolved,
overload, sweeper rounds that failed, leadership, retention, migrations) in a bounded
ring and never calls into Python. A daemon thread of this module drains the ring and hands
each record to the logger it names:

- ``stockade``: the engine;
- ``stockade.postgres``: connections, lost commits, migrations;
- ``stockade.batcher``: the hot-row layer (a full queue, a batch that failed as a whole);
- ``stockade.sweeper``: expiry and retention;
- ``stockade.http`` (from Python, not the core): what a problem document left out of
  its body (:func:`stockade.http.problem`).

Configure them as any stdlib logger: ``logging.getLogger("stockade").setLevel(...)``. The
core skips records below the effective level of ``stockade`` (read again every
``POLL_SECONDS``), so a quiet logger costs nothing. Faults that repeat under load are
logged at most once a second per place, with a count of those held back; if the ring
fills anyway, a warning says how many records were dropped. Messages never carry a
password or an unbounded caller value.

The thread starts with the first engine, and again in a forked child.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Optional

from . import _core

LOGGER = logging.getLogger("stockade")
POLL_SECONDS = 0.2
_BATCH = 256

_lock = threading.Lock()
_thread: Optional[threading.Thread] = None
_pid = 0
_stopping = threading.Event()


def _sync_level() -> None:
    _core.set_log_level(LOGGER.getEffectiveLevel())


def _pump() -> None:
    while not _stopping.is_set():
        _sync_level()
        records, dropped = _core.take_logs(_BATCH, int(POLL_SECONDS * 1000))
        for level, name, message, unix_us in records:
            logger = logging.getLogger(name)
            if logger.isEnabledFor(level):
                record = logger.makeRecord(
                    name, level, "(stockade core)", 0, message, (), None, "core"
                )
                record.created = unix_us / 1e6
                record.msecs = (unix_us // 1000) % 1000
                logger.handle(record)
        if dropped:
            LOGGER.warning("the core's log ring was full: %d records were dropped", dropped)


def start() -> None:
    """Starts the thread that drains the core's log records (idempotent; again after a
    fork, in the child)."""
    global _thread, _pid
    with _lock:
        if _thread is not None and _pid == os.getpid() and _thread.is_alive():
            return
        _sync_level()
        _pid = os.getpid()
        _thread = threading.Thread(target=_pump, name="stockade-log", daemon=True)
        _thread.start()


@atexit.register
def _stop() -> None:
    """At exit, before the interpreter finalizes: the reader leaves C++ (where a daemon
    thread must not be when Python ends it) after delivering what is left."""
    _stopping.set()
    _core.stop_taking_logs()
    thread = _thread
    if thread is not None and thread.is_alive() and _pid == os.getpid():
        thread.join(timeout=2.0)


def _forget_after_fork() -> None:
    global _thread, _lock
    _thread = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
