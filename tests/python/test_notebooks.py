"""Every notebook in notebooks/ runs top to bottom (with STOCKADE_NB_SCALE=small, so the
measurements are short) and produces its plots. A failing cell fails the test."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))

pytest.importorskip("nbclient", reason="the notebook tools are installed by make")
os.environ.setdefault("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's path migration notice
sys.path.insert(0, str(REPO / "notebooks"))
from make_notebooks import NOTEBOOKS as SOURCES  # noqa: E402
from make_notebooks import execute  # noqa: E402


def test_the_committed_notebooks_are_the_ones_the_sources_make() -> None:
    assert sorted(n.name for n in NOTEBOOKS) == sorted(SOURCES)


@pytest.mark.postgres
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_notebook_runs_to_the_end(path: Path, tmp_path: Path) -> None:
    import nbformat

    out = tmp_path / path.name
    execute(path, out, small=True, timeout=300)
    nb = nbformat.read(out, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    if path.name != "01_quickstart.ipynb":  # the measuring notebooks draw their plots
        assert any("image/png" in o.get("data", {}) for o in outputs)
