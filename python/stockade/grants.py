"""Least privilege on PostgreSQL: an owner role migrates, a runtime role serves.

The owner (the role that ran ``migrate()``) owns the schema, its tables and its routines.
The service connects as a runtime role that may read and write rows, use the lease-token
sequence and call the statement routines, and nothing else: no ``CREATE`` in the schema,
no ``ALTER``, ``DROP`` or ``TRUNCATE`` (those need ownership or a grant it never gets).
The runtime role needs no other right for the engine's own work: advisory locks, reading
its own sessions in ``pg_stat_activity`` and ending them with ``pg_terminate_backend``
(the fence after a lost commit) are open to any role for its own sessions.

    stockade migrate --dsn "$OWNER_DSN"
    stockade migrate --schema stockade --print-grants shop_runtime | psql "$OWNER_DSN"

:func:`runtime_grants` gives the statements; every name in them is quoted as an
identifier, so no role or schema name can change what they do.
"""

from __future__ import annotations

from typing import List, Optional

from .errors import InvalidArgument, InvalidType

__all__ = ["runtime_grants"]

NAME_BYTES_MAX = 63  # PostgreSQL's NAMEDATALEN - 1


def _identifier(what: str, name: object) -> str:
    if not isinstance(name, str):
        raise InvalidType(f"{what} must be a str, not {type(name).__name__}")
    size = len(name.encode("utf-8", "surrogatepass"))
    if not 1 <= size <= NAME_BYTES_MAX or "\x00" in name:
        raise InvalidArgument(
            f"{what} must be 1 to {NAME_BYTES_MAX} bytes long, without NUL; got {size} bytes"
        )
    return '"' + name.replace('"', '""') + '"'


def runtime_grants(
    role: str, *, schema: str = "stockade", owner: Optional[str] = None
) -> List[str]:
    """The statements that let ``role`` run an engine on ``schema``, to run as the schema's
    owner after ``migrate()``. The ``ALTER DEFAULT PRIVILEGES`` lines extend the same rights
    to what later migrations create, when ``owner`` (default: the role that runs them) is
    the role that will migrate."""
    r = _identifier("role", role)
    s = _identifier("schema", schema)
    by = "" if owner is None else f" FOR ROLE {_identifier('owner', owner)}"
    default = f"ALTER DEFAULT PRIVILEGES{by} IN SCHEMA {s} GRANT"
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {r};",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r};",
        f"REVOKE INSERT, UPDATE, DELETE ON {s}.schema_migrations FROM {r};",
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {s} TO {r};",
        f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r};",
        f"{default} SELECT, INSERT, UPDATE, DELETE ON TABLES TO {r};",
        f"{default} USAGE, SELECT, UPDATE ON SEQUENCES TO {r};",
        f"{default} EXECUTE ON FUNCTIONS TO {r};",
    ]
