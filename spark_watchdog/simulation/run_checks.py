"""The invariants as one run checks them (each check is in
simulation/invariants.py): at every power command, at every alert, as the run
goes and at its end. Every violation lands in the world's truth, named by the
run's seed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.record.notify import ABOUT_LEADERSHIP, Event
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState
from spark_watchdog.simulation.invariants import (
    OffCounts,
    budget_violations,
    command_violations,
    end_violations,
    halt_violations,
    open_incident_violations,
    power_alert_violation,
    reboot_violations,
    serving_restart_violations,
)
from spark_watchdog.simulation.process import Incarnation, InjectedBug, Killed
from spark_watchdog.simulation.world import World

# A pair's check that a process may send (simulation/pair.py's check_sender):
# the violation's text, or None.
SenderCheck = Callable[[int, str], str | None]


class RunChecks:
    """The run's invariants, and the alerts and unexpected errors they judge."""

    def __init__(
        self,
        seed: int,
        world: World,
        store: HistoryStore,
        *,
        dry_run: bool,
        errors: list[str],
        check_sender: SenderCheck | None,
    ) -> None:
        self.seed = seed
        self.world = world
        self.store = store  # the run's own view of the history
        self.dry_run = dry_run
        self.errors = errors
        self.check_sender = check_sender
        self.events: list[Event] = []
        self.off_counts: OffCounts = {}

    def violate(self, text: str) -> None:
        self.world.truth.violations.append(f"seed {self.seed}: {text}")

    def command(self, node: str, target: PowerState, number: int, *, failing: bool) -> None:
        """A power command about to reach ``node``'s outlet, sent by process
        ``number``; ``failing``: while the history fails its writes."""
        now = self.world.now()
        where = f"at {now:.1f}s: {target.value} to {node}"
        for text in command_violations(
            where,
            node,
            target,
            now=now,
            dry_run=self.dry_run,
            truth=self.world.truth,
            store=self.store,
            failing=failing,
            off_counts=self.off_counts,
        ):
            self.violate(text)
        if self.check_sender is not None:
            refused = self.check_sender(number, where)
            if refused is not None:
                self.violate(refused)

    def incidents(self) -> None:
        for text in open_incident_violations(self.store, self.world.now()):
            self.violate(text)

    def said(self, incarnation: Incarnation, event: Event) -> None:
        """I13: of a pair, only the leader says anything about nodes. I14: a
        power_action alert only for an off that reached the node's outlet."""
        self.events.append(event)
        if self.check_sender is not None and event.kind not in ABOUT_LEADERSHIP:
            where = f"at {self.world.now():.1f}s: {event.kind} ({event.node or 'cluster'})"
            refused = self.check_sender(incarnation.number, where)
            if refused is not None:
                self.violate(refused.replace("I12", "I13", 1))
        if event.kind == "power_action":
            told = power_alert_violation(event.node, self.events, self.world)
            if told is not None:
                self.violate(told)

    def unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An exception nobody handled (a task's, found when it is dropped) is a bug."""
        exc = context.get("exception")
        if not isinstance(exc, (Killed, InjectedBug)):
            self.errors.append(f"{context.get('message')}: {exc!r}")

    def at_end(
        self, controller: Controller, config: ControllerConfig, serving_restarts: list[float]
    ) -> None:
        """The end-of-run invariants (simulation/invariants.py): I3, I4, I5,
        I6, then I8, I9 and I10; an unexpected error is a violation too.
        ``serving_restarts``: every controller process's for serving faults."""
        truth, guards, dry_run = self.world.truth, config.guards, self.dry_run
        checks = [
            end_violations(self.world, controller, self.events, dry_run),
            budget_violations(truth, guards),
            ["I6: serving restarted in dry run"] if dry_run and truth.serving_restarts else [],
            serving_restart_violations(config, serving_restarts, self.store, self.world),
            reboot_violations(truth.reboots, dry_run, guards),
            halt_violations(truth.halts, dry_run),
            [f"unexpected error: {error}" for error in self.errors],
        ]
        for check in checks:
            for text in check:
                self.violate(text)
