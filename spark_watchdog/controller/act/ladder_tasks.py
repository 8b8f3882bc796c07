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
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from spark_watchdog.controller.act import unlatch, wedged
from spark_watchdog.controller.act.crew import Crew
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.ladder import open_incident
from spark_watchdog.controller.act.parts import Ladder
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution, close_dry_run
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.history.records import Incident
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")


def gentle_tools(crew: Crew) -> GentleTools:
    """Of the controller's parts, those a gentler ladder works with."""
    return GentleTools(
        crew.config, crew.clock, crew.ledger, crew.notifier, crew.holds, crew.power, crew.serving
    )


class WedgedLadders:
    """The wedged-but-alive ladder of each node, and its incident."""

    def __init__(self, host: Crew) -> None:
        self.host = host
        # The incident each node's ladder runs for (its task: host.work).
        self._incidents: dict[str, int] = {}

    async def hand_over(self, watch: NodeWatch) -> None:
        """The host went silent during its ladder: the ladder stops and the
        freeze path takes the node (controller/decide/decisions.py decided it)."""
        task = self.host.work.task(Ladder.UNWEDGING, watch.name)
        incident_id = self._incidents[watch.name]
        watch.leave_ladder(incident_id, NodeEvent.HANDED_TO_POWER)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, HistoryUnwritable):
                await task
        with contextlib.suppress(HistoryUnwritable):
            await wedged.hand_over(gentle_tools(self.host), watch, incident_id, None)

    async def start(self, watch: NodeWatch, *, with_serving: bool) -> None:
        """The ladder for a wedged GPU; ``with_serving``: its first rung restarts
        serving (not past the serving budget: controller/decide/decisions.py)."""
        host, ledger = self.host, self.host.ledger
        evidence = {
            "reasons": list(watch.finding.reasons),
            "agent_state": watch.snapshot,
            "flight_recorder": host.recorder.evidence(watch.name),
        }
        incident = await open_incident(host, wedged.KIND, watch, evidence, watch.gpu_timeout_wall)
        if incident is None:
            return
        host.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        if host.config.guards.dry_run:
            watch.conduct.dry_run_recorded(incident.id)
            await close_dry_run(
                ledger, incident.id, "restart serving, then a forced reboot over ssh"
            )
            return
        watch.apply(NodeEvent.WEDGED_CONFIRMED, incident=incident.id)
        task = asyncio.get_running_loop().create_task(
            self._run(watch, incident.id, with_serving), name=f"unwedge-{watch.name}"
        )
        host.work.add(Ladder.UNWEDGING, watch.name, task)
        self._incidents[watch.name] = incident.id

    async def _run(self, watch: NodeWatch, incident_id: int, with_serving: bool) -> str:
        host = self.host

        async def failed(exc: Exception) -> None:
            # Hold, record, a person decides.
            await host.holds.hold(
                watch, f"gpu_wedged ladder failed: {exc}", NodeEvent.HOLD, by_controller=True
            )

        try:
            return await _guarded(
                host,
                watch,
                incident_id,
                "gpu_wedged ladder",
                wedged.unwedge(gentle_tools(host), watch, incident_id, with_serving=with_serving),
                failed,
            )
        finally:
            watch.leave_ladder(incident_id)

    async def resume(self, incident: Incident) -> None:
        """A ladder cut short after its forced reboot may have left: the node's
        silence is still a reboot for boot_timeout, never a freeze to fence."""
        host = self.host
        steps = {s.step for s in await host.ledger.read(host.ledger.store.steps, incident.id)}
        sent = {StepName.REBOOT_REQUESTED, StepName.REBOOT_SENT} & steps
        for name in incident.nodes:
            watch = host.watches.get(name)
            if watch is not None and sent and StepName.NEW_BOOT_SEEN not in steps:
                watch.expect_reboot(
                    "a forced reboot may have been sent before a restart", host.clock.monotonic()
                )


class UnlatchLadders:
    """The clock latch: its alert, and its ladder, one node at a time."""

    def __init__(self, host: Crew) -> None:
        self.host = host

    def alert(self, watch: NodeWatch) -> None:
        """A boot whose GPU the agent found clock-latched: one critical alert
        (with policy.clock_latch_off_seconds, the unlatch ladder follows when
        the node is free: controller/decide/decisions.py)."""
        host = self.host
        boot = watch.clock_latched_boot
        watch.conduct.latch_alerted(boot)
        acting = host.config.policy.clock_latch_off_seconds > 0
        check = (watch.snapshot or {}).get("gpu_clock_check")
        evidence = dict(check) if isinstance(check, dict) else {}
        then = (
            f"the controller halts it and holds its AC off {unlatch.off_seconds(host.config):g}s"
            if acting and not host.config.guards.dry_run
            else "cut its AC for a few minutes (a reboot does not clear it)"
        )
        host.notifier.send(
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
        host, ledger = self.host, self.host.ledger
        check = (watch.snapshot or {}).get("gpu_clock_check")
        evidence = {
            "gpu_clock_check": dict(check) if isinstance(check, dict) else {},
            "boot_id": watch.clock_latched_boot,
            "flight_recorder": host.recorder.evidence(watch.name),
        }
        incident = await open_incident(host, unlatch.KIND, watch, evidence, None)
        if incident is None:
            return
        if host.config.guards.dry_run:
            await close_dry_run(
                ledger,
                incident.id,
                f"halt it over ssh, then hold its AC off {unlatch.off_seconds(host.config):g}s",
            )
            return
        watch.apply(NodeEvent.LATCH_CONFIRMED, incident=incident.id)
        task = asyncio.get_running_loop().create_task(
            self._run(watch, incident.id), name=f"unlatch-{watch.name}"
        )
        host.work.add(Ladder.UNLATCHING, watch.name, task)

    async def _run(self, watch: NodeWatch, incident_id: int) -> str:
        host = self.host

        async def failed(exc: Exception) -> None:
            # Alert; a person decides.
            host.notifier.send(
                Event(
                    "clock_latch_not_cleared",
                    f"{watch.name}: the clock latch ladder failed: {exc!r}",
                    watch.name,
                    incident_id,
                )
            )

        try:
            return await _guarded(
                host,
                watch,
                incident_id,
                "clock latch ladder",
                unlatch.unlatch(gentle_tools(host), watch, incident_id),
                failed,
            )
        finally:
            watch.leave_ladder(incident_id)

    async def resume(self, incident: Incident) -> None:
        """A halt for a clock latch may have left before a restart: the node's
        silence stays expected for boot_timeout and its next cut stays long;
        after the handover, only the long cut. The incident is closed by the
        caller (resume closes every gentle incident)."""
        host = self.host
        steps = await host.ledger.read(host.ledger.store.steps, incident.id)
        names = {s.step for s in steps}
        asked = [s for s in steps if s.step == StepName.HALT_REQUESTED]
        detail = asked[-1].detail if asked and isinstance(asked[-1].detail, dict) else {}
        off = detail.get("off_seconds")
        if not isinstance(off, (int, float)) or StepName.HALT_NOT_SENT in names:
            return
        for name in incident.nodes:
            watch = host.watches.get(name)
            if watch is None:
                continue
            boot = detail.get("boot_id")
            watch.arm_long_cut(float(off), boot if isinstance(boot, str) else None)
            watch.conduct.latch_answered(boot)  # this boot: not again
            if StepName.HANDED_TO_POWER_PATH not in names:
                watch.expect_reboot(
                    "a halt for the clock latch may have left", host.clock.monotonic()
                )


async def _guarded(
    host: Crew,
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
                host.ledger,
                incident_id,
                Resolution.GAVE_UP,
                detail={"why": f"the ladder failed: {exc!r}"},
            )
        return "gave_up"
