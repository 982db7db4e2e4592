"""The type stubs and annotations cannot drift from the compiled module.

Three checks: mypy --strict over the package source and a usage file (the annotations
are consistent and the Python layer calls _core as its stubs say); mypy's stubtest
against the built module (every stub name exists at run time and the reverse); and the
parameter names of every bound function, read from the signatures pybind11 writes into
docstrings, against the stubs (stubtest cannot see those).
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import stockade
from stockade import _core

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STUB = REPO / "python" / "stockade" / "_core.pyi"


def run_mypy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )


def test_package_and_usage_pass_mypy_strict() -> None:
    out = run_mypy(str(REPO / "python" / "stockade"), str(HERE / "typing_usage.py"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_reports_misuse(tmp_path: Path) -> None:
    # The check above can fail: a wrong call is caught.
    bad = tmp_path / "bad_usage.py"
    bad.write_text("import stockade\nstockade.Engine.memory().reserve('s', qty='2')\n")
    out = run_mypy(str(bad))
    assert out.returncode != 0 and "qty" in out.stdout


def test_mypy_strict_reports_a_misspelt_strategy(tmp_path: Path) -> None:
    # Strategies are typed as a Literal of their names (and the enum): a typo is caught
    # before it runs, while every real name and member type-checks.
    bad = tmp_path / "bad_strategy.py"
    bad.write_text(
        "import stockade\n"
        "eng = stockade.Engine.memory()\n"
        "eng.reserve('s', 1, strategy='batched')\n"
        "eng.reserve('s', 1, strategy=stockade.Strategy.ATOMIC)\n"
        "eng.reserve('s', 1, strategy='atomc')\n"
    )
    out = run_mypy(str(bad))
    assert out.returncode != 0 and "bad_strategy.py:5:" in out.stdout, out.stdout
    assert "bad_strategy.py:3:" not in out.stdout and "bad_strategy.py:4:" not in out.stdout


def test_mypy_strict_checks_the_keys_of_stats(tmp_path: Path) -> None:
    # stats(), row_counts() and metrics() are TypedDicts: a real key type-checks with its
    # type, a misspelt one is caught.
    bad = tmp_path / "bad_stats.py"
    bad.write_text(
        "import stockade\n"
        "eng = stockade.Engine.memory()\n"
        "held: int = eng.stats()['held_count']\n"
        "waits: int = eng.stats()['strategies']['atomic']['lock_waits']\n"
        "exact: bool = eng.stats()['counts_exact']\n"
        "n: int = eng.row_counts()['reservation_count']\n"
        "calls: int = eng.metrics()['calls'][0]['count']\n"
        "oops = eng.stats()['held_cuont']\n"
    )
    out = run_mypy(str(bad))
    assert out.returncode != 0 and "bad_stats.py:8:" in out.stdout, out.stdout
    assert all(f"bad_stats.py:{line}:" not in out.stdout for line in range(3, 8)), out.stdout


def test_the_typed_dicts_match_what_the_engine_returns() -> None:
    from stockade import stats as shapes

    with stockade.Engine.memory() as eng:
        eng.restock("s", 5)
        eng.reserve("s", 1, strategy="batched")
        st = eng.stats()
        assert set(st) == set(shapes.EngineStats.__annotations__)
        assert set(st["strategies"]["atomic"]) == set(shapes.StrategyStats.__annotations__)
        assert set(st["hottest_skus"][0]) == set(shapes.HotSku.__annotations__)
        assert set(st["sweeper"]) == set(shapes.SweeperStats.__annotations__)
        assert set(st["batcher"]) == set(shapes.BatcherStats.__annotations__)
        assert set(st["pool"]) == set(shapes.PoolStats.__annotations__)
        assert set(eng.row_counts()) == set(shapes.RowCounts.__annotations__)
        m = eng.metrics()
        assert set(m) == set(shapes.Metrics.__annotations__)
        assert set(m["calls"][0]) == set(shapes.CallSeries.__annotations__)


def test_the_strategy_literal_names_every_strategy() -> None:
    assert set(typing.get_args(stockade.StrategyName)) == {s.value for s in stockade.Strategy}


def test_stubtest_finds_no_drift() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy.stubtest",
            "stockade._core",
            "--allowlist",
            str(HERE / "stubtest_allowlist.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def stub_parameters() -> dict[str, list[str]]:
    """'Class.method' or 'function' -> parameter names (self excluded), from the stub."""
    tree = ast.parse(STUB.read_text())
    found: dict[str, list[str]] = {}

    def names(fn: ast.FunctionDef) -> list[str]:
        return [a.arg for a in fn.args.args if a.arg != "self"]

    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = names(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.decorator_list:
                    found[f"{node.name}.{item.name}"] = names(item)
                elif isinstance(item, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "staticmethod" for d in item.decorator_list
                ):
                    found[f"{node.name}.{item.name}"] = names(item)
    return found


def split_top_level(text: str) -> list[str]:
    """Splits 'a: int, b: tuple[str, int]' at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p for p in (*parts, current) if p.strip()]


def runtime_parameters() -> dict[str, list[str]]:
    """The same, from the signature line pybind11 puts first in each docstring."""
    found: dict[str, list[str]] = {}

    def parse(qualname: str, obj: object) -> None:
        doc = inspect.getdoc(obj) or ""
        match = re.match(r"^\w+\((.*?)\) ->", doc)
        if match is None:
            return
        params = [p.split(":")[0].strip() for p in split_top_level(match.group(1))]
        found[qualname] = [p for p in params if p not in ("self", "")]

    for name, obj in vars(_core).items():
        if inspect.isbuiltin(obj):
            parse(name, obj)
        elif isinstance(obj, type):
            for attr, member in vars(obj).items():
                if attr.startswith("__"):
                    continue
                target = member.__func__ if isinstance(member, staticmethod) else member
                if callable(target):
                    parse(f"{name}.{attr}", target)
    return found


def test_stub_parameter_names_match_the_bound_functions() -> None:
    stub, runtime = stub_parameters(), runtime_parameters()
    assert runtime, "no pybind11 signatures found: the check would prove nothing"
    for qualname, params in runtime.items():
        assert qualname in stub, f"{qualname} is bound but has no stub"
        assert stub[qualname] == params, f"{qualname}: stub {stub[qualname]} != bound {params}"


def test_public_names_are_exported() -> None:
    for name in stockade.__all__:
        assert hasattr(stockade, name), name


def test_every_awaitable_twin_takes_its_blocking_calls_parameters() -> None:
    # The twins are written out (engine.py); this keeps them from drifting apart.
    twins = [n for n in dir(stockade.Engine) if n.endswith("_async")]
    assert len(twins) >= 6
    for twin in twins:
        blocking = getattr(stockade.Engine, twin.removesuffix("_async"))
        assert inspect.iscoroutinefunction(getattr(stockade.Engine, twin)), twin
        assert (
            inspect.signature(getattr(stockade.Engine, twin)).parameters
            == inspect.signature(blocking).parameters
        ), twin
