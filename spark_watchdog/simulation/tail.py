"""A simulated run's quiet tail (docs/simulation.md, "The tail"): after the
fault window every temporary fault ends, and the run waits, its invariants
checked as before, until its world is at rest, or has been left to a person
for QUIET_S unchanged (simulation/rest.py), or until its cap."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Any

from spark_watchdog.controller.daemon import Controller
from spark_watchdog.simulation.pair import SimPair
from spark_watchdog.simulation.process import Incarnation
from spark_watchdog.simulation.rest import (
    QUIET_S,
    Stillness,
    at_rest,
    ladder_running,
    left_to_a_person,
    still_state,
)
from spark_watchdog.simulation.run_checks import RunChecks
from spark_watchdog.simulation.schedule import Scripted
from spark_watchdog.simulation.world import World


class QuietTail:
    """What the tail needs of the run (simulation/run.py), and the tail itself."""

    world: World
    controller: Controller | None
    incarnation: Incarnation
    incarnations: int
    pair: SimPair | None
    checks: RunChecks
    errors: list[str]
    pending_heals: list[Callable[[], Any]]
    script: list[Scripted] | None
    retired_serving_restarts: list[tuple[float, int]]

    def heal_all(self) -> None:
        raise NotImplementedError

    async def _faults_then_rest(
        self, loop: asyncio.AbstractEventLoop, fault_window: float, end: float
    ) -> tuple[float, str]:
        """Watch the incidents through the fault window, heal everything, then wait
        (until ``end`` at most) for the world to come to rest, or to be left to
        a person for QUIET_S unchanged; the time reached, and how the tail ended."""
        elapsed, settled = 0.0, 0
        healed = False
        stillness = Stillness()
        while elapsed < end:
            await asyncio.sleep(5.0)
            elapsed = loop.time()
            self.checks.incidents()
            if elapsed >= fault_window and not healed:
                self.heal_all()
                healed = True
            elif healed:
                # Done early once everything has come to rest twice in a row.
                settled = settled + 1 if self.settled() else 0
                if settled >= 2:
                    return elapsed, "at rest"
                if stillness.still_for(self.waiting_state(end), elapsed) >= QUIET_S:
                    return elapsed, "left to a person"
        return elapsed, "at the cap"

    def _ladder_running(self) -> bool:
        """The watched controller is cutting, booting or running a ladder for a node."""
        controller = self.controller
        return controller is not None and self.incarnation.alive and ladder_running(controller)

    def steady(self) -> Controller | None:
        """The watched controller, alive and (of a pair) neither paused nor cut."""
        controller = self.controller
        if controller is None or not self.incarnation.alive:
            return None
        if self.pair is not None and not self.pair.steady():
            return None
        return controller

    def settled(self) -> bool:
        """The watched controller (and a pair) steady, its world at rest."""
        controller = self.steady()
        return controller is not None and at_rest(controller, self.world)

    def waiting_state(self, cap: float) -> Hashable | None:
        """What the run has come to while it is left to a person before ``cap``,
        with no fault left to come (simulation/rest.py); None: it is not."""
        controller, world = self.steady(), self.world
        restarts = [at for at, _ in self.serving_fault_restarts()]
        if controller is None or not left_to_a_person(controller, world, restarts, cap):
            return None
        if self.pending_heals or any(at > world.now() for at, _, _ in self.script or ()):
            return None
        said = (len(self.checks.events), len(self.errors))
        return still_state(controller, world, (self.incarnations, said))

    def serving_fault_restarts(self) -> list[tuple[float, int]]:
        """Every controller process's restarts for serving faults (virtual time)."""
        seen = [*self.retired_serving_restarts]
        if self.controller is not None:
            seen.extend(self.controller.serving.budget.fault_restarts)
        return list(dict.fromkeys(seen))
