"""The live GPU faults of this boot, and what became of the rank
(docs/design.md, "Live GPU faults").

The GPU probe's worker watches NVML's event set for Xid critical errors and
hands the events on with each reading (probes/xid_events.py). Each event
becomes a fault of this log: numbered (per agent start), timed, and, for an
Xid that ends the faulting process's CUDA context (spark_watchdog/xid.py),
the serving rank stopped at once: its context is dead anyway, and a rank
left running may hold the GPU. Any other Xid is evidence only. ``/v1/state``
carries the log (``gpu_faults``), bounded; a flood is counted and logged at
most once a minute, never acted on past the first fault of a read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from spark_watchdog.agent.rank import ServingConflict, StopFailed
from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.probes.xid_events import XidReport
from spark_watchdog.xid import describe, ends_the_context

log = logging.getLogger("spark_watchdog.agent")

# Faults kept for /v1/state (the newest); older ones are counted as dropped.
FAULTS_KEPT = 32
FLOOD_LOG_EVERY_S = 60.0

# What stopping the rank came to: "stopped", "stop_failed", or "no_rank" (the
# agent runs no rank here, or none is running).
StopRank = Callable[[], Awaitable[str]]


class GpuFaultLog:
    def __init__(self, stop_rank: StopRank, clock: Callable[[], float] = time.monotonic) -> None:
        self._stop_rank = stop_rank
        self._clock = clock
        self.watcher = "off"
        self.detail: str | None = None
        self._faults: deque[dict[str, Any]] = deque(maxlen=FAULTS_KEPT)
        self._count = 0
        self.dropped = 0
        self.malformed = 0
        self._flood_logged_at = float("-inf")
        self._tasks: set[asyncio.Task[None]] = set()

    def take_soon(self, report: XidReport | None) -> None:
        """``take`` in a task of its own on the running loop: the probe's report
        hook does not wait for the rank's stop."""
        if report is None:
            return
        task = asyncio.get_running_loop().create_task(self.take(report))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def take(self, report: XidReport | None) -> None:
        """One reading's Xid report: the watcher's state, and each event as a fault."""
        if report is None:
            return
        if report.watcher != self.watcher and report.watcher in ("refused", "failed"):
            log.warning("GPU fault watcher %s: %s", report.watcher, report.detail)
        self.watcher, self.detail = report.watcher, report.detail
        self.dropped += report.dropped
        self.malformed += report.malformed
        stopped = False
        for event in report.events:
            self._count += 1
            fault: dict[str, Any] = {
                "id": self._count,
                "xid": event.xid,
                "what": describe(event.xid),
                "at_unix": event.at_unix,
                "gpu": event.gpu,
                "result": "evidence",
            }
            if ends_the_context(event.xid):
                # One stop answers every fault of this read: the rank is one.
                fault["result"] = "stopped" if stopped else await self._stop_rank()
                stopped = stopped or fault["result"] == "stopped"
                log.error(
                    "%s on GPU %s: the rank's CUDA context is gone: %s",
                    fault["what"],
                    event.gpu,
                    fault["result"],
                )
            if len(self._faults) == FAULTS_KEPT:
                self.dropped += 1
            self._faults.append(fault)
        if len(report.events) > FAULTS_KEPT or report.dropped:
            now = self._clock()
            if now - self._flood_logged_at >= FLOOD_LOG_EVERY_S:
                self._flood_logged_at = now
                log.warning(
                    "a flood of GPU faults: %d in one read, %d dropped so far",
                    len(report.events),
                    self.dropped,
                )

    def to_json(self) -> dict[str, Any]:
        return {
            "watcher": self.watcher,
            "detail": self.detail,
            "faults": [dict(f) for f in self._faults],
            "dropped": self.dropped,
            "malformed": self.malformed,
        }


def rank_stopper(launcher: ServingLauncher | None) -> StopRank:
    """How the agent stops the rank it serves after a fault that ended its CUDA
    context: "no_rank" when it serves none (or none runs), else "stopped" or
    "stop_failed" (a start or stop in progress, or something survived SIGKILL)."""

    async def stop() -> str:
        if launcher is None or launcher.status().get("state") != "running":
            return "no_rank"
        try:
            await asyncio.to_thread(launcher.stop)
        except (ServingConflict, StopFailed) as exc:
            log.error("the rank could not be stopped after a GPU fault: %s", exc)
            return "stop_failed"
        return "stopped"

    return stop
