"""What counts against ``serving.restart_budget``: the automatic serving
restarts for serving faults within ``restart_budget_window``, the ones
decided and not recorded yet included, and the refusal once it is spent
(docs/design.md, "Serving restart"). controller/decide/decisions.py decides from
the count."""

from __future__ import annotations

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.budgets import CLOCK_STEP_MARGIN_S
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.verdicts import SERVING_FAULT_KINDS

# How long a decided serving restart counts before its record must show it.
PROMISE_S = 30.0


def answer_kill(watch: NodeWatch) -> None:
    """The kill the node's verdict answers is taken care of."""
    kills = watch.kills_of(watch.finding.verdict)
    if kills is not None:
        kills.answer()


class ServingBudget:
    def __init__(
        self, config: ControllerConfig, clock: Clock, ledger: Ledger, notifier: Notifier
    ) -> None:
        self.config = config
        self.clock = clock
        self.ledger = ledger
        self.notifier = notifier
        # (monotonic time, record id) of the serving restarts this process made
        # for a serving fault: the restart budget counts them exactly.
        self.fault_restarts: list[tuple[float, int]] = []
        # After a serving restart refused by the budget: no new try (nor alert) before this.
        self._blocked_until = float("-inf")
        # Serving restarts decided and not recorded yet (monotonic time of each):
        # a ladder's restart comes a moment after its decision, and another node
        # decided meanwhile must count it. Each is taken by the next restart
        # recorded, or lapses after PROMISE_S (a ladder that restarted nothing).
        self._promised: list[float] = []

    def promise(self) -> None:
        """A serving restart for a fault was decided (a serving restart, or a
        wedged ladder's first rung): it counts against the budget from now.
        In dry run nothing is restarted, so nothing is promised."""
        if not self.config.guards.dry_run:
            self._promised.append(self.clock.monotonic())

    def recorded(self, restart_id: int) -> None:
        """A serving restart for a fault is in the history: it counts exactly."""
        self.fault_restarts.append((self.clock.monotonic(), restart_id))
        self._promised = self._promised[1:]

    async def count_in_window(self) -> int | None:
        """Automatic serving restarts for serving faults in the window; None:
        the history cannot be read now (nothing restarts; the next tick asks again).
        This process's by the monotonic clock, earlier ones from the history over
        a window widened by CLOCK_STEP_MARGIN_S (as the power budgets count)."""
        window = self.config.serving.restart_budget_window
        now = self.clock.monotonic()
        mine = [at for at, _ in self.fault_restarts if now - at < window]
        ours = {restart_id for _, restart_id in self.fault_restarts}
        since = self.clock.time() - window - CLOCK_STEP_MARGIN_S
        try:
            recorded = await self.ledger.read(
                self.ledger.store.serving_restarts_for, SERVING_FAULT_KINDS, since
            )
        except HistoryUnwritable:
            return None
        self._promised = [at for at in self._promised if now - at < PROMISE_S]
        others = sum(1 for restart_id in recorded if restart_id not in ours)
        return len(mine) + others + len(self._promised)

    def refuse(self, watch: NodeWatch, why: str) -> None:
        """The budget is spent (``why``): alert once, answer the node's kill, try
        no restart (nor alert) for a quarter of the window; a person decides."""
        self._blocked_until = self.clock.monotonic() + self.config.serving.restart_budget_window / 4
        answer_kill(watch)  # seen, alerted: no restart for it
        self.notifier.send(
            Event(
                "serving_budget_spent",
                f"{watch.name} {watch.finding.summary}: {why}; not restarting: a person decides",
                watch.name,
            )
        )

    def blocked(self, now: float) -> bool:
        """Refused by the budget a short while ago: no new try before then."""
        return now < self._blocked_until
