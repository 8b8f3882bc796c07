"""Another controller's answers read back as records (controller/page/peer_records.py):
what a controller's page API writes reads back the same, and what it never
writes is refused with the field named."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.controller.page.peer_records import (
    BadRecord,
    incident_list,
    timeline,
)
from spark_watchdog.history.records import IncidentTimeline
from spark_watchdog.history.store import HistoryStore


def _everything(path: Path) -> IncidentTimeline:
    """One incident with a step of each part: an action, a serving restart, a boot."""
    now = time.time()
    with HistoryStore(path) as store:
        incident = store.open_incident(
            "host_frozen",
            ["spark-2"],
            detected_at=now - 30,
            fault_onset=now - 38,
            evidence={"reasons": ["agent silent 8.0s"], "flight_recorder": {"fields": ["t"]}},
        )
        action = store.record_action(
            "spark-2", "cycle", device="pdu outlet 2", incident_id=incident.id, rung=0
        )
        store.add_step(incident.id, "off_requested", node="spark-2", detail={"on_after_s": 60})
        store.finish_action(action.id, "verified", step="power_restored")
        restart = store.start_serving_restart("safe", incident_id=incident.id)
        store.finish_serving_restart(restart.id, "succeeded", step_durations={"stop": 1.5})
        store.upsert_boot(
            "spark-2",
            "a" * 32,
            first_entry=now - 900,
            last_entry=now - 31,
            clean_shutdown=False,
            evidence={"xid": [{"message": "NVRM: Xid 79"}]},
            incident_id=incident.id,
        )
        store.resolve_incident(incident.id, "recovered")
        found = store.incident(incident.id)
    assert found is not None
    return found


def _wire(value: Any) -> Any:
    """As it crosses HTTP: JSON text and back."""
    return json.loads(json.dumps(value))


def test_a_timeline_reads_back_as_the_controller_wrote_it(tmp_path: Path) -> None:
    written = _everything(tmp_path / "history.db")
    read = timeline(_wire(written.to_json()), written.incident.id)
    assert read.to_json() == written.to_json()
    listed = {"incidents": [{**written.incident.to_json(), "evidence_keys": ["reasons"]}]}
    [(incident, keys)] = incident_list(_wire(listed), 50)
    assert incident.id == written.incident.id and keys == ("reasons",)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda t: t["incident"].update(status="closed"), "incident.status: expected one of"),
        (lambda t: t["steps"][0].update(step="Off Requested"), "answer.steps[0].step"),
        (lambda t: t["actions"][0].update(device=["x"]), "answer.actions[0].device"),
        (lambda t: t["actions"][0].update(error="x" * 5000), "answer.actions[0].error"),
        (lambda t: t["boots"][0].update(evidence=[]), "answer.boots[0].evidence: expected an"),
        (lambda t: t.update(steps=[t["steps"][0]] * 10_001), "answer.steps: expected a list"),
        (lambda t: t["incident"].pop("evidence"), "incident: no evidence"),
        (lambda t: t["incident"].update(opened_at="2026-12-01T10:00:00"), "UTC offset"),
    ],
)
def test_what_no_controller_writes_is_refused_with_its_field(
    tmp_path: Path, change: Any, named: str
) -> None:
    written = _everything(tmp_path / "history.db")
    answer = _wire(written.to_json())
    change(answer)
    with pytest.raises(BadRecord, match=named.replace("[", r"\[").replace("]", r"\]")):
        timeline(answer, written.incident.id)


def test_unknown_times_read_as_unknown_and_extra_fields_are_dropped(tmp_path: Path) -> None:
    written = _everything(tmp_path / "history.db")
    answer = _wire(written.to_json())
    answer["incident"].update(detected_at=None, injected="<script>")
    read = timeline(answer, written.incident.id)
    assert read.to_json()["incident"]["detected_at"] is None
    assert "injected" not in read.to_json()["incident"]
