"""The manual runs: every Python block of README.md and docs/*.md, page by page.

Goal: a reader who copies a page's code gets what the page says, not a NameError or a
NotFound. Method: each page's ```python blocks run once, in order, in one namespace (a
block may use what an earlier block of its page made); a block with a top-level ``await``
runs in an event loop. A page whose code opens PostgreSQL (``Engine.postgres``,
``connect``, ``from_env``) runs on the suite's server: the DSN it names, a host of the
reader's, becomes a fresh database there (empty if the page calls ``migrate()``, else
migrated); every other page runs on the memory store. Every engine a page makes is closed
after it.

A block that cannot run (a shell session, a fragment meant to be read, a service that
needs gunicorn) carries a visible marker in the markdown, right before it::

    <!-- not run: the reason -->

A marker without a reason, or one that stands before no Python block, fails its page; a
page whose every block is marked is reported as skipped, with the reasons.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import stockade
from stockade.tools.pytest_plugin import PostgresForTests

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*not run\b(.*?)-->\s*$")
PYTHON = ("python", "py", "python3")
# The calls that open PostgreSQL: a page that makes one runs on the suite's server.
POSTGRES_CALLS = {"postgres", "connect", "from_env", "connect_from_env"}


@dataclass
class Block:
    line: int  # the line of its opening fence, from 1
    code: str
    not_run: Optional[str] = None  # the marker's reason


@dataclass
class Page:
    path: Path
    blocks: List[Block] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)  # markers that do not hold

    @property
    def name(self) -> str:
        return self.path.name if self.path.parent == ROOT else f"docs/{self.path.name}"

    @property
    def on_postgres(self) -> bool:
        return any(opens_postgres(b.code) for b in self.blocks if b.not_run is None)

    @property
    def migrates(self) -> bool:
        return any(".migrate(" in b.code for b in self.blocks if b.not_run is None)


def opens_postgres(code: str) -> bool:
    """Whether the code calls ``Engine.postgres`` (or another constructor that connects);
    a mention in a comment does not count."""
    try:
        tree = ast.parse(code)
    except SyntaxError:  # the run says so
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            named = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if node.func.attr in POSTGRES_CALLS and named == "Engine":
                return True
    return False


def parse(path: Path, text: Optional[str] = None) -> Page:
    """The page's Python blocks and its not-run markers, with what is wrong with them."""
    page = Page(path)
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    marker: Optional[Tuple[int, str]] = None
    i = 0
    while i < len(lines):
        found = MARKER.match(lines[i])
        fence = FENCE.match(lines[i])
        if found:
            if marker is not None:
                page.problems.append(f"line {marker[0]}: a not-run marker before no block")
            reason = found.group(1).strip()
            if not reason.startswith(":") or not reason[1:].strip():
                page.problems.append(f"line {i + 1}: a not-run marker without a reason")
            marker = (i + 1, reason[1:].strip())
        elif fence:
            indent, language = fence.group(1), fence.group(2)
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith("```"):
                end += 1
            if language in PYTHON:
                code = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
                page.blocks.append(Block(i + 1, code, marker[1] if marker else None))
            elif marker is not None:
                page.problems.append(
                    f"line {marker[0]}: a not-run marker before a non-Python block"
                )
            marker = None
            i = end
        elif lines[i].strip() and marker is not None:
            page.problems.append(f"line {marker[0]}: a not-run marker before no block")
            marker = None
        i += 1
    if marker is not None:
        page.problems.append(f"line {marker[0]}: a not-run marker before no block")
    return page


def run_blocks(page: Page, namespace: Dict[str, Any]) -> int:
    """Runs the page's blocks in order in ``namespace``; returns how many ran. A failure
    names the page and the block's line (tracebacks carry the page's own line numbers)."""
    ran = 0
    for block in page.blocks:
        if block.not_run is not None:
            continue
        source = "\n" * block.line + block.code  # so that line numbers are the page's
        try:
            code = compile(source, str(page.path), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
            if code.co_flags & inspect.CO_COROUTINE:
                asyncio.run(eval(code, namespace))
            else:
                exec(code, namespace)
        except Exception as e:
            raise AssertionError(
                f"{page.name}, the block at line {block.line}: {type(e).__name__}: {e}"
            ) from e
        ran += 1
    return ran


class Engines:
    """Engine.memory and Engine.postgres while a page runs: each engine made is kept (to
    close it after the page), and Engine.postgres connects to ``dsn`` whatever DSN the
    page names."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, dsn: Optional[str]) -> None:
        self.made: List[stockade.Engine] = []
        memory, postgres = stockade.Engine.memory.__func__, stockade.Engine.postgres.__func__

        def made_in_memory(cls: Any, **options: Any) -> stockade.Engine:
            return self.keep(memory(cls, **options))

        def made_on_postgres(cls: Any, *_dsn: str, **options: Any) -> stockade.Engine:
            assert dsn is not None, "this page was not seen to open PostgreSQL"
            options.pop("dsn", None)  # the page's, by keyword
            return self.keep(postgres(cls, dsn, **options))

        monkeypatch.setattr(stockade.Engine, "memory", classmethod(made_in_memory))
        monkeypatch.setattr(stockade.Engine, "postgres", classmethod(made_on_postgres))
        if dsn is not None:
            monkeypatch.setenv("STOCKADE_DSN", dsn)  # Engine.from_env, connect_from_env

    def keep(self, engine: stockade.Engine) -> stockade.Engine:
        self.made.append(engine)
        return engine

    def close(self) -> None:
        for engine in self.made:
            engine.close()


def manual() -> Iterator[Any]:
    for path in PAGES:
        page = parse(path)
        if page.blocks or page.problems:
            marks = [pytest.mark.postgres] if page.on_postgres else []
            yield pytest.param(page, id=page.name, marks=marks)


@pytest.mark.parametrize("page", list(manual()))
def test_every_python_block_of_the_page_runs(
    page: Page, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    assert not page.problems, f"{page.name}: {page.problems}"
    not_run = [f"line {b.line}: {b.not_run}" for b in page.blocks if b.not_run is not None]
    if len(not_run) == len(page.blocks):
        pytest.skip(f"{page.name}: every block is marked not run ({'; '.join(not_run)})")
    server: Optional[PostgresForTests] = None
    database = dsn = None
    if page.on_postgres:
        server = request.getfixturevalue("stockade_postgres")
        database = server.new_database(migrated=not page.migrates)
        dsn = server.dsn(database)
    engines = Engines(monkeypatch, dsn)
    try:
        ran = run_blocks(page, {"__name__": "__manual__"})
    finally:
        engines.close()
        if server is not None and database is not None:
            server.drop_database(database)
    print(f"{page.name}: {ran} blocks ran, {len(not_run)} not run {not_run}")
    assert ran == len(page.blocks) - len(not_run) > 0


def test_the_runner_finds_the_blocks_and_holds_the_markers_to_their_word() -> None:
    # Goal: the runner cannot pass by finding nothing, and a marker must give its reason
    # and stand before a Python block. Method: the manual's counts, and pages made here.
    pages = [parse(p) for p in PAGES]
    blocks = [b for p in pages for b in p.blocks]
    assert len(blocks) >= 15 and sum(b.not_run is None for b in blocks) >= 12
    assert all(b.not_run for b in blocks if b.not_run is not None)
    (tour,) = (p for p in pages if p.path.name == "tour.md")
    assert tour.on_postgres and tour.migrates and "reserve_order" in tour.blocks[0].code
    odd = Path("odd.md")
    text = "<!-- not run -->\n```python\nx = 1\n```\n<!-- not run: shell -->\n```sh\nls\n```\n"
    text += "<!-- not run: why -->\ntext\n```python\ny = 2\n```\n"
    page = parse(odd, text)
    assert page.problems == [
        "line 1: a not-run marker without a reason",
        "line 5: a not-run marker before a non-Python block",
        "line 9: a not-run marker before no block",
    ]
    assert [(b.line, b.not_run) for b in page.blocks] == [(2, ""), (11, None)]
    fine = parse(odd, "<!-- not run: a fragment -->\n\n```python\nundefined_name\n```\n")
    assert not fine.problems and fine.blocks[0].not_run == "a fragment"
    assert run_blocks(fine, {}) == 0
    with pytest.raises(AssertionError, match="line 1: NameError"):
        run_blocks(parse(odd, "```python\nundefined_name\n```\n"), {})
    assert run_blocks(parse(odd, "```python\nimport asyncio\nawait asyncio.sleep(0)\n```"), {})
