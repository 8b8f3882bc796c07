"""The freeze path's act side: a frozen host's incident, opened, recovered, resumed.

``start`` opens the ``host_frozen`` incident (its evidence: the reasons, the
agent's last state, the flight recorder) and starts the freeze ladder
(controller/act/recovery.py) as a task of its own; ``record_dry_run`` writes
what would have been done instead. ``resume_incident`` continues an open
incident from its record after a restart or a takeover, through the same
ladder and the same preflight; ``supersede`` closes an older one of the same
node. ``refresh_offenders`` keeps each node's freezes and cycles from the
history and alerts once on a node whose hardware looks at fault.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from spark_watchdog.controller.act.parts import Ladder, Work
from spark_watchdog.controller.act.recovery import FreezeLadder, FreezeTools, RungOutcome
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.decide.planner import Step
from spark_watchdog.controller.decide.resume_plan import Phase, ResumeInfo, resume_plan
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.look.rank_kills import live_faults
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.errors import IncidentAlreadyOpen
from spark_watchdog.history.records import Incident
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")

# How often the repeat-offender counts are read again from the history.
OFFENDERS_REFRESH_S = 300.0


class FreezePath:
    """Each frozen host's incident and its ladder's task. Takes the ladder's
    tools, the work table (every ladder's task), the node watches and the
    fence (a pair's lease), and nothing else."""

    def __init__(
        self, tools: FreezeTools, work: Work, watches: Mapping[str, NodeWatch], fence: Fence
    ) -> None:
        self.tools, self.work, self.watches, self.fence = tools, work, watches, fence
        # When the repeat-offender counts were last read from the history (monotonic).
        self._offenders_read_at = float("-inf")

    async def start(self, watch: NodeWatch) -> None:
        try:
            incident = await self._open_incident(watch)
        except HistoryUnwritable as exc:
            await self.tools.holds.hold(
                watch, f"history unwritable: {exc}", NodeEvent.HOLD, record=False
            )
            return
        if incident is None:
            return
        watch.conduct.incident_opened(incident.id)
        watch.apply(NodeEvent.FROZEN_CONFIRMED)
        self._offenders_read_at = float("-inf")  # this freeze counts at the next tick
        self.tools.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        self._spawn(watch, incident.id, None)

    def _evidence(self, watch: NodeWatch) -> dict[str, Any]:
        """What a frozen host's incident keeps of what was seen before it."""
        return {
            "reasons": list(watch.finding.reasons),
            "last_agent_state": watch.snapshot,
            "boot_id": watch.boot_id,
            "banner": watch.banner_detail,
            "flight_recorder": self.tools.monitor.recorder.evidence(watch.name),
            # What the agent told of its GPU before the silence: often all there is.
            "live_gpu_faults": live_faults(watch.snapshot, watch.agent_progress_wall),
        }

    async def _open_incident(self, watch: NodeWatch) -> Incident | None:
        try:
            incident: Incident = await incident_log.open_incident(
                self.tools.ledger,
                "host_frozen",
                [watch.name],
                evidence=self._evidence(watch),
                fault_onset=watch.agent_progress_wall,
            )
        except IncidentAlreadyOpen as exc:
            # Ours would be running (and _act would not get here): a leftover.
            log.error("%s: %s; not opening another", watch.name, exc)
            await self.tools.holds.hold(
                watch,
                f"incident #{exc.incident_id} is still open: a person decides",
                NodeEvent.HOLD,
                by_controller=True,
            )
            return None
        return incident

    def _spawn(self, watch: NodeWatch, incident_id: int, resume: ResumeInfo | None) -> None:
        task = asyncio.get_running_loop().create_task(
            FreezeLadder(self.tools, watch, incident_id).run(resume),
            name=f"recover-{watch.name}",
        )
        self.work.add(Ladder.FENCING, watch.name, task)
        task.add_done_callback(lambda t: self._done(watch, t))

    def _done(self, watch: NodeWatch, task: asyncio.Task[RungOutcome]) -> None:
        if task.cancelled():
            return
        # The cycles it took count at the next tick, not OFFENDERS_REFRESH_S later.
        self._offenders_read_at = float("-inf")
        error = task.exception()
        if error is not None:
            # FreezeLadder.run holds on every error it sees; this is the last net.
            log.error("%s: recovery failed: %r", watch.name, error, exc_info=error)
            watch.conduct.held(by_controller=True)
            watch.apply(NodeEvent.RECOVERY_FAILED, reason=f"recovery failed: {error}")
            self.tools.notifier.send(
                Event("held", f"{watch.name}: recovery failed: {error}", watch.name)
            )

    async def record_dry_run(self, watch: NodeWatch, reason: str) -> None:
        """One dry-run incident for this spell (decided once: controller/decide/decisions.py)."""
        rungs = self.tools.power.rungs[watch.name]
        incident = await incident_log.open_incident(
            self.tools.ledger,
            "host_frozen",
            [watch.name],
            evidence=self._evidence(watch),
            fault_onset=watch.agent_progress_wall,
            dry_run=True,
        )
        watch.conduct.dry_run_recorded(incident.id, Step.RECORD_DRY_RUN)
        await self.tools.ledger.write(
            self.tools.ledger.store.record_action,
            watch.name,
            "cycle",
            device=f"power path {rungs[0].path.key_path}" if rungs else "none",
            incident_id=incident.id,
            rung=0,
            dry_run=True,
            step=StepName.DRY_RUN,
            step_detail={"decision": reason},
        )
        self.tools.notifier.send(
            Event(
                "incident_opened",
                f"{watch.name} {watch.finding.summary} (dry run: {reason})",
                watch.name,
                incident.id,
            )
        )
        await incident_log.resolve(
            self.tools.ledger,
            incident.id,
            Resolution.FALSE_ALARM,
            detail={"dry_run": True},
        )

    async def resume_incident(self, watch: NodeWatch, incident_id: int) -> None:
        """Continue one open incident from its record: the same code as a fresh one."""
        if self.fence.deposed():
            return  # a pair's lost lease: the incident is the new leader's to resume
        name = watch.name
        steps = await self.tools.ledger.read(self.tools.ledger.store.steps, incident_id)
        info = resume_plan(steps, name)
        watch.conduct.incident_resumed(incident_id, info.rungs_done)
        log.info("%s: resuming incident #%d (%s)", name, incident_id, info.phase.value)
        if self.tools.config.guards.dry_run:
            # Dry run sends nothing, not even an on: a person finishes this one.
            await self.tools.holds.hold(
                watch,
                f"incident #{incident_id} is open and the controller runs in dry run "
                f"({info.phase.value}); check the outlet",
                NodeEvent.HOLD,
                by_controller=True,
            )
            watch.conduct.incident_handed_over()
            await incident_log.resolve(
                self.tools.ledger,
                incident_id,
                Resolution.GAVE_UP,
                detail={"why": "the controller runs in dry run: held for a person"},
            )
            return
        if info.phase is Phase.BOOT_WAIT:
            watch.apply(NodeEvent.RESUMED_BOOT_WAIT)
        elif info.phase is Phase.LADDER:
            watch.apply(NodeEvent.RESUMED_LADDER)
        self._spawn(watch, incident_id, info)

    async def supersede(self, older: Incident, newer: Incident) -> None:
        await incident_log.supersede(self.tools.ledger, older.id, newer.id)

    async def refresh_offenders(self) -> None:
        """Freezes per node within suspect_window and cycles ever, from the history:
        every OFFENDERS_REFRESH_S, and after each freeze incident opens. A node that
        becomes hardware_suspect gets one alert."""
        now = self.tools.clock.monotonic()
        if now - self._offenders_read_at < OFFENDERS_REFRESH_S:
            return
        guards = self.tools.config.guards
        try:
            freezes, cycles = await self.tools.ledger.read(
                self.tools.ledger.store.repeat_offenders,
                self.tools.clock.time() - guards.suspect_window,
            )
        except HistoryUnwritable:
            return
        self._offenders_read_at = now
        for name, watch in self.watches.items():
            count = freezes.get(name, 0)
            suspect = count >= guards.suspect_freezes
            if suspect and not watch.conduct.hardware_suspect:
                self.tools.notifier.send(
                    Event(
                        "hardware_suspect",
                        f"{name} froze {count} times within "
                        f"{guards.suspect_window:g}s: the hardware may be at fault (GPU, PSU, "
                        "cable, the outlet); power cycles only treat the symptom",
                        name,
                    )
                )
            watch.conduct.offender_counts(count, cycles.get(name, 0), suspect=suspect)
