"""Whether a simulated run's controller is still at work, or its world has
come to rest, or nothing is left in it but a person's decision: when the
run's quiet tail may end (simulation/tail.py; docs/simulation.md, "The tail")."""

from __future__ import annotations

from collections.abc import Collection, Hashable

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.simulation.world import World

# How long a run left to a person must stay as it is before its tail ends:
# the invariants watch the controller do nothing for that long.
QUIET_S = 600.0
# A head's serving down, which the controller restarts unless a person must decide.
SERVING_DOWN = frozenset({Verdict.SERVING_DEAD, Verdict.SERVING_STALLED})


def ladder_running(controller: Controller) -> bool:
    """The controller is cutting, booting or running a ladder for a node."""
    busy = (NodeState.FENCING, NodeState.BOOTING)
    return any(w.state in busy for w in controller.watches.values()) or any(
        not t.done() for t in controller.work.tasks()
    )


def at_rest(controller: Controller, world: World, nodes: Collection[str] | None = None) -> bool:
    """Every node the controller does not hold is up, healthy and watched,
    with no incident open (``nodes``: of those only, the ones it acts for)."""
    for name, watch in controller.watches.items():
        if watch.state is NodeState.HELD or (nodes is not None and name not in nodes):
            continue
        if watch.state is not NodeState.WATCHING or watch.conduct.incident_id is not None:
            return False
        if world.nodes[name].phase != "up" or watch.finding.verdict.value != "healthy":
            return False
    return True


def in_flight(controller: Controller) -> bool:
    """A ladder, an agent restart or a serving restart of the controller runs."""
    tasks = [*controller.agent_restarts.tasks.values(), controller.serving.task]
    return ladder_running(controller) or any(t is not None and not t.done() for t in tasks)


def budget_spent_until(config: ControllerConfig, restarts: list[float], cap: float) -> bool:
    """The serving restart budget is spent now and still at ``cap``: as many
    serving restarts for faults (of every controller process, by the run's
    clock) as the budget allows fall within the window that ends at ``cap``.
    The controller counts at least these (docs/design.md, "Serving restart")."""
    window = config.serving.restart_budget_window
    return sum(1 for at in restarts if at > cap - window) >= config.serving.restart_budget


def left_to_a_person(
    controller: Controller,
    world: World,
    serving_restarts: list[float],
    cap: float,
    nodes: Collection[str] | None = None,
) -> bool:
    """Nothing is in flight, and every node not at rest stays so until a person
    acts or until past ``cap``: the controller holds it; or runs dry (it acts
    on nothing); or its serving is down and every rank restarts together,
    while another node is held and not healthy or the restart budget is spent
    until after ``cap``. ``nodes``: of those only, the ones it acts for."""
    if in_flight(controller):
        return False
    config, watches = controller.config, controller.watches.values()
    dry_run = config.guards.dry_run
    held_down = any(
        w.state is NodeState.HELD and w.finding.verdict is not Verdict.HEALTHY for w in watches
    )
    waits = held_down or budget_spent_until(config, serving_restarts, cap)
    for watch in watches:
        if watch.state is NodeState.HELD or (nodes is not None and watch.name not in nodes):
            continue
        if watch.state is not NodeState.WATCHING or watch.conduct.incident_id is not None:
            return False
        if dry_run:
            continue
        verdict = watch.finding.verdict
        if world.nodes[watch.name].phase != "up":
            return False
        if verdict is not Verdict.HEALTHY and not (verdict in SERVING_DOWN and waits):
            return False
    return True


def still_state(controller: Controller, world: World, run: Hashable) -> Hashable:
    """What must stay as it is while a run is left to a person: each node's
    watch and phase, each outlet, how many commands, self-timed ons, serving
    restarts, forced reboots, halts, switches by a person and violations there
    were, and ``run``'s own (the processes started, the alerts said, ...)."""
    watches = tuple(
        (n, w.state, w.conduct.incident_id, w.finding.verdict, world.nodes[n].phase)
        for n, w in controller.watches.items()
    )
    outlets = tuple(o.state for outlets in world.outlets.values() for o in outlets)
    truth = world.truth
    done = (len(truth.commands), len(truth.timed_ons), len(truth.serving_restarts))
    asked = (len(truth.reboots), len(truth.halts), len(truth.person_switches))
    return (watches, outlets, done, asked, len(truth.violations), run)


class Stillness:
    """How long a run has stayed in one state (None: a state that does not count)."""

    def __init__(self) -> None:
        self._state: Hashable | None = None
        self._since = 0.0

    def still_for(self, state: Hashable | None, now: float) -> float:
        if state is None or state != self._state:
            self._state, self._since = state, now
        return now - self._since
