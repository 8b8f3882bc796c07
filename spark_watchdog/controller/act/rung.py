"""One rung of the freeze ladder: one power path's preflight, verified cycle
and boot wait, fresh or resumed from the record (controller/act/recovery.py has
the ladder; docs/design.md, "The escalation ladder"; "Restart and resume").

A :class:`Rung` holds what its steps share: the ladder it belongs to (the
node, the incident and the parts it works with), the power path, the plan
(which rung, which try, what a resume read back) and, once recorded, its
action. It reports how it ended as a :class:`RungOutcome`; the ladder
decides what follows.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from spark_watchdog.controller.act.freeze_tools import LadderSteps, RungOutcome
from spark_watchdog.controller.act.left_cycle import LeftCycle, Unsettled
from spark_watchdog.controller.act.power_actions import RungPath
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Block
from spark_watchdog.controller.decide.resume_plan import RungPlan
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.errors import (
    Ambiguous,
    FoundOff,
    HandedOver,
    PowerError,
    SendRefused,
    Withdrawn,
)
from spark_watchdog.power.base import HOLD_TOLERANCE_S, PowerState, VerifiedPower, close_quietly
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")


@dataclass(frozen=True)
class _ActionRef:
    id: int


# A pair's gate refusing this many commands in a row for one node: the
# history's link is too slow for leadership.send_deadline, and every retry
# would be refused the same way. The node is held for a person.
SEND_REFUSALS_BEFORE_HOLD = 3


class Rung:
    """One power path's turn in an incident."""

    def __init__(self, ladder: LadderSteps, path: RungPath, plan: RungPlan) -> None:
        self.ladder = ladder
        self.tools = ladder.tools
        self.watch = ladder.watch
        self.path = path
        self.plan = plan
        # The rung's recorded action (None: not recorded yet, or a resume without one).
        self.action: Any = None if plan.action_id is None else _ActionRef(plan.action_id)

    @property
    def off_seconds(self) -> float:
        """The rung's off hold: power_off_seconds, or a clock latch's long cut."""
        plan = self.plan
        policy = self.tools.config.policy
        return policy.power_off_seconds if plan.off_seconds is None else plan.off_seconds

    async def run(self) -> RungOutcome:
        watch, plan, tools, ladder = self.watch, self.plan, self.tools, self.ladder
        node = watch.name
        watch.apply(NodeEvent.RUNG_STARTED, rung=plan.rung)
        power = tools.power.power_for(self.path, plan.rung, watch, ladder.incident_id)
        if plan.boot_before is None:
            plan.boot_before = watch.boot_id
        async with tools.power.slot:
            try:
                held_s = await self._cycle(power)
            except (HistoryUnwritable, SendRefused) as exc:
                return await self._not_sent(exc)
            except Withdrawn as exc:
                return await self._false_alarm(exc.message)
            except HandedOver as exc:
                return await self._handed_over(exc.message)
            except FoundOff as exc:  # switched off between the preflight's read and the cycle's
                return await self._found_off(power, exc)
            except Ambiguous as exc:
                await ladder.finish(self.action, "ambiguous", str(exc))
                ladder.tell("ambiguous_power", f"{node}: {exc}")
                await ladder.hold_and_close(
                    f"power outcome unknown: {exc.message}", NodeEvent.AMBIGUOUS
                )
                return RungOutcome.HELD
            except PowerError as exc:
                await ladder.finish(self.action, "failed", str(exc))
                await ladder.note(StepName.RUNG_FAILED, rung=plan.rung, error=str(exc))
                ladder.tell("power_action_failed", f"{node}: {exc}")
                return RungOutcome.NEXT
            finally:
                # Every way out of the rung releases the device's sockets.
                await close_quietly(power.backend)
        if isinstance(held_s, RungOutcome):
            return held_s  # stopped by its preflight: nothing was sent
        watch.conduct.command_went_out()
        if isinstance(held_s, Unsettled):
            return await self._unsettled(held_s)
        return await self._restored(power, held_s)

    async def _cycle(self, power: VerifiedPower) -> float | Unsettled | RungOutcome:
        """The preflight and the verified cycle (fresh), or what a stopped
        controller left of the cycle (resumed): the hold it got, how the boot
        wait is to settle an off of unknown fate, or why it stopped first."""
        plan, tools = self.plan, self.tools
        if not plan.fresh:
            return await LeftCycle(self.ladder, plan, power, self.off_seconds).finish()
        async with tools.power.budget_lock:
            stop = await self._preflight(power)
            if stop is not None:
                return stop
            if self.action is None:
                self.action = await self._record(power)
        cycled = await power.cycle(self.off_seconds, timed=tools.config.policy.self_timed_on)
        return Unsettled.THEN_NEXT if cycled.off_held_s is None else cycled.off_held_s

    async def _record(self, power: VerifiedPower) -> Any:
        """The rung's action and its ``rung_started`` step: from here on it counts
        against the budgets (recorded under the budget lock, before any command)."""
        plan, tools, watch = self.plan, self.tools, self.watch
        if plan.off_seconds is None:  # a second try keeps the first's
            plan.off_seconds = watch.off_seconds_override
        detail: dict[str, Any] = {"rung": plan.rung, "boot_id_before": plan.boot_before}
        if plan.off_seconds is not None:
            detail["off_seconds"] = plan.off_seconds  # for a resume
        if plan.attempt > 1:
            detail["attempt"] = plan.attempt  # a resume tries it no third time
        action = await tools.ledger.write(
            tools.ledger.store.record_action,
            watch.name,
            "cycle",
            device=power.name,
            incident_id=self.ladder.incident_id,
            rung=plan.rung,
            step=StepName.RUNG_STARTED,
            step_detail=detail,
        )
        tools.power.budgets.note_cycle(watch.name, action.id)
        return action

    async def _not_sent(self, exc: HistoryUnwritable | SendRefused) -> RungOutcome:
        """A record before the off failed (in a pair: any record), or a pair's gate
        refused a command (recorded as withdrawn where it could be): nothing
        unrecorded was sent. Held in memory; resumed from the record once the
        history can be written, by this controller or by the one that leads."""
        watch, holds = self.watch, self.tools.holds
        refused_often = (
            isinstance(exc, SendRefused)
            and watch.conduct.command_refused() >= SEND_REFUSALS_BEFORE_HOLD
        )
        if refused_often:
            # Every retry would be refused the same way: a person looks.
            watch.conduct.command_went_out()  # counted afresh after a release
            await holds.hold(
                watch,
                f"{SEND_REFUSALS_BEFORE_HOLD} commands in a row not sent ({exc}): "
                "writes to the history take longer than leadership.send_deadline",
                NodeEvent.HOLD,
                by_controller=True,
            )
            return RungOutcome.HELD
        why = "not sent" if isinstance(exc, SendRefused) else "history unwritable"
        await holds.hold(watch, f"{why}: {exc}", NodeEvent.HOLD, record=False)
        return RungOutcome.HELD

    async def _unsettled(self, held_s: Unsettled) -> RungOutcome:
        """A resumed off whose fate is unknown, the outlet on: not "power restored".
        Nothing is sent; a new boot settles it, or boot_timeout: the next rung, or
        (an off never seen to land) this rung once more."""
        ladder, plan = self.ladder, self.plan
        await ladder.finish(self.action, "ambiguous", "resumed: the off's outcome is unknown")
        self.watch.apply(NodeEvent.POWER_RESTORED)
        outcome = await ladder.await_new_boot(
            plan.boot_before, ladder.boot_wait_left(plan.boot_wait_from)
        )
        if outcome is RungOutcome.NEXT and held_s is Unsettled.THEN_AGAIN:
            return RungOutcome.AGAIN
        return outcome

    async def _restored(self, power: VerifiedPower, held_s: float) -> RungOutcome:
        """Power is back on: the bookkeeping, then the wait for a new boot."""
        ladder, node = self.ladder, self.watch.name
        try:
            await ladder.finish(
                self.action,
                "verified",
                None,
                step=StepName.POWER_RESTORED,
                detail={"off_held_s": held_s},
            )
            if self.action is None:
                await ladder.note(StepName.POWER_RESTORED, off_held_s=held_s, resumed=True)
        except HistoryUnwritable as exc:
            log.error("%s: power restored, but the history could not record it: %s", node, exc)
        self.watch.apply(NodeEvent.POWER_RESTORED)
        ladder.tell("power_restored", f"{node}: power restored via {power.name}")
        off_seconds = self.off_seconds
        if held_s < off_seconds - HOLD_TOLERANCE_S:
            # A device that timed its own on came back early: the GPU may still be latched.
            ladder.tell(
                "hold_cut_short",
                f"{node}: power was off {held_s:.1f}s, not {off_seconds:g}s: {power.name} "
                "switched on early by its own timer",
                {"off_held_s": round(held_s, 1), "power_off_seconds": off_seconds},
            )
        return await ladder.await_new_boot(
            self.plan.boot_before, self.tools.config.guards.boot_timeout
        )

    async def _preflight(self, power: VerifiedPower) -> RungOutcome | None:
        """Before every rung, fresh or resumed: the last look, the outlet, then the guards.

        The outlet is read before the rung is recorded, so one found off costs no
        budget. The guards are read under the controller's budget lock, and the
        caller records the rung before releasing it: two rungs in parallel cannot
        both take the last cycle of a budget.
        """
        watch, plan, tools, ladder = self.watch, self.plan, self.tools, self.ladder
        # Until its first rung passes the guards it counts toward the breaker, as when
        # watched; not a later rung or try, whose node may be dark by this cut.
        if not watch.conduct.rungs_done and plan.attempt == 1 and plan.action_id is None:
            tools.holds.nothing_sent.add(watch.name)
        frozen, why = await tools.monitor.still_frozen(watch)
        if not frozen:
            return await self._false_alarm(why)
        state = await power.state()
        if state is not PowerState.ON:
            found = FoundOff(power.name, f"read {state.value} before the off: not touched")
            return await self._found_off(power, found)
        blocked = await tools.power.rung_blocked(watch)
        if blocked is None:
            tools.holds.nothing_sent.discard(watch.name)  # an off may leave from here on
            return None
        why = blocked.reason
        if blocked.block is Block.NOT_MINE:
            return await self._handed_over(why)
        if blocked.block is Block.BREAKER:
            if not plan.breaker_noted:  # once per wait, not once a poll
                plan.breaker_noted = True
                await ladder.note(StepName.RUNG_BLOCKED, rung=plan.rung, why=why)
            return RungOutcome.BREAKER  # nothing sent; the rung's action, if any, is kept
        await ladder.note(StepName.RUNG_BLOCKED, rung=plan.rung, why=why)
        await ladder.finish(self.action, "failed", why)
        await ladder.hold_and_close(why, NodeEvent.GUARD_BLOCKED)
        return RungOutcome.HELD

    async def _false_alarm(self, why: str) -> RungOutcome:
        """The host answered (or could not be judged) before any off was sent."""
        ladder, watch = self.ladder, self.watch
        await ladder.note(StepName.PREFLIGHT_ANSWERED, why=why)
        await ladder.finish(self.action, "failed", why)
        await incident_log.resolve(
            self.tools.ledger, ladder.incident_id, Resolution.FALSE_ALARM, detail={"why": why}
        )
        watch.conduct.incident_closed()
        watch.apply(NodeEvent.FALSE_ALARM)
        ladder.tell("false_alarm", f"{watch.name}: {why}; no power action")
        return RungOutcome.FALSE_ALARM

    async def _handed_over(self, why: str) -> RungOutcome:
        """Another controller on the Sparks acts for the node now (it claims it, or
        one before this in the order is heard again): nothing was sent, nothing held."""
        ladder, watch = self.ladder, self.watch
        await ladder.note(StepName.RUNG_BLOCKED, rung=self.plan.rung, why=why)
        await ladder.finish(self.action, "failed", why)
        await incident_log.resolve(
            self.tools.ledger,
            ladder.incident_id,
            Resolution.GAVE_UP,
            detail={"why": f"handed over: {why}"},
        )
        watch.conduct.incident_closed()
        watch.apply(NodeEvent.FALSE_ALARM)
        return RungOutcome.FALSE_ALARM

    async def _found_off(self, power: VerifiedPower, exc: FoundOff) -> RungOutcome:
        """Off before our off: a person's doing (or another tool's). Never switched on."""
        ladder, node = self.ladder, self.watch.name
        reason = f"{power.name} is off: switched off by hand? Not switched on; a person decides"
        await ladder.note(StepName.OUTLET_FOUND_OFF, detail=exc.message)
        await ladder.finish(self.action, "failed", exc.message)
        ladder.tell("outlet_off", f"{node}: {reason}")
        await ladder.hold_and_close(reason, NodeEvent.AMBIGUOUS)
        return RungOutcome.HELD
