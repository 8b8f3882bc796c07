"""A clock-latched GPU: a clean halt, then a long AC cut by the power path
(docs/design.md, "Clock latch").

The agent's post-boot check found the GPU latched on this boot; a reboot
does not clear it, minutes without AC do. The host is alive, and power is
never cut on a host showing life, so:

1. the guards first (:func:`blocked`): an ssh path, a power path that can
   cut the outlet, no hold, the node and cluster budgets, the breaker shut,
   and no long cut of the node within ``guards.suspect_window`` already (a
   latch that outlives one is the hardware's: a person decides). A blocked
   unlatch is an alert, not a hold: the node keeps its freeze protection;
2. **a clean halt over SSH** (``halt_command``, ``systemctl halt``), recorded
   before it is sent; from before the send the node's silence is expected.
   A halt, not a power-off: a halted host is still powered, as a frozen one
   is, and a Spark is known to boot when AC comes back to a powered host,
   not known to after an orderly power-off (docs/facts.md, "Power path");
3. up to ``guards.boot_timeout`` for the host to go silent (no agent answer
   and no SSH answer for ``freeze_after``); one that keeps answering is
   alerted, and left as it is;
4. **the power path**: the expectation is dropped, so the silent host is
   ``host_frozen`` to the detector, and the freeze ladder runs with every
   guard of a freeze (the last look, the gate before the off, budgets,
   holds), holding the AC off ``clock_latch_off_seconds`` (at least
   ``power_off_seconds``) instead. This incident waits for the node's next
   boot and ends ``recovered`` with it, else ``gave_up``.
"""

from __future__ import annotations

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.ladder import new_boot, resolve, wait_for
from spark_watchdog.controller.act.wedged import ssh_device
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Action, Block, power_blocked
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.steps import StepName

KIND = "clock_latched"
HANDED_OVER = "handed over: "
# Extra seconds, past the cut and boot_timeout, that the incident waits for the boot.
_DETECT_MARGIN_S = 120.0


def off_seconds(config: ControllerConfig) -> float:
    """The long cut: never shorter than an ordinary one."""
    return max(config.policy.clock_latch_off_seconds, config.policy.power_off_seconds)


async def unlatch(host: GentleTools, watch: NodeWatch, incident_id: int) -> str:
    """Run the ladder for one open ``clock_latched`` incident; its resolution."""
    why = await blocked(host, watch)
    if why is not None and why.startswith(HANDED_OVER):
        # Another controller on the Sparks acts for the node now: its to answer.
        return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, why)
    if why is not None:
        return await _unanswered(host, watch, incident_id, why)
    boot = watch.boot_id
    why = await _halt(host, watch, incident_id, boot)
    if why is not None:
        return await _unanswered(host, watch, incident_id, why)
    if not await wait_for(
        host,
        lambda: not watch.shows_life(host.clock.monotonic(), host.config.detection.freeze_after),
        host.config.guards.boot_timeout,
    ):
        # The halt may still come (a slow stop): the cut that would follow stays long.
        watch.expect_reboot(None, host.clock.monotonic())
        return await _unanswered(
            host, watch, incident_id, "the halt was sent, but the host still answers"
        )
    await _hand_over(host, watch, incident_id)
    return await await_boot(host, watch, incident_id, boot)


async def _halt(
    host: GentleTools, watch: NodeWatch, incident_id: int, boot: str | None
) -> str | None:
    """Record and send the clean halt; None when it was (or may have been) sent,
    else why not."""
    ledger, name = host.ledger, watch.name
    device = ssh_device(watch)
    assert device is not None  # blocked() said so
    hold = off_seconds(host.config)
    await incident_log.step(
        ledger,
        incident_id,
        StepName.HALT_REQUESTED,
        node=name,
        detail={"boot_id": boot, "off_seconds": hold},
    )
    # Before it leaves: the silence that follows is this halt, not a freeze, and
    # the cut that follows it is the long one, for as long as this boot lasts.
    watch.expect_reboot("a halt for the GPU clock latch was sent", host.clock.monotonic())
    watch.arm_long_cut(hold, boot)
    attempt = await host.power.halt(device)
    if attempt.sent is False:
        watch.expect_reboot(None, host.clock.monotonic())
        watch.arm_long_cut(None, None)
        await incident_log.step(
            ledger,
            incident_id,
            StepName.HALT_NOT_SENT,
            node=name,
            detail={"detail": attempt.detail},
        )
        return f"the halt was not sent ({attempt.detail})"
    await incident_log.step(
        ledger,
        incident_id,
        StepName.HALT_SENT,
        node=name,
        detail={"detail": attempt.detail, "certain": attempt.sent is True},
    )
    return None


async def _hand_over(host: GentleTools, watch: NodeWatch, incident_id: int) -> None:
    """Silent: the freeze path cuts it, with its guards, for the long hold."""
    name, hold = watch.name, off_seconds(host.config)
    watch.leave_ladder(incident_id, NodeEvent.HANDED_TO_POWER)
    watch.expect_reboot(None, host.clock.monotonic())
    await incident_log.step(
        host.ledger,
        incident_id,
        StepName.HANDED_TO_POWER_PATH,
        node=name,
        detail={"off_seconds": hold},
    )
    host.notifier.send(
        Event(
            "clock_latch_halted",
            f"{name}: halted for the GPU clock latch; the power path holds its AC off {hold:g}s",
            name,
            incident_id,
        )
    )


async def await_boot(
    host: GentleTools, watch: NodeWatch, incident_id: int, boot: str | None
) -> str:
    """After the handover: the incident ends with the node's next boot."""
    config = host.config
    limit = (
        off_seconds(config)
        + config.guards.boot_timeout
        + config.detection.freeze_after
        + 2 * config.policy.power_timeout
        + _DETECT_MARGIN_S
    )
    if await new_boot(host, watch, boot, limit):
        return await resolve(
            host, incident_id, KIND, Resolution.RECOVERED, "a new boot after the long cut"
        )
    return await _unanswered(host, watch, incident_id, "no new boot after the halt and the cut")


async def blocked(host: GentleTools, watch: NodeWatch) -> str | None:
    """Why the node cannot be halted and cut for its latch now; None: it can."""
    guards = host.config.guards
    if ssh_device(watch) is None:
        return "no ssh path to halt it cleanly"
    if not host.power.rungs[watch.name]:
        return "no power path that can cut its outlet"
    stopped = power_blocked(await host.power.guards(watch, Action.LONG_CUT), Action.LONG_CUT)
    if stopped is not None and stopped.block is Block.NOT_MINE:
        return f"{HANDED_OVER}{stopped.reason}"
    if stopped is not None:
        return stopped.reason
    earlier = await _long_cut_since(host, watch.name, host.clock.time() - guards.suspect_window)
    if earlier is not None:
        return (
            f"latched again after a long AC cut (incident #{earlier}): the hardware may be at fault"
        )
    return None


async def _long_cut_since(host: GentleTools, node: str, since: float) -> int | None:
    """A freeze incident of the node since ``since`` that restored power after a long cut."""
    ledger = host.ledger
    incidents = await ledger.read(
        ledger.store.list_incidents, node=node, since=since, kind="host_frozen", limit=None
    )
    for incident in incidents:
        steps = await ledger.read(ledger.store.steps, incident.id)
        long_rung = any(
            s.step == StepName.RUNG_STARTED
            and isinstance(s.detail, dict)
            and isinstance(s.detail.get("off_seconds"), (int, float))
            for s in steps
        )
        if long_rung and any(s.step == StepName.POWER_RESTORED for s in steps):
            return incident.id
    return None


async def _unanswered(host: GentleTools, watch: NodeWatch, incident_id: int, why: str) -> str:
    """An alert: the latch stays; the node keeps its freeze protection (no hold)."""
    text = f"clock latched, not cleared: {why}; cut its AC for a few minutes when it can be spared"
    host.notifier.send(Event("clock_latch_not_cleared", f"{watch.name}: {text}", watch.name))
    return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, why)
