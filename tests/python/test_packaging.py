"""How the package is built for others: `make wheel` needs the build's own requirements
only, not the development toolchain (ruff, mypy, matplotlib, ...)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_wheel_installs_no_development_tools() -> None:
    # `make -n` prints what the target would run (and what it depends on), running nothing.
    plan = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", "wheel"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "pip wheel" in plan and "auditwheel repair" in plan
    for tool in ("ruff", "mypy", "matplotlib", "ipykernel", "clang-format", "mkdocs"):
        assert tool not in plan, f"make wheel installs {tool}"
    assert "--no-build-isolation" not in plan  # pyproject's build requirements, isolated
