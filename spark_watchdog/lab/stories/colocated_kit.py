"""What the scenarios of a lab with its controllers on the nodes are made of
(lab/stories/colocated_scenarios.py): their run, the records each controller
kept since the scenario began, and the checks of which controller acted and
what reached the PDU.

Several scenarios may run one after another on one lab (the tests share it):
each begins on a settled lab (every controller acting, every node healthy)
and counts only what came after its own start: the PDU's SETs from then,
and each history's records from then (their times are the wall clock's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from spark_watchdog.history.records import Action, Incident
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.colocated_session import ColocatedLab
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import LabTimeout
from spark_watchdog.lab.stories.scenario_kit import FENCING_VERDICTS, ScenarioResult

# Power operations (an agent restart over SSH is not one).
POWER_OPERATIONS = frozenset({"off", "on", "cycle", "ssh_reboot", "long_cut"})
# How long a cycle by a controller on a node may take on a loaded machine:
# freeze_after, the fence delay, the off hold, the boot and the agent's start.
RECOVERY_TIMEOUT_S = 120.0


@dataclass
class ColocatedRun:
    """What a co-located scenario has while it runs."""

    colo: ColocatedLab
    result: ScenarioResult
    since: float = field(default_factory=time.time)  # wall clock: its records are after it
    injected_at: float = 0.0
    sets_before: int = 0
    alerts_before: int = 0
    # What each controller's status said while the scenario polled it.
    claims: dict[str, set[str]] = field(default_factory=dict)
    verdicts: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    heard_s_ago: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def lab(self) -> LabCluster:
        return self.colo.lab

    def node(self, name: str) -> LabNode:
        return self.lab.node(name)

    def mark(self) -> None:
        """From now on: the PDU's SETs, the alerts and the records are this scenario's."""
        self.since = time.time()
        self.sets_before = len(self.lab.outlet_commands())
        receiver = self.colo.receiver
        self.alerts_before = 0 if receiver is None else len(receiver.snapshot())

    def inject(self, fault: str, node: LabNode) -> None:
        self.begin(fault, node, self.lab.inject(fault, node))

    def begin(self, fault: str, node: LabNode | None, what: str) -> None:
        self.injected_at = time.time()
        if node is not None and node.name not in self.result.nodes:
            self.result.nodes.append(node.name)
        self.colo.say(f"FAULT {fault}: {what}")

    # -- what the controllers say ------------------------------------------------

    def poll(self) -> None:
        """Each controller's status once: its claims, its verdicts, when it heard the others."""
        for name in self.colo.placed:
            status = self.colo.status(name)
            if status is None:
                continue
            placed = status.get("colocated") or {}
            self.claims.setdefault(name, set()).update(placed.get("claims") or [])
            seen = self.verdicts.setdefault(name, {})
            for entry in status.get("nodes") or []:
                said = seen.setdefault(str(entry.get("name")), [])
                verdict = str(entry.get("verdict"))
                if not said or said[-1] != verdict:
                    said.append(verdict)
            worst = self.heard_s_ago.setdefault(name, {})
            for peer, heard in (placed.get("peers") or {}).items():
                ago = heard.get("heard_s_ago")
                ago = float("inf") if ago is None else float(ago)
                worst[peer] = max(worst.get(peer, 0.0), ago)

    def watch(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll()
            time.sleep(0.3)

    def wait(self, check: Callable[[], bool], timeout: float, what: str) -> float:
        def polled() -> bool:
            self.poll()
            return check()

        return self.colo.wait_for(polled, timeout, what, interval=0.3)

    # -- what each controller recorded -------------------------------------------

    def incidents(self, by: str, kind: str | None = None) -> list[Incident]:
        """The incidents the controller on ``by`` opened since the scenario began."""
        found = self.colo.store(by).list_incidents(kind=kind, since=self.since)
        return sorted(found, key=lambda i: i.id)

    def actions(self, by: str) -> list[Action]:
        """What the controller on ``by`` sent (or tried) since the scenario began."""
        return [a for a in self.colo.store(by).actions() if a.requested_at >= self.since]

    def power_actions(self, by: str) -> list[Action]:
        return [a for a in self.actions(by) if a.operation in POWER_OPERATIONS]

    def pdu(self) -> dict[str, list[str]]:
        """The SETs that reached the PDU since the scenario began, by node."""
        by_outlet = {n.outlet: n.name for n in self.lab.nodes}
        seen: dict[str, list[str]] = {}
        for outlet, command in self.lab.outlet_commands(self.sets_before):
            seen.setdefault(by_outlet.get(outlet, f"outlet {outlet}"), []).append(command)
        return seen


def account(run: ColocatedRun) -> None:
    """What reached the PDU, what every controller recorded and who was alerted."""
    result = run.result
    commands = run.lab.outlet_commands(run.sets_before)
    by_outlet = {n.outlet: n.name for n in run.lab.nodes}
    result.pdu_commands = [f"outlet {o} ({by_outlet.get(o, '?')}) {c}" for o, c in commands]
    result.power_actions = len(commands)
    faulted = set(result.nodes)
    result.false_power_actions = sum(1 for o, _ in commands if by_outlet.get(o) not in faulted)
    if result.false_power_actions:
        result.problems.append(f"{result.false_power_actions} power command(s) to healthy nodes")
    restarts = 0
    for name in run.colo.placed:
        store = run.colo.store(name)
        restarts += len([r for r in store.serving_restarts(limit=100) if r.started_at >= run.since])
        for action in run.power_actions(name):
            if action.node not in faulted:
                result.problems.append(
                    f"{name}'s controller recorded {action.operation} of healthy {action.node}"
                )
    result.serving_restarts = restarts
    receiver = run.colo.receiver
    if receiver is not None:
        result.alerts = [str(e.get("kind")) for e in receiver.snapshot()[run.alerts_before :]]


def expect_no_power(run: ColocatedRun) -> None:
    """Nothing reached the PDU, no controller recorded a power action, and no
    controller called a node frozen or fenced it."""
    if run.pdu():
        run.result.problems.append(f"the PDU received {run.pdu()}")
    for name in run.colo.placed:
        sent = [f"{a.operation} {a.node} ({a.result})" for a in run.power_actions(name)]
        if sent:
            run.result.problems.append(f"{name}'s controller recorded {sent}")
        for node, seen in run.verdicts.get(name, {}).items():
            wrong = [v for v in seen if v in FENCING_VERDICTS]
            if wrong:
                run.result.problems.append(f"{name}'s controller called {node} {wrong}")


def expect_one_cycle_by(run: ColocatedRun, actor: str, node: LabNode) -> None:
    """The controller on ``actor``, and no other, cycled ``node`` once: one
    verified cycle in its history, one off and one on at the PDU."""
    result = run.result
    incidents = [i for i in run.incidents(actor, "host_frozen") if node.name in i.nodes]
    if len(incidents) != 1:
        result.problems.append(
            f"{actor}'s controller: {len(incidents)} host_frozen incidents of {node.name}"
        )
    store = run.colo.store(actor)
    for incident in incidents:
        actions = [(a.operation, a.result) for a in store.actions(incident_id=incident.id)]
        if actions != [("cycle", "verified")]:
            result.problems.append(f"{actor}'s incident #{incident.id}: actions {actions}")
        steps = [s.step for s in store.steps(incident.id)]
        for step in ("off_verified", "on_verified", "new_boot_seen", "resolved"):
            if step not in steps:
                result.problems.append(f"{actor}'s incident #{incident.id}: no {step} step")
    for name in run.colo.placed:
        if name == actor:
            continue
        others = [a.operation for a in run.power_actions(name) if a.node == node.name]
        if others:
            result.problems.append(f"{name}'s controller also sent {others} to {node.name}")
    seen = run.pdu().get(node.name, [])
    if seen != ["off", "on"]:
        result.problems.append(f"{node.name}: the PDU saw {seen}, expected one off, one on")


def off_after(run: ColocatedRun, actor: str, node: LabNode) -> float | None:
    """Seconds from the fault to the off the controller on ``actor`` asked for ``node``."""
    store = run.colo.store(actor)
    for incident in run.incidents(actor, "host_frozen"):
        if node.name in incident.nodes:
            for step in store.steps(incident.id):
                if step.step == "off_requested" and step.node in (None, node.name):
                    return step.at - run.injected_at
    return None


def judge_recovery(run: ColocatedRun, actor: str, nodes: list[LabNode]) -> None:
    """Outcome and timings from the controller on ``actor``'s incidents of ``nodes``."""
    result = run.result
    names = {n.name for n in nodes}
    incidents = [i for i in run.incidents(actor, "host_frozen") if names & set(i.nodes)]
    result.incident_ids = [i.id for i in incidents]
    if not incidents:
        result.outcome = "not_detected"
        return
    resolutions = {i.resolution or "open" for i in incidents}
    result.outcome = resolutions.pop() if len(resolutions) == 1 else "mixed"
    result.detected_after_s = min(i.detected_at for i in incidents) - run.injected_at
    ends = [i.resolved_at for i in incidents if i.resolution == "recovered" and i.resolved_at]
    if len(ends) == len(incidents):
        result.recovered_after_s = max(ends) - run.injected_at
    result.history = str(run.colo.placed[actor].history)


def settle(run: ColocatedRun, what: str) -> None:
    """The lab back where the next scenario starts: every controller acting,
    every node healthy (serving restarted where it had to be)."""
    try:
        run.colo.wait_ready()
    except LabTimeout as exc:
        run.result.problems.append(f"after {what}: {exc}")
