"""Inside the controller each module has one role, and the roles point one way
(docs/architecture.md, "Deciding and carrying out"):

- **decide** (pure: no I/O, no clock of its own) imports nothing but the
  other pure modules and the vocabularies below the daemons;
- **look** (what the controller sees and how it judges) never imports what
  decides or carries out;
- **carry out** (the ladders, the serving and agent restarts, the power
  actions) never imports the decision: a part that carries out does not ask
  again whether it may.

Every import counts, under ``TYPE_CHECKING`` and inside functions too
(tests/architecture/test_layers.py reads them the same way).
"""

from __future__ import annotations

from import_graph import PACKAGE, graph

C = "spark_watchdog.controller."
DECIDE = {
    f"{C}{m}"
    for m in ("detector", "planner", "decisions", "watcher_doubt", "node_states", "resume_plan")
}
# What a pure module may import besides the others: vocabularies and plain data.
BELOW = (
    "spark_watchdog.verdicts",
    "spark_watchdog.xid",
    "spark_watchdog.steps",
    "spark_watchdog.config",
    "spark_watchdog.history.records",
)
LOOK = {
    f"{C}{m}"
    for m in (
        "monitor",
        "node_watch",
        "node_conduct",
        "intake",
        "peer_evidence",
        "rank_kills",
        "witness",
        "flight_recorder",
        "http_client",
    )
}
CARRY_OUT = {
    f"{C}{m}"
    for m in (
        "hands",
        "freeze_path",
        "recovery",
        "rung",
        "left_cycle",
        "freeze_tools",
        "gentle_tools",
        "ladder",
        "ladder_tasks",
        "wedged",
        "unlatch",
        "agent_restart",
        "serving_policy",
        "serving_budget",
        "serving_restart",
        "power_actions",
        "holds",
    )
}
# What only the loop and the views it builds may import: the decision and the views.
DECIDING = {f"{C}decisions", f"{C}views", f"{C}watcher_doubt"}


def role_breaches(edges: dict[str, dict[str, int]]) -> list[str]:
    wrong = []
    for module, targets in edges.items():
        for target, line in targets.items():
            if not target.startswith("spark_watchdog."):
                continue
            where = f"{module}:{line} imports {target}"
            if module in DECIDE and target not in DECIDE and not target.startswith(BELOW):
                wrong.append(f"{where} (decide is pure)")
            if module in LOOK and (target in CARRY_OUT or target in DECIDING):
                wrong.append(f"{where} (look decides and does nothing)")
            if module in CARRY_OUT and target in DECIDING:
                wrong.append(f"{where} (carrying out does not decide again)")
    return sorted(wrong)


def test_each_role_imports_only_what_its_role_allows() -> None:
    assert role_breaches(graph()) == []


def test_every_role_names_modules_that_exist() -> None:
    present = {f"{C}{p.stem}" for p in (PACKAGE / "controller").glob("*.py")}
    assert (DECIDE | LOOK | CARRY_OUT | DECIDING) - present == set()


def test_the_check_finds_a_ladder_that_asks_the_decision() -> None:
    edges = {f"{C}wedged": {f"{C}decisions": 7}, f"{C}planner": {f"{C}ledger": 3}}
    assert role_breaches(edges) == [
        f"{C}planner:3 imports {C}ledger (decide is pure)",
        f"{C}wedged:7 imports {C}decisions (carrying out does not decide again)",
    ]
