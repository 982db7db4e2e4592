"""A throwaway PostgreSQL server: for the test suite, the demo and notebooks.

:class:`TemporaryPostgres` runs ``initdb`` in a temporary directory and starts a server on
a free loopback port, with ``fsync`` and ``synchronous_commit`` on (figures measured on it
are the figures of a durable server). PostgreSQL refuses to run as root, so when the
current user is root the server runs as the ``postgres`` system user.

    >>> with TemporaryPostgres() as server:            # doctest: +SKIP
    ...     eng = stockade.Engine.postgres(server.dsn())
    ...     eng.migrate()

The server binaries are found in ``$STOCKADE_PG_BINDIR``, else the newest
``/usr/lib/postgresql/<version>/bin`` (Debian), else ``PATH``.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .. import _core
from ..errors import InvalidArgument, StockadeError, Unavailable

__all__ = [
    "TemporaryPostgres",
    "child_connection",
    "conninfo_with",
    "find_bindir",
    "quote_ident",
    "run_sql",
]

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def quote_ident(name: str) -> str:
    """Checks that ``name`` is a plain lower-case SQL identifier and returns it."""
    if not _IDENT.match(name):
        raise ValueError(f"not a plain SQL identifier: {name!r}")
    return name


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    env = os.environ.get("STOCKADE_PG_BINDIR")
    if env:
        return Path(env)

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version)
    for candidate in reversed(debian):
        if (Path(candidate) / "initdb").exists():
            return Path(candidate)
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise Unavailable(
        "no PostgreSQL server binaries (initdb) found: install the `postgresql` package "
        "(`make test` and `make demo` do), or set STOCKADE_PG_BINDIR"
    )


# Connection keywords that are secrets: never on a child's command line (anyone on the
# machine can read /proc/<pid>/cmdline).
_SECRET_KEYWORDS = ("password", "sslpassword")


def child_connection(dsn: str) -> Tuple[str, Dict[str, str]]:
    """A connection string for a libpq child process (psql, pgbench) with the password
    taken out, and the environment that hands it over instead (``PGPASSWORD``, which only
    the same user can read). ``sslpassword`` has no environment variable and is refused."""
    options = dict(_core.parse_conninfo(dsn))
    if options.get("sslpassword"):
        raise InvalidArgument(
            "a dsn with sslpassword cannot be handed to psql or pgbench without putting the "
            "secret on their command line; use an unencrypted key file for benchmarks"
        )
    env = dict(os.environ, PGCLIENTENCODING="UTF8")  # the text we read back is UTF-8
    if options.get("password"):
        env["PGPASSWORD"] = options["password"]
    public = {k: v for k, v in options.items() if k not in _SECRET_KEYWORDS}
    return _conninfo(public), env


def conninfo_with(dsn: str, **changes: str) -> str:
    """The connection string ``dsn`` (key=value or URI) as key=value pairs, with the
    keywords in ``changes`` set (for example ``dbname``)."""
    options = dict(_core.parse_conninfo(dsn))
    options.update(changes)
    return _conninfo(options)


def _conninfo(options: Dict[str, str]) -> str:
    """Keyword/value pairs as one key=value connection string."""
    return " ".join(f"{keyword}={_conninfo_value(value)}" for keyword, value in options.items())


def _conninfo_value(value: str) -> str:
    """A conninfo value: as is when it is plain, else in single quotes with backslashes
    and quotes escaped."""
    if value and not any(c in value for c in " \t\n'\\"):
        return value
    escaped = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{escaped}'"


def run_sql(dsn: str, statement: str) -> str:
    """Runs one SQL statement with ``psql`` (autocommit); returns its unaligned output.
    The password travels in psql's environment, never on its command line."""
    return run_sql_with_messages(dsn, statement)[0]


def run_sql_with_messages(dsn: str, statement: str) -> Tuple[str, str]:
    """:func:`run_sql`, and the server's messages (NOTICE, LOG... as psql prints them on
    its standard error) besides the output."""
    psql = shutil.which("psql")
    if psql is None:
        try:
            psql = str(find_bindir() / "psql")
        except Unavailable:
            psql = "psql"
    conninfo, env = child_connection(dsn)
    done = subprocess.run(
        [psql, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-c", statement],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise StockadeError(f"psql failed on {statement!r}: {done.stderr.strip()}")
    return done.stdout.strip(), done.stderr


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryPostgres:
    """A PostgreSQL server in a temporary directory, removed by :meth:`stop`."""

    def __init__(
        self,
        *,
        max_connections: int = 300,
        settings: Optional[dict[str, str]] = None,
        user: str = "postgres",
    ) -> None:
        self.bindir = find_bindir()
        self.host = "127.0.0.1"
        self.port = 0
        self.user = user
        self.max_connections = max_connections
        self.settings = dict(settings or {})
        self._dir: Optional[Path] = None
        self._run_as: List[str] = []
        self._owner: Optional[pwd.struct_passwd] = None

    # --- lifecycle ---

    def start(self) -> TemporaryPostgres:
        """Runs initdb and starts the server; returns self."""
        if self._dir is not None:
            return self
        if os.geteuid() == 0:
            try:
                self._owner = pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable(
                    "running as root, and initdb refuses root: a `postgres` system user is "
                    "needed (the Debian `postgresql` package creates it)"
                ) from None
            self._run_as = ["runuser", "-u", "postgres", "--"]
        self._dir = Path(tempfile.mkdtemp(prefix="stockade-pg-"))
        if self._owner is not None:
            os.chown(self._dir, self._owner.pw_uid, self._owner.pw_gid)
        try:
            self._run(
                [
                    str(self.bindir / "initdb"),
                    "-D",
                    str(self._data),
                    "-U",
                    self.user,
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
            for attempt in range(5):
                self.port = _free_port()
                try:
                    self._pg_ctl_start()
                    break
                except StockadeError:
                    if attempt == 4:
                        raise
        except BaseException:
            self._cleanup()
            raise
        atexit.register(self.stop)  # no server outlives its process on a normal exit
        return self

    def stop(self) -> None:
        """Stops the server and removes its directory."""
        if self._dir is None:
            return
        atexit.unregister(self.stop)
        try:
            self._run(
                [str(self.bindir / "pg_ctl"), "-D", str(self._data), "-m", "fast", "-w", "stop"],
                check=False,
            )
        finally:
            self._cleanup()

    def restart(self, mode: str = "fast") -> None:
        """Stops the server with ``pg_ctl -m <mode>`` (``fast``: sessions are ended and
        the server shuts down cleanly; ``immediate``: no shutdown checkpoint, crash
        recovery on start) and starts it again on the same port and data."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError("mode must be smart, fast or immediate")
        if self._dir is None:
            raise RuntimeError("the server is not running")
        self._run([str(self.bindir / "pg_ctl"), "-D", str(self._data), "-m", mode, "-w", "stop"])
        self._pg_ctl_start()

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- use ---

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq connection string for ``dbname`` on this server."""
        return (
            f"host={self.host} port={self.port} user={self.user} dbname={dbname} "
            "sslmode=disable gssencmode=disable"
        )

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """Runs one SQL statement on ``dbname``; returns its unaligned output."""
        return run_sql(self.dsn(dbname), statement)

    def create_database(self, name: str, *, template: Optional[str] = None) -> str:
        """Creates database ``name`` (cloned from ``template`` if given); returns its DSN."""
        clause = f" TEMPLATE {quote_ident(template)}" if template else ""
        self.sql(f"CREATE DATABASE {quote_ident(name)}{clause}")
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drops database ``name``, disconnecting whoever is still on it."""
        self.sql(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)")

    @property
    def log_path(self) -> Optional[Path]:
        return None if self._dir is None else self._dir / "server.log"

    @property
    def pid(self) -> int:
        """The postmaster's process id (from its postmaster.pid), for tools that watch the
        server's processes."""
        if self._dir is None:
            raise RuntimeError("the server is not running")
        return int((self._data / "postmaster.pid").read_text().split()[0])

    # --- internals ---

    @property
    def _data(self) -> Path:
        assert self._dir is not None
        return self._dir / "data"

    def _pg_ctl_start(self) -> None:
        assert self._dir is not None
        options = {
            "listen_addresses": self.host,
            "port": str(self.port),
            "unix_socket_directories": str(self._dir),
            "max_connections": str(self.max_connections),
            "fsync": "on",
            "synchronous_commit": "on",
            **self.settings,
        }
        flags = " ".join(f"-c {k}={v}" for k, v in options.items())
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self._data),
                "-l",
                str(self._dir / "server.log"),
                "-o",
                flags,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )

    def _run(self, argv: Sequence[str], *, check: bool = True) -> None:
        done = subprocess.run(
            [*self._run_as, *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=str(self._dir) if self._dir else None,
        )
        if check and done.returncode != 0:
            log = ""
            if self.log_path is not None and self.log_path.exists():
                log = self.log_path.read_text(errors="replace")[-2000:]
            raise Unavailable(
                f"{Path(argv[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()}\n{log}".strip()
            )

    def _cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
