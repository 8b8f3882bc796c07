"""The package's layers point one way, and no module imports itself in a circle.

Every import counts, including those inside functions and under
``TYPE_CHECKING``: a lazy import hides a cycle from Python, not from a reader.
The layers (docs/design.md, "Layers"): the shared foundations (errors,
config, profiles, redaction, the HTTP server) depend on no daemon; probes,
power and history on no daemon; the agent and the controller not on each
other; only the lab and the CLI see everything. Inside the lab, the
simulated hardware does not see the cluster, nor the cluster the stories.
"""

from __future__ import annotations

import pytest
from import_graph import graph

# A module of the first group may not import one of the second.
# Every layer above a foundation.
_ALL_ABOVE = ("agent", "controller", "lab", "cli", "doctor", "probes", "power", "history", "config")
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "spark_watchdog.config": ("agent", "controller", "lab", "cli", "doctor", "probes", "power"),
    "spark_watchdog.profiles": ("agent", "controller", "lab", "cli", "config"),
    # The one clock of a process: a foundation, it depends on nothing of ours.
    "spark_watchdog.clock": _ALL_ABOVE,
    # The HTTP server, every module of it: foundations only (errors, clock, bearer ...).
    "spark_watchdog.http": _ALL_ABOVE,
    "spark_watchdog.bearer": ("agent", "controller", "lab", "cli", "config"),
    "spark_watchdog.probes": ("agent", "controller", "lab", "cli", "doctor"),
    "spark_watchdog.power": ("agent", "controller", "lab", "cli", "doctor"),
    "spark_watchdog.history": ("agent", "controller", "lab", "cli", "doctor"),
    "spark_watchdog.agent": ("controller", "lab", "cli", "doctor"),
    "spark_watchdog.controller": ("agent", "lab", "cli", "doctor"),
    "spark_watchdog.doctor": ("lab", "cli"),
}
# Foundations every surface uses for the rules of bad input (docs/bad-input.md):
# escaping for a terminal, redaction, bounded child processes. They depend on
# nothing above them, so any module may use them.
for _foundation in ("terminal", "redact", "child_run"):
    FORBIDDEN[f"spark_watchdog.{_foundation}"] = _ALL_ABOVE
# Inside the lab (spark_watchdog/lab/__init__.py): the hardware knows no
# cluster, the cluster tells no story.
_LAB_CLUSTER = ("cluster", "session", "lab_controller", "timeline", "up")
FORBIDDEN["spark_watchdog.lab.hardware"] = (
    *(f"lab.{m}" for m in _LAB_CLUSTER),
    "lab.stories",
    "cli",
)
for _module in (*_LAB_CLUSTER, "ports"):
    FORBIDDEN[f"spark_watchdog.lab.{_module}"] = ("lab.stories", "cli")


def test_no_module_imports_a_layer_above_it() -> None:
    wrong = []
    for module, targets in graph().items():
        for prefix, banned in FORBIDDEN.items():
            if module != prefix and not module.startswith(prefix + "."):
                continue
            for target, line in targets.items():
                if any(target.startswith(f"spark_watchdog.{b}") for b in banned):
                    wrong.append(f"{module}:{line} imports {target}")
    assert not wrong, "\n".join(sorted(wrong))


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles() -> None:
    edges = graph()
    # A package's __init__ importing its own modules is not a cycle of meaning.
    for name in list(edges):
        edges[name] = {t: n for t, n in edges[name].items() if not name.startswith(t + ".")}
    assert not cycles(edges), cycles(edges)


@pytest.mark.parametrize(
    ("edges", "expected"),
    [
        ({"a": {"b": 1}, "b": {"a": 1}}, [["a", "b"]]),
        ({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}, [["a", "b", "c"]]),
        ({"a": {"b": 1}, "b": {}}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(
    edges: dict[str, dict[str, int]], expected: list[list[str]]
) -> None:
    assert cycles(edges) == expected
