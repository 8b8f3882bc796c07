"""Who acts for each node at the end of a run with controllers on the Sparks,
when such a run is at rest or left to a person (simulation/tail.py's rules,
each node judged by the controller that acts for it), and whether the world
is as a single freeze's promise needs it (simulation/freeze_spells.py)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Protocol

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.colocation import actors
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState
from spark_watchdog.simulation.rest import (
    at_rest,
    in_flight,
    ladder_running,
    left_to_a_person,
    still_state,
)
from spark_watchdog.simulation.run_checks import RunChecks
from spark_watchdog.simulation.schedule import Scripted
from spark_watchdog.simulation.truth import Command
from spark_watchdog.simulation.world import World

# Earlier processes' power actions count against the budgets over a window this
# much wider (docs/design.md, "Guards"); a freeze after as many is not promised.
BUDGET_WIDENING_S = 900.0


class Placed(Protocol):
    """One controller on a Spark (simulation/colocated.py)."""

    store: HistoryStore
    controller: Controller | None
    restart_at: float | None

    def running(self) -> bool: ...

    def serving_restarts(self) -> list[float]: ...


class PlacedView:
    """The controllers of the run as the checks and the tail see them."""

    def __init__(
        self, placed: Mapping[str, Placed], world: World, config: ControllerConfig
    ) -> None:
        self.placed = placed
        self.world = world
        self.config = config
        assert config.colocated is not None
        self.order = config.colocated.order

    def live(self) -> dict[str, Controller]:
        """Host -> its controller, where it runs (alive, not stopped)."""
        return {
            h: p.controller
            for h, p in self.placed.items()
            if p.running() and p.controller is not None
        }

    def acting(self) -> dict[str, Controller]:
        """Node -> the controller that acts for it now: one of its actors that runs
        and holds it (the others leave a node held in any history alone), else
        the first of its actors that runs. A node none can act for is missing."""
        live, found = self.live(), {}
        for name in self.world.nodes:
            running = [h for h in actors(name, self.order) if h in live]
            holding = [h for h in running if live[h].watches[name].state is NodeState.HELD]
            host = next(iter(holding or running), None)
            if host is not None:
                found[name] = live[host]
        return found

    def domains(self) -> list[tuple[str, Controller, set[str]]]:
        """Each running controller, and the nodes it acts for now."""
        acting = self.acting()
        return [(h, c, {n for n, a in acting.items() if a is c}) for h, c in self.live().items()]

    def calm(self, node: str) -> bool:
        """Nothing is wrong now but ``node``'s freeze: no fault of the network,
        the power, the witness or the history, no other node in trouble."""
        world, now = self.world, self.world.now()
        hosts = world.hosts
        if world.witness_down or world.controller_net_down or (hosts and hosts.disturbed()):
            return False
        for name, other in world.nodes.items():
            if other.loss or now < other.dns_broken_until or now < other.partitioned_until:
                return False
            # A wedged GPU's forced reboot may hang the host: its ladder waits boot_timeout.
            if other.clock_latched or other.gpu_wedged or (name != node and other.agent != "ok"):
                return False
        return not any(
            now < o.down_until
            or now < o.refusing_until
            or o.ambiguous_p
            or o.lag
            or o.slow
            or o.bug
            for outlets in world.outlets.values()
            for o in outlets
        )

    def fit(self, node: str, commands: Sequence[Command], host_of: Mapping[int, str]) -> bool:
        """At a freeze of ``node``: no history holds it or the cluster, and every
        controller that may act for it has budget left."""
        guards, now = self.config.guards, self.world.now()
        since = now - guards.budget_window - BUDGET_WIDENING_S
        offs = [c for c in commands if c.target is PowerState.OFF and c.at >= since]
        for host in actors(node, self.order):
            store = self.placed[host].store
            if store.active_hold(node) or store.active_hold(CLUSTER):
                return False
            mine = [c for c in offs if host_of.get(c.incarnation) == host]
            if len(mine) >= guards.cluster_budget:
                return False
            if sum(1 for c in mine if c.node == node) >= guards.node_budget:
                return False
        return True


class PlacedTail:
    """The quiet tail's questions (simulation/tail.py), for controllers on the Sparks."""

    view: PlacedView
    placed: Mapping[str, Placed]
    world: World
    pending_heals: list[Callable[[], Any]]
    script: list[Scripted] | None
    checks: RunChecks
    errors: list[str]
    incarnations: int

    def _ladder_running(self) -> bool:
        return any(ladder_running(c) for c in self.view.live().values())

    def _all_running(self) -> bool:
        """Every controller whose host is up runs, none about to be started."""
        return all(
            p.running() or self.world.nodes[h].phase != "up" for h, p in self.placed.items()
        ) and all(p.restart_at is None for p in self.placed.values())

    def settled(self) -> bool:
        """Every controller runs where it can, and each node is at rest for the
        controller that acts for it."""
        view = self.view
        if not self._all_running() or len(view.acting()) < len(self.world.nodes):
            return False
        return all(at_rest(c, self.world, nodes) for _, c, nodes in view.domains())

    def waiting_state(self, cap: float) -> Hashable | None:
        """What the run has come to while it is left to a person (simulation/tail.py):
        each node by the controller that acts for it; a node none can act for waits."""
        world, view = self.world, self.view
        if self.pending_heals or any(at > world.now() for at, _, _ in self.script or ()):
            return None
        if not self._all_running():
            return None
        for host, controller, nodes in view.domains():
            restarts = self.placed[host].serving_restarts()
            if in_flight(controller) or not left_to_a_person(
                controller, world, restarts, cap, nodes
            ):
                return None
        said = (len(self.checks.events), len(self.errors))
        states = tuple(still_state(c, world, h) for h, c in view.live().items())
        return (states, self.incarnations, said)
