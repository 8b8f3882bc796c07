"""What a run with controllers on the Sparks reports (simulation/colocated.py):
the run's report (simulation/report.py), with the order, who sent each
command, the controller processes, and the freezes (simulation/freeze_spells.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_watchdog.simulation.report import Report


@dataclass
class PlacedReport(Report):
    # The controllers, in order; the host of the controller that sent each command.
    order: tuple[str, ...] = ()
    senders: list[str] = field(default_factory=list)
    # Controller processes started (each start after a kill or a boot counts).
    processes: int = 0
    # The freezes: how many, single ones, recovered within their bound, the
    # worst share of its bound one took, those in double faults (beyond the
    # promise), and second cycles of one freeze that a double fault excused.
    freezes: dict[str, float] = field(default_factory=dict)

    def cycles_by(self, node: str) -> list[str]:
        """The hosts whose controllers sent an off to ``node``, in order."""
        return [
            h for h, (n, t) in zip(self.senders, self.sent, strict=True) if n == node and t == "off"
        ]
