"""The invariants of a run whose controllers run on the Sparks themselves
(simulation/colocated.py; docs/simulation.md, "Controllers on the Sparks").

Each controller keeps its own history, so the checks of a command (I1, I2,
I6, I7) read the sender's history and what the sender was told; I4 and I8
count each controller's own commands and restarts; I3 and I5 judge each node
by the controller that acts for it at the end. Beside them:

- **I15** a controller never cuts, reboots or halts its own host;
- **I16**, **I17**: simulation/freeze_spells.py.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState
from spark_watchdog.simulation.freeze_spells import Spells
from spark_watchdog.simulation.invariants import (
    OffCounts,
    budget_violations,
    command_violations,
    end_violations,
    halt_violations,
    open_incident_violations,
    reboot_violations,
    serving_restart_violations,
)
from spark_watchdog.simulation.process import Incarnation
from spark_watchdog.simulation.run_checks import RunChecks
from spark_watchdog.simulation.truth import Truth
from spark_watchdog.simulation.world import World


class PlacedChecks(RunChecks):
    """The run's invariants, command by command with the sender's history."""

    def __init__(
        self,
        seed: int,
        world: World,
        stores: Mapping[str, HistoryStore],
        spells: Spells,
        *,
        dry_run: bool,
        errors: list[str],
    ) -> None:
        super().__init__(
            seed,
            world,
            next(iter(stores.values())),
            dry_run=dry_run,
            errors=errors,
            check_sender=None,
        )
        self.stores = stores
        self.spells = spells
        self.host_of: dict[int, str] = {}  # incarnation number -> its host
        self.off_counts_of: dict[str, OffCounts] = {h: {} for h in stores}
        self.events_of: dict[str, list[Event]] = {h: [] for h in stores}

    def sent(
        self, node: str, target: PowerState, number: int, *, landed: bool, failing: bool
    ) -> None:
        """A command about to reach ``node``'s outlet from process ``number``."""
        host, now = self.host_of[number], self.world.now()
        assert self.world.hosts is not None
        where = f"at {now:.1f}s: {target.value} to {node} from {host}'s controller"
        store = self.stores[host]
        for text in command_violations(
            where,
            node,
            target,
            now=now,
            dry_run=self.dry_run,
            truth=self.world.hosts.sighted(host),
            store=store,
            failing=failing,
            off_counts=self.off_counts_of[host],
        ):
            self.violate(text)
        if target is PowerState.OFF:
            self.own_host(host, node, where)
            if landed:
                self.spells.landed_off(node, (host, _incident(store, node)), now)

    def own_host(self, host: str | None, node: str, where: str) -> None:
        """I15: never its own host."""
        if host == node:
            self.violate(f"I15 {where}: its own host")

    def incidents(self) -> None:
        now = self.world.now()
        for host, store in self.stores.items():
            for text in open_incident_violations(store, now):
                self.violate(f"{text} (in {host}'s history)")

    def said(self, incarnation: Incarnation, event: Event) -> None:
        super().said(incarnation, event)
        if incarnation.host is not None:
            self.events_of[incarnation.host].append(event)

    def at_placed_end(
        self,
        config: ControllerConfig,
        acting: Mapping[str, Controller],
        live: Mapping[str, Controller],
        restarts: Mapping[str, list[float]],
    ) -> None:
        """The end-of-run invariants. ``acting``: node -> the controller that
        acts for it now; ``live``: host -> its running controller;
        ``restarts``: host -> every one of its processes' serving restarts for faults."""
        truth, guards, dry_run = self.world.truth, config.guards, self.dry_run
        checks: list[Iterator[str] | list[str]] = [
            _busy_at_end(live),
            reboot_violations(truth.reboots, dry_run, guards),
            halt_violations(truth.halts, dry_run),
            ["I6: serving restarted in dry run"] if dry_run and truth.serving_restarts else [],
            [f"unexpected error: {error}" for error in self.errors],
        ]
        for node, controller in acting.items():
            checks.append(end_violations(self.world, controller, self.events, dry_run, {node}))
        for host, store in self.stores.items():
            mine = Truth(truth.freeze_after, commands=self._commands_of(host))
            checks.append(budget_violations(mine, guards))
            starts = sorted(restarts.get(host, []))
            checks.append(serving_restart_violations(config, starts, store, self.world))
        for check in checks:
            for text in check:
                self.violate(text)
        self.spells.at_end()

    def _commands_of(self, host: str) -> list:  # type: ignore[type-arg]
        return [c for c in self.world.truth.commands if self.host_of.get(c.incarnation) == host]


def _incident(store: HistoryStore, node: str) -> int | None:
    """The sender's open freeze incident for ``node`` (None: none)."""
    return next(
        (
            i.id
            for i in store.open_incidents()
            if node in i.nodes and i.kind == "host_frozen" and not i.dry_run
        ),
        None,
    )


def _busy_at_end(live: Mapping[str, Controller]) -> Iterator[str]:
    """I5 for every live controller: none left a node fencing or booting."""
    for host, controller in live.items():
        for name, watch in controller.watches.items():
            if watch.state in (NodeState.FENCING, NodeState.BOOTING):
                yield f"I5 at the end: {name} still {watch.state.value} ({host}'s controller)"
