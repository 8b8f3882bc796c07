"""The escalation ladder for ``host_frozen``, step by recorded step (docs/design.md).

For each power path of the node, in the configured order, one rung
(controller/act/rung.py):

- **preflight**: re-check the holds, the budgets and the breaker, then take
  a last look (agent, SSH banner and the witness at once); any life ends the
  incident as a false alarm before anything is sent; an open breaker holds
  nothing: the rung waits for it, then starts again from its preflight;
- **cycle**: off, verify, hold, on, verify, each step recorded before it is
  taken; right before the off leaves, a gate checks once more that the host
  showed no life within ``freeze_after`` (else the off is withdrawn);
- **boot wait**: wait for the agent to answer with a *new boot id*. A
  verified cycle is not a recovery; a new boot is.

After the last path the node is held and a person decides. A controller
killed halfway resumes from the record through the same code: the rung's
last step says whether anything was sent, the outlet is read before anything
else, an off whose fate is unknown is never sent again, and a hold or wait
continues for what is left of it (clamped, see clock.remaining).

:class:`FreezeLadder` is one incident's ladder: its node, its incident and
the few parts it works with (:class:`FreezeTools`), so that every step
reads as what it does, not as the parameters it passes on.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from spark_watchdog.controller.act.freeze_tools import FreezeTools, RungOutcome
from spark_watchdog.controller.act.ladder import new_boot
from spark_watchdog.controller.act.rung import Rung
from spark_watchdog.controller.clock import remaining
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import Block
from spark_watchdog.controller.decide.resume_plan import Phase, ResumeInfo, RungPlan
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.errors import WatchdogError
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")

__all__ = ["FreezeLadder", "FreezeTools", "RungOutcome"]


@dataclass
class FreezeLadder:
    """The ladder of one open ``host_frozen`` incident."""

    tools: FreezeTools
    watch: NodeWatch
    incident_id: int

    async def run(self, resume: ResumeInfo | None = None) -> RungOutcome:
        """Run (or resume) the ladder.

        An unexpected error is treated as ambiguous: the node is held with the
        reason written to the history, and the incident is closed. The hold is
        the controller's own and is never released automatically.
        """
        watch = self.watch
        try:
            try:
                return await self._ladder(resume)
            finally:
                self.tools.holds.nothing_sent.discard(watch.name)
        except asyncio.CancelledError:
            raise
        except HistoryUnwritable as exc:
            # Expected, not a bug: nothing unrecorded cuts power, so this is a
            # pause, not a verdict: the node is held in memory only, and the
            # controller resumes the incident from its record once the history
            # can be written again.
            log.warning("%s: history unwritable mid-recovery: %s; holding", watch.name, exc)
            await self.tools.holds.hold(
                watch, f"history unwritable mid-recovery: {exc}", NodeEvent.HOLD, record=False
            )
            return RungOutcome.HELD
        except Exception as exc:
            log.error("%s: recovery failed: %r", watch.name, exc, exc_info=exc)
            await self.fail(f"recovery failed: {exc!r}")
            return RungOutcome.HELD

    async def _ladder(self, resume: ResumeInfo | None) -> RungOutcome:
        watch = self.watch
        paths = self.tools.power.rungs[watch.name]
        plan: RungPlan | None = None
        if resume is not None:
            if resume.phase is Phase.SERVING:
                return await self.finish_recovery()
            if resume.phase is Phase.BOOT_WAIT:
                left = self.boot_wait_left(resume.restored_at)
                outcome = await self.await_new_boot(resume.boot_before, left, resumed=True)
                if outcome is not RungOutcome.NEXT:
                    return outcome
            else:
                plan = resume.plan
        while True:
            if plan is None:
                left_rungs = [i for i in range(len(paths)) if i not in watch.conduct.rungs_done]
                if not left_rungs:
                    await self.give_up("every power path was tried")
                    return RungOutcome.HELD
                if watch.conduct.rungs_done:
                    watch.apply(
                        NodeEvent.RUNG_FAILED
                        if watch.state is NodeState.FENCING
                        else NodeEvent.BOOT_TIMEOUT
                    )
                plan = RungPlan(left_rungs[0])
            outcome = await Rung(self, paths[plan.rung], plan).run()
            if outcome is RungOutcome.BREAKER:
                await self._wait_out_breaker()
                continue
            self.tools.holds.nothing_sent.discard(watch.name)
            if outcome is RungOutcome.AGAIN:
                watch.apply(NodeEvent.BOOT_TIMEOUT)
                plan = plan.again()
                continue
            if outcome is not RungOutcome.NEXT:
                if outcome is not RungOutcome.HELD:
                    watch.conduct.ladder_over()
                return outcome
            watch.conduct.rung_ran(plan.rung)
            plan = None

    async def _wait_out_breaker(self) -> None:
        """The breaker refused a rung: more nodes look frozen at once than their own
        faults explain, and a blip of the controller's own links looks just so (it
        also silences the peers whose word kept a cut-off node ``unreachable``).
        Nothing was sent, so nothing is held: the incident stays open and the rung
        waits, outside the power slot, until the breaker closes, a hold comes (a
        breaker that lasts latches into one) or the node's verdict is no longer
        ``host_frozen``. The rung then starts again from its preflight: life on
        any path ends the incident a false alarm, silence goes on with the rung
        (docs/design.md, "Guards")."""
        watch, tools = self.watch, self.tools
        log.warning("%s: the circuit breaker is open; the rung waits for it", watch.name)
        while True:
            await tools.clock.sleep(tools.config.detection.poll_interval)
            if watch.finding.verdict is not Verdict.HOST_FROZEN:
                return
            blocked = await tools.power.rung_blocked(watch)
            if blocked is None or blocked.block is not Block.BREAKER:
                return

    def boot_wait_left(self, started_at: float | None) -> float:
        """What is left of a boot wait a record says began at ``started_at`` (all
        of it when none did). A controller back after the whole wait still gives
        the agent a few polls: the boot it waited for may well have come while it
        was down."""
        config = self.tools.config
        left = remaining(config.guards.boot_timeout, started_at, self.tools.clock.time())
        detection = config.detection
        return max(left, 3 * detection.poll_interval + detection.agent_timeout)

    async def await_new_boot(
        self, boot_before: str | None, timeout: float, *, resumed: bool = False
    ) -> RungOutcome:
        """Wait (monotonic) up to ``timeout`` for the agent to answer with another boot id."""
        watch, node = self.watch, self.watch.name
        before = boot_before if boot_before is not None else watch.boot_id
        await self.note(
            StepName.BOOT_WAIT_STARTED,
            boot_id_before=before,
            timeout_s=round(timeout, 1),
            resumed=resumed,
            off_side=True,  # power is on: waiting needs no record
        )
        if await new_boot(self.tools, watch, before, timeout):
            await self.note(
                StepName.NEW_BOOT_SEEN, boot_id=watch.boot_id, boot_id_before=before, off_side=True
            )
            watch.apply(NodeEvent.NEW_BOOT)
            await self._record_boots()
            return await self.finish_recovery()
        await incident_log.step(
            self.tools.ledger,
            self.incident_id,
            StepName.BOOT_TIMEOUT,
            node=node,
            detail={"timeout_s": round(timeout, 1)},
        )
        self.tell("boot_timeout", f"{node}: no new boot within {timeout:g}s")
        return RungOutcome.NEXT

    async def finish_recovery(self) -> RungOutcome:
        watch, incident_id, tools = self.watch, self.incident_id, self.tools
        await tools.serving.restart_after(incident_id, f"{watch.name} recovered from host_frozen")
        incident = await incident_log.resolve(
            tools.ledger, incident_id, Resolution.RECOVERED, detail={"boot_id": watch.boot_id}
        )
        watch.conduct.incident_closed()
        ttd, ttr = incident.time_to_detect_s, incident.time_to_recover_s
        self.tell(
            "recovered",
            f"incident #{incident_id} recovered: detected in {ttd:.1f}s, recovered in {ttr:.1f}s"
            if ttd is not None and ttr is not None
            else f"incident #{incident_id} recovered",
        )
        return RungOutcome.RECOVERED

    async def give_up(self, why: str) -> None:
        self.tell("gave_up", f"{self.watch.name}: gave up ({why}); held for a person")
        await self.hold_and_close(f"gave up: {why}", NodeEvent.LADDER_EXHAUSTED)

    async def hold_and_close(self, reason: str, event: NodeEvent) -> None:
        """Hold the node (recorded, the controller's own hold) and close the incident."""
        watch, tools = self.watch, self.tools
        await tools.holds.hold(watch, reason, event, by_controller=True)
        watch.conduct.incident_handed_over()
        try:
            await self.note(StepName.HELD, why=reason)
            await incident_log.resolve(
                tools.ledger, self.incident_id, Resolution.GAVE_UP, detail={"why": reason}
            )
        except HistoryUnwritable as exc:
            log.error("%s: incident #%d left open: %s", watch.name, self.incident_id, exc)

    async def fail(self, reason: str) -> None:
        """An unexpected error inside a recovery: as ambiguous as it gets. Hold, record, alert."""
        watch = self.watch
        self.tell("held", f"{watch.name}: {reason}")
        try:
            await self.hold_and_close(reason, NodeEvent.RECOVERY_FAILED)
        except Exception as exc:  # the record failed too: held in memory, never released
            log.error("%s: could not record the hold: %r", watch.name, exc)
            watch.conduct.held(by_controller=True)
            watch.apply(NodeEvent.RECOVERY_FAILED, reason=reason)

    def tell(self, kind: str, summary: str, detail: dict[str, Any] | None = None) -> None:
        """An alert about this incident's node."""
        self.tools.notifier.send(
            Event(kind, summary, self.watch.name, self.incident_id, detail or {})
        )

    async def note(self, step: str, *, off_side: bool = False, **detail: Any) -> None:
        """Record one step. ``off_side``: the outlet may be off, so a failed record
        must not stop the on that follows (logged and alerted instead)."""
        node = self.watch.name
        try:
            await incident_log.step(
                self.tools.ledger, self.incident_id, step, node=node, detail=detail
            )
        except HistoryUnwritable as exc:
            if not off_side:
                raise
            log.error("%s: %s not recorded (%s); power is restored all the same", node, step, exc)

    async def finish(
        self,
        action: Any,
        result: str,
        error: str | None,
        step: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """The rung's action, if it was recorded, ends with ``result``."""
        if action is None:
            return
        ledger = self.tools.ledger
        await ledger.write(
            ledger.store.finish_action,
            action.id,
            result,
            error=error,
            step=step,
            step_detail=detail,
        )

    async def _record_boots(self) -> None:
        """Store the agent's journal analysis: how did the previous boot end?"""
        watch, tools = self.watch, self.tools
        for boot in await tools.monitor.boots(watch):
            try:
                await tools.ledger.write(
                    tools.ledger.store.record_agent_boot,
                    watch.name,
                    boot,
                    incident_id=self.incident_id if boot.get("current") is False else None,
                )
            except (HistoryUnwritable, WatchdogError) as exc:
                log.warning("%s: boot record skipped: %s", watch.name, exc)
