"""What every lab scenario is made of (lab/stories/scenarios.py): its run and
result, the waits on the controller's history, the verdict watch, and the
checks of what reached the PDU."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.history.records import Incident
from spark_watchdog.lab.cluster import (
    REAL_START_TIMEOUT_S,
    LabCluster,
)
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import ControllerMode, LabSession, LabTimeout
from spark_watchdog.verdicts import TAKEN_FOR_FROZEN

# After detection, how long a no-rule scenario watches for a wrong action:
# twice the lab's freeze_after, so a mistaken freeze verdict would have fired.
QUIET_WATCH_S = 6.0
RECOVERY_TIMEOUT_S = 90.0
# Notifications that ask a person to act.
PERSON_ALERTS = frozenset({"gave_up", "held", "ambiguous_power", "outlet_off"})
# How long a planned reboot keeps the node down (its SSH port refusing), at
# least; longer than the lab's freeze_after, so that a controller counting a
# refusal as silence would have fenced it.
REBOOT_DOWN_S = 8.0
# Verdicts that mean the controller took a node for frozen, or acted on it.
FENCING_VERDICTS = TAKEN_FOR_FROZEN


@dataclass
class ScenarioResult:
    scenario: str
    outcome: str
    expected: tuple[str, ...]
    detected_after_s: float | None = None
    recovered_after_s: float | None = None
    power_actions: int = 0
    false_power_actions: int = 0
    serving_restarts: int = 0
    incident_ids: list[int] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    pdu_commands: list[str] = field(default_factory=list)
    alerts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    history: str | None = None
    lab_id: str | None = None  # the lab's process tag (cluster.LAB_ENV), for leak checks

    def not_available(self, why: str) -> ScenarioResult:
        """The scenario cannot run on this machine, and why."""
        self.outcome = "not_available"
        self.notes.append(why)
        return self

    @property
    def ok(self) -> bool:
        if self.outcome == "not_available":
            return False
        return self.outcome in self.expected and not self.problems

    def to_json(self) -> dict[str, Any]:
        def seconds(value: float | None) -> float | None:
            return None if value is None else round(value, 2)

        return {
            "scenario": self.scenario,
            "outcome": self.outcome,
            "detected_after_s": seconds(self.detected_after_s),
            "recovered_after_s": seconds(self.recovered_after_s),
            "power_actions": self.power_actions,
            "false_power_actions": self.false_power_actions,
            "serving_restarts": self.serving_restarts,
            "incident_ids": self.incident_ids,
            "expected": list(self.expected),
            "ok": self.ok,
            "nodes": self.nodes,
            "pdu_commands": self.pdu_commands,
            "alerts": self.alerts,
            "problems": self.problems,
            "notes": self.notes,
            "history": self.history,
            # Every process of the lab carries it (SPARK_WATCHDOG_LAB): none is left after.
            "lab_id": self.lab_id,
        }


@dataclass
class Run:
    """What a scenario function has while it runs."""

    session: LabSession
    result: ScenarioResult
    injected_at: float = 0.0  # wall clock
    sets_before: int = 0

    @property
    def lab(self) -> LabCluster:
        return self.session.lab

    def inject(self, fault: str, node: LabNode | None = None) -> None:
        what = self.lab.inject(fault, node)
        self.begin(fault, node, what)

    def begin(self, fault: str, node: LabNode | None, what: str) -> None:
        """The fault is in (injected, or played by the scenario itself): the clock starts."""
        self.injected_at = time.time()
        if node is not None and node.name not in self.result.nodes:
            self.result.nodes.append(node.name)
        self.session.say(f"FAULT {fault}: {what}")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    expected: tuple[str, ...]
    run: Callable[[Run], None]
    min_nodes: int = 2
    controller: ControllerMode = "thread"
    controller_overrides: dict[str, Any] = field(default_factory=dict)
    netns: bool = False
    doc: str = ""


# -- helpers ----------------------------------------------------------------------


def pick_target(run: Run, wanted: str | None, default_index: int) -> LabNode:
    nodes = run.lab.nodes
    if wanted is not None:
        return run.lab.node(wanted)
    return nodes[min(default_index, len(nodes) - 1)]


def incidents_of(run: Run) -> list[Incident]:
    return sorted(run.session.store().list_incidents(), key=lambda i: i.id)


def wait_resolved(
    run: Run, count: int, what: str, held_node: LabNode | None = None, kind: str | None = None
) -> None:
    """Until ``count`` incidents (of ``kind``, if given) are resolved, or ``held_node`` is held."""

    def done() -> bool:
        incidents = [i for i in incidents_of(run) if kind is None or i.kind == kind]
        resolved = [i for i in incidents if i.status == "resolved"]
        if len(incidents) >= count and len(resolved) >= count:
            return True
        return held_node is not None and run.session.verdict(held_node) == "held"

    run.session.wait_for(done, recovery_timeout(run), what)


def recovery_timeout(run: Run) -> float:
    """A real vLLM head is stopped and started again by a serving restart."""
    real = run.session.vllm == "real"
    return RECOVERY_TIMEOUT_S + (REAL_START_TIMEOUT_S if real else 0.0)


def judge_incidents(run: Run, kind: str) -> None:
    """Outcome and timings from the incidents the controller recorded."""
    result = run.result
    incidents = [i for i in incidents_of(run) if i.kind == kind]
    result.incident_ids = [i.id for i in incidents]
    if not incidents:
        result.outcome = "held" if any_held(run) else "not_detected"
        return
    resolutions = {i.resolution or "held" for i in incidents}
    result.outcome = resolutions.pop() if len(resolutions) == 1 else "mixed"
    result.detected_after_s = min(i.detected_at for i in incidents) - run.injected_at
    ends = [i.resolved_at for i in incidents if i.resolution == "recovered" and i.resolved_at]
    if len(ends) == len(incidents):
        result.recovered_after_s = max(ends) - run.injected_at


def any_held(run: Run) -> bool:
    status = run.session.status() or {}
    return any(n.get("verdict") == "held" for n in status.get("nodes", []))


def account(run: Run) -> None:
    """What reached the PDU and the history, whatever the outcome; and the
    guarantees every scenario keeps: nothing against a healthy node."""
    result, lab = run.result, run.lab
    commands = lab.outlet_commands(run.sets_before)
    by_outlet = {n.outlet: n.name for n in lab.nodes}
    result.pdu_commands = [f"outlet {o} ({by_outlet.get(o, '?')}) {c}" for o, c in commands]
    result.power_actions = len(commands)
    faulted = set(result.nodes)
    result.false_power_actions = sum(1 for o, _ in commands if by_outlet.get(o) not in faulted)
    if result.false_power_actions:
        result.problems.append(f"{result.false_power_actions} power command(s) to healthy nodes")
    store = run.session.store()
    result.serving_restarts = len(store.serving_restarts(limit=100))
    for node in lab.nodes:
        if node.name not in faulted and store.actions(node=node.name):
            result.problems.append(f"the history shows an action against healthy {node.name}")
    if run.session.receiver is not None:
        result.alerts = run.session.receiver.kinds()
    result.history = str(run.session.history_path)


def expect_cycles(run: Run, nodes: list[LabNode]) -> None:
    """One verified cycle per incident, and exactly one off then one on per node."""
    result, store = run.result, run.session.store()
    for incident_id in result.incident_ids:
        actions = [(a.operation, a.result) for a in store.actions(incident_id=incident_id)]
        if actions != [("cycle", "verified")]:
            result.problems.append(f"incident #{incident_id}: actions {actions}, expected 1 cycle")
        steps = [s.step for s in store.steps(incident_id)]
        for step in ("off_verified", "on_verified", "new_boot_seen", "resolved"):
            if step not in steps:
                result.problems.append(f"incident #{incident_id}: no {step} step recorded")
    commands = run.lab.outlet_commands(run.sets_before)
    for node in nodes:
        seen = [c for o, c in commands if o == node.outlet]
        if seen != ["off", "on"]:
            result.problems.append(f"{node.name}: the PDU saw {seen}, expected one off, one on")


def expect_safe_restart(run: Run) -> None:
    restarts = run.session.store().serving_restarts(limit=100)
    if not any(r.profile == "safe" and r.result == "succeeded" for r in restarts):
        run.result.problems.append("no succeeded serving restart with profile safe")


def expect_no_power(run: Run, allowed: tuple[str, ...] = ()) -> None:
    if run.result.power_actions:
        run.result.problems.append(f"{run.result.power_actions} power command(s) sent")
    if [a for a in run.session.store().actions() if a.operation not in allowed]:
        run.result.problems.append("the history shows power actions")


def rank_stopped_on_the_node(run: Run, fault: str, kind: str, evidence: str) -> tuple[LabNode, Any]:
    """Inject ``fault`` (one that ends a rank, not its host) into the first
    worker; once its ``kind`` incident is resolved, judge it, account for it
    and expect no power. The node and its incident's ``evidence`` entry."""
    node = pick_target(run, None, 1)
    run.inject(fault, node)
    wait_resolved(run, 1, f"the {kind} incident of {node.name} to be resolved")
    judge_incidents(run, kind)
    account(run)
    expect_no_power(run)
    incidents = [i for i in incidents_of(run) if i.id in run.result.incident_ids]
    return node, incidents[0].evidence.get(evidence) if incidents else None


def expect_no_incident(run: Run) -> None:
    incidents = incidents_of(run)
    run.result.incident_ids = [i.id for i in incidents]
    if incidents:
        kinds = [f"#{i.id} {i.kind} ({', '.join(i.nodes)})" for i in incidents]
        run.result.problems.append(f"incident(s) opened: {kinds}")


class Verdicts:
    """One node's verdicts in the controller's /v1/status, as the scenario
    sees them change (every wait and watch polls it)."""

    def __init__(self, run: Run, node: LabNode) -> None:
        self.run, self.node = run, node
        self.seen: list[str] = []
        self.first_at: dict[str, float] = {}  # wall clock

    def poll(self) -> str | None:
        verdict = self.run.session.verdict(self.node)
        if verdict is not None and (not self.seen or self.seen[-1] != verdict):
            self.seen.append(verdict)
            self.first_at.setdefault(verdict, time.time())
        return verdict

    def wait(self, wanted: Callable[[str | None], bool], timeout: float, what: str) -> float:
        return self.run.session.wait_for(lambda: wanted(self.poll()), timeout, what)

    def watch(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()
            time.sleep(0.2)

    def after_injection(self, verdict: str) -> float | None:
        at = self.first_at.get(verdict)
        return None if at is None else at - self.run.injected_at

    def note(self, final: bool = False) -> None:
        """The verdicts seen so far into the result's notes (a final note replaces it)."""
        prefix = f"{self.node.name}'s verdicts, in order: "
        notes = self.run.result.notes
        if final:
            notes[:] = [n for n in notes if not n.startswith(prefix)]
        notes.append(prefix + (" -> ".join(self.seen) or "none read"))

    def expect_no_fencing(self) -> None:
        wrong = [v for v in self.seen if v in FENCING_VERDICTS]
        if wrong:
            self.run.result.problems.append(
                f"the controller called {self.node.name} {', '.join(dict.fromkeys(wrong))}"
            )


def controller_boot_id(run: Run, node: LabNode) -> str | None:
    for entry in (run.session.status() or {}).get("nodes", []):
        if entry.get("name") == node.name and isinstance(entry.get("boot_id"), str):
            return str(entry["boot_id"]).replace("-", "")
    return None


# -- scenarios --------------------------------------------------------------------


def expect_verdict_holds(run: Run, verdicts: Verdicts, verdict: str, alert_within: float) -> None:
    """The node is called ``verdict`` within 30 s, an alert of that kind comes
    within ``alert_within``, and the verdict still stands QUIET_WATCH_S later
    (twice freeze_after: a controller that took it for a freeze would fence)."""
    receiver = run.session.receiver
    assert receiver is not None
    name = verdicts.node.name
    try:
        verdicts.wait(lambda v: v == verdict, 30, f"{name} called {verdict}")
    except LabTimeout as exc:
        run.result.problems.append(str(exc))
        verdicts.watch(QUIET_WATCH_S)  # what it does instead, for the record
        return
    try:
        run.session.wait_for(lambda: verdict in receiver.kinds(), alert_within, "an alert")
    except LabTimeout:
        run.result.problems.append(f"no {verdict} notification")
    verdicts.watch(QUIET_WATCH_S)
    if (final := verdicts.poll()) != verdict:
        run.result.problems.append(
            f"{name} is {final} after {QUIET_WATCH_S:g}s more; {verdict} expected"
        )
