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
from typing import Dict, List, Optional, Tuple

from ..errors import StockadeError, Unavailable
from .pgserver import _free_port, quote_ident, run_sql

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


# Everything about a schema of the Citus layout that a test may change besides the rows
# of its tables: its objects with their owners and grants, their columns, constraints and
# triggers, its functions, the Citus metadata of its tables and functions, and where each
# of its shards is placed. `{n}` is the schema's name as a quoted literal.
_SHAPE = """
SELECT md5(concat_ws(E'\\n',
  (SELECT format('%s %s', nspowner::regrole, nspacl) FROM pg_namespace WHERE nspname = {n}),
  (SELECT string_agg(format('%s %s %s %s %s', c.relname, c.relkind, c.relowner::regrole,
                            c.relacl, c.reloptions), ',' ORDER BY c.relname)
     FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s.%s %s %s %s', c.relname, a.attname, a.atttypid::regtype,
                            a.attnotnull, pg_get_expr(d.adbin, d.adrelid)), ','
                     ORDER BY c.relname, a.attnum)
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
     JOIN pg_namespace s ON s.oid = c.relnamespace
     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE s.nspname = {n} AND a.attnum > 0 AND NOT a.attisdropped),
  (SELECT string_agg(format('%s %s', k.conname, pg_get_constraintdef(k.oid)), ','
                     ORDER BY k.conname, k.oid::regclass::text)
     FROM pg_constraint k JOIN pg_namespace s ON s.oid = k.connamespace
    WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s %s %s', c.relname, t.tgname, t.tgenabled), ','
                     ORDER BY c.relname, t.tgname)
     FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
     JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s %s %s %s %s', p.oid::regprocedure, md5(p.prosrc),
                            p.proowner::regrole, p.proacl, p.proconfig), ','
                     ORDER BY p.oid::regprocedure::text)
     FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s %s %s %s', c.relname, d.partmethod, d.partkey,
                            d.colocationid), ',' ORDER BY c.relname)
     FROM pg_dist_partition d JOIN pg_class c ON c.oid = d.logicalrelid
     JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s %s', h.shardid, l.groupid), ',' ORDER BY h.shardid, l.groupid)
     FROM pg_dist_shard h JOIN pg_dist_placement l ON l.shardid = h.shardid
     JOIN pg_class c ON c.oid = h.logicalrelid
     JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = {n}),
  (SELECT string_agg(format('%s %s %s', p.oid::regprocedure, o.distribution_argument_index,
                            o.colocationid), ',' ORDER BY p.oid::regprocedure::text)
     FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass
                                         AND o.objid = p.oid
     JOIN pg_namespace s ON s.oid = p.pronamespace WHERE s.nspname = {n})
))"""

# Each table of the schema with the number of its rows, as `name|count` lines.
_ROWS = """
SELECT c.relname, (xpath('/row/n/text()', query_to_xml(
         format('SELECT count(*) AS n FROM %I.%I', s.nspname, c.relname), false, true, '')
       ))[1]::text
  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE s.nspname = {n} AND c.relkind IN ('r', 'p') ORDER BY c.relname"""


class CitusSchemas:
    """Migrated schemas of the Citus layout, handed out again after a test is done with
    them: migrating a schema on the cluster distributes its tables and functions to every
    node, and dropping it reaches every node again, about a second or more together on a
    loaded machine, while emptying its tables is one statement.

    A schema comes back (:meth:`give_back`) for the next test only if its shape is the one
    it had when it was made (objects, owners and grants, columns, constraints, triggers,
    functions, the Citus metadata, its shards' placements) and the tables the migrations
    wrote rows into (the migrations' record, one clock row per shard) hold as many as
    then. Every other table is emptied (``DELETE``). A schema that changed in any of
    these ways is dropped instead. At most ``keep`` schemas wait for reuse; :meth:`close`
    drops them. Sequences go on where they were: a reused schema hands out later ids.
    """

    def __init__(self, dsn: str, keep: int = 4) -> None:
        self._dsn = dsn
        self._keep = keep
        self._idle: List[str] = []
        # Per schema made here: its shape's digest, the tables to empty, and the row
        # counts of the others.
        self._made: Dict[str, Tuple[str, List[str], Dict[str, str]]] = {}

    def take(self) -> Optional[str]:
        """A clean, migrated schema to reuse, or None (then make one and :meth:`made` it).
        A waiting schema whose shape changed meanwhile is dropped: the tables of every
        schema share a co-location group, so a shard that another test moved moves theirs
        too, and a new schema would start from Citus's own placement."""
        while self._idle:
            schema = self._idle.pop()
            if run_sql(self._dsn, _SHAPE.format(n=_literal(schema))) == self._made[schema][0]:
                return schema
            del self._made[schema]
            drop_citus_schema(self._dsn, schema)
        return None

    def made(self, schema: str) -> None:
        """Records the shape and the rows of a schema just migrated, so that it can come
        back after the test."""
        n = _literal(schema)
        shape = run_sql(self._dsn, _SHAPE.format(n=n))
        counts = dict(line.split("|", 1) for line in run_sql(self._dsn, _ROWS.format(n=n)).split())
        empty = [t for t, count in counts.items() if count == "0"]
        kept = {t: count for t, count in counts.items() if count != "0"}
        self._made[schema] = (shape, empty, kept)

    def owns(self, schema: str) -> bool:
        """Whether the schema was made here (:meth:`made`)."""
        return schema in self._made

    def give_back(self, schema: str) -> None:
        """Empties the schema for the next test, or drops it if the test changed it (or
        enough wait already). Its engines must be closed."""
        shape, empty, kept = self._made[schema]
        if len(self._idle) < self._keep and self._reset(schema, shape, empty, kept):
            self._idle.append(schema)
            return
        del self._made[schema]
        drop_citus_schema(self._dsn, schema)

    def close(self) -> None:
        """Drops every schema that waits for reuse."""
        while self._idle:
            schema = self._idle.pop()
            del self._made[schema]
            drop_citus_schema(self._dsn, schema)

    def _reset(self, schema: str, shape: str, empty: List[str], kept: Dict[str, str]) -> bool:
        n = _literal(schema)
        q = quote_ident(schema)
        counts = ", ".join(f"(SELECT count(*) FROM {q}.{quote_ident(t)})" for t in kept)
        check = f"SELECT concat_ws(' ', ({_SHAPE.format(n=n)}), {counts or 'NULL'})"
        # DELETE, not TRUNCATE: on tables with few rows it is a fifth of the time on the
        # cluster. psql runs the statements as one transaction; a foreign key to a
        # reference table makes Citus change the tables over one connection per node. A
        # delete that a foreign key refuses fails the reset, and the schema is dropped.
        deletes = "".join(f"; DELETE FROM {q}.{quote_ident(t)}" for t in empty)
        sequential = "SET LOCAL citus.multi_shard_modify_mode TO 'sequential'; "
        want = " ".join([shape, *kept.values()])
        try:
            got = run_sql(self._dsn, sequential + check + deletes)
        except StockadeError:
            return False
        return got == want


def _literal(schema: str) -> str:
    """The schema's name (a plain identifier, checked) as an SQL string literal."""
    return f"'{quote_ident(schema)}'"
