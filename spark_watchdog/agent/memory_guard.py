"""The memory guard: is this host about to run out of memory? A pure decision.

On GB10 the rank's allocations are unified memory, which cgroup limits and
``docker --memory`` do not see, and the host freezes as MemAvailable reaches
zero (docs/design.md, "Memory guard"). So the agent judges the host itself,
from readings it already takes, and kills the rank before the end.

A fixed floor alone kills healthy configs that run close to it for weeks
(docs/facts.md, "Freeze precursors"), so a level is never enough by itself.
The guard trips only when MemAvailable is at or below ``watch_below`` **and**
one of these agrees, on ``confirm`` consecutive readings:

- *collapse*: MemAvailable falls at least ``min_fall`` per second (a least
  squares slope over the last ``slope_window`` seconds, and since the
  previous reading too: a step down to a flat level is no collapse) and at
  that slope reaches ``floor`` within ``lead_time`` seconds;
- *pressure*: MemAvailable is not rising and the kernel says tasks are
  stalled on memory (PSI ``full avg10`` at least ``psi_full``) or the GPU
  driver is failing allocations (``NV_ERR_NO_MEMORY`` lines at least
  ``no_memory_per_min`` per minute).

A ramp to a plateau above ``watch_below`` (a model loading, the KV cache
being reserved) is never judged; a plateau below it without pressure is
left alone. After a trip the guard stays quiet for ``rearm_after`` seconds
(the rank's memory comes back within them), then judges afresh: a kill that
freed nothing (a container runtime's client killed, not the container) is
tried again only if the host still runs out by the same rules.

Time is injected (monotonic seconds); nothing here reads or kills.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3


@dataclass(frozen=True)
class GuardPolicy:
    floor_bytes: float = 1.0 * GIB
    watch_below_bytes: float = 6.0 * GIB
    lead_time_s: float = 4.0
    min_fall_bytes_per_s: float = 0.25 * GIB
    slope_window_s: float = 3.0
    psi_full: float = 20.0  # percent; 0 = not used
    no_memory_per_min: float = 60.0  # lines per minute; 0 = not used
    confirm: int = 2
    rearm_after_s: float = 30.0


@dataclass(frozen=True)
class MemorySample:
    """One reading as the guard sees it."""

    at: float  # monotonic seconds
    available: int | None  # MemAvailable, bytes
    psi_full_avg10: float | None = None  # percent
    no_memory_per_min: float | None = None  # NV_ERR_NO_MEMORY lines per minute

    def to_json(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "mem_available_bytes": self.available,
            "psi_full_avg10": self.psi_full_avg10,
            "no_memory_per_min": self.no_memory_per_min,
        }


@dataclass(frozen=True)
class Assessment:
    """What the guard makes of the latest reading."""

    state: str  # "clear" | "watching" | "alarm" | "tripped" | "cooling_down" | "unknown"
    reasons: tuple[str, ...] = ()
    slope_bytes_per_s: float | None = None
    seconds_to_floor: float | None = None
    agreeing: int = 0  # consecutive readings in alarm

    @property
    def trip(self) -> bool:
        return self.state == "tripped"

    def to_json(self) -> dict[str, Any]:
        def rounded(value: float | None, digits: int) -> float | None:
            return None if value is None else round(value, digits)

        return {
            "state": self.state,
            "reasons": list(self.reasons),
            "slope_bytes_per_s": rounded(self.slope_bytes_per_s, 0),
            "seconds_to_floor": rounded(self.seconds_to_floor, 2),
            "agreeing": self.agreeing,
        }


def slope(points: list[tuple[float, int]]) -> float | None:
    """Least squares slope (bytes/s) of ``(t, bytes)`` points; None for < 2 or one instant."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var <= 0.0:
        return None
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / var


@dataclass
class MemoryGuard:
    policy: GuardPolicy = field(default_factory=GuardPolicy)
    _points: deque[tuple[float, int]] = field(default_factory=deque)
    _agreeing: int = 0
    _tripped_at: float | None = None
    # The last readings, kept as the evidence of a trip.
    recent: deque[MemorySample] = field(default_factory=lambda: deque(maxlen=30))

    def observe(self, sample: MemorySample) -> Assessment:
        """Take one reading; ``trip`` on the reading that should end the rank."""
        self.recent.append(sample)
        policy = self.policy
        if sample.available is None:
            self._agreeing = 0
            return Assessment("unknown", ("no MemAvailable reading",))
        points = self._points
        points.append((sample.at, sample.available))
        while points and sample.at - points[0][0] > policy.slope_window_s:
            points.popleft()
        rate = slope(list(points))
        # The fall since the previous reading: a step down to a flat level (a KV
        # cache reserved) has a steep window slope but no fall now.
        last_rate = None
        if len(points) >= 2 and points[-1][0] > points[-2][0]:
            (t0, v0), (t1, v1) = points[-2], points[-1]
            last_rate = (v1 - v0) / (t1 - t0)
        left = sample.available - policy.floor_bytes
        to_floor = None
        if rate is not None and rate < 0:
            to_floor = max(0.0, left) / -rate
        if self._tripped_at is not None:
            if sample.at - self._tripped_at < policy.rearm_after_s:
                return Assessment(
                    "cooling_down",
                    (f"tripped; judges again {policy.rearm_after_s:g}s after the kill",),
                    rate,
                    to_floor,
                )
            self._tripped_at = None
        if sample.available > policy.watch_below_bytes:
            self._agreeing = 0
            return Assessment("clear", (), rate, to_floor)
        reasons = self._alarm_reasons(sample, rate, to_floor, last_rate)
        if not reasons:
            self._agreeing = 0
            return Assessment(
                "watching",
                (f"MemAvailable {_gib(sample.available)} at or below watch_below",),
                rate,
                to_floor,
            )
        self._agreeing += 1
        if self._agreeing < policy.confirm:
            return Assessment("alarm", tuple(reasons), rate, to_floor, self._agreeing)
        self._tripped_at = sample.at
        agreeing, self._agreeing = self._agreeing, 0
        return Assessment("tripped", tuple(reasons), rate, to_floor, agreeing)

    def _alarm_reasons(
        self,
        sample: MemorySample,
        rate: float | None,
        to_floor: float | None,
        last_rate: float | None,
    ) -> list[str]:
        policy = self.policy
        assert sample.available is not None
        reasons: list[str] = []
        level = f"MemAvailable {_gib(sample.available)}"
        if (
            rate is not None
            and to_floor is not None
            and -rate >= policy.min_fall_bytes_per_s
            and to_floor <= policy.lead_time_s
            and last_rate is not None
            and -last_rate >= policy.min_fall_bytes_per_s
        ):
            reasons.append(
                f"{level} falling {_gib(-rate)}/s: the floor ({_gib(policy.floor_bytes)}) "
                f"in {to_floor:.1f} s"
            )
        if rate is not None and rate > 0:
            return reasons  # recovering: pressure alone is not a reason then
        psi = sample.psi_full_avg10
        if policy.psi_full > 0 and psi is not None and psi >= policy.psi_full:
            reasons.append(f"{level} and memory pressure full avg10 {psi:.1f}%")
        lines = sample.no_memory_per_min
        if policy.no_memory_per_min > 0 and lines is not None and lines >= policy.no_memory_per_min:
            reasons.append(f"{level} and NV_ERR_NO_MEMORY at {lines:.0f} lines/min")
        return reasons


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"
