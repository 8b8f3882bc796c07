"""Rows of the history's tables back into records (``history.records``).

A cell that does not decode is a row changed outside spark-watchdog: a
``StoreCorrupt`` that names the file and the cell.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from spark_watchdog.errors import StoreCorrupt
from spark_watchdog.history.records import (
    Action,
    Boot,
    Hold,
    Incident,
    IncidentStep,
    ServingRestart,
    Setting,
)

# The columns each decoder takes, in its order.
INCIDENT_COLUMNS = (
    "id, kind, opened_at, detected_at, fault_onset, evidence, dry_run, status, "
    "resolution, resolved_at, time_to_detect_s, time_to_recover_s"
)
STEP_COLUMNS = "incident_id, seq, at, node, step, detail, epoch"
BOOT_COLUMNS = (
    "node, boot_id, first_entry, last_entry, clean_shutdown, evidence, recorded_at, "
    "updated_at, incident_id"
)
ACTION_COLUMNS = (
    "id, incident_id, node, rung, device, operation, requested_at, verified_at, result, "
    "error, dry_run"
)
RESTART_COLUMNS = (
    "id, incident_id, profile, started_at, finished_at, duration_s, result, error, step_durations"
)
HOLD_COLUMNS = "id, node, reason, created_at, created_by, released_at, released_by"


def load_json(text: Any, what: str, path: str, *, mapping: bool = True) -> Any:
    """A JSON cell; ``mapping``: it must be an object."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise StoreCorrupt(
            path,
            f"history database {path}: {what} is not valid JSON ({exc}); "
            "the row was changed outside spark-watchdog",
        ) from None
    if mapping and not isinstance(value, dict):
        raise StoreCorrupt(
            path,
            f"history database {path}: {what} should be a JSON object, "
            f"found {type(value).__name__}",
        )
    return value


def incident(row: Sequence[Any], nodes: Sequence[str], path: str) -> Incident:
    (id_, kind, opened_at, detected_at, fault_onset, evidence, dry_run, status) = row[:8]
    (resolution, resolved_at, ttd, ttr) = row[8:12]
    return Incident(
        id=id_,
        kind=kind,
        nodes=tuple(nodes),
        opened_at=opened_at,
        detected_at=detected_at,
        fault_onset=fault_onset,
        evidence=load_json(evidence, f"incident {id_} evidence", path),
        dry_run=bool(dry_run),
        status=status,
        resolution=resolution,
        resolved_at=resolved_at,
        time_to_detect_s=ttd,
        time_to_recover_s=ttr,
    )


def step(row: Sequence[Any], path: str) -> IncidentStep:
    incident_id, seq, at, node, name, detail, epoch = row
    return IncidentStep(
        incident_id=incident_id,
        seq=seq,
        at=at,
        node=node,
        step=name,
        detail=load_json(detail, f"incident {incident_id} step {seq} detail", path),
        epoch=epoch,
    )


def boot(row: Sequence[Any], path: str) -> Boot:
    node, boot_id, first, last, clean, evidence, recorded, updated, incident_id = row
    return Boot(
        node=node,
        boot_id=boot_id,
        first_entry=first,
        last_entry=last,
        clean_shutdown=None if clean is None else bool(clean),
        evidence=load_json(evidence, f"boot {boot_id} of node {node} evidence", path),
        recorded_at=recorded,
        updated_at=updated,
        incident_id=incident_id,
    )


def action(row: Sequence[Any]) -> Action:
    (id_, incident_id, node, rung, device, operation, requested, verified) = row[:8]
    result, error, dry_run = row[8:11]
    return Action(
        id=id_,
        incident_id=incident_id,
        node=node,
        rung=rung,
        device=device,
        operation=operation,
        requested_at=requested,
        verified_at=verified,
        result=result,
        error=error,
        dry_run=bool(dry_run),
    )


def serving_restart(row: Sequence[Any], path: str) -> ServingRestart:
    id_, incident_id, profile, started, finished, duration, result, error, steps = row
    return ServingRestart(
        id=id_,
        incident_id=incident_id,
        profile=profile,
        started_at=started,
        finished_at=finished,
        duration_s=duration,
        result=result,
        error=error,
        step_durations=load_json(steps, f"serving restart {id_} step durations", path),
    )


def hold(row: Sequence[Any]) -> Hold:
    id_, node, reason, created_at, created_by, released_at, released_by = row
    return Hold(
        id=id_,
        node=node,
        reason=reason,
        created_at=created_at,
        created_by=created_by,
        released_at=released_at,
        released_by=released_by,
    )


def setting(row: Sequence[Any], path: str) -> Setting:
    key, value, changed_at, changed_by = row
    return Setting(
        key=key,
        value=load_json(value, f"setting {key!r} value", path, mapping=False),
        changed_at=changed_at,
        changed_by=changed_by,
    )
