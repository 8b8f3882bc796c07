"""Every incident's record, in one place: opened, stepped, resolved, and
closed at once in dry run (docs/design.md, "Freeze history"). The step
names are the history's (spark_watchdog/steps.py), the same the power layer
writes; every write goes through the ledger, so one that cannot be made
raises ``HistoryUnwritable`` and the action it stands before does not
happen (docs/design.md, "Restart and resume")."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from spark_watchdog.controller.pair.fence import RecordingOnly
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.history.records import Incident, IncidentStep
from spark_watchdog.steps import StepName


class Resolution(enum.Enum):
    """How an incident ended."""

    RECOVERED = "recovered"  # the node came back (a new boot, or serving again)
    GAVE_UP = "gave_up"  # held for a person, or closed for another reason
    FALSE_ALARM = "false_alarm"  # it showed life before anything was cut; or dry run


async def open_incident(
    ledger: Ledger,
    kind: str,
    nodes: Sequence[str],
    *,
    evidence: Mapping[str, Any],
    fault_onset: float | None = None,
    detected_at: float | None = None,
    dry_run: bool = False,
) -> Incident:
    """Open an incident with its evidence; its first step is ``incident_opened``.

    :raises IncidentAlreadyOpen: one of the nodes has an open incident.
    :raises HistoryUnwritable: not recorded: nothing of it may happen.
    """
    incident: Incident = await ledger.write(
        ledger.store.open_incident,
        kind,
        list(nodes),
        evidence=evidence,
        fault_onset=fault_onset,
        detected_at=detected_at,
        dry_run=dry_run,
    )
    return incident


async def step(
    ledger: Ledger,
    incident_id: int,
    name: StepName | str,
    *,
    node: str | None = None,
    detail: Mapping[str, Any] | None = None,
    through: RecordingOnly | None = None,
) -> IncidentStep:
    """Append one step, before the action it names is taken.

    ``through`` wraps the store's write: a pair's leader writes a step that
    lets nothing out on a lease too short for a command
    (``Fence.recording_only``, controller/pair/fence.py).

    :raises HistoryUnwritable: not recorded: the action must not happen.
    """
    add_step = ledger.store.add_step if through is None else through(ledger.store.add_step)
    recorded: IncidentStep = await ledger.write(
        add_step, incident_id, name, node=node, detail=detail
    )
    return recorded


async def resolve(
    ledger: Ledger,
    incident_id: int,
    resolution: Resolution,
    *,
    detail: Mapping[str, Any] | None = None,
) -> Incident:
    """Close the incident; its last step is ``resolved``.

    :raises HistoryUnwritable: it stays open, for the next start to resume or close.
    """
    incident: Incident = await ledger.write(
        ledger.store.resolve_incident, incident_id, resolution.value, detail=detail
    )
    return incident


async def close_dry_run(ledger: Ledger, incident_id: int, would: str) -> None:
    """In dry run an incident records what would have been done and closes as a
    false alarm: nothing is sent."""
    await step(ledger, incident_id, StepName.DRY_RUN, detail={"would": would})
    await resolve(ledger, incident_id, Resolution.FALSE_ALARM, detail={"dry_run": True})


async def supersede(ledger: Ledger, older: int, newer: int) -> None:
    """Close an older open incident of a node that a newer one replaces."""
    detail = {"why": f"superseded by incident #{newer}"}
    await step(ledger, older, StepName.SUPERSEDED, detail=detail)
    await resolve(ledger, older, Resolution.GAVE_UP, detail=detail)
