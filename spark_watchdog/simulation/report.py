"""What a simulation run reports (simulation/run.py), and how it reads what
the controller logged and recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from spark_watchdog.history.records import IncidentStep
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.simulation.process import InjectedBug, Killed
from spark_watchdog.steps import StepName


@dataclass
class Report:
    seed: int
    simulated_s: float
    nodes: int
    violations: list[str]
    faults: dict[str, int] = field(default_factory=dict)
    commands: int = 0
    incidents: int = 0
    recovered: int = 0
    crashes: int = 0
    dry_run: bool = False
    writes: int = 0
    # (node, target) of every command the controller sent, in order, and when.
    sent: list[tuple[str, str]] = field(default_factory=list)
    sent_at: list[float] = field(default_factory=list)
    # Kinds of the alerts sent, in order, and the final verdict of each node.
    alerts: list[str] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    resolutions: list[str] = field(default_factory=list)
    # The kind of each incident (not dry run), in order.
    kinds: list[str] = field(default_factory=list)
    # Outlets switched on by their own timer (a self-timed cycle), not by a command.
    timed_ons: int = 0
    # Rungs run a second time: a resumed off never seen to land (left_cycle.Unsettled).
    second_tries: int = 0
    # A controller pair ran (simulation/pair.py): leaderships taken, and of them
    # those taken after another controller had led.
    pair: bool = False
    epochs: int = 0
    takeovers: int = 0
    # How the quiet tail ended (docs/simulation.md, "The tail"): "at rest",
    # "left to a person" or "at the cap".
    tail: str = "at the cap"

    @property
    def node_hours(self) -> float:
        return self.simulated_s * self.nodes / 3600.0


def attempt_of(steps: list[IncidentStep]) -> int:
    """Which try of its rung the latest ``rung_started`` is: a rung runs a second
    time only after its first off was never seen to land (left_cycle.Unsettled)."""
    started = [s for s in steps if s.step == StepName.RUNG_STARTED]
    detail = started[-1].detail if started else None
    attempt = detail.get("attempt", 1) if isinstance(detail, dict) else 1
    return attempt if isinstance(attempt, int) else 1


def with_incidents(report: Report, store: HistoryStore) -> Report:
    """``report`` with what the history recorded of its incidents (dry run
    ones left out): how many, how each ended, their kinds, and the rungs run a
    second time."""
    incidents = [i for i in store.list_incidents(limit=10_000) if not i.dry_run]
    return replace(
        report,
        incidents=len(incidents),
        recovered=sum(1 for i in incidents if i.resolution == "recovered"),
        resolutions=[str(i.resolution) for i in incidents],
        kinds=[i.kind for i in incidents],
        second_tries=sum(
            1
            for i in incidents
            for s in store.steps(i.id)
            if s.step == StepName.RUNG_STARTED and attempt_of([s]) == 2
        ),
    )


class ErrorTrap(logging.Handler):
    """Tracebacks from the controller are bugs: each one is a violation."""

    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.ERROR)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and not isinstance(record.exc_info[1], (InjectedBug, Killed)):
            self.sink.append(f"{record.getMessage()} ({record.exc_info[1]!r})")
