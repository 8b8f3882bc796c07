"""The gentler ladders as tasks of their own: when one starts, what it opens,
how it ends on an unexpected error, and what a restarted controller picks
up of one (docs/design.md, "Wedged but alive"; "Clock latch"; "Restart and
resume"). The ladders themselves are controller/act/wedged.py and
controller/act/unlatch.py; the freeze ladder is controller/act/recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.controller.act import unlatch, wedged
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.ladder import open_incident
from spark_watchdog.controller.act.parts import Ladder, Work
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Step
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution, close_dry_run
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.history.records import Incident
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")


@dataclass(eq=False)
class _Tasks:
    """What a gentler ladder's task works with: the ladder's own tools, the
    controller's work (every ladder's task), the node watches and the flight
    recorder (an incident's evidence), and nothing else."""

    tools: GentleTools
    work: Work
    watches: Mapping[str, NodeWatch]
    recorder: FlightRecorder


@dataclass(eq=False)
class WedgedLadders(_Tasks):
    """The wedged-but-alive ladder of each node, and its incident."""

    # The incident each node's ladder runs for (its task: self.work).
    _incidents: dict[str, int] = field(default_factory=dict, init=False)

    async def hand_over(self, watch: NodeWatch) -> None:
        """The host went silent during its ladder: the ladder stops and the
        freeze path takes the node (controller/decide/decisions.py decided it)."""
        task = self.work.task(Ladder.UNWEDGING, watch.name)
        incident_id = self._incidents[watch.name]
        watch.leave_ladder(incident_id, NodeEvent.HANDED_TO_POWER)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, HistoryUnwritable):
                await task
        with contextlib.suppress(HistoryUnwritable):
            await wedged.hand_over(self.tools, watch, incident_id, None)

    async def start(self, watch: NodeWatch, *, with_serving: bool) -> None:
        """The ladder for a wedged GPU; ``with_serving``: its first rung restarts
        serving (not past the serving budget: controller/decide/decisions.py)."""
        tools, ledger = self.tools, self.tools.ledger
        evidence = {
            "reasons": list(watch.finding.reasons),
            "agent_state": watch.snapshot,
            "flight_recorder": self.recorder.evidence(watch.name),
        }
        incident = await open_incident(tools, wedged.KIND, watch, evidence, watch.gpu_timeout_wall)
        if incident is None:
            return
        tools.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        if tools.config.guards.dry_run:
            watch.conduct.dry_run_recorded(incident.id, Step.UNWEDGE)
            await close_dry_run(
                ledger, incident.id, "restart serving, then a forced reboot over ssh"
            )
            return
        watch.apply(NodeEvent.WEDGED_CONFIRMED, incident=incident.id)
        task = asyncio.get_running_loop().create_task(
            self._run(watch, incident.id, with_serving), name=f"unwedge-{watch.name}"
        )
        self.work.add(Ladder.UNWEDGING, watch.name, task)
        self._incidents[watch.name] = incident.id

    async def _run(self, watch: NodeWatch, incident_id: int, with_serving: bool) -> str:
        tools = self.tools

        async def failed(exc: Exception) -> None:
            # Hold, record, a person decides.
            await tools.holds.hold(
                watch, f"gpu_wedged ladder failed: {exc}", NodeEvent.HOLD, by_controller=True
            )

        try:
            return await _guarded(
                tools,
                watch,
                incident_id,
                "gpu_wedged ladder",
                wedged.unwedge(self.tools, watch, incident_id, with_serving=with_serving),
                failed,
            )
        finally:
            watch.leave_ladder(incident_id)

    async def resume(self, incident: Incident) -> None:
        """A ladder cut short after its forced reboot may have left: the node's
        silence is still a reboot for boot_timeout, never a freeze to fence."""
        tools = self.tools
        steps = {s.step for s in await tools.ledger.read(tools.ledger.store.steps, incident.id)}
        sent = {StepName.REBOOT_REQUESTED, StepName.REBOOT_SENT} & steps
        for name in incident.nodes:
            watch = self.watches.get(name)
            if watch is not None and sent and StepName.NEW_BOOT_SEEN not in steps:
                watch.expect_reboot(
                    "a forced reboot may have been sent before a restart", tools.clock.monotonic()
                )


@dataclass(eq=False)
class UnlatchLadders(_Tasks):
    """The clock latch: its alert, and its ladder, one node at a time."""

    def alert(self, watch: NodeWatch) -> None:
        """A boot whose GPU the agent found clock-latched: one critical alert
        (with policy.clock_latch_off_seconds, the unlatch ladder follows when
        the node is free: controller/decide/decisions.py)."""
        tools = self.tools
        boot = watch.clock_latched_boot
        watch.conduct.latch_alerted(boot)
        acting = tools.config.policy.clock_latch_off_seconds > 0
        check = (watch.snapshot or {}).get("gpu_clock_check")
        evidence = dict(check) if isinstance(check, dict) else {}
        then = (
            f"the controller halts it and holds its AC off {unlatch.off_seconds(tools.config):g}s"
            if acting and not tools.config.guards.dry_run
            else "cut its AC for a few minutes (a reboot does not clear it)"
        )
        tools.notifier.send(
            Event(
                "clock_latched",
                f"{watch.name}: GPU clock latched on boot {boot} (busy, never above "
                f"{evidence.get('max_busy_sm_clock_mhz')} MHz of a "
                f"{evidence.get('floor_mhz')} MHz floor): the illegal memory access is "
                f"likely to return; {then}",
                watch.name,
                None,
                {"boot_id": boot, "check": evidence},
            )
        )

    async def start(self, watch: NodeWatch) -> None:
        """The unlatch ladder (a clean halt, then the power path's long cut:
        controller/act/unlatch.py), once per boot."""
        boot = watch.clock_latched_boot
        with contextlib.suppress(HistoryUnwritable):
            await self._start(watch)
            watch.conduct.latch_answered(boot)

    async def _start(self, watch: NodeWatch) -> None:
        tools, ledger = self.tools, self.tools.ledger
        check = (watch.snapshot or {}).get("gpu_clock_check")
        evidence = {
            "gpu_clock_check": dict(check) if isinstance(check, dict) else {},
            "boot_id": watch.clock_latched_boot,
            "flight_recorder": self.recorder.evidence(watch.name),
        }
        incident = await open_incident(tools, unlatch.KIND, watch, evidence, None)
        if incident is None:
            return
        if tools.config.guards.dry_run:
            await close_dry_run(
                ledger,
                incident.id,
                f"halt it over ssh, then hold its AC off {unlatch.off_seconds(tools.config):g}s",
            )
            return
        watch.apply(NodeEvent.LATCH_CONFIRMED, incident=incident.id)
        task = asyncio.get_running_loop().create_task(
            self._run(watch, incident.id), name=f"unlatch-{watch.name}"
        )
        self.work.add(Ladder.UNLATCHING, watch.name, task)

    async def _run(self, watch: NodeWatch, incident_id: int) -> str:
        tools = self.tools

        async def failed(exc: Exception) -> None:
            # Alert; a person decides.
            tools.notifier.send(
                Event(
                    "clock_latch_not_cleared",
                    f"{watch.name}: the clock latch ladder failed: {exc!r}",
                    watch.name,
                    incident_id,
                )
            )

        try:
            return await _guarded(
                tools,
                watch,
                incident_id,
                "clock latch ladder",
                unlatch.unlatch(self.tools, watch, incident_id),
                failed,
            )
        finally:
            watch.leave_ladder(incident_id)

    async def resume(self, incident: Incident) -> None:
        """A halt for a clock latch may have left before a restart: the node's
        silence stays expected for boot_timeout and its next cut stays long;
        after the handover, only the long cut. The incident is closed by the
        caller (resume closes every gentle incident)."""
        tools = self.tools
        steps = await tools.ledger.read(tools.ledger.store.steps, incident.id)
        names = {s.step for s in steps}
        asked = [s for s in steps if s.step == StepName.HALT_REQUESTED]
        detail = asked[-1].detail if asked and isinstance(asked[-1].detail, dict) else {}
        off = detail.get("off_seconds")
        if not isinstance(off, (int, float)) or StepName.HALT_NOT_SENT in names:
            return
        for name in incident.nodes:
            watch = self.watches.get(name)
            if watch is None:
                continue
            boot = detail.get("boot_id")
            watch.arm_long_cut(float(off), boot if isinstance(boot, str) else None)
            watch.conduct.latch_answered(boot)  # this boot: not again
            if StepName.HANDED_TO_POWER_PATH not in names:
                watch.expect_reboot(
                    "a halt for the clock latch may have left", tools.clock.monotonic()
                )


async def _guarded(
    tools: GentleTools,
    watch: NodeWatch,
    incident_id: int,
    what: str,
    ladder: Coroutine[Any, Any, str],
    failed: Callable[[Exception], Awaitable[None]],
) -> str:
    """Run a gentle ladder to its outcome.

    The history unwritable stops it (``unrecorded``): a forced reboot or halt
    that may have left keeps the node's silence expected (and a halt's long
    cut armed), and the freeze path takes a host that stays silent. An
    unexpected error is never guessed past: ``failed`` (a hold, an alert),
    then the incident closed as ``gave_up``.
    """
    try:
        return await ladder
    except HistoryUnwritable as exc:
        log.warning("%s: %s stopped: %s", watch.name, what, exc)
        return "unrecorded"
    except Exception as exc:
        log.exception("%s: %s failed", watch.name, what)
        with contextlib.suppress(HistoryUnwritable):
            await failed(exc)
            await incident_log.resolve(
                tools.ledger,
                incident_id,
                Resolution.GAVE_UP,
                detail={"why": f"the ladder failed: {exc!r}"},
            )
        return "gave_up"
