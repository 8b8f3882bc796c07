"""Death by refusal: once vLLM answered, its port refusing connections for
``dead_after`` seconds is its death. A pure rule over scrapes and time, like
the rest of the judgement (:mod:`.vllm_progress`): no clock, no I/O."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

from spark_watchdog.probes.vllm_sample import VllmSample
from spark_watchdog.probes.vllm_status import VllmState

# A planned stop whose rank keeps answering this long did not take (the launcher
# refused it, or had nothing to stop): death by refusal is armed again.
PLANNED_STOP_GRACE_S = 120.0


class RefusalWatch:
    """Whether vLLM's port refusing connections is its death, and since when.

    Real vLLM's API server exits (code 0) within a second of its engine dying,
    so the 503 on ``/health`` is usually never seen: the refusal is the sign. A
    timeout is not death (a wedged server can time out), and a head that never
    answered since the watch started stays unreachable. A planned stop
    (:meth:`note_planned_stop`) disarms the rule until vLLM answers again after
    a refusal.
    """

    def __init__(self, dead_after: float | None) -> None:
        self.dead_after = dead_after
        # Wall-clock time of vLLM's last answer (/health or /metrics), if any.
        self._answered_wall: float | None = None
        self._refusing_since: float | None = None
        self._refusing_wall: float | None = None  # the same instant, wall clock
        # The wall-clock time of the first sign of the death being reported.
        self._dead_since: float | None = None
        # A planned stop (the agent's own launcher) disarms death by refusal
        # until vLLM answers again after the port went away.
        self._planned_stop = False
        self._planned_stop_refused = False
        self._planned_stop_at = 0.0

    def note_planned_stop(self, now: float) -> None:
        self._answered_wall = None
        self._planned_stop = True
        self._planned_stop_refused = False
        self._planned_stop_at = now
        self._refusing_since = None

    def note_planned_start(self) -> None:
        self._planned_stop = False

    def note_answer(self, sample: VllmSample | None, now: float) -> None:
        """Remember whether vLLM answered, and since when its port refuses."""
        if sample is None:
            return
        if sample.reachable or sample.health_status is not None:
            self._refusing_since = None
            if self._planned_stop:
                if (
                    not self._planned_stop_refused
                    and now - self._planned_stop_at < PLANNED_STOP_GRACE_S
                ):
                    return  # still the rank being stopped
                self._planned_stop = False
            self._answered_wall = sample.wall_time
        elif sample.refused:
            if self._planned_stop:
                self._planned_stop_refused = True
            elif self._refusing_since is None:
                self._refusing_since = now
                self._refusing_wall = sample.wall_time
        else:
            self._refusing_since = None

    def refused_for_good(self, sample: VllmSample, now: float) -> str | None:
        """The death-by-refusal reason, or None when the rule does not hold."""
        if (
            self.dead_after is None
            or self._answered_wall is None
            or self._refusing_since is None
            or now - self._refusing_since < self.dead_after
        ):
            return None
        parts = urlsplit(sample.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        answered = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._answered_wall))
        return (
            f"vLLM answered until {answered} and now refuses connections on port {port} "
            f"(for {now - self._refusing_since:.1f} s, dead_after {self.dead_after:g} s): "
            "its API server is gone"
        )

    def dead_since(self, state: VllmState, look: float | None) -> float | None:
        """While ``state`` is dead: the wall-clock time of the first sign of it
        (the first refusal when that is the sign, else the look that saw it),
        kept across unreachable looks until vLLM answers again."""
        refused = self._refusing_wall if self._refusing_since is not None else None
        self._dead_since = _first_sign(self._dead_since, state, refused, look)
        return self._dead_since if state == "dead" else None


def _first_sign(
    kept: float | None, state: VllmState, refused: float | None, look: float | None
) -> float | None:
    if state != "dead":
        return kept if state == "unreachable" else None
    if kept is not None:
        return kept
    return refused if refused is not None else look
