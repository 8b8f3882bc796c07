"""The pieces of the agent's snapshot (``GET /v1/state``).

The snapshot is rebuilt and encoded once per loop; two kinds of value in it
are ages the controller counts back from when it got the answer
(docs/design.md, "Peers"): the head's ``probes.vllm.progress_ago_s`` and each peer's
``progress_ago_s`` / ``answer_ago_s``. Served as built, they would be up to a
loop old, and a sighting would look younger than it is; so :class:`StateBody`
keeps the encoded snapshot with holes where those go and fills them in, by the
agent's monotonic clock, as each answer leaves.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from spark_watchdog.agent.probe_runner import Observation, ProbeRunner, iso_time
from spark_watchdog.probes.gpu import GpuReading, low_power_while_running
from spark_watchdog.probes.journal import JournalReport
from spark_watchdog.probes.vllm import VllmStatus


def ago(at: float | None, now: float) -> float | None:
    """Seconds from the monotonic instant ``at`` to ``now``; None for never."""
    return None if at is None else round(max(0.0, now - at), 3)


class ProbeBodies:
    """Each probe's JSON body, encoded once per report (the journal's is the largest)."""

    def __init__(
        self,
        runners: dict[str, ProbeRunner],
        low_power_watts: float,
        requests_running: Callable[[], float | None],
    ) -> None:
        self._runners = runners
        self._low_power_watts = low_power_watts
        self._requests_running = requests_running
        self._bodies: dict[str, tuple[Observation, dict[str, Any]]] = {}

    def json(self, name: str, now: float) -> dict[str, Any]:
        runner = self._runners.get(name)
        if runner is None:
            return {"state": "disabled", "observed_at": None}
        latest = runner.latest
        if latest is None:
            return {"state": "pending", "observed_at": None}
        cached = self._bodies.get(name)
        if cached is not None and cached[0] is latest:
            body = cached[1]
        else:
            if name == "journal" and isinstance(latest.report, JournalReport):
                body = latest.report.summary_json()
                body.update(
                    observed_at=iso_time(latest.observed_at),
                    duration_s=round(latest.duration_s, 4),
                )
            else:
                body = latest.to_json()
            self._bodies[name] = (latest, body)
        if name == "gpu" and isinstance(latest.report, GpuReading):
            body = {
                **body,
                "low_power_while_running": low_power_while_running(
                    latest.report, self._requests_running(), self._low_power_watts
                ),
            }
        if isinstance(latest.report, VllmStatus):
            body = {**body, "progress_ago_s": ago(latest.report.advanced_at, now)}
        return body


# Filled in as each answer leaves: (where in the snapshot, the value as of now).
LiveValue = tuple[tuple[str, ...], Callable[[float], Any]]


class StateBody:
    """The encoded snapshot, with its ages filled in at each answer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._token = uuid.uuid4().hex
        # One attribute, swapped whole: an answer in an HTTP thread never mixes two.
        self._encoded: tuple[list[bytes], list[Callable[[float], Any]]] = ([b"{}\n"], [])

    def set(self, snapshot: dict[str, Any], live: list[LiveValue]) -> None:
        """Encode ``snapshot``; each live value's place gets its value as of the answer."""
        holed = snapshot
        fills: list[Callable[[float], Any]] = []
        for i, (path, fill) in enumerate(live):
            placed = _put(holed, path, f"\x00{self._token}:{i}\x00")
            if placed is not None:
                holed = placed
                fills.append(fill)
        encoded = json.dumps(holed, separators=(",", ":")).encode() + b"\n"
        parts = [encoded]
        for i in range(len(fills)):
            marker = json.dumps(f"\x00{self._token}:{i}\x00").encode()
            head, found, tail = parts[-1].partition(marker)
            if not found:  # cannot happen; serve the values as built rather than a hole
                encoded = json.dumps(snapshot, separators=(",", ":")).encode() + b"\n"
                parts, fills = [encoded], []
                break
            parts[-1:] = [head, tail]
        self._encoded = (parts, fills)

    def render(self) -> bytes:
        parts, fills = self._encoded
        if not fills:
            return parts[0]
        now = self._clock()
        out = [parts[0]]
        for fill, part in zip(fills, parts[1:], strict=True):
            out.append(json.dumps(fill(now), separators=(",", ":")).encode())
            out.append(part)
        return b"".join(out)


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any] | None:
    """A copy of ``data`` with ``value`` in place of the one at ``path`` (copying only
    along it), or None when there is none."""
    head, rest = path[0], path[1:]
    if not rest:
        return {**data, head: value} if head in data else None
    inner = data.get(head)
    if not isinstance(inner, dict):
        return None
    placed = _put(inner, rest, value)
    return None if placed is None else {**data, head: placed}
