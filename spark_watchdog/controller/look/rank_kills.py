"""Kills of the serving rank that an agent reports, and which one the controller
has answered (docs/design.md, "Memory guard"; "Live GPU faults").

Two things on a node end its rank on their own: the memory guard, which kills
it before the host runs out of memory, and a GPU fault that ends its CUDA
context (an Xid of spark_watchdog/xid.py), after which the agent stops it.
Either is reported in ``/v1/state`` with an id (counted per agent start) and
its wall time; the controller answers each once (an incident and a serving
restart, or an alert), and never acts on a report older than ``FRESH_S``, nor
on one whose time it does not believe (controller/look/intake.py put its own
receipt time in its place): the dead rank shows as ``serving_dead`` anyway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.controller.look.intake import agent_field
from spark_watchdog.xid import describe, ends_the_context

# A kill older than this (by the controller's wall clock) when first seen is
# history, not news: a controller started long after it does not restart
# serving for it (a dead rank shows as serving_dead anyway).
FRESH_S = 300.0

Key = tuple[str | None, int]


@dataclass
class ReportedKills:
    """One kind of kill: the one reported and not answered yet, and the last answered."""

    pending: dict[str, Any] | None = None
    answered: Key | None = None

    @property
    def key(self) -> Key | None:
        kill = self.pending
        return None if kill is None else (kill.get("agent_started_at"), int(kill["id"]))

    def note(self, kill: Any, agent_started_at: str | None, wall: float) -> None:
        """Take a reported kill: a well-formed one (an int id, a finite time the
        agent gave and the controller believes), fresh, and not the one pending
        or answered already."""
        if not isinstance(kill, dict) or agent_field("at_unix") in kill:
            return
        kill_id, at = kill.get("id"), kill.get("at_unix")
        if not isinstance(kill_id, int) or isinstance(kill_id, bool):
            return
        if not isinstance(at, (int, float)) or isinstance(at, bool) or not math.isfinite(at):
            return
        key = (agent_started_at, kill_id)
        if key == self.answered or key == self.key or wall - at > FRESH_S:
            return
        self.pending = dict(kill)
        self.pending["agent_started_at"] = agent_started_at

    def grown_old(self, wall: float) -> bool:
        """The pending kill was reported more than ``FRESH_S`` ago (a hold, a
        failed restart kept it pending): no longer news."""
        at = None if self.pending is None else self.pending.get("at_unix")
        return isinstance(at, (int, float)) and wall - at > FRESH_S

    def answer(self) -> None:
        """The pending kill is taken care of (an incident, or a person)."""
        if self.pending is not None:
            self.answered = self.key
            self.pending = None


# What a GPU fault report says became of the rank: it is gone either way (its
# CUDA context ended), stopped by the agent or left for the restart to stop.
RANK_ENDED = frozenset({"stopped", "stop_failed"})


def note_kills(
    memory: ReportedKills,
    gpu: ReportedKills,
    snapshot: Mapping[str, Any],
    agent_started_at: str | None,
    wall: float,
) -> None:
    """From one agent answer: the rank's last kill by the memory guard, and the
    last GPU fault that ended its CUDA context (the agent stopped the rank, or
    could not)."""
    guard = snapshot.get("memory_guard")
    memory.note(
        guard.get("last_kill") if isinstance(guard, Mapping) else None, agent_started_at, wall
    )
    faults = snapshot.get("gpu_faults")
    listed = faults.get("faults") if isinstance(faults, Mapping) else None
    if not isinstance(listed, list):
        return
    ending = [
        f
        for f in listed
        if isinstance(f, dict) and ends_the_context(f.get("xid")) and f.get("result") in RANK_ENDED
    ]
    if ending:
        gpu.note(ending[-1], agent_started_at, wall)


# The live faults an incident keeps (the newest), whatever the agent sent.
LIVE_FAULTS_KEPT = 8


def live_faults(
    snapshot: Mapping[str, Any] | None, silent_since: float | None
) -> list[dict[str, Any]]:
    """The GPU faults the agent reported live on this boot, each with what it says
    in words and, when the agent then went silent (wall clock), how long before:
    what a ``host_frozen`` incident keeps, the journal of that boot being often
    empty."""
    section = (snapshot or {}).get("gpu_faults")
    listed = section.get("faults") if isinstance(section, Mapping) else None
    kept: list[dict[str, Any]] = []
    for fault in listed if isinstance(listed, list) else []:
        if not isinstance(fault, Mapping):
            continue
        xid, at, gpu = fault.get("xid"), fault.get("at_unix"), fault.get("gpu")
        if isinstance(xid, bool) or not isinstance(xid, int):
            continue
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
            continue
        said = describe(xid) + (f" on GPU {gpu}" if isinstance(gpu, int) else "")
        kept.append({**fault, "said": said + _when(fault, at, silent_since)})
    return kept[-LIVE_FAULTS_KEPT:]


def _when(fault: Mapping[str, Any], at: float, silent_since: float | None) -> str:
    """When a fault came, in words: the agent's time, or the controller's when it
    did not believe the agent's (controller/look/intake.py)."""
    try:
        when = datetime.fromtimestamp(at, timezone.utc).strftime("%H:%M:%S.%f")[:-5]
    except (OverflowError, OSError, ValueError):
        return " at an unknown time"
    agent_said = fault.get(agent_field("at_unix"))
    if agent_said is not None:
        return f" seen by the controller at {when} UTC (its agent gave the time {agent_said})"
    if silent_since is not None and silent_since >= at:
        return f" at {when} UTC, {silent_since - at:.1f} s before its agent went silent"
    return f" at {when} UTC"
