"""The package stays readable in pieces: no module over 800 lines, no class over
400, no function over 60 (docs/architecture.md, "Where each kind of change goes")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spark_watchdog"
LIMITS = {"module": 800, "class": 400, "function": 60}


def oversized(root: Path = PACKAGE) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        where = path.relative_to(root.parent)
        lines = len(source.splitlines())
        if lines > LIMITS["module"]:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef):
                kind = "class"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                kind = "function"
            else:
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMITS[kind]:
                found.append(f"{where}:{node.lineno} {kind} {node.name}: {length} lines")
    return found


def test_no_module_class_or_function_outgrows_its_limit() -> None:
    assert oversized() == [], "split these (one job each):\n" + "\n".join(oversized())


def test_the_check_finds_an_oversized_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(61))
    (tmp_path / "big.py").write_text(f"def long_one() -> None:\n{body}\n")
    assert oversized(tmp_path) == [f"{tmp_path.name}/big.py:1 function long_one: 62 lines"]
