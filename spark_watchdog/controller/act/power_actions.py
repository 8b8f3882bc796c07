"""Every power action of the controller, behind its guards (docs/design.md, "Guards").

Each node's rungs, the power paths that can reach a frozen host and their
timings, are worked out once, when the controller starts (its config is
never reloaded while it runs): ``rungs``, read by the ladder, the guards,
the clock-latch ladder and the dry run alike. ``power_for`` builds one
rung's verified power path (power/base.py) whose every step
is written to the history before its command leaves, with the send gate
that reads the holds and the pair's fence right before an off. ``guards``
gathers what ``planner.power_blocked`` judges (holds, breaker, the budget
the action counts against); ``rung_blocked`` asks it again before every
rung with the holds read from the history. ``halt`` and ``forced_reboot``
are the SSH actions of the wedged and clock-latch ladders, fenced too.
The power slot bounds how many commands are in flight at once; the budget
lock is held from a rung's guard check to its record.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any, Protocol

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.planner import Action, Blocked, Guards, power_blocked
from spark_watchdog.controller.io import ControllerIO, RebootAttempt
from spark_watchdog.controller.look.controller_peers import ALONE
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.budgets import Budgets
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.errors import HandedOver, SendRefused, WatchdogError
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.power.base import PowerState, PowerStep, PowerTiming, VerifiedPower
from spark_watchdog.power.paths import PowerPath, power_paths, timing_for
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")

# The only steps whose failed record must stop what follows: they precede a cut.
_BEFORE_A_CUT = frozenset(
    {StepName.TIMED_ON_UNAVAILABLE, StepName.OFF_SPACING, StepName.OFF_REQUESTED}
)
# Steps that say a command did not leave.
_NOTHING_LEFT = frozenset({StepName.OFF_WITHDRAWN, StepName.ON_WITHDRAWN})


@dataclass(frozen=True)
class RungPath:
    """One rung of a node's freeze ladder: a power path that can reach a frozen
    host (SSH cannot), and its timing."""

    path: PowerPath
    timing: PowerTiming


def freeze_rungs(config: ControllerConfig) -> dict[str, tuple[RungPath, ...]]:
    """Each node's rungs, in the order its power paths are configured."""
    return {
        node.name: tuple(
            RungPath(path, timing_for(config, path))
            for path in power_paths(config, node)
            if not path.is_soft
        )
        for node in config.nodes
    }


class Placed(Protocol):
    """Where this controller stands among the controllers on the Sparks
    (controller/look/controller_peers.py; ALONE: there are none)."""

    def not_mine(self, watch: NodeWatch) -> str | None: ...

    async def claimed_elsewhere(self, watch: NodeWatch) -> str | None: ...


class PowerActions:
    def __init__(
        self,
        config: ControllerConfig,
        ledger: Ledger,
        notifier: Notifier,
        io: ControllerIO,
        budgets: Budgets,
        holds: Holds,
        watches: dict[str, NodeWatch],
        placed: Placed = ALONE,
    ) -> None:
        self.config = config
        # Why another controller on the Sparks acts for a node (None: none does),
        # and which one is recovering it, asked afresh (before a resumed on).
        self.not_mine = placed.not_mine
        self.claimed_elsewhere = placed.claimed_elsewhere
        self.ledger = ledger
        self.notifier = notifier
        self.io = io
        self.clock: Clock = io.clock
        self.fence = io.fence
        self.budgets = budgets
        self.holds = holds
        self.watches = watches
        # Each node's rungs, by its name: worked out once, the config never changes.
        self.rungs = freeze_rungs(config)
        # How many power commands may be in flight at once.
        self.slot = asyncio.Semaphore(config.guards.max_concurrent_power_actions)
        # Held from a rung's guard check to its record (see rung.Rung._preflight).
        self.budget_lock = asyncio.Lock()

    def power_for(
        self, rung_path: RungPath, rung: int, watch: NodeWatch, incident_id: int
    ) -> VerifiedPower:
        """Rung ``rung``'s verified power path, its every step written ahead, with the send gate.

        What its cycle raises steers the ladder (controller/act/recovery.py):

        :raises HistoryUnwritable: a step could not be written ahead; its
            command was not sent (``NotLeading``: this controller of a pair
            may not write any more).
        :raises SendRefused: the gate or the lease's send window stopped the
            command right before it left; nothing was sent.
        :raises Withdrawn: the host showed life right before the off; nothing sent.
        :raises FoundOff: the outlet was off before anything was sent.
        :raises Ambiguous: a command may or may not have landed: held for a person.
        """
        path = rung_path.path

        async def write_ahead(step: PowerStep) -> None:
            # Awaited by VerifiedPower *before* each command leaves.
            await self._write_ahead(path, rung, watch.name, incident_id, step)

        def gate(target: PowerState) -> str | None:
            if target is PowerState.OFF:
                # Another controller on the Sparks may have the node now (a
                # controller woken from a stop right here has not listened yet).
                refusal = self.not_mine(watch)
                if refusal is not None:
                    raise HandedOver(path.key_path, f"off withdrawn: {refusal}")
            why = self._may_cut(watch) if target is PowerState.OFF else None
            # Last, after the hold read: nothing leaves past the send deadline.
            refused = self.fence.refusal()
            if refused is not None:
                raise SendRefused(path.key_path, refused)
            return why

        # The lease's send window once more, from inside the backend (power/send_window.py).
        return self.io.power_factory(
            path, rung_path.timing, write_ahead, gate, self.fence.send_refusal
        )

    async def _write_ahead(
        self, path: PowerPath, rung: int, node: str, incident_id: int, step: PowerStep
    ) -> None:
        """One power step into the incident before its command leaves.

        :raises HistoryUnwritable: before a cut, or in a pair: the command is
            not sent. An on of a lone controller goes out all the same.
        """
        detail: dict[str, Any] = {"rung": rung, "device": path.key_path, "detail": step.detail}
        if step.on_after_s is not None:
            detail["on_after_s"] = step.on_after_s  # a resume reads it: a self-timed off
        # A step that lets nothing out is written on a lease too short for a command.
        through = self.fence.recording_only if step.name in _NOTHING_LEFT else None
        try:
            await incident_log.step(
                self.ledger, incident_id, step.name, node=node, detail=detail, through=through
            )
        except HistoryUnwritable as exc:
            if step.name in _BEFORE_A_CUT or self.fence.in_pair:
                # Nothing unrecorded cuts power; in a pair nothing unrecorded
                # leaves at all: a deposed leader's on could cut the new
                # leader's hold short (docs/design.md, "Controller pair").
                raise
            # The outlet may be off: the on goes out all the same.
            log.error("%s: %s not recorded (%s); carrying on to power on", node, step.name, exc)
            self.notifier.send(
                Event(
                    "history_unwritable",
                    f"{node}: {step.name} not recorded ({exc}); the controller restores power",
                    node,
                    incident_id,
                )
            )
            return
        if step.name == StepName.OFF_VERIFIED:
            # Once the off is read back, not when it is asked for: the send
            # gate may still withdraw an off that was recorded ahead.
            self.notifier.send(
                Event(
                    "power_action",
                    f"{node}: power cycle via {path.key_path}: the outlet is off",
                    node,
                    incident_id,
                    {"rung": rung + 1},
                )
            )

    def _may_cut(self, watch: NodeWatch) -> str | None:
        """Right before an off leaves: any reason not to send it (None: send).

        Synchronous on purpose: nothing else of the event loop runs between
        this answer and the command. The holds are read from the history
        itself, so a hold placed a moment ago by the CLI counts.
        """
        now = self.clock.monotonic()
        life = watch.last_life_at
        if life is not None and now - life < self.config.detection.freeze_after:
            return f"the host showed life {now - life:.1f}s ago: off withdrawn"
        try:
            hold = self.ledger.store.active_hold(watch.name) or self.ledger.store.active_hold(
                CLUSTER
            )
        except WatchdogError as exc:
            return f"the history cannot be read ({exc}): off withdrawn"
        if hold is not None:
            return f"held ({hold.reason}): off withdrawn"
        return None

    async def rung_blocked(self, watch: NodeWatch) -> Blocked | None:
        """Before every rung: the guard again, with the holds read from the history
        (a person's hold from the CLI counts before this controller has seen it)."""
        holds = await self.ledger.read(self.ledger.store.active_holds)
        hold = next((h for h in holds if h.node in (watch.name, CLUSTER)), None)
        guards = await self.guards(watch)
        if hold is not None:
            guards = replace(guards, node_held=True, hold_reason=hold.reason)
        return power_blocked(guards, Action.CYCLE)

    async def guards(self, watch: NodeWatch, action: Action = Action.CYCLE) -> Guards:
        """What :func:`power_blocked` and :func:`decide` judge for ``watch``: holds,
        the breaker, the budgets: the one that action counts against, read once."""
        g = self.config.guards
        node_cycles = cluster_cycles = reboots = 0
        if action is Action.FORCED_REBOOT:
            reboots = await self.budgets.reboots_in_window(watch.name)
        else:
            node_cycles, cluster_cycles = await self.budgets.cycles_in_window(watch.name)
        # Nodes in the power phase of a rung; the power slot serialises the
        # commands themselves, this keeps new incidents from queueing blind.
        in_flight = sum(1 for w in self.watches.values() if w.state is NodeState.FENCING)
        return Guards(
            not_mine=self.not_mine(watch),
            node_held=watch.state is NodeState.HELD,
            cluster_held=self.holds.cluster_hold is not None,
            breaker_tripped=self.holds.breaker_open(),
            dry_run=g.dry_run,
            node_cycles_in_window=node_cycles,
            node_budget=g.node_budget,
            cluster_cycles_in_window=cluster_cycles,
            cluster_budget=g.cluster_budget,
            power_actions_in_flight=in_flight,
            max_concurrent_power_actions=g.max_concurrent_power_actions,
            rungs=len(self.rungs[watch.name]),
            # Rungs tried for the node's open incident; none outside one.
            rungs_done=frozenset(
                watch.conduct.rungs_done if watch.conduct.incident_id is not None else ()
            ),
            node_reboots_in_window=reboots,
            budget_window=g.budget_window,
        )

    async def halt(self, device: SshDevice) -> RebootAttempt:
        self.fence.check_leading()
        return await self.io.halt(device)

    async def forced_reboot(self, device: SshDevice) -> RebootAttempt:
        self.fence.check_leading()
        return await self.io.forced_reboot(device)
