"""What the pytest fixtures hand on from one test to the next: a migrated database of the
throwaway server, or a migrated schema of the Citus cluster, with its tables emptied.

Cloning the migrated template takes about 0.3 s with fsync on (PostgreSQL writes the whole
database to the WAL) and dropping it 0.05 s; migrating a schema on the cluster and
dropping it again take about a second on a loaded machine. Emptying the tables of a used
one is a statement. A database or schema comes back (:meth:`Handed.give_back`) only if
its shape is the one it had when it was made, as far as :func:`shape_sql` reads it: its
schemas, tables, views, sequences and types with their owners, grants and settings,
columns, constraints, triggers, policies, rules and functions, default privileges; for a
Citus schema, the Citus metadata and shard placements of its tables and functions on the
coordinator; for a database, its own settings, grants and connection limit, extensions,
publications, event triggers, prepared transactions, replication slots and large
objects. The rows of the tables the migrations filled (their record, a clock row per
Citus shard) must be the same too. Every other table is emptied. One that changed in any
of these ways is dropped instead, and the next test gets a new one. What it does not
read: the Citus workers' own catalogs, and anything outside the database.
"""

from __future__ import annotations

import abc
import logging
from typing import Callable, Dict, List, NamedTuple, Optional

from ..errors import StockadeError
from .pgserver import quote_ident

_log = logging.getLogger(__name__)

# The schemas a test database's shape covers: all but PostgreSQL's own.
USER_SCHEMAS = (
    "s.nspname NOT IN ('pg_catalog', 'information_schema') AND s.nspname NOT LIKE 'pg\\_%'"
)


def schema_is(name: str) -> str:
    """The condition on ``s.nspname`` for one schema (a plain identifier, checked)."""
    return f"s.nspname = '{quote_ident(name)}'"


def _object_parts(w: str) -> List[str]:
    """The schemas' objects, as the parts of :func:`shape_sql`."""
    return [
        f"""(SELECT string_agg(format('%s %s %s', s.nspname, s.nspowner::regrole, s.nspacl),
                          ',' ORDER BY s.nspname) FROM pg_namespace s WHERE {w})""",
        f"""(SELECT string_agg(format('%s.%s %s %s %s %s %s %s %s', s.nspname, c.relname,
                                  c.relkind, c.relowner::regrole, c.relacl, c.reloptions,
                                  c.relpersistence, c.relrowsecurity, c.relreplident), ','
                           ORDER BY s.nspname, c.relname)
           FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s.%s %s %s %s %s %s %s', c.oid::regclass, a.attname,
                                  format_type(a.atttypid, a.atttypmod), a.attnotnull,
                                  pg_get_expr(d.adbin, d.adrelid), a.attacl, a.attidentity,
                                  a.attcollation), ','
                           ORDER BY c.oid::regclass::text, a.attnum)
           FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
           JOIN pg_namespace s ON s.oid = c.relnamespace
           LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
          WHERE {w} AND a.attnum > 0 AND NOT a.attisdropped)""",
        f"""(SELECT string_agg(format('%s %s', k.conname, pg_get_constraintdef(k.oid)), ','
                           ORDER BY k.conname, pg_get_constraintdef(k.oid))
           FROM pg_constraint k JOIN pg_namespace s ON s.oid = k.connamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s', c.oid::regclass, t.tgname, t.tgenabled), ','
                           ORDER BY c.oid::regclass::text, t.tgname)
           FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
           JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s %s %s', p.oid::regprocedure, md5(p.prosrc),
                                  p.proowner::regrole, p.proacl, p.proconfig), ','
                           ORDER BY p.oid::regprocedure::text)
           FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s %s %s %s %s %s', q.seqrelid::regclass,
                                  q.seqtypid::regtype, q.seqstart, q.seqincrement, q.seqmin,
                                  q.seqmax, q.seqcache, q.seqcycle), ','
                           ORDER BY q.seqrelid::regclass::text)
           FROM pg_sequence q JOIN pg_class c ON c.oid = q.seqrelid
           JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s %s', c.oid::regclass, p.polname, p.polcmd,
                                  pg_get_expr(p.polqual, p.polrelid)), ','
                           ORDER BY c.oid::regclass::text, p.polname)
           FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
           JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s', c.oid::regclass, r.rulename), ','
                           ORDER BY c.oid::regclass::text, r.rulename)
           FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
           JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s', t.oid::regtype, t.typtype, t.typacl), ','
                           ORDER BY t.oid::regtype::text)
           FROM pg_type t JOIN pg_namespace s ON s.oid = t.typnamespace
          WHERE {w} AND t.typtype IN ('e', 'd', 'c', 'r') AND t.typrelid = 0)""",
        f"""(SELECT string_agg(format('%s %s %s', a.defaclrole::regrole, a.defaclobjtype,
                                  a.defaclacl), ',' ORDER BY a.oid)
           FROM pg_default_acl a LEFT JOIN pg_namespace s ON s.oid = a.defaclnamespace
          WHERE a.defaclnamespace = 0 OR ({w}))""",
    ]


def _citus_parts(w: str) -> List[str]:
    """The Citus metadata of the schemas' tables and functions, and their placements."""
    return [
        f"""(SELECT string_agg(format('%s %s %s %s', c.oid::regclass, d.partmethod,
                              d.partkey, d.colocationid), ','
                       ORDER BY c.oid::regclass::text)
       FROM pg_dist_partition d JOIN pg_class c ON c.oid = d.logicalrelid
       JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s', h.shardid, l.groupid), ','
                       ORDER BY h.shardid, l.groupid)
       FROM pg_dist_shard h JOIN pg_dist_placement l ON l.shardid = h.shardid
       JOIN pg_class c ON c.oid = h.logicalrelid
       JOIN pg_namespace s ON s.oid = c.relnamespace WHERE {w})""",
        f"""(SELECT string_agg(format('%s %s %s', p.oid::regprocedure,
                              o.distribution_argument_index, o.colocationid), ','
                       ORDER BY p.oid::regprocedure::text)
       FROM pg_dist_object o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass
                                           AND o.objid = p.oid
       JOIN pg_namespace s ON s.oid = p.pronamespace WHERE {w})""",
    ]


def _database_parts() -> List[str]:
    """The database's own settings and what lives beside its schemas."""
    return [
        """(SELECT format('%s %s %s %s', datdba::regrole, datacl, datconnlimit,
                     datallowconn) FROM pg_database WHERE datname = current_database())""",
        """(SELECT string_agg(array_to_string(r.setconfig, ' '), ',' ORDER BY r.setrole)
       FROM pg_db_role_setting r JOIN pg_database b ON b.oid = r.setdatabase
      WHERE b.datname = current_database())""",
        "(SELECT string_agg(extname || ' ' || extversion, ',' ORDER BY extname) FROM pg_extension)",
        "(SELECT string_agg(format('%s %s', p.pubname, r.prrelid::regclass), ','"
        " ORDER BY p.pubname, r.prrelid::regclass::text)"
        " FROM pg_publication p LEFT JOIN pg_publication_rel r ON r.prpubid = p.oid)",
        "(SELECT string_agg(evtname, ',' ORDER BY evtname) FROM pg_event_trigger)",
        "(SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())",
        "(SELECT count(*) FROM pg_replication_slots WHERE database = current_database())",
        "(SELECT count(*) FROM pg_largeobject_metadata)",
    ]


def shape_sql(where: str, *, citus: bool) -> str:
    """One statement that returns a digest of the shape of the schemas ``where`` names
    (a condition on ``s``, their pg_namespace row): with ``citus`` the Citus metadata of
    their tables and functions and where each shard is placed, else the settings of the
    database it runs in."""
    parts = _object_parts(where) + (_citus_parts(where) if citus else _database_parts())
    return "SELECT md5(concat_ws(E'\\n', " + ",\n".join(parts) + "))"


def rows_sql(where: str) -> str:
    """One statement that lists each table of the schemas ``where`` names with its
    number of rows, as ``schema.table|count`` lines."""
    return f"""
SELECT format('%I.%I', s.nspname, c.relname), (xpath('/row/n/text()', query_to_xml(
         format('SELECT count(*) AS n FROM %I.%I', s.nspname, c.relname), false, true, '')
       ))[1]::text
  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE {where} AND c.relkind IN ('r', 'p') ORDER BY 1"""


class Shape(NamedTuple):
    """A database or schema as it was made: the tables to empty, the others (the ones the
    migrations wrote rows into), and what :meth:`check_sql` returned then."""

    empty: List[str]
    kept: List[str]
    expected: str

    @staticmethod
    def read(run: Callable[[str], str], where: str, *, citus: bool) -> Shape:
        """Reads it with ``run`` (runs one statement, returns its output) on the schemas
        ``where`` names."""
        counts = dict(line.split("|", 1) for line in run(rows_sql(where)).split())
        empty = [t for t, n in counts.items() if n == "0"]
        kept = [t for t, n in counts.items() if n != "0"]
        made = Shape(empty, kept, "")
        return made._replace(expected=run(made.check_sql(shape_sql(where, citus=citus))))

    def check_sql(self, shape: str) -> str:
        """One statement that returns the digest of the shape and of the kept tables' rows:
        ``expected`` while nothing changed."""
        rows = ", ".join(
            f"(SELECT md5(coalesce(string_agg(r::text, ',' ORDER BY r::text), '')) FROM {t} r)"
            for t in self.kept
        )
        return f"SELECT concat_ws(' ', ({shape}), {rows or 'NULL'})"


class Handed(abc.ABC):
    """The bookkeeping of handed-on databases or schemas, by name; subclasses say where to
    read one's shape (``citus``: a schema of the cluster), how to empty it and how to drop
    it. At most ``keep`` wait for reuse. With ``recheck``, :meth:`take` reads the shape
    again first: for what other tests can change while it waits."""

    citus = False
    recheck = False

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._idle: List[str] = []
        self._made: Dict[str, Shape] = {}

    def take(self) -> Optional[str]:
        """One to reuse, or None (then make one and :meth:`made` it). One whose shape
        changed while it waited (``recheck``), or that cannot be read, is dropped."""
        while self._idle:
            name = self._idle.pop()
            try:
                if not self.recheck or self._check(name) == self._made[name].expected:
                    return name
            except StockadeError as e:
                _log.info("a test database or schema could not be read, dropped: %.300s", e)
            self._forget(name)
        return None

    def shape_of(self, name: str) -> Shape:
        """The shape of a database or schema (one not handed on, such as a template)."""
        return self._read(name)

    def made(self, name: str, like: Optional[Shape] = None) -> Shape:
        """Records the shape of one just made (or that it is ``like`` another), so that it
        can come back after the test."""
        self._made[name] = like or self._read(name)
        return self._made[name]

    def owns(self, name: str) -> bool:
        """Whether it was made here and is in a test's hands (not waiting)."""
        return name in self._made and name not in self._idle

    def give_back(self, name: str) -> None:
        """Empties it for the next test, or drops it if the test changed it (or enough wait
        already). Whatever used it must be done. It may come back under a new name
        (:meth:`_reset`), so that nothing that kept the old one reaches it."""
        if not self.owns(name):
            return  # handed back already
        shape = self._made[name]
        if len(self._idle) < self._keep:
            try:
                now = self._reset(name, shape)
            except StockadeError as e:
                _log.info("a test database or schema could not be emptied, dropped: %.300s", e)
                now = None
            if now is not None:
                del self._made[name]
                self._made[now] = shape
                self._idle.append(now)
                return
        self._forget(name)

    def close(self) -> None:
        """Drops every one that waits for reuse."""
        while self._idle:
            self._forget(self._idle.pop())

    def _forget(self, name: str) -> None:
        del self._made[name]
        self._drop(name)

    def _check(self, name: str) -> str:
        return self._run(name, self._made[name].check_sql(self._shape_sql(name)))

    def _read(self, name: str) -> Shape:
        return Shape.read(lambda sql: self._run(name, sql), self._where(name), citus=self.citus)

    def _shape_sql(self, name: str) -> str:
        return shape_sql(self._where(name), citus=self.citus)

    @abc.abstractmethod
    def _run(self, name: str, sql: str) -> str:
        """Runs one statement where it reads ``name``'s shape; returns its output."""

    @abc.abstractmethod
    def _where(self, name: str) -> str:
        """The condition on ``s`` (pg_namespace) that names its schemas."""

    @abc.abstractmethod
    def _reset(self, name: str, shape: Shape) -> Optional[str]:
        """Empties it and returns the name it now has, or None if its shape changed."""

    @abc.abstractmethod
    def _drop(self, name: str) -> None:
        """Drops it."""
