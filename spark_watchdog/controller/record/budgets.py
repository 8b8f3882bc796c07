"""What counts against the power and reboot budgets (docs/design.md, "Guards").

A rung this process recorded counts by the monotonic clock, exactly, under
any step of the wall clock; those of earlier processes come from the
history by wall time, over a window widened by ``CLOCK_STEP_MARGIN_S`` (a
clock stepped by less than that between the record and now cannot hide
one). Over-counting makes the controller hold sooner, never cut more.
"""

from __future__ import annotations

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.record.ledger import Ledger

# Budgets count cycles by the wall clock (they are recorded); the window is
# widened by this much so a clock stepped forward cannot forget a cycle.
CLOCK_STEP_MARGIN_S = 900.0


class Budgets:
    """The node's and the cluster's power cycles, and forced reboots, in the window."""

    def __init__(self, config: ControllerConfig, ledger: Ledger, clock: Clock) -> None:
        self.config = config
        self.ledger = ledger
        self.clock = clock
        # Rungs this process recorded: (node, monotonic time, action id).
        self._cycles: list[tuple[str, float, int]] = []

    def note_cycle(self, node: str, action_id: int) -> None:
        """A rung was recorded: it counts against the budgets from now (monotonic)."""
        self._cycles.append((node, self.clock.monotonic(), action_id))

    async def cycles_in_window(self, node: str) -> tuple[int, int]:
        """Cycles of the node and of the cluster within ``guards.budget_window``."""
        window = self.config.guards.budget_window
        since = self.clock.time() - window - CLOCK_STEP_MARGIN_S
        ours = {action_id for _, _, action_id in self._cycles}
        earlier = [
            cut_node
            for action_id, cut_node, _ in await self.ledger.read(
                self.ledger.store.power_cuts_since, since
            )
            if action_id not in ours
        ]
        now = self.clock.monotonic()
        mine = [n for n, at, _ in self._cycles if now - at < window]
        return earlier.count(node) + mine.count(node), len(earlier) + len(mine)

    async def reboots_in_window(self, node: str) -> int:
        """Forced reboots of the node within ``guards.budget_window``, from the
        history (widened by ``CLOCK_STEP_MARGIN_S``, as the power budgets)."""
        since = self.clock.time() - self.config.guards.budget_window - CLOCK_STEP_MARGIN_S
        actions = await self.ledger.read(self.ledger.store.actions, node=node, limit=None)
        return sum(
            1
            for a in actions
            if a.operation == "ssh_reboot" and not a.dry_run and a.requested_at >= since
        )
