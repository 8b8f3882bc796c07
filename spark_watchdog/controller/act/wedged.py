"""The wedged-but-alive ladder: a node whose GPU driver is stuck while the host
still answers (docs/design.md, "Wedged but alive").

Power is for hosts that show no life; this one does. So the rungs are:

1. **serving restart** with the safe profile (a rank that holds the driver
   may be what keeps it stuck), within the serving restart budget; then up
   to ``gpu_wedged_after`` for the GPU reads to come back;
2. **a forced reboot over SSH** (``forced_command``: sysrq's emergency
   restart, which a wedged driver cannot hang), recorded before it is sent,
   within the node's budget, never repeated; verified only by a new boot id
   within ``boot_timeout``;
3. **the power path**, only the way every power action comes: a host that
   goes silent (a reboot hung in the driver) is ``host_frozen`` to the
   detector, and this incident is handed over. A host that keeps answering
   after a reboot that did not happen is held for a person: power is never
   cut on a host showing life.

Every rung is a step of the incident; holds, budgets and dry run apply.
"""

from __future__ import annotations

from spark_watchdog.config.controller import SshDevice
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.ladder import new_boot, resolve, wait_for
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Action, Block, power_blocked
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.steps import StepName

KIND = Verdict.GPU_WEDGED.value


def ssh_device(watch: NodeWatch) -> SshDevice | None:
    return next((d for d in watch.config.power if isinstance(d, SshDevice)), None)


async def unwedge(
    host: GentleTools, watch: NodeWatch, incident_id: int, *, with_serving: bool
) -> str:
    """Run the ladder for one open ``gpu_wedged`` incident; its resolution.
    ``with_serving``: its first rung restarts serving (decided with the budget)."""
    reason = watch.finding.summary
    restarted = with_serving
    if restarted:
        await host.serving.restart_after(incident_id, reason, kind=KIND)
        settle = host.config.detection.gpu_wedged_after
        if await wait_for(host, lambda: watch.gpu_answers(), settle):
            return await resolve(
                host, incident_id, KIND, Resolution.RECOVERED, "the GPU answers after a restart"
            )
    await incident_log.step(
        host.ledger,
        incident_id,
        StepName.STILL_WEDGED,
        node=watch.name,
        detail={"reason": reason, "serving_restarted": restarted},
    )
    device = ssh_device(watch)
    refused = await _reboot_blocked(host, watch, device)
    if refused is not None:
        blocked, for_a_person = refused
        if for_a_person:
            await host.holds.hold(watch, blocked, NodeEvent.HOLD, by_controller=True)
        return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, blocked)
    assert device is not None
    if watch.gpu_answers():
        return await resolve(host, incident_id, KIND, Resolution.RECOVERED, "the GPU answers again")
    return await _forced_reboot(host, watch, incident_id, device, reason)


async def _forced_reboot(
    host: GentleTools, watch: NodeWatch, incident_id: int, device: SshDevice, reason: str
) -> str:
    """The second rung: a forced reboot over SSH, recorded before it is sent,
    never repeated; then the wait for its boot."""
    ledger, store = host.ledger, host.ledger.store
    name = watch.name
    boot_before = watch.boot_id
    action = await ledger.write(
        store.record_action,
        name,
        "ssh_reboot",
        device=f"ssh {device.host}:{device.port}",
        incident_id=incident_id,
        rung=1,
        step=StepName.REBOOT_REQUESTED,
        step_detail={"boot_id_before": boot_before, "forced": True},
    )
    host.notifier.send(Event("forced_reboot", f"{name}: {reason}; forced reboot", name))
    # Before it leaves: a sysrq restart drops the host at once, without a goodbye
    # (the ssh session may hang until its own deadline), and the silence that
    # follows is a reboot for up to boot_timeout, not a freeze.
    watch.expect_reboot("a forced reboot was sent", host.clock.monotonic())
    attempt = await host.power.forced_reboot(device)
    if attempt.sent is False:
        watch.expect_reboot(None, host.clock.monotonic())  # certainly not sent: nothing to wait for
        await ledger.write(
            store.finish_action,
            action.id,
            "failed",
            error=attempt.detail,
            step=StepName.REBOOT_NOT_SENT,
            step_detail={"detail": attempt.detail},
        )
        why = f"gpu_wedged and the forced reboot was not sent ({attempt.detail}): a person decides"
        await host.holds.hold(watch, why, NodeEvent.HOLD, by_controller=True)
        return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, why)
    await incident_log.step(
        ledger,
        incident_id,
        StepName.REBOOT_SENT,
        node=name,
        detail={"detail": attempt.detail, "certain": attempt.sent is True},
    )
    return await _boot_wait(host, watch, incident_id, action.id, boot_before)


async def _reboot_blocked(
    host: GentleTools, watch: NodeWatch, device: SshDevice | None
) -> tuple[str, bool] | None:
    """Why no forced reboot now, and whether a person must decide (a hold);
    None: it may go. Another controller acting for the node holds nothing."""
    if device is None:
        return "gpu_wedged, and no ssh path to reboot it: a person decides", True
    stopped = power_blocked(
        await host.power.guards(watch, Action.FORCED_REBOOT), Action.FORCED_REBOOT
    )
    if stopped is None:
        return None
    if stopped.block is Block.NOT_MINE:
        return f"handed over: {stopped.reason}", False
    if stopped.block is Block.HELD:
        return f"{stopped.reason}: no forced reboot", True
    return f"gpu_wedged, and {stopped.reason}: a person decides", True


async def _boot_wait(
    host: GentleTools, watch: NodeWatch, incident_id: int, action_id: int, boot_before: str | None
) -> str:
    ledger, store = host.ledger, host.ledger.store
    name = watch.name
    timeout = host.config.guards.boot_timeout
    await incident_log.step(
        ledger,
        incident_id,
        StepName.BOOT_WAIT_STARTED,
        node=name,
        detail={"timeout_s": timeout, "boot_id_before": boot_before},
    )
    if await new_boot(host, watch, boot_before, timeout):
        await ledger.write(
            store.finish_action,
            action_id,
            "verified",
            step=StepName.NEW_BOOT_SEEN,
            step_detail={"boot_id": watch.boot_id, "boot_id_before": boot_before},
        )
        settle = host.config.detection.gpu_wedged_after
        if not await wait_for(host, lambda: watch.gpu_answers(), settle):
            why = (
                "the GPU is still wedged after a forced reboot: minutes without AC power may "
                "clear it; a person decides (power is never cut on a host showing life)"
            )
            await incident_log.step(
                ledger, incident_id, StepName.STILL_WEDGED, node=name, detail={"why": why}
            )
            await host.holds.hold(watch, why, NodeEvent.HOLD, by_controller=True)
            return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, why)
        # Bounded by the reboot budget, not the serving one (like a restart after a cycle).
        await host.serving.restart_after(incident_id, f"{name} rebooted", kind="forced_reboot")
        return await resolve(
            host, incident_id, KIND, Resolution.RECOVERED, "a new boot, the GPU answers"
        )
    if watch.shows_life(host.clock.monotonic(), host.config.detection.freeze_after):
        await ledger.write(
            store.finish_action,
            action_id,
            "failed",
            error="no new boot id, and the host still answers",
            step=StepName.BOOT_TIMEOUT,
            step_detail={"boot_id": watch.boot_id},
        )
        # It did not happen: nothing to wait for any more.
        watch.expect_reboot(None, host.clock.monotonic())
        why = (
            "gpu_wedged; the forced reboot brought no new boot and the host still answers: "
            "a person decides (power is never cut on a host showing life)"
        )
        await host.holds.hold(watch, why, NodeEvent.HOLD, by_controller=True)
        return await resolve(host, incident_id, KIND, Resolution.GAVE_UP, why)
    return await hand_over(host, watch, incident_id, action_id)


async def hand_over(
    host: GentleTools, watch: NodeWatch, incident_id: int, action_id: int | None
) -> str:
    """The host went silent: the freeze path (and its own incident) takes over."""
    ledger, store = host.ledger, host.ledger.store
    watch.leave_ladder(incident_id, NodeEvent.HANDED_TO_POWER)
    if action_id is not None:
        await ledger.write(
            store.finish_action, action_id, "ambiguous", error="the host went silent"
        )
    await incident_log.step(
        ledger,
        incident_id,
        StepName.HANDED_TO_POWER_PATH,
        node=watch.name,
        detail={"verdict": watch.finding.verdict.value},
    )
    return await resolve(
        host, incident_id, KIND, Resolution.GAVE_UP, "silent: handed to the power path"
    )
