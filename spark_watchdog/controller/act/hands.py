"""What carries out each decision of controller/decide/decisions.py: one step, one
part (docs/architecture.md, "Deciding and carrying out"). Nothing here asks
whether the step may happen; that was decided."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

from spark_watchdog.controller.act.agent_restart import AgentRestarts
from spark_watchdog.controller.act.freeze_path import FreezePath
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.ladder_tasks import UnlatchLadders, WedgedLadders
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Decision, Step
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.serving.serving_budget import answer_kill
from spark_watchdog.controller.serving.serving_policy import ServingRestarts

log = logging.getLogger("spark_watchdog.controller")


@dataclass(frozen=True)
class Hands:
    freeze: FreezePath
    holds: Holds
    agent_restarts: AgentRestarts
    serving: ServingRestarts
    wedged: WedgedLadders
    unlatch: UnlatchLadders
    notifier: Notifier

    @classmethod
    def of(
        cls,
        tools: GentleTools,
        freeze: FreezePath,
        agent_restarts: AgentRestarts,
        wedged: WedgedLadders,
        unlatch: UnlatchLadders,
    ) -> Hands:
        """The hands of one controller: its ladders' and restarts' parts, and
        from the gentler ladders' tools the holds, the serving restarts and
        the notifier."""
        return cls(
            freeze, tools.holds, agent_restarts, tools.serving, wedged, unlatch, tools.notifier
        )

    async def carry_out_cluster(self, decision: Decision) -> None:
        """Carry out one step for the cluster as a whole."""
        if decision.step is Step.ALERT_WATCHER_DOUBT:
            log.warning("%s", decision.reason)
            self.notifier.send(Event("watcher_in_doubt", decision.reason))
        elif decision.step is Step.LATCH_BREAKER:
            await self.holds.latch_breaker(decision.reason)

    async def carry_out(self, watch: NodeWatch, decision: Decision) -> None:
        """Carry out one step for the node.

        :raises HistoryUnwritable: a step that needed a record did not happen.
        """
        step = decision.step
        if step is Step.FENCE:
            await self.freeze.start(watch)
        elif step is Step.RECORD_DRY_RUN:
            await self.freeze.record_dry_run(watch, decision.reason)
        elif step is Step.HOLD:
            assert decision.event is not None
            await self.holds.hold(watch, decision.reason, decision.event, by_controller=True)
        elif step is Step.HOLD_UNRECORDED:
            await self.holds.hold(watch, decision.reason, NodeEvent.HOLD, record=False)
        elif step is Step.RESUME_INCIDENT:
            # Ours, open, and nothing runs it (paused while the history could
            # not be written): resumed from its record, as after a restart.
            incident = watch.conduct.incident_id
            assert incident is not None
            with contextlib.suppress(HistoryUnwritable):
                await self.freeze.resume_incident(watch, incident)
        elif step is Step.FORGET_DRY_RUN:
            watch.conduct.dry_run_recorded(None)  # the next freeze is a new dry-run incident
        else:
            await self._gentler(watch, decision)

    async def _gentler(self, watch: NodeWatch, decision: Decision) -> None:
        """The steps that never cut power: agents, serving, the gentler ladders."""
        step = decision.step
        if step is Step.RESTART_AGENT:
            self.agent_restarts.restart(watch)
        elif step is Step.RESTART_SERVING:
            self.serving.budget.promise()
            self.serving.start(watch)
        elif step is Step.SERVING_BUDGET_SPENT:
            self.serving.budget.refuse(watch, decision.reason)
        elif step is Step.TELL_NO_AUTO_RESTART:
            self.serving.tell_no_auto_restart(watch)
        elif step is Step.ANSWER_KILL:
            answer_kill(watch)
        elif step is Step.ALERT_GUARD_FAILED:
            self.serving.tell_guard_failed(watch)
        elif step is Step.FORGET_OLD_KILL:
            watch.answer_guard_kill()
        elif step is Step.UNWEDGE:
            if decision.with_serving:
                self.serving.budget.promise()
            await self.wedged.start(watch, with_serving=decision.with_serving)
        elif step is Step.HAND_TO_POWER:
            await self.wedged.hand_over(watch)
        elif step is Step.ALERT_CLOCK_LATCH:
            self.unlatch.alert(watch)
        elif step is Step.UNLATCH:
            await self.unlatch.start(watch)
