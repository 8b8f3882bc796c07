"""The package's imports as a graph, for the tests of its layers and roles
(tests/architecture): every import counts, including those inside functions
and under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spark_watchdog"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of the package in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                # `from spark_watchdog.lab.hardware import real_vllm` imports a module too.
                yield node.lineno, f"{node.module}.{alias.name}"
                yield node.lineno, node.module


def graph() -> dict[str, dict[str, int]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for line, target in imports(path):
            if target in modules and target != name:
                edges[name].setdefault(target, line)
    return edges
