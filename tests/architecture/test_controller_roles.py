"""Inside the controller each sub-package has one role, and the roles point one
way (docs/architecture.md, "Deciding and carrying out"). One rule per package:
what it may import from the rest of the controller.

- ``decide`` (pure: no I/O, no clock of its own) imports nothing of the
  controller but itself, and only the vocabularies below the daemons;
- ``look`` (what the controller sees and how it judges it) imports only the
  judges of ``decide`` and the seams to the outside;
- ``act`` and ``serving`` (the ladders, the power actions, the serving and
  agent restarts) carry out: they never import the decision, the page or the
  pair; a part that carries out does not ask again whether it may;
- ``record`` (the history's door, incidents, alerts, tallies) tells and
  keeps what was seen and done: it never imports what carries out, the
  decision, the page or the pair's loop;
- ``page`` (the status API and the operator's page) reads and records, and
  never carries out;
- ``pair`` (two controllers and their lease) sits above the loop.

The decision itself (``decide.decisions``, ``decide.watcher_doubt``) is
imported only by the loop: ``daemon`` and the ``views`` it builds each tick.
Every import counts, under ``TYPE_CHECKING`` and inside functions too
(tests/architecture/test_layers.py reads them the same way).
"""

from __future__ import annotations

from import_graph import PACKAGE, graph

C = "spark_watchdog.controller."
# What a pure module may import besides decide: vocabularies and plain data.
BELOW = (
    "spark_watchdog.verdicts",
    "spark_watchdog.xid",
    "spark_watchdog.steps",
    "spark_watchdog.config",
    "spark_watchdog.history.records",
)
SEAMS = ("io", "clock")
JUDGES = (
    "decide.colocation",
    "decide.detector",
    "decide.node_states",
    "decide.planner",
    "decide.resume_plan",
)
# What each package may import from the rest of the controller.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "decide": ("decide",),
    "look": ("look", *JUDGES, *SEAMS),
    "act": ("act", "look", "serving", "record", "pair.fence", *JUDGES, *SEAMS),
    "serving": ("serving", "look", "record", "act.ladder", *JUDGES, *SEAMS),
    "record": ("record", "look", "pair.fence", "clock", *JUDGES),
    "page": ("page", "look", "record", *JUDGES),
    "pair": ("pair", "page", "record", "daemon", *SEAMS),
}
THE_LOOP = ("daemon", "views")
THE_DECISION = ("decide.decisions", "decide.watcher_doubt")


def _within(target: str, names: tuple[str, ...]) -> bool:
    return any(target == f"{C}{n}" or target.startswith(f"{C}{n}.") for n in names)


def _package(module: str) -> str:
    return module[len(C) :].split(".")[0]


def role_breaches(edges: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for module, targets in edges.items():
        if not module.startswith(C):
            continue
        package = _package(module)
        for target, line in targets.items():
            where = f"{module}:{line} imports {target}"
            if not target.startswith(C):
                outside = target.startswith("spark_watchdog.") and not target.startswith(BELOW)
                if package == "decide" and outside:
                    wrong.append(f"{where} (decide is pure)")
                continue
            if target == C.rstrip(".") or target == f"{C}{_package(target)}":
                continue  # a package's empty __init__, named by `from package import module`
            if _within(target, THE_DECISION) and package not in THE_LOOP:
                wrong.append(f"{where} (only the loop asks the decision)")
            elif package in MAY_IMPORT and not _within(target, MAY_IMPORT[package]):
                wrong.append(
                    f"{where} ({package} may import only {', '.join(MAY_IMPORT[package])})"
                )
    return sorted(wrong)


def test_each_package_imports_only_what_its_role_allows() -> None:
    assert role_breaches(graph()) == []


def test_every_module_of_the_controller_has_a_role() -> None:
    """A new module goes into a package whose rule holds it, or beside the loop."""
    loose = {p.stem for p in (PACKAGE / "controller").glob("*.py")} - {"__init__"}
    assert loose == {*THE_LOOP, *SEAMS}
    packages = {p.name for p in (PACKAGE / "controller").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(MAY_IMPORT)


def test_the_rules_name_modules_that_exist() -> None:
    for names in MAY_IMPORT.values():
        for name in names:
            path = PACKAGE / "controller" / name.replace(".", "/")
            assert path.is_dir() or path.with_suffix(".py").exists(), name


def test_the_check_finds_a_ladder_that_asks_the_decision() -> None:
    edges = {
        f"{C}act.wedged": {f"{C}decide.decisions": 7},
        f"{C}decide.planner": {f"{C}record.ledger": 3, "spark_watchdog.power.snmp": 4},
        f"{C}look.monitor": {f"{C}act.hands": 9, f"{C}decide.detector": 2},
    }
    assert role_breaches(edges) == [
        f"{C}act.wedged:7 imports {C}decide.decisions (only the loop asks the decision)",
        f"{C}decide.planner:3 imports {C}record.ledger (decide may import only decide)",
        f"{C}decide.planner:4 imports spark_watchdog.power.snmp (decide is pure)",
        f"{C}look.monitor:9 imports {C}act.hands (look may import only look, decide.colocation, "
        "decide.detector, decide.node_states, decide.planner, decide.resume_plan, io, clock)",
    ]
