"""A throwaway PgBouncer in transaction mode, in front of a :class:`TemporaryPostgres`.

The test suite runs its PostgreSQL tests through it (``pytest --stockade-pooler
pgbouncer``), and ``benchmarks/pooler.py`` measures the cost of the hop. It listens on a
free loopback port, with trust authentication, ``pool_mode = transaction`` and a wildcard
database entry, so every database of the server is reachable under its own name.
PgBouncer refuses to run as root, so as root it runs as the ``postgres`` system user. It
runs in the foreground as a child of this process, and :meth:`stop` ends it by its PID.

    >>> with TemporaryPostgres() as server, TemporaryPgBouncer(server) as bouncer:  # doctest: +SKIP
    ...     eng = stockade.Engine.postgres(bouncer.dsn(), pooler="pgbouncer-transaction")
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional, Protocol

from ..errors import Unavailable
from .pgserver import _free_port

__all__ = ["TemporaryPgBouncer", "find_pgbouncer"]


def find_pgbouncer() -> Optional[str]:
    """The pgbouncer binary: ``$STOCKADE_PGBOUNCER``, else ``pgbouncer`` on PATH or in
    /usr/sbin (Debian's package puts it there); None if there is none."""
    env = os.environ.get("STOCKADE_PGBOUNCER")
    if env:
        return env
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")


class Upstream(Protocol):
    """Where PgBouncer connects: a :class:`TemporaryPostgres`, or any server like it
    (trust authentication on loopback)."""

    host: str
    port: int
    user: str


class TemporaryPgBouncer:
    """PgBouncer in transaction mode in front of ``server``, removed by :meth:`stop`."""

    def __init__(
        self,
        server: Upstream,
        *,
        pool_size: int = 150,
        settings: Optional[Dict[str, str]] = None,
    ) -> None:
        self.server = server
        self.host = "127.0.0.1"
        self.port = 0
        self.pool_size = pool_size
        self.settings = dict(settings or {})
        self._dir: Optional[Path] = None
        self._process: Optional[subprocess.Popen[bytes]] = None

    def start(self) -> TemporaryPgBouncer:
        if self._process is not None:
            return self
        binary = find_pgbouncer()
        if binary is None:
            raise Unavailable("pgbouncer is not installed (Debian package `pgbouncer`)")
        owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._dir = Path(tempfile.mkdtemp(prefix="stockade-pgbouncer-"))
        if owner is not None:
            os.chown(self._dir, owner.pw_uid, owner.pw_gid)
        try:
            for attempt in range(5):
                self.port = _free_port()
                self._write_config()
                self._spawn(binary)
                if self._wait_listening(10.0):
                    break
                self._end_process()
                if attempt == 4:
                    raise Unavailable(f"pgbouncer did not start: {self._log_tail()}")
        except BaseException:
            self._cleanup()
            raise
        atexit.register(self.stop)
        return self

    def restart(self) -> None:
        """Ends PgBouncer and starts it again on the same port and configuration: every
        client and server connection through it drops, as in a pooler's restart."""
        binary = find_pgbouncer()
        if self._dir is None or binary is None:
            raise RuntimeError("pgbouncer is not running")
        self._end_process()
        for _ in range(50):  # the port may take a moment to come free
            self._spawn(binary)
            if self._wait_listening(10.0):
                return
            self._end_process()
            time.sleep(0.1)
        raise Unavailable(f"pgbouncer did not restart: {self._log_tail()}")

    def stop(self) -> None:
        """Ends PgBouncer (by its PID) and removes its directory."""
        if self._dir is None:
            return
        atexit.unregister(self.stop)
        try:
            self._end_process()
        finally:
            self._cleanup()

    def __enter__(self) -> TemporaryPgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> Optional[int]:
        return None if self._process is None else self._process.pid

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname`` through PgBouncer."""
        return (
            f"host={self.host} port={self.port} user={self.server.user} dbname={dbname} "
            "sslmode=disable gssencmode=disable"
        )

    # --- internals ---

    def _write_config(self) -> None:
        assert self._dir is not None
        options = {
            "listen_addr": self.host,
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self._dir / "userlist.txt"),
            "pool_mode": "transaction",
            "max_client_conn": "4000",
            "default_pool_size": str(self.pool_size),
            "server_idle_timeout": "30",
            # libpq sends it when asked to; PgBouncer would refuse the connection otherwise
            "ignore_startup_parameters": "extra_float_digits",
            "logfile": str(self._dir / "pgbouncer.log"),
            "pidfile": str(self._dir / "pgbouncer.pid"),
            **self.settings,
        }
        lines = [
            "[databases]",
            f"* = host={self.server.host} port={self.server.port}",
            "[pgbouncer]",
            *(f"{k} = {v}" for k, v in options.items()),
        ]
        (self._dir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (self._dir / "userlist.txt").write_text(f'"{self.server.user}" ""\n')
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            for name in ("pgbouncer.ini", "userlist.txt"):
                os.chown(self._dir / name, owner.pw_uid, owner.pw_gid)

    def _spawn(self, binary: str) -> None:
        assert self._dir is not None
        owner = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        self._process = subprocess.Popen(
            [binary, str(self._dir / "pgbouncer.ini")],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=str(self._dir),
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
        )

    def _wait_listening(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return True
            except OSError:
                time.sleep(0.02)
        return False

    def _end_process(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)  # PgBouncer 1.18: immediate shutdown
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def _log_tail(self) -> str:
        if self._dir is None:
            return ""
        log = self._dir / "pgbouncer.log"
        return log.read_text(errors="replace")[-1000:] if log.exists() else "(no log)"

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
