"""A cycle a stopped controller left after its off may have left: finished
from the record, never sent twice (docs/design.md, "Restart and resume").

The rung's last recorded step says how far it got; the outlet is read
before anything else. An off whose fate is unknown with the outlet on is
settled by the boot wait (:class:`Unsettled`); with the outlet reading
neither on nor off, a person decides. A hold continues for what is left of
it (clamped, see clock.remaining).
"""

from __future__ import annotations

import enum

from spark_watchdog.controller.act.freeze_tools import LadderSteps
from spark_watchdog.controller.clock import remaining
from spark_watchdog.controller.decide.resume_plan import RungPlan
from spark_watchdog.errors import Ambiguous, HandedOver, PowerError
from spark_watchdog.power.base import PowerState, VerifiedPower
from spark_watchdog.steps import OFF_SIDE, OFF_UNSETTLED, ON_UNSETTLED, StepName


class Unsettled(enum.Enum):
    """An off of unknown fate, the outlet on: the boot wait settles it. With no
    new boot, the rung is tried once more (the off may never have left), or
    (its second try) the ladder goes on to the next rung."""

    THEN_NEXT = "then_next"
    THEN_AGAIN = "then_again"


class LeftCycle:
    """The rest of one rung's cycle, resumed."""

    def __init__(
        self, ladder: LadderSteps, plan: RungPlan, power: VerifiedPower, off_seconds: float
    ) -> None:
        self.ladder = ladder
        self.plan = plan
        self.power = power
        self.off_seconds = off_seconds  # the rung's off hold
        self.tools = ladder.tools
        self.watch = ladder.watch

    async def finish(self) -> float | Unsettled:
        """Finish a cycle a killed controller left after its off may have left.

        The hold it restored, or how the boot wait is to settle an off of unknown
        fate with the outlet on.

        :raises Ambiguous: the off's fate is unknown and the outlet reads on:
            nothing is sent again, a person decides.
        """
        plan = self.plan
        last = plan.resume_from
        state = await self.power.state()
        await self.ladder.note(StepName.RESUMED, last_step=last, state=state.value, off_side=True)
        off_verified_at = plan.off_verified_at
        if last in OFF_UNSETTLED:
            settled = await self._settle_unknown_off(state)
            if settled is not None:
                return settled
            # Off, but since when is unknown: the whole hold again.
            last, off_verified_at = StepName.OFF_VERIFIED, None
        if last in OFF_SIDE or last == "spacing":  # "spacing": records before the step had a side
            await self._resume_hold(state, off_verified_at)
            return self.off_seconds
        if last in ON_UNSETTLED and state is not PowerState.ON:
            # Turning an off outlet on cannot hurt a healthy node: it has no power.
            await self._on()
        # on_verified / power_restored: only the boot wait remains.
        return self.off_seconds

    async def _settle_unknown_off(self, state: PowerState) -> float | Unsettled | None:
        """An off whose fate the record does not say, the outlet read ``state``:
        the hold (a new boot settled it), how the boot wait is to settle it, or
        None (the outlet is off: the whole hold again).

        :raises Ambiguous: the outlet reads neither: a person decides.
        """
        plan, ladder = self.plan, self.ladder
        last = plan.resume_from
        if state is PowerState.ON and self._booted_since():
            await ladder.note(StepName.RESUMED, settled_by="new boot id", off_side=True)
            return self.off_seconds
        # A second try only for an off that may never have left (an off_ambiguous
        # did leave), against the recorded boot of the frozen host (without it,
        # the old boot answering again would pass for a new one).
        again = (
            last == StepName.OFF_REQUESTED and plan.attempt == 1 and plan.boot_before is not None
        )
        if state is PowerState.ON and (plan.timed_on_after is not None or again):
            # Nothing is sent now; the boot wait settles it. The off may have
            # landed and power come back by the device's timer (a timed off) or
            # a person, or it never left (a controller killed or deposed between
            # its record and the send). Silent for all of boot_timeout: the rung
            # runs once more as a new action, through the preflight and the gate
            # like any other, or (a timed off) the ladder goes on to the next.
            # This off is never sent again (docs/design.md, "Restart and resume").
            await ladder.note(
                StepName.RESUMED,
                settled_by="the boot wait, then "
                + ("the rung once more" if again else "the next rung")
                + " (nothing is sent now)",
                again=again,
                off_side=True,
            )
            return Unsettled.THEN_AGAIN if again else Unsettled.THEN_NEXT
        if state is not PowerState.OFF:
            # The off may or may not have landed; a second off is never sent.
            raise Ambiguous(
                self.power.name,
                f"resumed after {last}, but the outlet reads {state.value}: a person must "
                "decide (a device that times its own on may have cycled it already)",
            )
        return None

    async def _resume_hold(self, state: PowerState, off_verified_at: float | None) -> None:
        """The off side of a resumed cycle: what is left of the hold, then the on."""
        if state is PowerState.OFF:
            ladder, clock = self.ladder, self.tools.clock
            left = remaining(self.off_seconds, off_verified_at, clock.time())
            await ladder.note(
                StepName.HOLD_STARTED, remaining_s=round(left, 1), resumed=True, off_side=True
            )
            await clock.sleep(left)
            await ladder.note(StepName.HOLD_DONE, off_side=True)
            if await self._device_switched_on():
                return
        if state is not PowerState.ON:
            await self._on()

    async def _on(self) -> None:
        """The on of a resumed cycle, unless another controller on the Sparks is
        recovering the node now: its own off may be what holds the outlet off.

        :raises HandedOver: not sent; the node is the other's.
        """
        claimed = await self.tools.power.claimed_elsewhere(self.watch)
        if claimed is not None:
            raise HandedOver(self.power.name, f"not switched on: {claimed}")
        await self.power.on()

    async def _device_switched_on(self) -> bool:
        """A resumed self-timed off: await the device's own on (read back), as the
        cycle would have. False when it was not timed or the on did not come."""
        plan, ladder = self.plan, self.ladder
        if plan.timed_on_after is None:
            return False
        clock, policy = self.tools.clock, self.tools.config.policy
        due = remaining(plan.timed_on_after, plan.off_requested_at, clock.time())
        await ladder.note(StepName.ON_AWAITED, due_s=round(due, 1), off_side=True)
        deadline = clock.monotonic() + due + policy.power_timeout
        while clock.monotonic() < deadline:
            try:
                if await self.power.state() is PowerState.ON:
                    await ladder.note(StepName.ON_VERIFIED, by="device", off_side=True)
                    return True
            except PowerError:
                pass  # a missed read decides nothing; the deadline does
            await clock.sleep(policy.power_poll_interval)
        await ladder.note(StepName.ON_NOT_BY_DEVICE, off_side=True)
        return False

    def _booted_since(self) -> bool:
        """The agent answers with a boot id other than the frozen one."""
        watch, before = self.watch, self.plan.boot_before
        return (
            before is not None
            and watch.boot_id is not None
            and watch.boot_id != before
            and watch.snapshot is not None
        )
