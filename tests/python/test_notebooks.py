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


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_notebooks_use_the_public_api_and_label_their_plots(name: str) -> None:
    code = "\n".join(c.source for c in SOURCES[name] if c.cell_type == "code")
    assert "._core" not in code and "INSERT INTO" not in code and ".sql(" not in code
    if "plt.subplots" in code:
        # Every panel has a title and a legend; the figure a title; one style per strategy.
        assert code.count("set_title") >= code.count("set_ylabel") > 0
        assert "legend(" in code and "suptitle" in code
        # The measuring notebooks draw strategies, each in its one style (the quickstart's
        # plot draws one SKU's level from its journal).
        assert "STYLE[" in code or name == "01_quickstart.ipynb"
        assert 'layout="constrained"' in code  # titles and labels never overlap


def test_recommend_renders_as_a_table_in_a_notebook() -> None:
    import stockade

    with stockade.Engine.memory() as eng:
        eng.restock("mug", 5)
        eng.reserve("mug", 1)
        advice = eng.recommend("mug")
    table = advice._repr_markdown_()
    assert table.startswith("| question | answer |") and "| **odds** |" in table
    assert "| **strategy** | atomic |" in table
    text = str(advice).splitlines()
    assert text[0].split() == ["strategy", "atomic"] and all(len(line) <= 88 for line in text)
