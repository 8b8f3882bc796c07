"""The per-node record is written in one place per side: what the controller
sees (``NodeWatch``) by its own module and the monitor, what it has done
(``NodeConduct``) only through its methods, never assigned from outside
(docs/architecture.md, "Deciding and carrying out")."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from spark_watchdog.controller.look.node_conduct import NodeConduct
from spark_watchdog.controller.look.node_watch import NodeWatch

PACKAGE = Path(__file__).resolve().parents[2] / "spark_watchdog"
WATCH_FIELDS = {f.name for f in fields(NodeWatch)}
CONDUCT_FIELDS = {n for f in fields(NodeConduct) for n in (f.name, f.name.lstrip("_"))}
# Look-side facts the monitor writes as it looks.
MONITOR_WRITES = {"finding", "banner_checked_at"}
OWN = {"controller/look/node_watch.py", "controller/look/node_conduct.py"}


def _base(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _writes(source: str) -> list[tuple[int, str]]:
    """(line, attribute) of each assignment to a watch's field or its conduct's."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            # watch.conduct.rungs_done.add(...) and the like: a mutation in place.
            owner = node.func.value
            if node.func.attr in {"add", "clear", "discard", "update", "append", "pop"}:
                targets = [owner]
        for target in targets:
            if not isinstance(target, ast.Attribute) or _base(target) not in {"watch", "w"}:
                continue
            on_conduct = isinstance(target.value, ast.Attribute) and target.value.attr == "conduct"
            if target.attr in CONDUCT_FIELDS and on_conduct:
                found.append((target.lineno, f"conduct.{target.attr}"))
            elif target.attr in WATCH_FIELDS and not on_conduct:
                found.append((target.lineno, target.attr))
    return sorted(found)


def record_writes_outside(root: Path = PACKAGE) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root).as_posix()
        if where in OWN:
            continue
        for line, attr in _writes(path.read_text()):
            if where == "controller/look/monitor.py" and attr in MONITOR_WRITES:
                continue
            bad.append(f"{where}:{line} writes {attr}")
    return bad


def test_only_the_monitor_writes_what_is_seen_and_only_its_methods_what_is_done() -> None:
    assert record_writes_outside() == []


def test_the_check_finds_a_field_assigned_from_a_ladder(tmp_path: Path) -> None:
    (tmp_path / "controller" / "act").mkdir(parents=True)
    (tmp_path / "controller" / "act" / "ladder.py").write_text(
        "def f(watch):\n"
        "    watch.conduct.incident_id = 3\n"
        "    watch.conduct.rungs_done.add(1)\n"
        "    watch.finding = None\n"
        "    watch.conduct.incident_opened(3)\n"
    )
    assert record_writes_outside(tmp_path) == [
        "controller/act/ladder.py:2 writes conduct.incident_id",
        "controller/act/ladder.py:3 writes conduct.rungs_done",
        "controller/act/ladder.py:4 writes finding",
    ]
