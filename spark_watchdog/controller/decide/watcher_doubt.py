"""When the silence is evidence against the watcher, not the nodes.

Two signs that the controller itself is what went wrong
(docs/design.md, "When the watcher is in doubt"):

- **its loop stalled**: a tick began much later than its poll interval and
  an agent's timeout allow, or a sweep took that long (a stopped or starved
  process, a paused VM, a swapping host). What it saw of silence before and
  during the stall proves nothing about the nodes;
- **every node fell silent at once** (two nodes or more): the nodes did not
  all break together, the path or the watcher did.

While in doubt the controller restarts no agent over SSH and opens no
incident for a silent node; one alert says why. Doubt from a stall lasts
until ``freeze_after`` has passed since the stall ended, so every verdict
that counts again rests on answers sought after it. Kubernetes' node
controller stops evicting in a full disruption for the same reason.
Pure: the controller gives it its tick times and what it sees.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from spark_watchdog.config.controller import DetectionConfig

# Where a tick's lateness begins to count: beyond its interval, the agents'
# timeout (a sweep waits that long for a silent agent) and this margin.
STALL_MARGIN_S = 2.0


@dataclass
class WatcherDoubt:
    """The controller's own pace, and whether its view can be trusted now."""

    poll_interval: float
    agent_timeout: float
    freeze_after: float
    _last_start: float | None = None
    _stalled_at: float | None = None
    stall_s: float = 0.0  # the longest stall of the current spell (seconds late)

    @classmethod
    def of(cls, detection: DetectionConfig) -> WatcherDoubt:
        return cls(detection.poll_interval, detection.agent_timeout, detection.freeze_after)

    @property
    def allowance(self) -> float:
        """How long a tick may take from the last one's start before it is late."""
        return self.poll_interval + self.agent_timeout + STALL_MARGIN_S

    def tick_started(self, now: float) -> None:
        """A tick begins at ``now`` (monotonic): late if the gap passed the allowance."""
        if self._last_start is not None:
            self._late(now - self._last_start, now)
        self._last_start = now

    def sweep_took(self, seconds: float, now: float) -> None:
        """The sweep just ended at ``now`` after ``seconds``: a stall if that long."""
        self._late(seconds, now)

    def _late(self, gap: float, now: float) -> None:
        late = gap - self.allowance
        if late <= 0:
            return
        if self._stalled_at is None or now - self._stalled_at >= self.freeze_after:
            self.stall_s = 0.0  # a new spell
        self._stalled_at = now
        self.stall_s = max(self.stall_s, late)

    def stalled(self, now: float) -> bool:
        """The loop stalled within the last ``freeze_after``."""
        return self._stalled_at is not None and now - self._stalled_at < self.freeze_after

    def stall_reason(self, now: float) -> str | None:
        """Why the controller doubts what it saw of silence, after a stall; None: no stall."""
        if not self.stalled(now):
            return None
        return (
            f"the controller's loop stalled ({self.stall_s:.1f}s late): "
            "what it saw of silence is not evidence against the nodes"
        )


def all_silent_reason(silent: Iterable[bool]) -> str | None:
    """Every node (two or more) silent to the controller at once: why that is
    doubt about the watcher; None otherwise. ``silent``: one flag per node."""
    flags = list(silent)
    if len(flags) >= 2 and all(flags):
        return (
            f"every node ({len(flags)}) fell silent at once: the controller or its "
            "network is more likely wrong than every node"
        )
    return None
