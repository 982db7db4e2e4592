"""The keyword defaults of Engine.memory() and Engine.postgres() are the core's: each
factory's defaults, filled into the option structs as a call would fill them, equal the
structs' own defaults field by field (engine.hpp, batcher.hpp, memory_store.hpp,
postgres_store.hpp). A default changed on one side only fails here."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List

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
