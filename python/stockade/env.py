"""Configuration from the environment, for :meth:`stockade.Engine.from_env` and the CLI.

The DSN is ``$STOCKADE_DSN``, else empty when one of libpq's variables names a server
(``PGHOST``, ``PGHOSTADDR``, ``PGPORT``, ``PGDATABASE``, ``PGUSER``, ``PGSERVICE``; libpq
then reads them, and ``PGPASSWORD`` or ``~/.pgpass``, itself). stockade's own options:

==============================  ==================================  =========================
variable                        option of Engine.postgres           form
==============================  ==================================  =========================
STOCKADE_SCHEMA                 schema                              text
STOCKADE_STRATEGY               strategy                            a strategy name
STOCKADE_POOL_SIZE              pool_size                           integer
STOCKADE_LOCK_TIMEOUT           lock_timeout                        seconds (decimal)
STOCKADE_POOL_TIMEOUT           pool_timeout                        seconds
STOCKADE_CALL_TIMEOUT           call_timeout                        seconds
STOCKADE_DEFAULT_TTL            default_ttl                         seconds
STOCKADE_SWEEPER                sweeper (default on)                1/0, true/false, yes/no
STOCKADE_RETENTION              retention (needs the sweeper)       seconds
STOCKADE_JOURNAL_RETENTION      journal_retention (needs sweeper)   seconds
STOCKADE_FEED_LAG_MAX           feed_lag_max                        seconds
STOCKADE_APPLICATION_NAME       application_name                    text
STOCKADE_POOLER                 pooler                              auto, none or
                                                                    pgbouncer-transaction
STOCKADE_LAYOUT                 layout                              plain or citus
STOCKADE_CITUS_ROUTING          citus_routing                       coordinator or direct
==============================  ==================================  =========================
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Mapping, Optional

from .errors import InvalidArgument
from .values import shown

__all__ = ["dsn_from_environment", "options_from_environment"]

# libpq's environment variables that name a server: when one is set and no DSN is given,
# the DSN is empty and libpq reads them (and PGPASSWORD).
_LIBPQ_SERVER_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def dsn_from_environment(
    given: Optional[str], environ: Optional[Mapping[str, str]] = None
) -> Optional[str]:
    """``given`` if set, else ``$STOCKADE_DSN``, else ``""`` (libpq's own defaults) when a
    PG* variable names a server, else None. Keeps passwords off command lines."""
    env = os.environ if environ is None else environ
    if given:
        return given
    if env.get("STOCKADE_DSN"):
        return env["STOCKADE_DSN"]
    if any(env.get(name) for name in _LIBPQ_SERVER_VARIABLES):
        return ""
    return None


def _seconds(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number of seconds, got {shown(text)}") from None


def _integer(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer, got {shown(text)}") from None


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise InvalidArgument(f"{name} must be 1/0, true/false or yes/no, got {shown(text)}")


def _text(name: str, text: str) -> str:
    return text


_OPTIONS: Dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "STOCKADE_SCHEMA": ("schema", _text),
    "STOCKADE_STRATEGY": ("strategy", _text),
    "STOCKADE_POOL_SIZE": ("pool_size", _integer),
    "STOCKADE_LOCK_TIMEOUT": ("lock_timeout", _seconds),
    "STOCKADE_POOL_TIMEOUT": ("pool_timeout", _seconds),
    "STOCKADE_CALL_TIMEOUT": ("call_timeout", _seconds),
    "STOCKADE_DEFAULT_TTL": ("default_ttl", _seconds),
    "STOCKADE_SWEEPER": ("sweeper", _flag),
    "STOCKADE_RETENTION": ("retention", _seconds),
    "STOCKADE_JOURNAL_RETENTION": ("journal_retention", _seconds),
    "STOCKADE_FEED_LAG_MAX": ("feed_lag_max", _seconds),
    "STOCKADE_APPLICATION_NAME": ("application_name", _text),
    "STOCKADE_POOLER": ("pooler", _text),
    "STOCKADE_LAYOUT": ("layout", _text),
    "STOCKADE_CITUS_ROUTING": ("citus_routing", _text),
}


def options_from_environment(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """The keyword arguments of :meth:`Engine.postgres` that STOCKADE_* variables set."""
    env = os.environ if environ is None else environ
    out: Dict[str, Any] = {}
    for variable, (option, parse) in _OPTIONS.items():
        if variable in env:
            out[option] = parse(variable, env[variable])
    return out
