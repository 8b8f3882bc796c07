"""The rows of the freeze history, as frozen dataclasses.

Times are UNIX seconds (float, UTC) exactly as stored; ``iso_utc`` renders
them for people and ``to_json`` renders a whole record for ``--json``. JSON
cells (evidence, detail, ...) come back parsed; treat them as read-only.

A stored number no clock gives (a time beyond the calendar, one that is not
a number: a row changed outside spark-watchdog, or written before the
controller checked what its agents send) renders as unknown (None) for that
field; the rest of the record, and of the list, still shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar

from spark_watchdog.verdicts import INCIDENT_KINDS

# The target of a cluster-wide hold.
CLUSTER = "*"

INCIDENT_STATUSES = ("open", "resolved")
RESOLUTIONS = ("recovered", "gave_up", "false_alarm")

# The kinds the controller opens incidents of: each verdict's that opens one
# (spark_watchdog/verdicts.py), and the clock-latch ladder's (controller/act/unlatch.py).
# The store accepts any snake_case kind so the controller can add one without
# a migration.
KNOWN_INCIDENT_KINDS = (*INCIDENT_KINDS, "clock_latched")

# The steps the product writes: spark_watchdog.steps.StepName (any snake_case step is accepted).

ACTION_OPERATIONS = ("off", "on", "cycle", "ssh_reboot", "agent_restart", "serving_restart")
# "pending": recorded before the command is sent (write-ahead), not finished yet.
ACTION_RESULTS = ("pending", "verified", "failed", "ambiguous", "dry_run")
# Operations that cut a node's power: they count against the power-cycle budget.
POWER_CUT_OPERATIONS = ("off", "cycle")

# "running" until finish_serving_restart; "profile_mismatch": the effective
# config the head reports is not the profile asked for and not known to be as
# safe (an error: docs/design.md, "Serving restart").
SERVING_RESTART_RESULTS = ("running", "succeeded", "failed", "timed_out", "profile_mismatch")


def readable_number(value: Any) -> float | None:
    """A stored number as a finite float; None: unknown (not a number, or none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def utc_time(ts: Any) -> datetime | None:
    """UNIX seconds as a UTC datetime; None for a value no calendar date has."""
    seconds = readable_number(ts)
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):  # beyond years 1 to 9999
        return None


def iso_utc(ts: Any) -> str | None:
    """UNIX seconds as ISO-8601 UTC with milliseconds: ``2025-03-01T04:05:06.789+00:00``;
    None for None and for a value no calendar date has."""
    when = utc_time(ts)
    return None if when is None else when.isoformat(timespec="milliseconds")


class _Record:
    """``to_json``: the record as JSON-ready data, time fields as ISO-8601 UTC."""

    _times: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.name in self._times:
                value = iso_utc(value)
            elif isinstance(value, float) and not math.isfinite(value):
                value = None  # JSON has no such number
            elif isinstance(value, tuple):
                value = [v.to_json() if isinstance(v, _Record) else v for v in value]
            elif isinstance(value, _Record):
                value = value.to_json()
            out[f.name] = value
        return out


@dataclass(frozen=True)
class Node(_Record):
    """A node the controller has seen."""

    name: str
    first_seen: float
    last_boot_id: str | None

    _times: ClassVar[frozenset[str]] = frozenset({"first_seen"})


@dataclass(frozen=True)
class Boot(_Record):
    """One boot of one node, from the agent's journal analysis (``/v1/boots``)."""

    node: str
    boot_id: str
    first_entry: float | None
    last_entry: float | None
    # True: journald's "Journal stopped" closed it. False: the journal just
    # stops (freeze, power cut). None: unknown, or the boot is still running.
    clean_shutdown: bool | None
    evidence: Mapping[str, Any]
    recorded_at: float
    updated_at: float
    incident_id: int | None

    _times: ClassVar[frozenset[str]] = frozenset(
        {"first_entry", "last_entry", "recorded_at", "updated_at"}
    )


@dataclass(frozen=True)
class Incident(_Record):
    """Something went wrong on one or several nodes, and what came of it."""

    id: int
    kind: str
    nodes: tuple[str, ...]
    opened_at: float
    detected_at: float
    fault_onset: float | None  # the last time the node(s) were seen healthy
    evidence: Mapping[str, Any]
    dry_run: bool
    status: str  # open | resolved
    resolution: str | None  # recovered | gave_up | false_alarm
    resolved_at: float | None
    time_to_detect_s: float | None  # detected_at - fault_onset
    time_to_recover_s: float | None  # resolved_at - detected_at, when recovered

    _times: ClassVar[frozenset[str]] = frozenset(
        {"opened_at", "detected_at", "fault_onset", "resolved_at"}
    )

    @property
    def is_open(self) -> bool:
        return self.status == "open"


@dataclass(frozen=True)
class IncidentStep(_Record):
    """One entry of an incident's write-ahead log; ``seq`` counts from 1 per incident."""

    incident_id: int
    seq: int
    at: float
    node: str | None  # None: a cluster-wide step (serving restart, resolution)
    step: str
    detail: Mapping[str, Any]
    # The leadership epoch of the controller that wrote it; None without a lease.
    epoch: int | None = None

    _times: ClassVar[frozenset[str]] = frozenset({"at"})


@dataclass(frozen=True)
class Action(_Record):
    """One command sent (or, in dry run, decided) to a power path, SSH or an agent."""

    id: int
    incident_id: int | None  # None: operator-initiated
    node: str
    rung: int | None
    device: str
    operation: str  # off | on | cycle | ssh_reboot | agent_restart | serving_restart
    requested_at: float
    verified_at: float | None
    result: str  # pending | verified | failed | ambiguous | dry_run
    error: str | None
    dry_run: bool

    _times: ClassVar[frozenset[str]] = frozenset({"requested_at", "verified_at"})


@dataclass(frozen=True)
class ServingRestart(_Record):
    """One ordered restart of serving on every node (docs/design.md, "Serving restart")."""

    id: int
    incident_id: int | None  # None: operator-initiated
    profile: str
    started_at: float
    finished_at: float | None
    duration_s: float | None
    result: str  # running | succeeded | failed | timed_out | profile_mismatch
    error: str | None
    step_durations: Mapping[str, float]  # step -> seconds, in the order taken

    _times: ClassVar[frozenset[str]] = frozenset({"started_at", "finished_at"})


@dataclass(frozen=True)
class Hold(_Record):
    """An operator's (or the controller's) "do nothing automatic here"."""

    id: int
    node: str  # a node name, or CLUSTER ("*") for the whole cluster
    reason: str
    created_at: float
    created_by: str
    released_at: float | None
    released_by: str | None

    _times: ClassVar[frozenset[str]] = frozenset({"created_at", "released_at"})

    @property
    def cluster_wide(self) -> bool:
        return self.node == CLUSTER

    @property
    def active(self) -> bool:
        return self.released_at is None


@dataclass(frozen=True)
class Setting(_Record):
    """One cluster setting (serving profile in force, circuit breaker, ...)."""

    key: str
    value: Any  # any JSON value
    changed_at: float
    changed_by: str

    _times: ClassVar[frozenset[str]] = frozenset({"changed_at"})


@dataclass(frozen=True)
class IncidentTimeline(_Record):
    """Everything recorded about one incident, for ``spark-watchdog show``."""

    incident: Incident
    steps: tuple[IncidentStep, ...]
    actions: tuple[Action, ...]
    serving_restarts: tuple[ServingRestart, ...]
    boots: tuple[Boot, ...]
