"""A throwaway three-node Citus cluster on loopback, for the Citus layout's tests.

It uses the prebuilt Citus of the directory beside the project (``../shared/citus``, or
``$STOCKADE_CITUS_DIR``): ``install.sh`` copies the extension into the PostgreSQL 15
server's directories (it exits 3 where the build does not fit, for example another
PostgreSQL version: :func:`citus_available` then says why), and ``cluster.sh`` starts a
coordinator and two workers on free loopback ports, as the ``postgres`` system user when
run as root. :meth:`TemporaryCitus.stop` stops the three servers with ``pg_ctl`` and then
ends any that is left by the PID in its ``postmaster.pid``, and removes their directory.

    >>> with TemporaryCitus() as cluster:  # doctest: +SKIP
    ...     eng = stockade.Engine.postgres(cluster.dsn(), layout="citus", schema="shop")
    ...     eng.migrate()
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

from ..errors import Unavailable
from .pgserver import _free_port, run_sql
from .reuse import Handed, Shape, schema_is

__all__ = [
    "CitusSchemas",
    "TemporaryCitus",
    "citus_available",
    "drop_citus_schema",
    "find_citus_dir",
]

# The nodes cluster.sh starts, on the ports PORT, PORT+1 and PORT+2.
NODES = ("coordinator", "worker1", "worker2")

# install.sh's exit code for "this Citus build does not fit this machine".
NOT_AVAILABLE = 3


def find_citus_dir() -> Optional[Path]:
    """``$STOCKADE_CITUS_DIR``, else ``shared/citus`` beside the project's checkout (the
    directory above it); None if neither holds ``install.sh`` and ``cluster.sh``."""
    env = os.environ.get("STOCKADE_CITUS_DIR")
    here = Path(__file__).resolve()
    candidates = [Path(env)] if env else []
    candidates += [parent / "shared" / "citus" for parent in here.parents]
    candidates.append(Path.cwd().parent / "shared" / "citus")
    for c in candidates:
        if (c / "install.sh").is_file() and (c / "cluster.sh").is_file():
            return c
    return None


def citus_available() -> Tuple[bool, str]:
    """Runs ``install.sh`` (idempotent) and says whether a cluster can start here, and if
    not, why."""
    directory = find_citus_dir()
    if directory is None:
        return False, "no Citus build found (../shared/citus or $STOCKADE_CITUS_DIR)"
    try:
        out = subprocess.run(
            ["bash", str(directory / "install.sh")],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"install.sh did not run: {type(exc).__name__}"
    if out.returncode == NOT_AVAILABLE:
        reason = (out.stdout + out.stderr).strip().splitlines()
        return False, "install.sh exit 3, Citus not available here: " + " / ".join(reason[-3:])
    if out.returncode != 0:
        return False, f"install.sh failed (exit {out.returncode}): {out.stderr.strip()[-300:]}"
    return True, "installed"


class TemporaryCitus:
    """A coordinator and two workers from ``cluster.sh``, removed by :meth:`stop`."""

    def __init__(self) -> None:
        self.directory = find_citus_dir()
        self.port = 0
        self._base: Optional[Path] = None

    def start(self) -> TemporaryCitus:
        if self._base is not None:
            return self
        if self.directory is None:
            raise Unavailable("no Citus build found (../shared/citus or $STOCKADE_CITUS_DIR)")
        error = ""
        # It needs three consecutive free ports, and another process may take one between
        # the check and the bind: a failed start is stopped, and tried again on new ones.
        for _ in range(3):
            root = Path(tempfile.mkdtemp(prefix="stockade-citus-"))
            root.chmod(0o755)  # the servers run as the postgres user
            self._base = root / "cluster"
            atexit.register(self.stop)  # no server outlives this process on a normal exit
            self.port = _free_port()
            if self.port <= 65530:
                out = self._cluster("start")
                if out.returncode == 0:
                    return self
                error = out.stderr.strip()[-500:]
            self.stop()
        raise Unavailable(f"the Citus cluster did not start: {error}")

    def stop(self) -> None:
        if self._base is None:
            return
        base, self._base = self._base, None
        atexit.unregister(self.stop)
        try:
            if self.directory is not None:
                subprocess.run(
                    ["bash", str(self.directory / "cluster.sh"), "stop", str(base), str(self.port)],
                    capture_output=True,
                    timeout=120,
                )
        except (OSError, subprocess.TimeoutExpired):
            pass
        for pid in self._pids(base):  # whatever pg_ctl left running
            try:
                os.kill(pid, signal.SIGQUIT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in self._pids(base)) and time.monotonic() < deadline:
            time.sleep(0.1)
        shutil.rmtree(base.parent, ignore_errors=True)

    def __enter__(self) -> TemporaryCitus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def dsn(self, dbname: str = "postgres") -> str:
        """The coordinator's libpq URI (user postgres, trust authentication)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def pids(self) -> List[int]:
        """The postmasters' PIDs of the coordinator and the workers that are running."""
        return [] if self._base is None else self._pids(self._base)

    def node_port(self, node: str) -> int:
        """The port of ``node`` (coordinator, worker1 or worker2)."""
        return self.port + NODES.index(node)

    def node_dsn(self, node: str) -> str:
        """The libpq URI of ``node``'s database postgres (user postgres, trust
        authentication)."""
        return f"postgresql://postgres@127.0.0.1:{self.node_port(node)}/postgres"

    def stop_node(self, node: str, mode: str = "immediate") -> None:
        """Stops one node with ``pg_ctl stop -m mode`` (``immediate``: as a crash, with
        crash recovery at the next start), for fault tests; :meth:`start_node` brings it
        back."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be smart, fast or immediate, got {mode!r}")
        self._pg_ctl(node, "stop", "-m", mode, "-w", "-t", "60")

    def start_node(self, node: str) -> None:
        """Starts a node that :meth:`stop_node` stopped, and waits until it accepts
        connections (after any crash recovery), at most 120 s."""
        self._pg_ctl(
            node, "start", "-w", "-t", "120", "-l", str(self._node_dir(node) / "server.log")
        )

    def log_text(self, node: str = "coordinator") -> str:
        """The server log of ``node`` (coordinator, worker1 or worker2) so far."""
        if self._base is None:
            return ""
        try:
            return (self._base / node / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def workers_sessions_kib(self, application_name: str) -> Tuple[int, int]:
        """The private memory (the ``Private_*`` lines of ``/proc/PID/smaps_rollup``, in
        KiB) of the sessions on both workers whose ``application_name`` is LIKE
        ``application_name`` (a pattern of letters, digits, ``_``, ``-`` and ``%``), and
        how many there were. A session that ends between the two reads is left out."""
        if not all(c.isalnum() or c in "_-% " for c in application_name):
            raise ValueError("application_name must be letters, digits, _, -, % or spaces")
        total, sessions = 0, 0
        for node in NODES[1:]:
            pids = run_sql(
                self.node_dsn(node),
                "SELECT coalesce(string_agg(pid::text, ' '), '') FROM pg_stat_activity"
                f" WHERE application_name LIKE '{application_name}'",
            )
            for pid in pids.split():
                try:
                    with open(f"/proc/{pid}/smaps_rollup") as f:
                        total += sum(
                            int(line.split()[1]) for line in f if line.startswith("Private_")
                        )
                    sessions += 1
                except FileNotFoundError:
                    pass
        return total, sessions

    def _cluster(self, action: str) -> subprocess.CompletedProcess[str]:
        assert self.directory is not None and self._base is not None
        return subprocess.run(
            ["bash", str(self.directory / "cluster.sh"), action, str(self._base), str(self.port)],
            capture_output=True,
            text=True,
            timeout=300,
        )

    def _node_dir(self, node: str) -> Path:
        if node not in NODES:
            raise ValueError(f"node must be one of {', '.join(NODES)}, got {node!r}")
        if self._base is None:
            raise Unavailable("the cluster is not running")
        return self._base / node

    def _pg_ctl(self, node: str, *args: str) -> None:
        directory = self._node_dir(node)
        command = [str(_pg_bindir() / "pg_ctl"), "-D", str(directory), *args]
        if os.geteuid() == 0:  # the servers run as the postgres user (cluster.sh)
            command = ["runuser", "-u", "postgres", "--", *command]
        out = subprocess.run(command, capture_output=True, text=True, timeout=180, cwd="/")
        if out.returncode != 0:
            raise Unavailable(f"pg_ctl {args[0]} of {node} failed: {out.stderr.strip()[-300:]}")

    @staticmethod
    def _pids(base: Path) -> List[int]:
        pids = []
        for node in NODES:
            try:
                first = (base / node / "postmaster.pid").read_text().split("\n", 1)[0]
                pids.append(int(first))
            except (OSError, ValueError):
                pass
        return [p for p in pids if _alive(p)]


def _pg_bindir() -> Path:
    """The PostgreSQL 15 binaries the cluster runs on (as cluster.sh finds them)."""
    env = os.environ.get("PG_BINDIR")
    return Path(env) if env else Path("/usr/lib/postgresql/15/bin")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def drop_citus_schema(dsn: str, schema: str) -> None:
    """Drops a schema of the Citus layout on the cluster at ``dsn``, if it exists. Dropping
    distributed tables has the coordinator connect to every worker; on a loaded machine
    one such connection has failed once in a while (Unavailable, "connection to the
    remote node ... failed"). That is the cluster's hiccup: try again a few times, then
    raise."""
    from ..engine import Engine  # here, not above: the engine imports the tools lazily

    made = f"SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}'"
    if run_sql(dsn, made) == "0":
        return
    with Engine.postgres(dsn, layout="citus", schema=schema, pool_size=1, sweeper=False) as eng:
        for attempt in range(3):
            try:
                eng.drop_schema(confirm=schema)
                return
            except Unavailable:
                if attempt == 2:
                    raise
                time.sleep(1.0)


class CitusSchemas(Handed):
    """Migrated schemas of the Citus layout that tests hand on to each other
    (:mod:`stockade.tools.reuse`): a schema comes back with its tables emptied by
    ``DELETE`` (on tables of few rows a fifth of the time ``TRUNCATE`` takes on the
    cluster). Sequences go on where they were: a reused schema hands out later ids.

    The tables of every schema share a co-location group, so a shard that one test moves
    moves those of the schemas that wait too: :meth:`take` drops those. Once no schema of
    the group is left, a new schema starts from Citus's own placement again.
    """

    citus = True
    recheck = True

    def __init__(self, dsn: str, keep: int = 4) -> None:
        super().__init__(keep)
        self._dsn = dsn

    def _run(self, name: str, sql: str) -> str:
        return run_sql(self._dsn, sql)

    def _where(self, name: str) -> str:
        return schema_is(name)

    def _reset(self, name: str, shape: Shape) -> Optional[str]:
        # psql runs the statements as one transaction; a foreign key to a reference table
        # makes Citus change the tables over one connection per node. A delete that a
        # foreign key refuses fails the reset, and the schema is dropped. The check goes
        # last: psql before 15 prints only the last statement's result.
        sequential = "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'; "
        deletes = "".join(f"DELETE FROM {t}; " for t in shape.empty)
        check = shape.check_sql(self._shape_sql(name))
        return name if run_sql(self._dsn, sequential + deletes + check) == shape.expected else None

    def _drop(self, name: str) -> None:
        drop_citus_schema(self._dsn, name)
