"""The memory guard at work on a node: readings in, a kill of the rank out.

:class:`MemoryWatch` feeds each host reading (and the rate of
``NV_ERR_NO_MEMORY`` lines from the journal probe) to the pure
:class:`~spark_watchdog.agent.memory_guard.MemoryGuard`. When it trips, the
rank's whole process group is killed at once with SIGKILL, here, without
asking the controller: the host has seconds left, and the controller may not
be reachable. Killed are the launcher's group (``serving.enabled``) and every
group holding a process that matches ``probes.vllm.process_match``.

Each kill is kept with its evidence (the reasons, the slope, the last
readings, what was signalled) in ``memory_guard.last_kill`` of ``/v1/state``,
logged at error level, and noted in the serving log. The controller opens a
``memory_exhausted`` incident from it and restarts serving with the safe
profile (docs/design.md, "Memory guard").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from spark_watchdog.agent.memory_guard import (
    GIB,
    Assessment,
    GuardPolicy,
    MemoryGuard,
    MemorySample,
)
from spark_watchdog.agent.probe_runner import iso_time
from spark_watchdog.agent.rank_kill import kill_groups, matching_groups
from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import MemoryGuardConfig
from spark_watchdog.probes.host import HostReading
from spark_watchdog.probes.journal import JournalReport

log = logging.getLogger("spark_watchdog.agent.memory_guard")

# Readings kept in a kill's evidence (one per agent loop: the last ~10 s).
EVIDENCE_READINGS = 10


def policy_of(config: MemoryGuardConfig) -> GuardPolicy:
    return GuardPolicy(
        floor_bytes=config.floor_gib * GIB,
        watch_below_bytes=config.watch_below_gib * GIB,
        lead_time_s=config.lead_time,
        min_fall_bytes_per_s=config.min_fall_gib_per_s * GIB,
        slope_window_s=config.slope_window,
        psi_full=config.psi_full,
        no_memory_per_min=config.no_memory_per_min,
        confirm=config.confirm,
        rearm_after_s=config.rearm_after,
    )


class MemoryWatch:
    def __init__(
        self,
        config: MemoryGuardConfig,
        *,
        launcher: ServingLauncher | None,
        process_match: str | None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.guard = MemoryGuard(policy_of(config))
        self.launcher = launcher
        self.process_match = process_match
        self._wall = wall
        self.latest: Assessment | None = None
        self.kills = 0
        self.last_kill: dict[str, Any] | None = None
        # (monotonic time, boot id, NV_ERR_NO_MEMORY count) of the last journal report
        self._journal_mark: tuple[float, str, int] | None = None
        self.no_memory_per_min: float | None = None

    def note_journal(self, report: JournalReport, now: float) -> None:
        """The rate of NV_ERR_NO_MEMORY lines in this boot, between two journal reports."""
        boot = report.current_boot
        if boot is None:
            return
        count = int(boot.evidence_counts.get("nv_err_no_memory", 0))
        mark = self._journal_mark
        self._journal_mark = (now, boot.boot_id, count)
        if mark is None or mark[1] != boot.boot_id or now <= mark[0]:
            self.no_memory_per_min = None
            return
        self.no_memory_per_min = max(0, count - mark[2]) * 60.0 / (now - mark[0])

    def observe(self, reading: HostReading, now: float) -> Assessment:
        sample = MemorySample(
            now,
            reading.mem_available_bytes,
            reading.mem_pressure_full_avg10,
            self.no_memory_per_min,
        )
        assessment = self.guard.observe(sample)
        self.latest = assessment
        if assessment.trip:
            self._kill(assessment, now)
        return assessment

    def _kill(self, assessment: Assessment, now: float) -> None:
        killed: list[dict[str, Any]] = []
        if self.launcher is not None:
            group = self.launcher.kill_now("memory_guard")
            if group is not None:
                killed.append({**group, "by": "launcher"})
        if self.process_match:
            groups = matching_groups(self.process_match)
            for done in killed:
                if "pgid" in done:  # a container's processes are in no group of ours
                    groups.pop(done["pgid"], None)
            killed.extend({**k, "by": "process_match"} for k in kill_groups(groups))
        signalled = [k for k in killed if "error" not in k]
        result = "killed" if signalled else ("failed" if killed else "nothing_to_kill")
        self.kills += 1
        readings = list(self.guard.recent)[-EVIDENCE_READINGS:]
        wall = self._wall()
        judged = assessment.to_json()
        self.last_kill = {
            "id": self.kills,
            "at": iso_time(wall),
            "at_unix": round(wall, 3),
            "result": result,
            "reasons": list(assessment.reasons),
            "slope_bytes_per_s": judged["slope_bytes_per_s"],
            "seconds_to_floor": judged["seconds_to_floor"],
            "readings": [_reading_json(r, now) for r in readings],
            "killed": killed,
        }
        log.error(
            "memory guard: %s; %s the rank (%s)",
            "; ".join(assessment.reasons),
            {"killed": "SIGKILL to", "failed": "could not kill", "nothing_to_kill": "no"}[result],
            ", ".join(_what(k) for k in killed) or "nothing of it runs",
            extra={"memory_guard": result},
        )

    def to_json(self) -> dict[str, Any]:
        latest = self.latest
        return {
            "enabled": True,
            "state": "pending" if latest is None else latest.state,
            "assessment": None if latest is None else latest.to_json(),
            "no_memory_per_min": None
            if self.no_memory_per_min is None
            else round(self.no_memory_per_min, 1),
            "kills": self.kills,
            "last_kill": self.last_kill,
        }


def disabled_json() -> dict[str, Any]:
    return {
        "enabled": False,
        "state": "disabled",
        "assessment": None,
        "no_memory_per_min": None,
        "kills": 0,
        "last_kill": None,
    }


def _reading_json(sample: MemorySample, now: float) -> dict[str, Any]:
    body = sample.to_json()
    del body["at"]
    return {"ago_s": round(now - sample.at, 2), **body}


def _what(killed: dict[str, Any]) -> str:
    """One kill as a log line names it: a process group, or the rank's container."""
    if "pgid" in killed:
        return f"group {killed['pgid']}"
    return f"container {(killed.get('container') or {}).get('name')}"
