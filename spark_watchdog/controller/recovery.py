"""The escalation ladder for ``host_frozen``, step by recorded step (docs/design.md).

For each power path of the node, in the configured order:

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
"""

from __future__ import annotations

import asyncio
import enum
import logging
from dataclasses import dataclass
from typing import Any

from spark_watchdog.controller import incident_log
from spark_watchdog.controller.clock import remaining
from spark_watchdog.controller.crew import Crew
from spark_watchdog.controller.detector import Verdict
from spark_watchdog.controller.incident_log import Resolution
from spark_watchdog.controller.ladder import new_boot
from spark_watchdog.controller.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.node_states import NodeEvent, NodeState
from spark_watchdog.controller.node_watch import NodeWatch
from spark_watchdog.controller.notify import Event
from spark_watchdog.controller.planner import Block
from spark_watchdog.controller.power_actions import rungs_of
from spark_watchdog.controller.resume_plan import Phase, ResumeInfo, RungPlan
from spark_watchdog.errors import (
    Ambiguous,
    FoundOff,
    PowerError,
    SendRefused,
    WatchdogError,
    Withdrawn,
)
from spark_watchdog.power.base import HOLD_TOLERANCE_S, PowerState, VerifiedPower, close_quietly
from spark_watchdog.power.paths import PowerPath
from spark_watchdog.steps import (
    OFF_SIDE,
    OFF_UNSETTLED,
    ON_UNSETTLED,
    StepName,
)

log = logging.getLogger("spark_watchdog.controller")


class RungOutcome(enum.Enum):
    RECOVERED = "recovered"  # a new boot id: the incident is resolved
    FALSE_ALARM = "false_alarm"  # the host showed life before anything was cut
    NEXT = "next"  # this rung failed or the boot never came: the next rung, if any
    HELD = "held"  # a person decides (ambiguity, a guard, the ladder ran out)
    # The circuit breaker refused the rung before anything was sent: it waits for
    # the breaker, then starts again from its preflight (``_wait_out_breaker``).
    BREAKER = "breaker"
    # A resumed off never seen to land (the outlet on, no new boot within
    # boot_timeout): the same rung once more, fresh, through its preflight.
    AGAIN = "again"


class Unsettled(enum.Enum):
    """An off of unknown fate, the outlet on: the boot wait settles it. With no
    new boot, the rung is tried once more (the off may never have left), or
    (its second try) the ladder goes on to the next rung."""

    THEN_NEXT = "then_next"
    THEN_AGAIN = "then_again"


@dataclass(frozen=True)
class _ActionRef:
    id: int


async def recover_frozen_host(
    host: Crew, watch: NodeWatch, incident_id: int, resume: ResumeInfo | None = None
) -> RungOutcome:
    """Run (or resume) the ladder for one incident.

    An unexpected error is treated as ambiguous: the node is held with the
    reason written to the history, and the incident is closed. The hold is
    the controller's own and is never released automatically.
    """
    try:
        return await _recover(host, watch, incident_id, resume)
    except asyncio.CancelledError:
        raise
    except HistoryUnwritable as exc:
        # Expected, not a bug: nothing unrecorded happens, so the node is held.
        # Nothing unrecorded cuts power, so this is a pause, not a verdict: the
        # node is held in memory only, and the controller resumes the incident
        # from its record once the history can be written again.
        log.warning("%s: history unwritable mid-recovery: %s; holding", watch.name, exc)
        await host.holds.hold(
            watch, f"history unwritable mid-recovery: {exc}", NodeEvent.HOLD, record=False
        )
        return RungOutcome.HELD
    except Exception as exc:
        log.error("%s: recovery failed: %r", watch.name, exc, exc_info=exc)
        await _fail(host, watch, incident_id, f"recovery failed: {exc!r}")
        return RungOutcome.HELD


async def _recover(
    host: Crew, watch: NodeWatch, incident_id: int, resume: ResumeInfo | None
) -> RungOutcome:
    try:
        return await _ladder(host, watch, incident_id, resume)
    finally:
        host.holds.nothing_sent.discard(watch.name)


async def _ladder(
    host: Crew, watch: NodeWatch, incident_id: int, resume: ResumeInfo | None
) -> RungOutcome:
    paths = rungs_of(host.config, watch)
    plan: RungPlan | None = None
    if resume is not None:
        if resume.phase is Phase.SERVING:
            return await finish_recovery(host, watch, incident_id)
        if resume.phase is Phase.BOOT_WAIT:
            left = _boot_wait_left(host, resume.restored_at)
            outcome = await await_new_boot(
                host, watch, incident_id, resume.boot_before, left, resumed=True
            )
            if outcome is not RungOutcome.NEXT:
                return outcome
        else:
            plan = resume.plan
    while True:
        if plan is None:
            left_rungs = [i for i in range(len(paths)) if i not in watch.conduct.rungs_done]
            if not left_rungs:
                await _give_up(host, watch, incident_id, "every power path was tried")
                return RungOutcome.HELD
            if watch.conduct.rungs_done:
                watch.apply(
                    NodeEvent.RUNG_FAILED
                    if watch.state is NodeState.FENCING
                    else NodeEvent.BOOT_TIMEOUT
                )
            plan = RungPlan(left_rungs[0])
        outcome = await _run_rung(host, watch, incident_id, paths[plan.rung], plan)
        if outcome is RungOutcome.BREAKER:
            await _wait_out_breaker(host, watch)
            continue
        host.holds.nothing_sent.discard(watch.name)
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


# A pair's gate refusing this many commands in a row for one node: the
# history's link is too slow for leadership.send_deadline, and every retry
# would be refused the same way. The node is held for a person.
SEND_REFUSALS_BEFORE_HOLD = 3


async def _run_rung(
    host: Crew, watch: NodeWatch, incident_id: int, path: PowerPath, plan: RungPlan
) -> RungOutcome:
    ledger, node = host.ledger, watch.name
    watch.apply(NodeEvent.RUNG_STARTED, rung=plan.rung)
    power = host.power.power_for(path, watch, incident_id)
    if plan.boot_before is None:
        plan.boot_before = watch.boot_id
    action: Any = None if plan.action_id is None else _ActionRef(plan.action_id)
    async with host.power.slot:
        try:
            if plan.fresh:
                async with host.power.budget_lock:
                    stop = await _preflight(host, watch, incident_id, plan, action, power)
                    if stop is not None:
                        return stop
                    if action is None:
                        action = await _record_rung(host, watch, incident_id, plan, power)
                off_seconds = _off_seconds(host, plan)
                cycled = await power.cycle(off_seconds, timed=host.config.policy.self_timed_on)
                held_s = Unsettled.THEN_NEXT if cycled.off_held_s is None else cycled.off_held_s
            else:
                held_s = await _resume_cycle(host, watch, incident_id, power, plan)
        except (HistoryUnwritable, SendRefused) as exc:
            return await _not_sent(host, watch, exc)
        except Withdrawn as exc:
            return await _false_alarm(host, watch, incident_id, action, exc.message)
        except FoundOff as exc:  # switched off between the preflight's read and the cycle's
            return await _found_off(host, watch, incident_id, action, power, exc)
        except Ambiguous as exc:
            await _finish(ledger, action, "ambiguous", str(exc))
            host.notifier.send(Event("ambiguous_power", f"{node}: {exc}", node, incident_id))
            await _hold_and_close(
                host,
                watch,
                incident_id,
                f"power outcome unknown: {exc.message}",
                NodeEvent.AMBIGUOUS,
            )
            return RungOutcome.HELD
        except PowerError as exc:
            await _finish(ledger, action, "failed", str(exc))
            await _note(
                host, incident_id, node, StepName.RUNG_FAILED, rung=plan.rung, error=str(exc)
            )
            host.notifier.send(Event("power_action_failed", f"{node}: {exc}", node, incident_id))
            return RungOutcome.NEXT
        finally:
            # Every way out of the rung releases the device's sockets.
            await close_quietly(power.backend)
    watch.conduct.command_went_out()
    if isinstance(held_s, Unsettled):
        return await _unsettled(host, watch, incident_id, plan, action, held_s)
    return await _restored(host, watch, incident_id, plan, action, power, held_s)


async def _record_rung(
    host: Crew, watch: NodeWatch, incident_id: int, plan: RungPlan, power: VerifiedPower
) -> Any:
    """The rung's action and its ``rung_started`` step: from here on it counts
    against the budgets (recorded under the budget lock, before any command)."""
    if plan.off_seconds is None:  # a second try keeps the first's
        plan.off_seconds = watch.off_seconds_override
    detail: dict[str, Any] = {"rung": plan.rung, "boot_id_before": plan.boot_before}
    if plan.off_seconds is not None:
        detail["off_seconds"] = plan.off_seconds  # for a resume
    if plan.attempt > 1:
        detail["attempt"] = plan.attempt  # a resume tries it no third time
    action = await host.ledger.write(
        host.ledger.store.record_action,
        watch.name,
        "cycle",
        device=power.name,
        incident_id=incident_id,
        rung=plan.rung,
        step=StepName.RUNG_STARTED,
        step_detail=detail,
    )
    host.power.note_cycle(watch.name, action.id)
    return action


async def _not_sent(
    host: Crew, watch: NodeWatch, exc: HistoryUnwritable | SendRefused
) -> RungOutcome:
    """A record before the off failed (in a pair: any record), or a pair's gate
    refused a command (recorded as withdrawn where it could be): nothing
    unrecorded was sent. Held in memory; resumed from the record once the
    history can be written, by this controller or by the one that leads."""
    refused_often = (
        isinstance(exc, SendRefused)
        and watch.conduct.command_refused() >= SEND_REFUSALS_BEFORE_HOLD
    )
    if refused_often:
        # Every retry would be refused the same way: a person looks.
        watch.conduct.command_went_out()  # counted afresh after a release
        await host.holds.hold(
            watch,
            f"{SEND_REFUSALS_BEFORE_HOLD} commands in a row not sent ({exc}): "
            "writes to the history take longer than leadership.send_deadline",
            NodeEvent.HOLD,
            by_controller=True,
        )
        return RungOutcome.HELD
    why = "not sent" if isinstance(exc, SendRefused) else "history unwritable"
    await host.holds.hold(watch, f"{why}: {exc}", NodeEvent.HOLD, record=False)
    return RungOutcome.HELD


async def _unsettled(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    plan: RungPlan,
    action: Any,
    held_s: Unsettled,
) -> RungOutcome:
    """A resumed off whose fate is unknown, the outlet on: not "power restored".
    Nothing is sent; a new boot settles it, or boot_timeout: the next rung, or
    (an off never seen to land) this rung once more."""
    await _finish(host.ledger, action, "ambiguous", "resumed: the off's outcome is unknown")
    watch.apply(NodeEvent.POWER_RESTORED)
    outcome = await await_new_boot(
        host, watch, incident_id, plan.boot_before, _boot_wait_left(host, plan.boot_wait_from)
    )
    if outcome is RungOutcome.NEXT and held_s is Unsettled.THEN_AGAIN:
        return RungOutcome.AGAIN
    return outcome


async def _restored(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    plan: RungPlan,
    action: Any,
    power: VerifiedPower,
    held_s: float,
) -> RungOutcome:
    """Power is back on: the bookkeeping, then the wait for a new boot."""
    node = watch.name
    try:
        await _finish(
            host.ledger,
            action,
            "verified",
            None,
            step=StepName.POWER_RESTORED,
            detail={"off_held_s": held_s},
        )
        if action is None:
            await _note(
                host, incident_id, node, StepName.POWER_RESTORED, off_held_s=held_s, resumed=True
            )
    except HistoryUnwritable as exc:
        log.error("%s: power restored, but the history could not record it: %s", node, exc)
    watch.apply(NodeEvent.POWER_RESTORED)
    host.notifier.send(
        Event("power_restored", f"{node}: power restored via {power.name}", node, incident_id)
    )
    off_seconds = _off_seconds(host, plan)
    if held_s < off_seconds - HOLD_TOLERANCE_S:
        # A device that timed its own on came back early: the GPU may still be latched.
        host.notifier.send(
            Event(
                "hold_cut_short",
                f"{node}: power was off {held_s:.1f}s, not {off_seconds:g}s: {power.name} "
                "switched on early by its own timer",
                node,
                incident_id,
                {"off_held_s": round(held_s, 1), "power_off_seconds": off_seconds},
            )
        )
    return await await_new_boot(
        host, watch, incident_id, plan.boot_before, host.config.guards.boot_timeout
    )


def _boot_wait_left(host: Crew, started_at: float | None) -> float:
    """What is left of a boot wait a record says began at ``started_at`` (all
    of it when none did). A controller back after the whole wait still gives
    the agent a few polls: the boot it waited for may well have come while it
    was down."""
    left = remaining(host.config.guards.boot_timeout, started_at, host.clock.time())
    detection = host.config.detection
    return max(left, 3 * detection.poll_interval + detection.agent_timeout)


async def _preflight(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    plan: RungPlan,
    action: Any,
    power: VerifiedPower,
) -> RungOutcome | None:
    """Before every rung, fresh or resumed: the last look, the outlet, then the guards.

    The outlet is read before the rung is recorded, so one found off costs no
    budget. The guards are read under the controller's budget lock, and the
    caller records the rung before releasing it: two rungs in parallel cannot
    both take the last cycle of a budget.
    """
    # Until its first rung passes the guards it counts toward the breaker, as when
    # watched; not a later rung or try, whose node may be dark by this cut.
    if not watch.conduct.rungs_done and plan.attempt == 1 and plan.action_id is None:
        host.holds.nothing_sent.add(watch.name)
    frozen, why = await host.monitor.still_frozen(watch)
    if not frozen:
        return await _false_alarm(host, watch, incident_id, action, why)
    state = await power.state()
    if state is not PowerState.ON:
        found = FoundOff(power.name, f"read {state.value} before the off: not touched")
        return await _found_off(host, watch, incident_id, action, power, found)
    blocked = await host.power.rung_blocked(watch)
    if blocked is None:
        host.holds.nothing_sent.discard(watch.name)  # an off may leave from here on
        return None
    why, node = blocked.reason, watch.name
    if blocked.block is Block.BREAKER:
        if not plan.breaker_noted:  # once per wait, not once a poll
            plan.breaker_noted = True
            await _note(host, incident_id, node, StepName.RUNG_BLOCKED, rung=plan.rung, why=why)
        return RungOutcome.BREAKER  # nothing sent; the rung's action, if any, is kept
    await _note(host, incident_id, node, StepName.RUNG_BLOCKED, rung=plan.rung, why=why)
    await _finish(host.ledger, action, "failed", why)
    await _hold_and_close(host, watch, incident_id, why, NodeEvent.GUARD_BLOCKED)
    return RungOutcome.HELD


async def _wait_out_breaker(host: Crew, watch: NodeWatch) -> None:
    """The breaker refused a rung: more nodes look frozen at once than their own
    faults explain, and a blip of the controller's own links looks just so (it
    also silences the peers whose word kept a cut-off node ``unreachable``).
    Nothing was sent, so nothing is held: the incident stays open and the rung
    waits, outside the power slot, until the breaker closes, a hold comes (a
    breaker that lasts latches into one) or the node's verdict is no longer
    ``host_frozen``. The rung then starts again from its preflight: life on
    any path ends the incident a false alarm, silence goes on with the rung
    (docs/design.md, "Guards")."""
    log.warning("%s: the circuit breaker is open; the rung waits for it", watch.name)
    while True:
        await host.clock.sleep(host.config.detection.poll_interval)
        if watch.finding.verdict is not Verdict.HOST_FROZEN:
            return
        blocked = await host.power.rung_blocked(watch)
        if blocked is None or blocked.block is not Block.BREAKER:
            return


async def _false_alarm(
    host: Crew, watch: NodeWatch, incident_id: int, action: Any, why: str
) -> RungOutcome:
    """The host answered (or could not be judged) before any off was sent."""
    ledger, node = host.ledger, watch.name
    await _note(host, incident_id, node, StepName.PREFLIGHT_ANSWERED, why=why)
    await _finish(ledger, action, "failed", why)
    await incident_log.resolve(ledger, incident_id, Resolution.FALSE_ALARM, detail={"why": why})
    watch.conduct.incident_closed()
    watch.apply(NodeEvent.FALSE_ALARM)
    host.notifier.send(Event("false_alarm", f"{node}: {why}; no power action", node, incident_id))
    return RungOutcome.FALSE_ALARM


async def _found_off(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    action: Any,
    power: VerifiedPower,
    exc: FoundOff,
) -> RungOutcome:
    """Off before our off: a person's doing (or another tool's). Never switched on."""
    node = watch.name
    where = power.name
    reason = f"{where} is off: switched off by hand? Not switched on; a person decides"
    await _note(host, incident_id, node, StepName.OUTLET_FOUND_OFF, detail=exc.message)
    await _finish(host.ledger, action, "failed", exc.message)
    host.notifier.send(Event("outlet_off", f"{node}: {reason}", node, incident_id))
    await _hold_and_close(host, watch, incident_id, reason, NodeEvent.AMBIGUOUS)
    return RungOutcome.HELD


async def _resume_cycle(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    power: VerifiedPower,
    plan: RungPlan,
) -> float | Unsettled:
    """Finish a cycle a killed controller left after its off may have left.

    The hold it restored, or how the boot wait is to settle an off of unknown
    fate with the outlet on.

    :raises Ambiguous: the off's fate is unknown and the outlet reads on:
        nothing is sent again, a person decides.
    """
    node, last = watch.name, plan.resume_from
    off_seconds = _off_seconds(host, plan)
    state = await power.state()
    await _note(
        host, incident_id, node, StepName.RESUMED, last_step=last, state=state.value, off_side=True
    )
    off_verified_at = plan.off_verified_at
    if last in OFF_UNSETTLED:
        settled = await _settle_unknown_off(host, watch, incident_id, power, plan, state)
        if settled is not None:
            return settled
        # Off, but since when is unknown: the whole hold again.
        last, off_verified_at = StepName.OFF_VERIFIED, None
    if last in OFF_SIDE or last == "spacing":  # "spacing": records before the step had a side
        await _resume_hold(host, watch, incident_id, power, plan, state, off_verified_at)
        return off_seconds
    if last in ON_UNSETTLED and state is not PowerState.ON:
        # Turning an off outlet on cannot hurt a healthy node: it has no power.
        await power.on()
    # on_verified / power_restored: only the boot wait remains.
    return off_seconds


async def _settle_unknown_off(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    power: VerifiedPower,
    plan: RungPlan,
    state: PowerState,
) -> float | Unsettled | None:
    """An off whose fate the record does not say, the outlet read ``state``:
    the hold (a new boot settled it), how the boot wait is to settle it, or
    None (the outlet is off: the whole hold again).

    :raises Ambiguous: the outlet reads neither: a person decides.
    """
    node, last = watch.name, plan.resume_from
    if state is PowerState.ON and _booted_since(watch, plan):
        await _note(
            host, incident_id, node, StepName.RESUMED, settled_by="new boot id", off_side=True
        )
        return _off_seconds(host, plan)
    # A second try only for an off that may never have left (an off_ambiguous
    # did leave), against the recorded boot of the frozen host (without it,
    # the old boot answering again would pass for a new one).
    again = last == StepName.OFF_REQUESTED and plan.attempt == 1 and plan.boot_before is not None
    if state is PowerState.ON and (plan.timed_on_after is not None or again):
        # Nothing is sent now, and the boot wait settles it: a new boot id,
        # or boot_timeout. The off may have landed and power come back by
        # the device's own timer (a timed off), or by a person: the node may
        # be booting. Or it never left: a controller killed (or deposed, its
        # datagram held back at the socket) between its record and the send.
        # A node silent for all of boot_timeout is still frozen: the rung
        # runs once more as a new action, through the preflight (last look,
        # holds, budgets) and the gate like any other; otherwise (a timed
        # off) the ladder goes on to the next rung. This off is never sent
        # again (docs/design.md, "Restart and resume").
        await _note(
            host,
            incident_id,
            node,
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
            power.name,
            f"resumed after {last}, but the outlet reads {state.value}: a person must decide "
            "(a device that times its own on may have cycled it already)",
        )
    return None


async def _resume_hold(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    power: VerifiedPower,
    plan: RungPlan,
    state: PowerState,
    off_verified_at: float | None,
) -> None:
    """The off side of a resumed cycle: what is left of the hold, then the on."""
    if state is PowerState.OFF:
        left = remaining(_off_seconds(host, plan), off_verified_at, host.clock.time())
        node = watch.name
        await _note(
            host,
            incident_id,
            node,
            StepName.HOLD_STARTED,
            remaining_s=round(left, 1),
            resumed=True,
            off_side=True,
        )
        await host.clock.sleep(left)
        await _note(host, incident_id, node, StepName.HOLD_DONE, off_side=True)
        if await _device_switched_on(host, watch, incident_id, power, plan):
            return
    if state is not PowerState.ON:
        await power.on()


async def _device_switched_on(
    host: Crew, watch: NodeWatch, incident_id: int, power: VerifiedPower, plan: RungPlan
) -> bool:
    """A resumed self-timed off: await the device's own on (read back), as the
    cycle would have. False when it was not timed or the on did not come."""
    if plan.timed_on_after is None:
        return False
    node, clock = watch.name, host.clock
    due = remaining(plan.timed_on_after, plan.off_requested_at, clock.time())
    await _note(host, incident_id, node, StepName.ON_AWAITED, due_s=round(due, 1), off_side=True)
    deadline = clock.monotonic() + due + host.config.policy.power_timeout
    while clock.monotonic() < deadline:
        try:
            if await power.state() is PowerState.ON:
                await _note(
                    host, incident_id, node, StepName.ON_VERIFIED, by="device", off_side=True
                )
                return True
        except PowerError:
            pass  # a missed read decides nothing; the deadline does
        await clock.sleep(host.config.policy.power_poll_interval)
    await _note(host, incident_id, node, StepName.ON_NOT_BY_DEVICE, off_side=True)
    return False


def _off_seconds(host: Crew, plan: RungPlan) -> float:
    """The rung's off hold: power_off_seconds, or a clock latch's long cut."""
    return host.config.policy.power_off_seconds if plan.off_seconds is None else plan.off_seconds


def _booted_since(watch: NodeWatch, plan: RungPlan) -> bool:
    """The agent answers with a boot id other than the frozen one."""
    return (
        plan.boot_before is not None
        and watch.boot_id is not None
        and watch.boot_id != plan.boot_before
        and watch.snapshot is not None
    )


async def await_new_boot(
    host: Crew,
    watch: NodeWatch,
    incident_id: int,
    boot_before: str | None,
    timeout: float,
    *,
    resumed: bool = False,
) -> RungOutcome:
    """Wait (monotonic) up to ``timeout`` for the agent to answer with another boot id."""
    ledger, node = host.ledger, watch.name
    before = boot_before if boot_before is not None else watch.boot_id
    await _note(
        host,
        incident_id,
        node,
        StepName.BOOT_WAIT_STARTED,
        boot_id_before=before,
        timeout_s=round(timeout, 1),
        resumed=resumed,
        off_side=True,  # power is on: waiting needs no record
    )
    if await new_boot(host, watch, before, timeout):
        await _note(
            host,
            incident_id,
            node,
            StepName.NEW_BOOT_SEEN,
            boot_id=watch.boot_id,
            boot_id_before=before,
            off_side=True,
        )
        watch.apply(NodeEvent.NEW_BOOT)
        await record_boots(host, watch, incident_id)
        return await finish_recovery(host, watch, incident_id)
    await incident_log.step(
        ledger,
        incident_id,
        StepName.BOOT_TIMEOUT,
        node=node,
        detail={"timeout_s": round(timeout, 1)},
    )
    host.notifier.send(
        Event("boot_timeout", f"{node}: no new boot within {timeout:g}s", node, incident_id)
    )
    return RungOutcome.NEXT


async def finish_recovery(host: Crew, watch: NodeWatch, incident_id: int) -> RungOutcome:
    await host.serving.restart_after(incident_id, f"{watch.name} recovered from host_frozen")
    incident = await incident_log.resolve(
        host.ledger,
        incident_id,
        Resolution.RECOVERED,
        detail={"boot_id": watch.boot_id},
    )
    watch.conduct.incident_closed()
    ttd = incident.time_to_detect_s
    ttr = incident.time_to_recover_s
    host.notifier.send(
        Event(
            "recovered",
            f"incident #{incident_id} recovered: detected in {ttd:.1f}s, recovered in {ttr:.1f}s"
            if ttd is not None and ttr is not None
            else f"incident #{incident_id} recovered",
            watch.name,
            incident_id,
        )
    )
    return RungOutcome.RECOVERED


async def _give_up(host: Crew, watch: NodeWatch, incident_id: int, why: str) -> None:
    host.notifier.send(
        Event(
            "gave_up", f"{watch.name}: gave up ({why}); held for a person", watch.name, incident_id
        )
    )
    await _hold_and_close(host, watch, incident_id, f"gave up: {why}", NodeEvent.LADDER_EXHAUSTED)


async def _hold_and_close(
    host: Crew, watch: NodeWatch, incident_id: int, reason: str, event: NodeEvent
) -> None:
    """Hold the node (recorded, the controller's own hold) and close the incident."""
    await host.holds.hold(watch, reason, event, by_controller=True)
    watch.conduct.incident_handed_over()
    try:
        await _note(host, incident_id, watch.name, StepName.HELD, why=reason)
        await incident_log.resolve(
            host.ledger, incident_id, Resolution.GAVE_UP, detail={"why": reason}
        )
    except HistoryUnwritable as exc:
        log.error("%s: incident #%d left open: %s", watch.name, incident_id, exc)


async def _fail(host: Crew, watch: NodeWatch, incident_id: int, reason: str) -> None:
    """An unexpected error inside a recovery: as ambiguous as it gets. Hold, record, alert."""
    host.notifier.send(Event("held", f"{watch.name}: {reason}", watch.name, incident_id))
    try:
        await _hold_and_close(host, watch, incident_id, reason, NodeEvent.RECOVERY_FAILED)
    except Exception as exc:  # the record failed too: held in memory, never released
        log.error("%s: could not record the hold: %r", watch.name, exc)
        watch.conduct.held(by_controller=True)
        watch.apply(NodeEvent.RECOVERY_FAILED, reason=reason)


async def _note(
    host: Crew,
    incident_id: int,
    node: str,
    step: str,
    *,
    off_side: bool = False,
    **detail: Any,
) -> None:
    """Record one step. ``off_side``: the outlet may be off, so a failed record
    must not stop the on that follows (logged and alerted instead)."""
    try:
        await incident_log.step(host.ledger, incident_id, step, node=node, detail=detail)
    except HistoryUnwritable as exc:
        if not off_side:
            raise
        log.error("%s: %s not recorded (%s); power is restored all the same", node, step, exc)


async def _finish(
    ledger: Ledger,
    action: Any,
    result: str,
    error: str | None,
    step: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    if action is None:
        return
    await ledger.write(
        ledger.store.finish_action, action.id, result, error=error, step=step, step_detail=detail
    )


async def record_boots(host: Crew, watch: NodeWatch, incident_id: int) -> None:
    """Store the agent's journal analysis: how did the previous boot end?"""
    for boot in await host.monitor.boots(watch):
        try:
            await host.ledger.write(
                host.ledger.store.record_agent_boot,
                watch.name,
                boot,
                incident_id=incident_id if boot.get("current") is False else None,
            )
        except (HistoryUnwritable, WatchdogError) as exc:
            log.warning("%s: boot record skipped: %s", watch.name, exc)
