"""Run one probe on its own schedule with its own deadline.

Each probe gets its own asyncio task, so a slow probe never delays the others
or the heartbeat. A blocking probe runs in a worker thread; threads cannot be
killed, so when one overruns its deadline the runner reports ``timeout`` and
does not start a second copy until the first has returned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.probes.base import ProbeReport

log = logging.getLogger("spark_watchdog.agent")


@dataclass(frozen=True)
class ProbeFailure:
    """What a runner reports when the probe itself could not report."""

    state: str  # "timeout" | "error"
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error}


@dataclass(frozen=True)
class Observation:
    """A probe's latest report, stamped with when it was taken."""

    report: ProbeReport
    observed_at: float  # unix time
    duration_s: float

    def to_json(self) -> dict[str, Any]:
        body = self.report.to_json()
        body["state"] = self.report.state
        body["observed_at"] = iso_time(self.observed_at)
        body["duration_s"] = round(self.duration_s, 4)
        return body


def iso_time(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class ProbeRunner:
    """Schedules ``probe`` every ``interval`` seconds, bounded by ``deadline``."""

    name: str
    interval: float
    deadline: float
    probe: Callable[[], Awaitable[ProbeReport]] | None = None
    blocking_probe: Callable[[], ProbeReport] | None = None
    on_report: Callable[[str, Observation], None] | None = None
    latest: Observation | None = None
    completed: int = 0
    _inflight: asyncio.Future[ProbeReport] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    def stop(self) -> None:
        """End :meth:`run_forever` at its next step. Cancelling its task is not
        enough on its own: before Python 3.12, ``asyncio.wait_for`` drops a
        cancellation that comes in the same turn of the loop as the probe's
        answer, and the runner would go on probing with its agent stopped."""
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped

    async def run_once(self) -> Observation:
        started = time.monotonic()
        wall = time.time()
        report: ProbeReport
        try:
            report = await asyncio.wait_for(self._start(), self.deadline)
        except asyncio.TimeoutError:
            report = ProbeFailure(
                "timeout", f"{self.name} probe gave no answer in {self.deadline:g}s"
            )
        except Exception as exc:  # a probe bug must not take the agent down
            log.exception("probe %s failed", self.name, extra={"probe": self.name})
            report = ProbeFailure("error", f"{type(exc).__name__}: {exc}")
        observation = Observation(report, wall, time.monotonic() - started)
        previous = self.latest
        self.latest = observation
        self.completed += 1
        if previous is None or previous.report.state != report.state:
            log.info(
                "probe %s: %s",
                self.name,
                report.state,
                extra={"probe": self.name, "state": report.state},
            )
        if self.on_report is not None:
            self.on_report(self.name, observation)
        return observation

    def _start(self) -> Awaitable[ProbeReport]:
        if self.probe is not None:
            return self.probe()
        assert self.blocking_probe is not None
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(asyncio.to_thread(self.blocking_probe))
        # shield: a timeout must not cancel the thread's future, so the next
        # round waits on the same call instead of starting a second one.
        return asyncio.shield(self._inflight)

    async def run_forever(self, first_wait: bool = False) -> None:
        """Run the probe every ``interval`` until stopped; ``first_wait``: one
        interval before the first round (the agent's first round ran already)."""
        if first_wait:
            await asyncio.sleep(self.interval)
        while not self.stopped():
            started = time.monotonic()
            await self.run_once()
            if self.stopped():
                return
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(0.0, self.interval - elapsed))
