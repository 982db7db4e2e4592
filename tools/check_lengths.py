#!/usr/bin/env python3
"""Checks that no function in cpp/ or python/stockade/ runs over 70 lines (its head, body
and docstring included): a function that long does more than one thing. Also that no
source file of the engine (cpp/src) runs over 800 lines: a file that long holds more than
one concern.

    python tools/check_lengths.py [--max 70] [--file-max 800]   # exits 1 if any

Python functions are measured from the syntax tree. C++ functions are found by a scan of
the source with comments and string literals blanked (raw strings too): a brace block is a
function body when the text before it ends like a function head (a parameter list,
qualifiers, a trailing return type or a constructor's initializer list), and not like a
control statement. Lambdas inside a function count towards that function. Generated
files (python/stockade/_twins.py) are measured too: the generator writes one short method
per call.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

_HEAD = re.compile(
    r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(final\s*)?(->\s*[\w:<>,&*\s]+)?$"
    r"|\)\s*:\s*[\w:]+[({].*[)}]$"  # the end of a constructor's initializer list
    r"|[)}]\s*$"
)
_TEMPLATE = re.compile(r"template\s*<[^<>]*(<[^<>]*>[^<>]*)*>")
_CONTROL = re.compile(r"\b(if|for|while|switch|catch|return)\b[^;{}]*$")
_LAMBDA = re.compile(r"\]\s*(\([^()]*(\([^()]*\)[^()]*)*\))?\s*(mutable\s*)?(->\s*[\w:<>]+\s*)?$")


def _blank(text: str) -> str:
    """The source with comments and string and char literals blanked, newlines kept."""

    def keep_lines(m: re.Match[str]) -> str:
        return '""' + "\n" * m.group(0).count("\n")

    text = re.sub(r'R"(\w*)\((.*?)\)\1"', keep_lines, text, flags=re.S)
    text = re.sub(r"/\*.*?\*/", keep_lines, text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def cpp_functions(path: pathlib.Path) -> list[tuple[int, int, str]]:
    """(first line, lines, head) of each outermost function body in a C++ file."""
    src = _blank(path.read_text(encoding="utf-8"))
    found: list[tuple[int, int, str]] = []
    stack: list[tuple[int, bool]] = []  # (line of '{', whether it opens a function)
    line = 1
    last_cut = 0  # where the text before the next '{' starts
    for i, ch in enumerate(src):
        if ch == "\n":
            line += 1
        elif ch == "{":
            before = _TEMPLATE.sub("", src[last_cut:i]).strip()
            inside_function = any(is_fn for _, is_fn in stack)
            is_fn = (
                not inside_function
                and bool(_HEAD.search(before))
                and not _CONTROL.search(before.split(";")[-1])
                and not _LAMBDA.search(before)
                and not re.search(r"\b(namespace|class|struct|enum|union)\b[^;{}]*$", before)
                and not re.search(r"=\s*$", before)
            )
            stack.append((line, is_fn))
            last_cut = i + 1
        elif ch == "}":
            if stack:
                start, is_fn = stack.pop()
                if is_fn:
                    found.append((start, line - start + 1, _head_at(path, start)))
            last_cut = i + 1
        elif ch == ";":
            last_cut = i + 1
    return found


def _head_at(path: pathlib.Path, line: int) -> str:
    lines = path.read_text(encoding="utf-8").split("\n")
    for back in range(line - 1, max(-1, line - 12), -1):
        text = lines[back].strip()
        if "(" in text and not text.startswith(":"):
            return text[:90]
    return lines[line - 1].strip()[:90]


def python_functions(path: pathlib.Path) -> list[tuple[int, int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out.append((first, (node.end_lineno or node.lineno) - first + 1, node.name))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max", type=int, default=70)
    parser.add_argument("--file-max", type=int, default=800)
    args = parser.parse_args()
    long: list[str] = []
    count = 0
    for path in sorted((ROOT / "cpp" / "src").rglob("*")):
        if path.suffix in {".cpp", ".hpp"}:
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > args.file_max:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines, over {args.file_max}")
    for path in sorted((ROOT / "cpp").rglob("*")):
        if path.suffix in {".cpp", ".hpp"}:
            for start, lines, head in cpp_functions(path):
                count += 1
                if lines > args.max:
                    long.append(f"{path.relative_to(ROOT)}:{start}: {lines} lines: {head}")
    for path in sorted((ROOT / "python" / "stockade").rglob("*.py")):
        for start, lines, name in python_functions(path):
            count += 1
            if lines > args.max:
                long.append(f"{path.relative_to(ROOT)}:{start}: {lines} lines: {name}")
    for entry in long:
        print(entry, file=sys.stderr)
    if long:
        print(
            f"check_lengths: {len(long)} function(s) over {args.max} lines or file(s) over "
            f"{args.file_max}",
            file=sys.stderr,
        )
        return 1
    print(
        f"check_lengths: {count} functions, none over {args.max} lines; no cpp/src file over "
        f"{args.file_max} lines"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
