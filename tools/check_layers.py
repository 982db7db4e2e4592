#!/usr/bin/env python3
"""Checks the C++ layers (docs/architecture.md, "Layers"): each file includes only headers of
its own layer and of the layers below it, and no include climbs out of a folder with `../`.

    python tools/check_layers.py        # from the repository root; exits 1 on a violation

Each folder of cpp/src is a layer; each public header in cpp/include/stockade belongs to
the layer named in PUBLIC below, so that a public header cannot smuggle an upward
dependency either. The bindings, the tools library, the tests and the benchmarks sit above
every layer and are checked for `../` only.
"""

from __future__ import annotations

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Each layer and the layers it may include (its own is always allowed).
BELOW: dict[str, set[str]] = {
    "base": set(),
    "obs": {"base"},
    "store": {"base", "obs"},
    "memory": {"base", "obs", "store"},
    "postgres": {"base", "obs", "store"},
    "hotrow": {"base", "obs", "store"},
    "engine": {"base", "obs", "store", "memory", "postgres", "hotrow"},
}

# The layer of each public header (cpp/include/stockade/NAME.hpp).
PUBLIC: dict[str, str] = {
    "errors": "base",
    "types": "base",
    "uuid": "base",
    "hash": "base",
    "clock": "base",
    "log": "base",
    "async": "base",
    "telemetry": "obs",
    "store": "store",
    "journal": "store",
    "batch": "store",
    "testing": "store",
    "memory_store": "memory",
    "postgres_store": "postgres",
    "batcher": "hotrow",
    "contention": "hotrow",
    "engine": "engine",
}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of_include(target: str) -> str | None:
    if target.startswith("stockade/tools/"):
        return None  # the tools library, above the core
    if target.startswith("stockade/"):
        name = target.removeprefix("stockade/").removesuffix(".hpp")
        return PUBLIC.get(name, "?" + name)
    head = target.split("/", 1)[0]
    return head if head in BELOW and "/" in target else None


def main() -> int:
    problems: list[str] = []
    sources: list[tuple[pathlib.Path, str | None]] = []
    for path in sorted((ROOT / "cpp" / "src").rglob("*")):
        if path.suffix in {".cpp", ".hpp", ".in"}:
            layer = path.relative_to(ROOT / "cpp" / "src").parts[0]
            if layer not in BELOW:
                problems.append(f"{path.relative_to(ROOT)}: not in a layer's folder")
                layer = None
            sources.append((path, layer))
    for path in sorted((ROOT / "cpp" / "include" / "stockade").glob("*.hpp")):
        layer = PUBLIC.get(path.stem)
        if layer is None:
            problems.append(f"{path.relative_to(ROOT)}: no layer in tools/check_layers.py")
        sources.append((path, layer))
    for folder in ("cpp/bindings", "cpp/tools", "tests/cpp", "tests/fuzz", "benchmarks/cpp"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix in {".cpp", ".hpp"}:
                sources.append((path, None))
    for path, layer in sources:
        rel = path.relative_to(ROOT)
        for target in INCLUDE.findall(path.read_text(encoding="utf-8")):
            if ".." in target.split("/"):
                problems.append(f"{rel}: includes {target!r} through '..'")
                continue
            if layer is None:
                continue
            if "/" not in target:
                problems.append(f"{rel}: includes {target!r}; name its folder (layer/file.hpp)")
                continue
            want = layer_of_include(target)
            if want is None:
                continue
            if want.startswith("?"):
                problems.append(f"{rel}: includes {target!r}, a header with no layer")
            elif want != layer and want not in BELOW[layer]:
                problems.append(f"{rel} ({layer}) includes {target!r} ({want}): an upward include")
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"check_layers: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"check_layers: {len(sources)} files, every include goes down a layer or stays")
    return 0


if __name__ == "__main__":
    sys.exit(main())
