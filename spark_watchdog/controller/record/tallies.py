"""What the controller has done since it started, counted in memory for ``/metrics``.

The history holds every incident and action, but a scrape must stay cheap on
a history of years: counting rows on every scrape would scan tables. So the
ledger hands each record it has written here (an opened or resolved
incident, a finished action) and ``/metrics`` reads these counts. They start
at zero with the controller, as Prometheus counters do; ``resume`` seeds the
incidents a previous controller left open, so the open-incident gauge is
right after a restart.

The event loop writes, the HTTP thread reads: every access holds the lock.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from spark_watchdog.history.records import (
    KNOWN_INCIDENT_KINDS,
    RESOLUTIONS,
    Action,
    Incident,
)

# Results after which an action row changes no more, except ``ambiguous``:
# a re-read may later settle it, and then it counts once per outcome.
_COUNTED_ACTION_RESULTS = ("verified", "failed", "ambiguous", "dry_run")


@dataclass(frozen=True)
class TallyView:
    """A consistent copy of the counts, for one scrape."""

    incidents_opened: dict[tuple[str, str], int]  # (node, kind)
    incidents_resolved: dict[tuple[str, str, str], int]  # (node, kind, resolution)
    incidents_open: dict[tuple[str, str], int]  # (node, kind)
    power_actions: dict[tuple[str, str, str], int]  # (node, operation, result)
    verdict_changes: dict[tuple[str, str], int]  # (node, verdict entered)


class Tallies:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: Counter[tuple[str, str]] = Counter()
        self._resolved: Counter[tuple[str, str, str]] = Counter()
        self._open: dict[int, Incident] = {}
        self._actions: Counter[tuple[str, str, str]] = Counter()
        self._verdicts: Counter[tuple[str, str]] = Counter()

    def seed_nodes(self, nodes: Iterable[str]) -> None:
        """Start the counters alerts watch at 0 for every node.

        A series that first appears at 1 shows no increase() to Prometheus,
        so the first gave_up or failed cycle would never fire an alert.
        """
        with self._lock:
            for node in nodes:
                for kind in KNOWN_INCIDENT_KINDS:
                    self._opened.setdefault((node, kind), 0)
                    for resolution in RESOLUTIONS:
                        self._resolved.setdefault((node, kind, resolution), 0)
                # The escalation ladder records each rung as one "cycle" action.
                for result in _COUNTED_ACTION_RESULTS:
                    self._actions.setdefault((node, "cycle", result), 0)

    def note_record(self, record: object) -> None:
        """Count what a history write returned; records of other kinds are ignored."""
        with self._lock:
            if isinstance(record, Incident):
                self._note_incident(record)
            elif isinstance(record, Action) and record.result in _COUNTED_ACTION_RESULTS:
                self._actions[(record.node, record.operation, record.result)] += 1

    def _note_incident(self, incident: Incident) -> None:
        if incident.status == "open":
            if incident.id not in self._open:
                self._open[incident.id] = incident
                for node in incident.nodes:
                    self._opened[(node, incident.kind)] += 1
            return
        self._open.pop(incident.id, None)
        for node in incident.nodes:
            self._resolved[(node, incident.kind, str(incident.resolution))] += 1

    def seed_open(self, incidents: Iterable[Incident]) -> None:
        """Incidents found open at start (a previous controller's): open, not newly opened."""
        with self._lock:
            for incident in incidents:
                if incident.status == "open":
                    self._open[incident.id] = incident

    def note_verdict(self, node: str, verdict: str) -> None:
        """A node's published verdict changed to ``verdict``."""
        with self._lock:
            self._verdicts[(node, verdict)] += 1

    def view(self) -> TallyView:
        with self._lock:
            open_now: Counter[tuple[str, str]] = Counter()
            for incident in self._open.values():
                for node in incident.nodes:
                    open_now[(node, incident.kind)] += 1
            return TallyView(
                incidents_opened=dict(self._opened),
                incidents_resolved=dict(self._resolved),
                incidents_open=dict(open_now),
                power_actions=dict(self._actions),
                verdict_changes=dict(self._verdicts),
            )
