"""status, history, show, boots, hold, release over a real history database."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from spark_watchdog.cli.main import main
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
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


@pytest.fixture
def config(db: Path) -> Path:
    """The controller's config, whose history is ``db``."""
    path = db.parent / "controller.yaml"
    nodes = [{"name": f"spark-{i}", "agent": f"http://127.0.0.1:{9000 + i}"} for i in (1, 2, 3)]
    path.write_text(yaml.safe_dump({"nodes": nodes, "history": str(db)}))
    return path


def test_hold_and_release(db: Path, config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["hold", "spark-2", "--reason", "swap PSU", "--config", str(config)], capsys)
    assert code == 0 and "held spark-2: swap PSU" in out
    with HistoryStore(db, read_only=True) as store:
        hold = store.active_hold("spark-2")
        assert hold is not None and hold.created_by == "cli"
    code, out, _ = run(["release", "spark-2", "--db", str(db), "--config", str(config)], capsys)
    assert code == 0 and "released spark-2" in out
    # With --db alone, the nodes the history has recorded are the known ones.
    code, out, _ = run(["hold", "spark-3", "--reason", "reseat", "--db", str(db)], capsys)
    assert code == 0 and "held spark-3: reseat" in out
    code, out, _ = run(["release", "spark-3", "--db", str(db)], capsys)
    assert code == 0 and "released spark-3" in out
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


@pytest.mark.parametrize(
    "argv",
    [
        ["history"],
        ["show", "1"],
        ["boots", "spark-3"],
        ["status", "--url", "http://127.0.0.1:9"],
        ["hold", "spark-1", "--reason", "x"],
        ["hold", "--all", "--reason", "x"],
        ["release", "spark-1"],
        ["release", "--all"],
    ],
)
def test_a_db_that_does_not_exist_is_refused_and_not_created(
    tmp_path: Path, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    typo = tmp_path / "typo.db"
    code, out, err = run([*argv, "--db", str(typo)], capsys)
    assert code == 2 and out == ""
    assert err == (
        f"spark-watchdog: --db {typo}: no such file; give the history database the "
        "controller writes (the history: path of its config, default "
        "/var/lib/spark-watchdog/history.db), or --config FILE instead of --db\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_unknown_nodes_are_refused(
    db: Path, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["hold", "spark-9", "--reason", "x", "--config", str(config)], capsys)
    assert (code, out) == (2, "")
    assert err == (
        f'spark-watchdog: hold: no node "spark-9" in the config {config}; '
        "known: spark-1, spark-2, spark-3\n"
    )
    code, _, err = run(["hold", "spark-9", "--reason", "x", "--db", str(db)], capsys)
    assert code == 2
    assert err == (
        f'spark-watchdog: hold: no node "spark-9" in history {db} (nodes it has recorded); '
        "known: spark-1, spark-3; to check the name against the controller's nodes, "
        "add --config FILE\n"
    )
    code, _, err = run(["release", "spark-9", "--config", str(config)], capsys)
    assert code == 2 and 'release: no node "spark-9" in the config' in err
    with HistoryStore(db, read_only=True) as store:
        assert store.active_holds() == []
    # A hold left on a node since removed from the config can still be released.
    with HistoryStore(db) as store:
        store.hold("spark-7", "decommissioned", by="alice")
    code, out, _ = run(["release", "spark-7", "--config", str(config)], capsys)
    assert code == 0 and out == "released spark-7\n"
    code, _, err = run(["hold", "spark-1", "--reason", " ", "--config", str(config)], capsys)
    assert code == 2 and err == (
        "spark-watchdog: hold: --reason must say why (it is shown with the hold)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["show", "99999999999999999999999"],
            "argument INCIDENT: expected a whole number from 1 to 9223372036854775807, "
            "got '99999999999999999999999'",
        ),
        (
            ["show", "0"],
            "argument INCIDENT: expected a whole number from 1 to 9223372036854775807, got '0'",
        ),
        (
            ["history", "--limit", "-1"],
            "argument --limit: expected a whole number from 1 to 9223372036854775807, got '-1'",
        ),
        (
            ["history", "--limit", "1e3"],
            "argument --limit: expected a whole number from 1 to 9223372036854775807, got '1e3'",
        ),
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    db: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--db", str(db)])
    _, err = capsys.readouterr()
    assert exited.value.code == 2
    assert f"error: {message}\n" in err


def test_an_age_too_large_for_a_number_is_a_usage_error(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    age = "9" * 400 + "w"
    code, _, err = run(["history", "--db", str(db), "--since", age], capsys)
    assert code == 2
    assert err == f'spark-watchdog: --since: expected an age like 30m, 12h, 7d or 2w, got "{age}"\n'


@pytest.mark.parametrize("url", ["notaurl", "http://[::1", "http://h:x", "ftp://h"])
def test_a_url_that_is_not_one_is_a_usage_error(
    db: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["status", "--db", str(db), "--url", url], capsys)
    assert (code, out) == (2, "")
    assert err == f"spark-watchdog: --url {url}: expected the controller's URL, http://HOST:PORT\n"


def test_show_draws_the_flight_recorder_and_json_has_every_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = FlightRecorder(120.0)
    for t in range(40):
        snapshot = {
            "probes": {
                "host": {"mem_available_bytes": (30 - t // 2) * 1024**3},
                "gpu": {"state": "ok", "devices": [{"power_w": 45.0 - t / 4}]},
                "vllm": {"state": "progressing" if t < 30 else "stalled", "engine_steps": t * 5},
            }
        }
        recorder.note("spark-2", snapshot, 5000.0 + t)
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        store.open_incident(
            "host_frozen",
            ["spark-2"],
            detected_at=5040.0,
            evidence={
                "reasons": ["agent silent 8.0s"],
                "flight_recorder": recorder.evidence("spark-2"),
            },
        )
    code, out, _ = run(["show", "1", "--db", str(path)], capsys)
    assert code == 0
    drawing = out.split("flight recorder (spark-2: 40 samples from -40s to -1s", 1)[1]
    assert "MemAvailable GiB" in drawing and "30 → 11" in drawing
    assert "progressing (-40s) → stalled (-10s)" in drawing
    assert drawing.index("MemAvailable") < drawing.index("timeline:")
    code, out, _ = run(["show", "1", "--db", str(path), "--json"], capsys)
    kept = json.loads(out)["incident"]["evidence"]["flight_recorder"]
    assert len(kept["samples"]) == 40 and kept["fields"][0] == "t"


def test_show_prints_the_innermost_frames_of_the_stacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "history.db"
    stack = "Thread 7 (idle)\n    wait_for_gpu (rank.py:4)\n    <module> (rank.py:5)\n"
    nodes = {
        "spark-1": {"processes": [{"pid": 7, "command": "python rank.py", "stack": stack}]},
        "spark-2": {"processes": [{"pid": 9, "command": "vllm", "error": "Permission denied"}]},
        "spark-3": {"processes": [], "note": "py-spy is not installed"},
    }
    with HistoryStore(path) as store:
        incident = store.open_incident(
            "serving_stalled", ["spark-1"], detected_at=time.time(), evidence={}
        )
        store.add_step(incident.id, "stacks_recorded", detail={"nodes": nodes})
    code, out, _ = run(["show", "1", "--db", str(path)], capsys)
    assert code == 0
    assert "pid 7: python rank.py" in out and "wait_for_gpu (rank.py:4)" in out
    assert "(Permission denied)" in out and "spark-3 (py-spy is not installed)" in out


def test_show_says_a_live_gpu_fault_and_the_journal_s_lines_each_with_its_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_watchdog.controller.look.rank_kills import live_faults

    fault = {"id": 1, "xid": 31, "at_unix": 5037.7, "gpu": 0, "result": "stopped"}
    path = tmp_path / "history.db"
    with HistoryStore(path) as store:
        incident = store.open_incident(
            "host_frozen",
            ["spark-2"],
            detected_at=5048.0,
            evidence={
                "reasons": ["agent silent 8.0s"],
                "live_gpu_faults": live_faults({"gpu_faults": {"faults": [fault]}}, 5040.0),
            },
        )
        store.upsert_boot(
            "spark-2",
            "b0",
            first_entry=4000.0,
            last_entry=5037.9,
            clean_shutdown=False,
            evidence={"xid": [{"message": "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, MMU Fault"}]},
            incident_id=incident.id,
        )
    code, out, _ = run(["show", "1", "--db", str(path)], capsys)
    assert code == 0
    assert (
        "gpu fault Xid 31 (GPU memory page fault (MMU fault)) on GPU 0 at 01:23:57.7 UTC, "
        "2.3 s before its agent went silent  (live: the agent's report, before the silence)"
    ) in out
    assert (
        "journal xid: NVRM: Xid (PCI:000f:01:00): 31, pid=4242, MMU Fault  (from the journal"
        in (out)
    )


# A value no clock gives, as a row may hold it: written before the controller
# checked what its agents send (a GPU fault's time in microseconds), or changed
# outside spark-watchdog (text in a time's column).
ABSURD_TIMES = [1.7e15, -1.7e15, 1e300, "soon"]


@pytest.mark.parametrize("absurd", ABSURD_TIMES, ids=repr)
def test_one_row_with_an_absurd_time_blinds_no_listing(
    db: Path, absurd: object, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = sqlite3.connect(db)
    with raw:
        raw.execute(
            "UPDATE incidents SET fault_onset = ?, detected_at = ?, opened_at = ?, "
            "time_to_detect_s = ? WHERE id = 1",
            (absurd, absurd, absurd, absurd),
        )
        raw.execute("UPDATE incident_steps SET at = ? WHERE incident_id = 1 AND seq = 2", (absurd,))
        raw.execute("UPDATE actions SET verified_at = ? WHERE incident_id = 1", (absurd,))
        raw.execute("UPDATE boots SET first_entry = ? WHERE incident_id = 1", (absurd,))
    raw.close()
    code, out, err = run(["history", "--db", str(db), "--json"], capsys)
    assert code == 0, err
    listed = {i["id"]: i for i in json.loads(out)["incidents"]}
    assert set(listed) == {1, 2}  # the rest of the list still shows
    assert listed[1]["fault_onset"] is None and listed[1]["detected_at"] is None
    assert listed[1]["kind"] == "host_frozen" and listed[2]["kind"] == "serving_stalled"
    code, out, err = run(["history", "--db", str(db)], capsys)
    assert code == 0 and "host_frozen" in out and "serving_stalled" in out, err
    code, out, err = run(["show", "1", "--db", str(db), "--json"], capsys)
    assert code == 0, err
    body = json.loads(out)
    assert body["incident"]["opened_at"] is None and body["steps"][1]["at"] is None
    assert body["actions"][0]["verified_at"] is None and body["boots"][0]["first_entry"] is None
    code, out, err = run(["show", "1", "--db", str(db)], capsys)
    assert code == 0, err
    assert "detected  unknown" in out and "t=       ?  spark-3 off_requested" in out
    assert "cycle spark-3 via snmp pdu outlet 3: verified" in out
