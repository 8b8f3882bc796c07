"""Whether a simulated run's controller is still at work, or its world has
come to rest: when the run's quiet tail may end (simulation/run.py)."""

from __future__ import annotations

from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.simulation.world import World


def ladder_running(controller: Controller) -> bool:
    """The controller is cutting, booting or running a ladder for a node."""
    busy = (NodeState.FENCING, NodeState.BOOTING)
    return any(w.state in busy for w in controller.watches.values()) or any(
        not t.done() for t in controller.work.tasks()
    )


def at_rest(controller: Controller, world: World) -> bool:
    """Every node the controller does not hold is up, healthy and watched,
    with no incident open."""
    for name, watch in controller.watches.items():
        if watch.state is NodeState.HELD:
            continue
        if watch.state is not NodeState.WATCHING or watch.conduct.incident_id is not None:
            return False
        if world.nodes[name].phase != "up" or watch.finding.verdict.value != "healthy":
            return False
    return True
