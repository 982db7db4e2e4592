"""The keyword defaults of Engine.memory() and Engine.postgres() are the core's: each
factory's defaults, filled into the option structs as a call would fill them, equal the
structs' own defaults field by field (engine.hpp, batcher.hpp, memory_store.hpp,
postgres_store.hpp). A default changed on one side only fails here."""

from __future__ import annotations

import enum
import inspect
import re
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from stockade import Engine, _core
from stockade.options import engine_options, memory_options, postgres_options


def defaults(factory: Callable[..., Any]) -> Dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(factory).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def differences(built: Any, core: Any, path: str = "") -> List[str]:
    """Every field (nested structs included) where `built` and `core` differ."""
    out: List[str] = []
    for name in dir(core):
        if name.startswith("_"):
            continue
        ours, theirs = getattr(built, name), getattr(core, name)
        if callable(theirs):
            continue
        if type(theirs).__module__ == _core.__name__:  # a nested struct
            out += differences(ours, theirs, f"{path}{name}.")
        elif ours != theirs:
            out.append(f"{path}{name}: python {ours!r}, core {theirs!r}")
    return out


def test_the_memory_factorys_defaults_are_the_cores() -> None:
    engine, _, memory = memory_options(defaults(Engine.memory))
    assert differences(engine, _core.EngineOptions()) == []
    assert differences(memory, _core.MemoryOptions()) == []


def test_the_postgres_factorys_defaults_are_the_cores() -> None:
    postgres, engine = postgres_options("", defaults(Engine.postgres))
    assert differences(engine, _core.EngineOptions()) == []
    assert differences(postgres, _core.PostgresOptions()) == []


def test_every_shared_keyword_has_one_default() -> None:
    memory, postgres = defaults(Engine.memory), defaults(Engine.postgres)
    shared = sorted(set(memory) & set(postgres))
    assert len(shared) > 10
    assert {k: memory[k] for k in shared} == {k: postgres[k] for k in shared}


def test_the_comparison_can_fail() -> None:
    # Goal: the check above is not vacuous. Method: one default changed on the Python side.
    given = defaults(Engine.memory)
    given["batch_max"] = 17
    engine = engine_options(given)
    assert differences(engine, _core.EngineOptions()) == ["batcher.batch_max: python 17, core 4096"]


# --- the table of defaults in the manual (docs/api.md, "Defaults") ---

API_PAGE = Path(__file__).parents[2] / "docs" / "api.md"
UNITS = {
    "µs": timedelta(microseconds=1),
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "min": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "days": timedelta(days=1),
}
# What the brief of the table promises a reader: each of these has a row.
PROMISED = {
    "default_ttl",
    "strategy",
    "lock_timeout",
    "retries_max",
    "sweeper",
    "sweep_interval",
    "call_timeout",
    "pool_size",
    "pool_timeout",
    "batch_max",
    "batch_linger",
}


def defaults_table() -> Dict[str, Tuple[str, str]]:
    """The rows of the manual's table of defaults: keyword -> (default cell, store cell)."""
    text = API_PAGE.read_text(encoding="utf-8")
    assert "\n## Defaults\n" in text, "docs/api.md has no section of defaults"
    section = text.split("\n## Defaults\n", 1)[1].split("\n::: ", 1)[0]
    rows: Dict[str, Tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`(\w+)`", cells[0]) if len(cells) == 4 else None
        if match:
            rows[match.group(1)] = (cells[1], cells[2])
    return rows


def values_in(cell: str) -> List[Any]:
    """What a default cell says: every duration in it ("15 min (900 s)" says 900 s twice),
    else a count ("4,096"), on/off, none, or a `name`."""
    durations = re.findall(r"(\d[\d,]*) (µs|ms|s|min|h|days)\b", cell)
    if durations:
        return [int(n.replace(",", "")) * UNITS[unit] for n, unit in durations]
    words = {"on": True, "off": False, "none": None}
    if cell in words:
        return [words[cell]]
    if re.fullmatch(r"\d[\d,]*", cell):
        return [int(cell.replace(",", ""))]
    name = re.fullmatch(r"`(\w+)`", cell)
    assert name, f"the table's cell {cell!r} does not read as a default"
    return [name.group(1)]


def as_table_value(default: Any) -> Any:
    """A signature's default as the table states it (a Strategy by its name)."""
    return default.value if isinstance(default, enum.Enum) else default


@pytest.mark.parametrize("store", ["memory", "PostgreSQL"])
def test_the_manuals_table_of_defaults_is_the_factories(store: str) -> None:
    # Goal: the table a caller reads cannot drift from the code. Method: every row's value
    # against the keyword's default in the signature of each store's factory it names.
    factory = Engine.memory if store == "memory" else Engine.postgres
    signature = defaults(factory)
    table = defaults_table()
    assert set(table) >= PROMISED, sorted(PROMISED - set(table))
    checked = 0
    for keyword, (cell, stores) in table.items():
        assert stores in ("both", "memory", "PostgreSQL"), (keyword, stores)
        if stores not in ("both", store):
            continue
        assert keyword in signature, f"{keyword} is no keyword of Engine.{factory.__name__}"
        expected = as_table_value(signature[keyword])
        for said in values_in(cell):
            if isinstance(said, timedelta) and not isinstance(expected, timedelta):
                expected = timedelta(seconds=expected)
            assert said == expected, f"{keyword}: the manual says {cell}, the code {expected!r}"
        checked += 1
    assert checked >= (8 if store == "memory" else 15)


def test_the_table_check_can_fail() -> None:
    # Goal: the check above reads what it compares. Method: cells read as their values.
    assert values_in("15 min (900 s)") == [timedelta(minutes=15), timedelta(seconds=900)]
    assert values_in("300 µs") == [timedelta(microseconds=300)]
    assert values_in("4,096") == [4096] and values_in("on") == [True]
    assert values_in("`auto`") == ["auto"] and values_in("none") == [None]
    assert values_in("14 min (900 s)")[0] != timedelta(seconds=900)
