"""The escalation ladder for ``host_frozen``, step by recorded step (DESIGN §4).

For each power path of the node, in the configured order: record, re-check
that the host is still frozen, cycle it (off, verify, hold, on, verify),
then wait for the agent to answer with a *new boot id*. A verified cycle is
not a recovery; a new boot is. After the last path the node is held and a
person decides.

Every step is committed to the history before it is taken, so a controller
killed halfway resumes from the record after re-reading the power state,
and never repeats a completed off or on, nor runs a rung twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.node_states import NodeEvent, NodeState
from spark_watchdog.controller.node_watch import NodeWatch
from spark_watchdog.controller.notify import Event, Notifier
from spark_watchdog.errors import Ambiguous, PowerError
from spark_watchdog.history.records import IncidentStep
from spark_watchdog.power.base import PowerState, PowerStep, VerifiedPower
from spark_watchdog.power.paths import PowerPath, close_backend, power_paths

log = logging.getLogger("spark_watchdog.controller")

PowerFactory = Callable[[PowerPath, Callable[[PowerStep], Awaitable[None]]], VerifiedPower]

# Steps after which power may be off and the on not yet verified.
_OFF_SIDE = ("off_verified", "already_off", "hold_started", "hold_done", "spacing")


class RecoveryHost(Protocol):
    """What the ladder needs from the running controller."""

    config: ControllerConfig
    ledger: Ledger
    notifier: Notifier
    power_factory: PowerFactory

    async def still_frozen(self, watch: NodeWatch) -> tuple[bool, str]: ...

    async def record_boots(self, watch: NodeWatch, incident_id: int) -> None: ...

    async def restart_serving_after(self, incident_id: int, reason: str) -> bool: ...

    def power_slot(self) -> asyncio.Semaphore: ...

    async def hold_node(self, watch: NodeWatch, reason: str, event: NodeEvent) -> None: ...


@dataclass
class RungPlan:
    """Where to (re)start a rung: from the top, or resuming after a crash."""

    rung: int
    resume_from: str | None = None  # the last recorded step of this rung
    off_verified_at: float | None = None  # wall clock, from the record
    action_id: int | None = None  # the rung's action row, when it was recorded
    boot_before: str | None = None  # the frozen boot's id: recovery means another one


@dataclass(frozen=True)
class _ActionRef:
    id: int


@dataclass
class ResumeInfo:
    """What an incident's log says about where a killed controller stopped."""

    plan: RungPlan | None
    rungs_done: set[int]
    phase: str  # "ladder" | "boot_wait" | "serving"
    boot_before: str | None = None
    restored_at: float | None = None


def rungs_of(config: ControllerConfig, watch: NodeWatch) -> list[PowerPath]:
    """The node's power paths that can reach a frozen host (SSH cannot)."""
    node = config.node(watch.name)
    return [p for p in power_paths(config, node) if not p.is_soft]


async def recover_frozen_host(
    host: RecoveryHost, watch: NodeWatch, incident_id: int, start: RungPlan | None = None
) -> str:
    """Run the ladder for one incident; returns the resolution or "held"."""
    paths = rungs_of(host.config, watch)
    plan = start
    while True:
        if plan is None:
            remaining = [i for i in range(len(paths)) if i not in watch.rungs_done]
            if not remaining:
                await _give_up(host, watch, incident_id, "every power path was tried")
                return "gave_up"
            plan = RungPlan(remaining[0])
        outcome = await _run_rung(host, watch, incident_id, paths[plan.rung], plan)
        plan_rung, plan = plan.rung, None
        if outcome in ("recovered", "false_alarm"):
            # The incident is over: the node's next freeze starts from the first rung.
            watch.rungs_done.clear()
            return outcome
        watch.rungs_done.add(plan_rung)
        if outcome == "held":
            return outcome
        # "next": this rung failed or the boot never came; a later rung remains?
        if any(i not in watch.rungs_done for i in range(len(paths))):
            watch.apply(
                NodeEvent.RUNG_FAILED
                if watch.state is NodeState.FENCING
                else NodeEvent.BOOT_TIMEOUT
            )


async def _run_rung(
    host: RecoveryHost, watch: NodeWatch, incident_id: int, path: PowerPath, plan: RungPlan
) -> str:
    ledger, node = host.ledger, watch.name
    off_seconds = host.config.policy.power_off_seconds

    async def write_ahead(step: PowerStep) -> None:
        # Awaited by VerifiedPower *before* each command leaves.
        await ledger.write(
            ledger.store.add_step,
            incident_id,
            step.name,
            node=node,
            detail={"rung": plan.rung, "device": path.key_path, "detail": step.detail},
        )

    power = host.power_factory(path, write_ahead)
    if plan.boot_before is None:
        plan.boot_before = watch.boot_id
    action: Any = None
    async with host.power_slot():
        try:
            hold = await ledger.read(ledger.store.active_hold, node)
            if hold is not None and plan.resume_from in (None, "rung_started"):
                # An operator hold stops every new command (restoring power
                # that was already cut is not a new command, see below).
                await ledger.write(
                    ledger.store.add_step,
                    incident_id,
                    "rung_skipped_held",
                    node=node,
                    detail={"hold": hold.reason},
                )
                await host.hold_node(watch, hold.reason, NodeEvent.HOLD)
                return "held"
            if plan.resume_from in (None, "rung_started"):
                frozen, why = await host.still_frozen(watch)
                if not frozen:
                    # The host answered before any command was sent.
                    await ledger.write(
                        ledger.store.add_step,
                        incident_id,
                        "preflight_answered",
                        node=node,
                        detail={"why": why},
                    )
                    if plan.action_id is not None:
                        await _finish(ledger, _ActionRef(plan.action_id), "failed", why)
                    await ledger.write(
                        ledger.store.resolve_incident,
                        incident_id,
                        "false_alarm",
                        detail={"why": why},
                    )
                    watch.incident_id = None
                    watch.apply(NodeEvent.FALSE_ALARM)
                    host.notifier.send(
                        Event("false_alarm", f"{node}: {why}; no power action", node, incident_id)
                    )
                    return "false_alarm"
                if plan.resume_from is None:
                    action = await ledger.write(
                        ledger.store.record_action,
                        node,
                        "cycle",
                        device=power.name,
                        incident_id=incident_id,
                        rung=plan.rung,
                        step="rung_started",
                        step_detail={"rung": plan.rung, "boot_id_before": watch.boot_id},
                    )
                elif plan.action_id is not None:
                    action = _ActionRef(plan.action_id)
                host.notifier.send(
                    Event(
                        "power_action",
                        f"{node}: power cycle via {power.name}",
                        node,
                        incident_id,
                        {"rung": plan.rung + 1},
                    )
                )
                result = await power.cycle(off_seconds)
                held_s = result.off_held_s
            else:
                if plan.action_id is not None:
                    action = _ActionRef(plan.action_id)
                held_s = await _resume_cycle(host, watch, incident_id, power, plan, off_seconds)
        except HistoryUnwritable as exc:
            await host.hold_node(watch, f"history unwritable: {exc}", NodeEvent.HOLD)
            return "held"
        except Ambiguous as exc:
            await _finish(ledger, action, "ambiguous", str(exc))
            host.notifier.send(Event("ambiguous_power", f"{node}: {exc}", node, incident_id))
            await host.hold_node(
                watch, f"power outcome unknown: {exc.message}", NodeEvent.AMBIGUOUS
            )
            return "held"
        except PowerError as exc:
            await _finish(ledger, action, "failed", str(exc))
            await ledger.write(
                ledger.store.add_step,
                incident_id,
                "rung_failed",
                node=node,
                detail={"rung": plan.rung, "error": str(exc)},
            )
            host.notifier.send(Event("power_action_failed", f"{node}: {exc}", node, incident_id))
            return "next"
        finally:
            # Every way out of the rung releases the device's sockets.
            await close_backend(power.backend)
    await _finish(
        ledger, action, "verified", None, step="power_restored", detail={"off_held_s": held_s}
    )
    if action is None:
        await ledger.write(
            ledger.store.add_step,
            incident_id,
            "power_restored",
            node=node,
            detail={"off_held_s": held_s, "resumed": True},
        )
    watch.apply(NodeEvent.POWER_RESTORED)
    host.notifier.send(
        Event("power_restored", f"{node}: power restored via {power.name}", node, incident_id)
    )
    return await await_new_boot(host, watch, incident_id, time.time(), plan.boot_before)


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


async def _resume_cycle(
    host: RecoveryHost,
    watch: NodeWatch,
    incident_id: int,
    power: VerifiedPower,
    plan: RungPlan,
    off_seconds: float,
) -> float | None:
    """Finish a cycle a killed controller left halfway; None means hold."""
    ledger, node, last = host.ledger, watch.name, plan.resume_from
    state = await power.state()
    await ledger.write(
        ledger.store.add_step,
        incident_id,
        "resumed",
        node=node,
        detail={"last_step": last, "state": state.value},
    )
    if last in ("off_requested", "off_ambiguous"):
        if state is not PowerState.OFF:
            # The off may or may not have landed; a second off is never sent.
            raise Ambiguous(
                power.name,
                f"resumed after {last}, but the outlet reads {state.value}: a person must decide",
            )
        plan = RungPlan(plan.rung, "off_verified", time.time())
        last = "off_verified"
    if last in _OFF_SIDE:
        if state is PowerState.OFF:
            since = plan.off_verified_at or time.time()
            remaining = max(0.0, off_seconds - (time.time() - since))
            await ledger.write(
                ledger.store.add_step,
                incident_id,
                "hold_started",
                node=node,
                detail={"remaining_s": round(remaining, 1), "resumed": True},
            )
            await asyncio.sleep(remaining)
            await ledger.write(ledger.store.add_step, incident_id, "hold_done", node=node)
            await power.on()
        return off_seconds
    if last in ("on_requested", "on_ambiguous"):
        if state is not PowerState.ON:
            # Turning an off outlet on cannot hurt a healthy node: it has no power.
            await power.on()
        return off_seconds
    # on_verified / power_restored: only the boot wait remains.
    return off_seconds


async def await_new_boot(
    host: RecoveryHost,
    watch: NodeWatch,
    incident_id: int,
    restored_at: float,
    boot_before: str | None = None,
) -> str:
    ledger, node = host.ledger, watch.name
    before = boot_before if boot_before is not None else watch.boot_id
    timeout = host.config.guards.boot_timeout
    await ledger.write(
        ledger.store.add_step,
        incident_id,
        "boot_wait_started",
        node=node,
        detail={"boot_id_before": before, "timeout_s": timeout},
    )
    deadline = restored_at + timeout
    while time.time() < deadline:
        if watch.boot_id is not None and watch.boot_id != before and watch.snapshot is not None:
            await ledger.write(
                ledger.store.add_step,
                incident_id,
                "new_boot_seen",
                node=node,
                detail={"boot_id": watch.boot_id, "boot_id_before": before},
            )
            watch.apply(NodeEvent.NEW_BOOT)
            await host.record_boots(watch, incident_id)
            return await finish_recovery(host, watch, incident_id)
        await asyncio.sleep(0.25)
    await ledger.write(
        ledger.store.add_step, incident_id, "boot_timeout", node=node, detail={"timeout_s": timeout}
    )
    host.notifier.send(
        Event("boot_timeout", f"{node}: no new boot within {timeout:g}s", node, incident_id)
    )
    return "next"


async def finish_recovery(host: RecoveryHost, watch: NodeWatch, incident_id: int) -> str:
    await host.restart_serving_after(incident_id, f"{watch.name} recovered from host_frozen")
    incident = await host.ledger.write(
        host.ledger.store.resolve_incident,
        incident_id,
        "recovered",
        detail={"boot_id": watch.boot_id},
    )
    watch.incident_id = None
    watch.rungs_done.clear()
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
    return "recovered"


async def _give_up(host: RecoveryHost, watch: NodeWatch, incident_id: int, why: str) -> None:
    await host.ledger.write(
        host.ledger.store.resolve_incident, incident_id, "gave_up", detail={"why": why}
    )
    host.notifier.send(
        Event(
            "gave_up", f"{watch.name}: gave up ({why}); held for a person", watch.name, incident_id
        )
    )
    watch.incident_id = None
    await host.hold_node(watch, f"gave up: {why}", NodeEvent.LADDER_EXHAUSTED)


def resume_plan(steps: Sequence[IncidentStep], node: str) -> ResumeInfo:
    """Read an incident's log: the rung to resume, the rungs done, and the phase.

    Phases: "ladder" (resume or continue the ladder), "boot_wait" (power was
    restored; wait for the new boot), "serving" (the node is back; finish).
    """
    info = ResumeInfo(None, set(), "ladder")
    current: RungPlan | None = None
    for step in steps:
        if step.node not in (node, None):
            continue
        detail = step.detail if isinstance(step.detail, dict) else {}
        rung = detail.get("rung")
        if step.step == "rung_started" and isinstance(rung, int):
            if current is not None:
                info.rungs_done.add(current.rung)
            action_id = detail.get("action_id")
            before = detail.get("boot_id_before")
            info.boot_before = before if isinstance(before, str) else None
            current = RungPlan(
                rung,
                "rung_started",
                None,
                action_id if isinstance(action_id, int) else None,
                info.boot_before,
            )
            info.phase = "ladder"
        elif step.step in ("rung_failed", "boot_timeout") and current is not None:
            info.rungs_done.add(current.rung)
            current, info.phase = None, "ladder"
        elif step.step == "power_restored":
            info.phase, info.restored_at = "boot_wait", step.at
            if current is not None:
                info.rungs_done.add(current.rung)
        elif step.step == "new_boot_seen":
            info.phase = "serving"
        elif current is not None and step.step in (
            "off_requested",
            "off_ambiguous",
            "off_verified",
            "already_off",
            "hold_started",
            "hold_done",
            "spacing",
            "on_requested",
            "on_ambiguous",
            "on_verified",
        ):
            current.resume_from = step.step
            if step.step in ("off_verified", "already_off"):
                current.off_verified_at = step.at
    if info.phase == "ladder":
        info.plan = current
    return info
