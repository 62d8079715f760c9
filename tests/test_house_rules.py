"""The house rules for the shipped code (kgroup/, operator/, worker_sidecar/, pipeline/):
no module over 600 lines and no function over 80, unless the module's docstring says why
(a sentence with "over 600 lines", in any case) or the function's does ("over 80
lines"). A reader
should not meet a long module or function that nobody decided to keep long.
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("kgroup", "operator", "worker_sidecar", "pipeline")
MODULE_LINES = 600
FUNCTION_LINES = 80


@dataclass(frozen=True)
class TooLong:
    where: str
    lines: int

    def __str__(self) -> str:
        return f"{self.where}: {self.lines} lines"


def too_long(path: str, text: str) -> list[TooLong]:
    """What in one module breaks the rules without saying why."""
    tree = ast.parse(text)
    out: list[TooLong] = []
    lines = len(text.splitlines())
    if lines > MODULE_LINES and f"over {MODULE_LINES} lines" not in (
            ast.get_docstring(tree) or "").lower():
        out.append(TooLong(path, lines))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            n = node.end_lineno - node.lineno + 1
            if n > FUNCTION_LINES and f"over {FUNCTION_LINES} lines" not in (
                    ast.get_docstring(node) or "").lower():
                out.append(TooLong(f"{path}:{node.lineno} {node.name}", n))
    return out


def shipped_modules() -> list[str]:
    out = subprocess.run(["git", "ls-files", *(f"{d}/*.py" for d in SHIPPED)], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    return [p for p in out if (REPO / p).exists()]


def test_no_long_module_or_function_without_a_reason() -> None:
    modules = shipped_modules()
    assert len(modules) > 50 and "kgroup/core/operator/decide.py" in modules
    found = [t for p in modules for t in too_long(p, (REPO / p).read_text())]
    assert not found, "over the house rules, with no sentence saying why: " + "; ".join(
        map(str, found))


def test_the_rule_sees_a_long_module_and_a_long_function_and_their_reasons() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    long_function = f'def f():\n    """Does one thing."""\n{body}\n'
    assert [t.where for t in too_long("m.py", long_function)] == ["m.py:1 f"]
    kept = long_function.replace("Does one thing.", "Does one thing; over 80 lines because.")
    assert too_long("m.py", kept) == []
    filler = "\n".join(f"y{i} = {i}" for i in range(MODULE_LINES))
    assert [t.where for t in too_long("m.py", f'"""A module."""\n{filler}\n')] == ["m.py"]
    assert too_long("m.py", f'"""A module, over 600 lines: why."""\n{filler}\n') == []
