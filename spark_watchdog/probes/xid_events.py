"""The Xid events the NVML worker saw live, as the GPU probe hands them on
(docs/design.md, "Live GPU faults"; the worker: probes/gpu_worker.py).

Each worker answer carries what its Xid watcher is (``on``, ``refused``,
``failed``) and the events since the last read. An event that is not a
well-formed Xid (an integer) with a finite time is not passed on: it is
counted as malformed, and the rest of the reading stands.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WATCHER_STATES = ("on", "refused", "failed", "off")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    gpu: int | None
    at_unix: float


@dataclass(frozen=True)
class XidReport:
    watcher: str  # one of WATCHER_STATES, or "unknown" for anything else said
    detail: str | None
    events: tuple[XidEvent, ...] = ()
    dropped: int = 0  # events the worker could not keep between two reads
    malformed: int = 0  # events the worker sent that were not events


def _event(data: Any) -> XidEvent | None:
    if not isinstance(data, Mapping):
        return None
    xid, gpu, at = data.get("xid"), data.get("gpu"), data.get("at_unix")
    if isinstance(xid, bool) or not isinstance(xid, int) or xid < 0:
        return None
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        return None
    index = gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu >= 0 else None
    return XidEvent(xid, index, float(at))


def parse_xid_report(answer: Mapping[str, Any]) -> XidReport | None:
    """The Xid part of a worker answer; None when the worker did not watch (yet)."""
    watcher = answer.get("xid_watcher")
    if not isinstance(watcher, Mapping):
        return None
    state = watcher.get("state")
    detail = watcher.get("detail")
    listed = answer.get("xid_events")
    events: list[XidEvent] = []
    malformed = 0
    if isinstance(listed, list):
        for data in listed:
            event = _event(data)
            if event is None:
                malformed += 1
            else:
                events.append(event)
    elif listed is not None:
        malformed = 1  # not a list at all: one malformed answer
    dropped = answer.get("xid_dropped")
    return XidReport(
        watcher=state if state in WATCHER_STATES else "unknown",
        detail=detail if isinstance(detail, str) else None,
        events=tuple(events),
        dropped=dropped if isinstance(dropped, int) and not isinstance(dropped, bool) else 0,
        malformed=malformed,
    )
