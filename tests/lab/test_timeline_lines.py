"""The story's one line per power step (lab/timeline.py)."""

from __future__ import annotations

import pytest

from spark_watchdog.history.records import IncidentStep
from spark_watchdog.lab.timeline import _POWER_LINES, _power_line

DEVICE = "PDU 127.0.0.1 outlet 2"


def _step(name: str, detail: dict[str, object], at: float = 10.0) -> IncidentStep:
    return IncidentStep(incident_id=1, seq=1, at=at, node="spark-2", step=name, detail=dict(detail))


@pytest.mark.parametrize(
    ("name", "detail", "times", "line"),
    [
        ("rung_started", {"rung": 0}, {}, f"fencing spark-2: power path 1, {DEVICE}"),
        ("off_verified", {}, {"off_requested": 9.5}, f"{DEVICE} off (verified 0.5s)"),
        ("on_verified", {}, {}, f"{DEVICE} on (verified)"),
        ("already_off", {}, {}, f"{DEVICE} read back off already: no command sent"),
        ("already_on", {}, {}, f"{DEVICE} read back on already: no command sent"),
        ("off_ambiguous", {"detail": "timeout"}, {}, f"{DEVICE}: off ambiguous: timeout"),
        ("hold_started", {"remaining_s": 5}, {}, f"{DEVICE} held off 5s"),
        ("on_ambiguous", {"detail": "no answer"}, {}, f"{DEVICE}: on ambiguous: no answer"),
        ("rung_failed", {"error": "timeout"}, {}, f"{DEVICE} failed: timeout"),
    ],
)
def test_each_power_step_reads_as_one_line(
    name: str, detail: dict[str, object], times: dict[str, float], line: str
) -> None:
    assert name in _POWER_LINES
    assert _power_line(name, _step(name, detail), detail, DEVICE, times).startswith(line)
