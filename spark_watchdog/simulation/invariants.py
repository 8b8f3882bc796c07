"""The simulation's invariants (docs/simulation.md, "Invariants"): what the
run (simulation/run.py) checks at every power command, as it goes and at the
end. Each check yields the text of each violation it finds, in order; the
run records them."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence

from spark_watchdog.config.controller import ControllerConfig, GuardsConfig
from spark_watchdog.controller.act.parts import Ladder
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState
from spark_watchdog.simulation.report import attempt_of
from spark_watchdog.simulation.truth import Truth
from spark_watchdog.simulation.world import World

ALERT_KINDS = frozenset({"held", "gave_up", "circuit_breaker", "outlet_off", "ambiguous_power"})

# A gentler ladder's state, and the task that must be running while a node has it.
_GENTLE = {NodeState.UNWEDGING: Ladder.UNWEDGING, NodeState.UNLATCHING: Ladder.UNLATCHING}

# (incident, rung, try) -> the offs sent for it.
OffCounts = dict[tuple[int, int, int], int]


def command_violations(
    where: str,
    node: str,
    target: PowerState,
    *,
    now: float,
    dry_run: bool,
    truth: Truth,
    store: HistoryStore,
    failing: bool,
    off_counts: OffCounts,
) -> Iterator[str]:
    """I1, I6, I7 and I2 for a command to ``node`` going out now (``failing``:
    the history refuses writes); counts the offs of each rung's try."""
    if dry_run:
        yield f"I6 {where} in dry run"
    if target is PowerState.OFF:
        life = truth.alive_at(node, now)
        if life is not None:
            yield f"I1 {where}, which answered {now - life:.1f}s before"
        if store.active_hold(node) or store.active_hold(CLUSTER):
            yield f"I6 {where} while held"
    incident = next(
        (
            i
            for i in store.open_incidents()
            if node in i.nodes and i.kind == "host_frozen" and not i.dry_run
        ),
        None,
    )
    if incident is None:
        if not failing:
            yield f"I7 {where} with no open incident"
        return
    mine = [s for s in store.steps(incident.id) if s.node == node]
    last = mine[-1] if mine else None
    wanted = f"{target.value}_requested"
    excused = failing and target is PowerState.ON  # an on goes out unrecorded
    if (last is None or last.step != wanted) and not excused:
        yield f"I7 {where}: last step {last and last.step}, not {wanted}"
    if target is PowerState.OFF and last is not None and isinstance(last.detail, dict):
        key = (incident.id, int(last.detail.get("rung", -1)), attempt_of(mine))
        off_counts[key] = off_counts.get(key, 0) + 1
        if key[2] > 2:
            yield f"I2 {where}: try {key[2]} of incident #{key[0]} rung {key[1]}"
        if off_counts[key] > 1:
            yield f"I2 {where}: a second off in incident #{key[0]} rung {key[1]} (try {key[2]})"


def open_incident_violations(store: HistoryStore, now: float) -> Iterator[str]:
    """I2: at most one open host_frozen incident per node."""
    counts: dict[str, int] = {}
    for incident in store.open_incidents():
        if incident.kind == "host_frozen" and not incident.dry_run:
            for node in incident.nodes:
                counts[node] = counts.get(node, 0) + 1
    for node, count in counts.items():
        if count > 1:
            yield f"I2 at {now:.1f}s: {node} has {count} open incidents"


def end_violations(
    world: World,
    controller: Controller,
    events: list[Event],
    dry_run: bool,
    nodes: Collection[str] | None = None,
) -> Iterator[str]:
    """I5 and I3 at the end, node by node: no ladder half done, no node left
    stuck unheld, no outlet of ours left off or node held without an alert
    (``nodes``: of those only, the ones ``controller`` acts for)."""
    truth = world.truth
    alerted = {e.node for e in events if e.kind in ALERT_KINDS}
    cluster_alert = any(e.kind in ALERT_KINDS and e.node is None for e in events)
    for name, node in world.nodes.items():
        if nodes is not None and name not in nodes:
            continue
        watch = controller.watches[name]
        mine = [c for c in truth.commands if c.node == name]
        person = [p for p in truth.person_switches if p[1] == name]
        if watch.state in (NodeState.FENCING, NodeState.BOOTING):
            yield f"I5 at the end: {name} still {watch.state.value}"
        ladder = _GENTLE.get(watch.state)
        if ladder is not None and not controller.work.running_for(ladder, name):
            yield f"I5 at the end: {name} {watch.state.value} with no ladder running"
        left_off = world.outlets[name][0].state is not PowerState.ON
        last_ours = mine[-1] if mine else None
        ours_last = last_ours is not None and (not person or person[-1][0] < last_ours.at)
        if left_off and ours_last and not (name in alerted or cluster_alert):
            yield f"I3 at the end: {name}'s outlet left off with no alert naming it"
        stuck = node.phase in ("frozen", "off", "halted")
        if stuck and not dry_run and watch.state is not NodeState.HELD:
            yield f"I5 at the end: {name} is {node.phase} and not held"
        if stuck and watch.state is NodeState.HELD and not (name in alerted or cluster_alert):
            yield f"I5 at the end: {name} held without an alert"


def budget_violations(truth: Truth, guards: GuardsConfig) -> Iterator[str]:
    """I4: no more offs within the budget window than the cluster's and each
    node's budget (the first excess only)."""
    window = guards.budget_window
    offs = [c for c in truth.commands if c.target is PowerState.OFF]
    for i, first in enumerate(offs):
        inside = [c for c in offs[i:] if c.at - first.at < window]
        if len(inside) > guards.cluster_budget:
            yield f"I4: {len(inside)} offs within {window:g}s (cluster budget)"
            return
        same = [c for c in inside if c.node == first.node]
        if len(same) > guards.node_budget:
            yield f"I4: {len(same)} offs to {first.node} within {window:g}s"
            return


def serving_restart_violations(
    config: ControllerConfig, starts: list[float], store: HistoryStore, world: World
) -> Iterator[str]:
    """I8: no restart loop. Automatic serving restarts (``starts``, sorted)
    stay within their budget in every window, and no memory guard kill is
    answered twice."""
    serving = config.serving
    for i, first in enumerate(starts):
        inside = [t for t in starts[i:] if t - first < serving.restart_budget_window]
        if len(inside) > serving.restart_budget:
            yield (
                f"I8: {len(inside)} serving restarts within "
                f"{serving.restart_budget_window:g}s (budget {serving.restart_budget})"
            )
            break
    incidents = store.list_incidents(kind="memory_exhausted", limit=10_000)
    for name, node in world.nodes.items():
        answered = [i for i in incidents if name in i.nodes]
        if len(answered) > len(node.guard_kills):
            yield (
                f"I8: {len(answered)} memory_exhausted incidents for {name}, "
                f"{len(node.guard_kills)} kills by its memory guard"
            )


def halt_violations(halts: list[tuple[float, str, bool, int]], dry_run: bool) -> Iterator[str]:
    """I10: a halt over SSH goes only to a node whose GPU is clock-latched,
    never in dry run, at most once per boot, and never more often than the
    node latched and booted again. A node left halted at the end is I5's:
    held, with an alert."""
    seen: set[tuple[str, int]] = set()
    for at, name, latched, boot in halts:
        if not latched:
            yield f"I10 at {at:.1f}s: halt of {name}, whose GPU is not latched"
        if dry_run:
            yield f"I10 at {at:.1f}s: halt of {name} in dry run"
        if (name, boot) in seen:
            yield f"I10 at {at:.1f}s: a second halt of {name} on boot {boot}"
        seen.add((name, boot))


def reboot_violations(
    reboots: list[tuple[float, str, bool]], dry_run: bool, guards: GuardsConfig
) -> Iterator[str]:
    """I9: a forced reboot goes only to a node whose GPU is wedged, never in dry
    run, and never beyond the node budget in any window."""
    for at, node, wedged in reboots:
        if not wedged:
            yield f"I9 at {at:.1f}s: forced reboot of {node}, whose GPU answers"
        if dry_run:
            yield f"I9 at {at:.1f}s: forced reboot of {node} in dry run"
        same = [t for t, n, _ in reboots if n == node and at <= t < at + guards.budget_window]
        if len(same) > guards.node_budget:
            yield f"I9: {len(same)} forced reboots of {node} within the budget window"
            break


def power_alert_violation(node: str | None, events: Sequence[Event], world: World) -> str | None:
    """I14: a power_action alert tells of an off that reached the node's
    outlet: never more of them for ``node`` than offs sent to it."""
    offs = sum(1 for c in world.truth.commands if c.node == node and c.target is PowerState.OFF)
    told = sum(1 for e in events if e.kind == "power_action" and e.node == node)
    if told <= offs:
        return None
    return (
        f"I14 at {world.now():.1f}s: power_action alert {told} for {node}, after {offs} off(s) sent"
    )
