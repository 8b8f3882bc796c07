"""status, history, show, boots, hold, release over a real history database."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spark_watchdog.cli.main import main
from spark_watchdog.history.store import HistoryStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "history.db"
    now = time.time()
    with HistoryStore(path) as store:
        incident = store.open_incident(
            "host_frozen",
            ["spark-3"],
            detected_at=now - 100,
            fault_onset=now - 108,
            evidence={"reasons": ["agent silent 8.0s", "no ssh banner x2"]},
        )
        action = store.record_action(
            "spark-3",
            "cycle",
            device="snmp pdu outlet 3",
            incident_id=incident.id,
            rung=0,
            step="rung_started",
        )
        store.add_step(incident.id, "off_requested", node="spark-3")
        store.add_step(incident.id, "off_verified", node="spark-3")
        store.finish_action(action.id, "verified", step="power_restored")
        store.record_agent_boot(
            "spark-3",
            {
                "boot_id": "a" * 32,
                "first_entry": "2026-11-29T01:00:00+00:00",
                "last_entry": "2026-11-30T01:00:00+00:00",
                "current": False,
                "clean_shutdown": False,
                "evidence": [
                    {"time": "2026-11-30T01:00:00+00:00", "kind": "xid", "message": "NVRM: Xid 31"}
                ],
            },
            incident_id=incident.id,
        )
        store.resolve_incident(incident.id, "recovered")
        store.open_incident("serving_stalled", ["spark-1"], detected_at=now - 5, evidence={})
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_history_table_and_json(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["history", "--db", str(db)], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "DETECTED", "(UTC)"]
    assert "serving_stalled" in lines[1] and "host_frozen" in lines[2]
    assert "recovered" in lines[2] and "8.0s" in lines[2]
    code, out, _ = run(["history", "--db", str(db), "--node", "spark-3", "--json"], capsys)
    incidents = json.loads(out)["incidents"]
    assert [i["kind"] for i in incidents] == ["host_frozen"]
    code, out, _ = run(["history", "--db", str(db), "--since", "1m", "--json"], capsys)
    assert [i["kind"] for i in json.loads(out)["incidents"]] == ["serving_stalled"]


def test_bad_since_is_a_usage_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["history", "--db", str(db), "--since", "yesterday"], capsys)
    assert code == 2 and 'expected an age like 30m, 12h, 7d or 2w, got "yesterday"' in err


def test_show_timeline(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["show", "1", "--db", str(db)], capsys)
    assert code == 0
    assert "incident #1: host_frozen on spark-3" in out
    assert "agent silent 8.0s; no ssh banner x2" in out
    timeline = out.split("timeline:", 1)[1]
    steps = ["incident_opened", "rung_started", "off_requested", "off_verified", "resolved"]
    positions = [timeline.index(f" {step}") for step in steps]
    assert positions == sorted(positions)
    assert "cycle spark-3 via snmp pdu outlet 3: verified" in out
    assert "UNCLEAN" in out
    code, out, _ = run(["show", "1", "--db", str(db), "--json"], capsys)
    body = json.loads(out)
    assert body["incident"]["resolution"] == "recovered"
    code, _, err = run(["show", "99", "--db", str(db)], capsys)
    assert code == 1 and "no incident 99" in err


def test_boots(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["boots", "spark-3", "--db", str(db), "--json"], capsys)
    boots = json.loads(out)["boots"]
    assert code == 0 and boots[0]["clean_shutdown"] is False and boots[0]["incident_id"] == 1


def test_hold_and_release(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["hold", "spark-2", "--reason", "swap PSU", "--db", str(db)], capsys)
    assert code == 0 and "held spark-2: swap PSU" in out
    with HistoryStore(db, read_only=True) as store:
        hold = store.active_hold("spark-2")
        assert hold is not None and hold.created_by == "cli"
    code, out, _ = run(["release", "spark-2", "--db", str(db)], capsys)
    assert code == 0 and "released spark-2" in out
    code, _, err = run(["hold", "--db", str(db), "--reason", "x"], capsys)
    assert code == 2 and "give a NODE or --all" in err
    code, out, _ = run(
        ["hold", "--all", "--reason", "breaker test", "--db", str(db), "--json"], capsys
    )
    assert json.loads(out)["node"] == "*"
    code, out, _ = run(["release", "--all", "--db", str(db), "--json"], capsys)
    assert [h["node"] for h in json.loads(out)["released"]] == ["*"]


def test_status_without_a_controller_reads_the_history(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = run(["status", "--db", str(db), "--url", "http://127.0.0.1:9", "--json"], capsys)
    body = json.loads(out)
    assert body["source"].startswith("history")
    assert [i["kind"] for i in body["open_incidents"]] == ["serving_stalled"]


def test_missing_database_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["history", "--db", str(tmp_path / "none.db")], capsys)
    assert code == 1 and "no history database at" in err
