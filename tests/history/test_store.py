"""Round trips through the freeze history, on a real SQLite file.

Each test writes through the public API and reads back through it (and, where
the point is what is on disk, through a second store on the same file).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.errors import IncidentAlreadyOpen, WatchdogError
from spark_watchdog.history import (
    CLUSTER,
    HistoryStore,
    InvalidRecord,
    StoreCorrupt,
    StoreError,
    UnknownRecord,
    iso_utc,
)

# The shape of one item of an agent's GET /v1/boots "boots" list
# (spark_watchdog.probes.journal.BootRecord.to_json).
AGENT_BOOT: dict[str, Any] = {
    "boot_id": "0D6E2A4B-9C1F-4E0A-8B7D-3F2E1C0B9A88",
    "first_entry": "2025-06-14T08:00:00.000000+00:00",
    "last_entry": "2025-06-15T15:06:31.250000+00:00",
    "current": False,
    "clean_shutdown": False,
    "evidence": [
        {
            "time": "2025-06-15T15:06:30.000000+00:00",
            "kind": "xid",
            "message": "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, Ch 00000008",
        }
    ],
    "evidence_counts": {"xid": 1, "soft_lockup": 0},
    "kernel_lines": 18234,
    "uncleanly_shut_down_logged": False,
    "damaged_files": [],
}


def open_frozen(store: HistoryStore, node: str = "spark-2", **kw: Any) -> int:
    kw.setdefault("detected_at", store_now(store))
    kw.setdefault("evidence", {"agent": {"seq": 41}})
    return store.open_incident("host_frozen", [node], **kw).id


def store_now(store: HistoryStore) -> float:
    return store._clock()


# -- times ---------------------------------------------------------------------------


def test_an_incident_opened_without_a_detection_time_is_detected_by_the_store_clock(
    store: HistoryStore,
) -> None:
    """What the controller does: a pair's store clock is the database's
    (docs/design.md, "One clock for the pair"), so detection times are on it too."""
    now = store_now(store)
    incident = store.open_incident("host_frozen", ["spark-2"], evidence={})
    assert incident.detected_at == now
    given = store.open_incident("host_frozen", ["spark-3"], detected_at=now - 5, evidence={})
    assert given.detected_at == now - 5


def test_iso_utc_renders_unix_seconds_as_utc() -> None:
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000+00:00"
    assert iso_utc(1_750_000_000.25) == "2025-06-15T15:06:40.250+00:00"
    assert iso_utc(None) is None


def test_to_json_renders_times_as_iso_and_nests_records(store: HistoryStore, clock: Any) -> None:
    incident_id = open_frozen(store, fault_onset=clock.now - 9)
    timeline = store.incident(incident_id)
    assert timeline is not None
    data = timeline.to_json()
    json.dumps(data)  # all of it serialises
    assert data["incident"]["detected_at"] == iso_utc(clock.now)
    assert data["incident"]["nodes"] == ["spark-2"]
    assert data["steps"][0]["step"] == "incident_opened"
    assert data["steps"][0]["at"] == iso_utc(clock.now)


# -- nodes and boots -----------------------------------------------------------------


def test_record_node_keeps_first_seen_and_updates_last_boot(
    store: HistoryStore, clock: Any
) -> None:
    first = store.record_node("spark-1", at=clock.now)
    assert first.last_boot_id is None
    later = store.record_node("spark-1", boot_id="AB-CD", at=clock.now + 100)
    assert later.first_seen == first.first_seen
    assert later.last_boot_id == "abcd"  # normalised like the probes do
    assert [n.name for n in store.nodes()] == ["spark-1"]


def test_boot_upsert_is_idempotent_and_newer_report_wins(store: HistoryStore, clock: Any) -> None:
    kw: dict[str, Any] = {"first_entry": 100.0, "last_entry": 200.0, "clean_shutdown": None}
    first = store.upsert_boot("spark-1", "b1", evidence={"n": 1}, **kw)
    clock.advance(30)
    kw["last_entry"] = 260.0
    kw["clean_shutdown"] = False
    second = store.upsert_boot("spark-1", "b1", evidence={"n": 2}, **kw)
    again = store.upsert_boot("spark-1", "b1", evidence={"n": 2}, **kw)

    assert store.boots("spark-1") == [again]
    assert second.recorded_at == first.recorded_at  # first recorded stays
    assert second.updated_at == first.updated_at + 30
    assert (second.last_entry, second.clean_shutdown, second.evidence) == (260.0, False, {"n": 2})


def test_boot_upsert_never_forgets_a_known_shutdown_or_incident(store: HistoryStore) -> None:
    incident_id = open_frozen(store)
    store.upsert_boot(
        "spark-2",
        "b1",
        first_entry=1.0,
        last_entry=2.0,
        clean_shutdown=False,
        evidence={},
        incident_id=incident_id,
    )
    # A later report that lost the journal file knows less; what we knew stays.
    later = store.upsert_boot(
        "spark-2", "b1", first_entry=None, last_entry=None, clean_shutdown=None, evidence={}
    )
    assert (later.first_entry, later.last_entry) == (1.0, 2.0)
    assert later.clean_shutdown is False
    assert later.incident_id == incident_id


def test_agent_boot_json_round_trip(store: HistoryStore) -> None:
    boot = store.record_agent_boot("spark-2", AGENT_BOOT)
    assert boot.boot_id == "0d6e2a4b9c1f4e0a8b7d3f2e1c0b9a88"
    assert boot.first_entry == 1_749_888_000.0
    assert boot.last_entry == 1_749_999_991.25
    assert boot.clean_shutdown is False
    assert boot.evidence["evidence_counts"] == {"xid": 1, "soft_lockup": 0}
    assert boot.evidence["evidence"][0]["kind"] == "xid"
    assert "boot_id" not in boot.evidence and "first_entry" not in boot.evidence
    # Reported again (the agent reports every boot every time): still one row.
    store.record_agent_boot("spark-2", AGENT_BOOT)
    assert store.boots("spark-2") == [boot]


def test_agent_boot_marked_current_becomes_the_nodes_last_boot(store: HistoryStore) -> None:
    store.record_agent_boot("spark-2", {**AGENT_BOOT, "current": True, "clean_shutdown": None})
    (node,) = store.nodes()
    assert node.last_boot_id == "0d6e2a4b9c1f4e0a8b7d3f2e1c0b9a88"


@pytest.mark.parametrize(
    ("item", "complaint"),
    [
        ({"first_entry": "2025-01-01T00:00:00+00:00"}, "no boot_id"),
        ({**AGENT_BOOT, "first_entry": "yesterday"}, "not an ISO-8601 time"),
        ({**AGENT_BOOT, "clean_shutdown": "no"}, "clean_shutdown"),
        ({**AGENT_BOOT, "evidence": {1, 2}}, "not JSON-serialisable"),
    ],
)
def test_malformed_agent_boot_is_refused_by_name(
    store: HistoryStore, item: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(InvalidRecord, match=complaint):
        store.record_agent_boot("spark-2", item)
    assert store.boots("spark-2") == []


def test_boots_newest_first_and_linking(store: HistoryStore) -> None:
    for n, first in enumerate([10.0, 30.0, 20.0]):
        store.upsert_boot(
            "spark-1", f"b{n}", first_entry=first, last_entry=None, clean_shutdown=None, evidence={}
        )
    assert [b.boot_id for b in store.boots("spark-1")] == ["b1", "b2", "b0"]
    assert [b.boot_id for b in store.boots("spark-1", limit=1)] == ["b1"]
    incident_id = open_frozen(store, node="spark-1")
    assert store.link_boot("spark-1", "b2", incident_id).incident_id == incident_id
    with pytest.raises(UnknownRecord, match="no boot nope of node spark-1"):
        store.link_boot("spark-1", "nope", incident_id)


# -- incidents -----------------------------------------------------------------------


def test_incident_round_trip_with_detect_and_recover_times(store: HistoryStore, clock: Any) -> None:
    evidence = {
        "agent": {"seq": 4411, "boot_id": "b1"},
        "metrics": {"vllm:num_requests_running": 3},
        "gpu_power_w": 11.5,
        "mem_available_bytes": 734_003_200,
        "journal": ["NVRM: Xid 31"],
    }
    opened = store.open_incident(
        "host_frozen",
        ["spark-2"],
        detected_at=clock.now,
        fault_onset=clock.now - 9.0,
        evidence=evidence,
        dry_run=True,
    )
    assert opened.is_open and opened.dry_run
    assert opened.evidence == evidence
    assert opened.time_to_detect_s == 9.0
    assert opened.opened_at == clock.now

    clock.advance(190)
    resolved = store.resolve_incident(opened.id, "recovered", detail={"new_boot_id": "b2"})
    assert (resolved.status, resolved.resolution) == ("resolved", "recovered")
    assert resolved.resolved_at == clock.now
    assert resolved.time_to_recover_s == 190.0
    assert store.get_incident(opened.id) == resolved
    last = store.last_step(opened.id)
    assert last is not None
    assert (last.step, last.detail) == (
        "resolved",
        {"resolution": "recovered", "new_boot_id": "b2"},
    )


@pytest.mark.parametrize("resolution", ["gave_up", "false_alarm"])
def test_only_recovery_has_a_time_to_recover(store: HistoryStore, resolution: str) -> None:
    incident_id = open_frozen(store)
    assert store.resolve_incident(incident_id, resolution).time_to_recover_s is None


def test_resolution_is_validated_and_final(store: HistoryStore) -> None:
    incident_id = open_frozen(store)
    with pytest.raises(InvalidRecord, match="recovered, gave_up, false_alarm"):
        store.resolve_incident(incident_id, "fixed")
    store.resolve_incident(incident_id, "gave_up")
    with pytest.raises(InvalidRecord, match="already resolved"):
        store.resolve_incident(incident_id, "recovered")
    with pytest.raises(UnknownRecord, match="no incident 999"):
        store.resolve_incident(999, "recovered")


def test_incident_spanning_several_nodes_keeps_their_order(store: HistoryStore) -> None:
    nodes = ["spark-3", "spark-1", "spark-4", "spark-2"]
    incident = store.open_incident("serving_stalled", nodes, detected_at=1.0, evidence={})
    assert store.get_incident(incident.id).nodes == tuple(nodes)
    assert store.last_step(incident.id, "spark-3") is None  # a cluster-wide opening step
    assert {n.name for n in store.nodes()} == set(nodes)


@pytest.mark.parametrize(
    ("kind", "nodes", "evidence", "complaint"),
    [
        ("Host Frozen", ["spark-1"], {}, "snake_case"),
        ("host_frozen", [], {}, "one or more nodes"),
        ("host_frozen", "spark-1", {}, "one or more nodes"),
        ("host_frozen", ["spark-1", "spark-1"], {}, "repeat"),
        ("host_frozen", ["*"], {}, "not a node name"),
        ("host_frozen", ["spark-1"], ["not", "an", "object"], "JSON object"),
        ("host_frozen", ["spark-1"], {"power": float("nan")}, "not JSON-serialisable"),
        ("host_frozen", ["spark-1"], {"when": object()}, "not JSON-serialisable"),
    ],
)
def test_open_incident_validates_before_writing(
    store: HistoryStore, kind: str, nodes: Any, evidence: Any, complaint: str
) -> None:
    with pytest.raises(InvalidRecord, match=complaint):
        store.open_incident(kind, nodes, detected_at=1.0, evidence=evidence)
    assert store.list_incidents() == []


def test_list_incidents_filters_newest_first(store: HistoryStore) -> None:
    a = store.open_incident("host_frozen", ["spark-1"], detected_at=100.0, evidence={}).id
    b = store.open_incident("serving_dead", ["spark-1", "spark-2"], detected_at=200.0, evidence={})
    c = store.open_incident("host_frozen", ["spark-3"], detected_at=300.0, evidence={}).id
    store.resolve_incident(a, "recovered")

    def ids(**kw: Any) -> list[int]:
        return [i.id for i in store.list_incidents(**kw)]

    assert ids() == [c, b.id, a]
    assert ids(node="spark-1") == [b.id, a]
    assert ids(node="spark-2") == [b.id]
    assert ids(since=200.0) == [c, b.id]
    assert ids(kind="host_frozen") == [c, a]
    assert ids(status="open") == [c, b.id]
    assert ids(node="spark-1", kind="host_frozen", since=50.0) == [a]
    assert ids(limit=1) == [c]
    assert ids(node="nobody") == []
    assert [i.id for i in store.open_incidents()] == [b.id, c]  # oldest first, for resume


def test_incident_timeline_gathers_everything(store: HistoryStore, clock: Any) -> None:
    incident_id = open_frozen(store)
    store.add_step(incident_id, "rung_started", node="spark-2", detail={"rung": 1})
    action = store.record_action(
        "spark-2", "cycle", device="pdu-a outlet 2", incident_id=incident_id, rung=1
    )
    restart = store.start_serving_restart("safe", incident_id=incident_id)
    store.upsert_boot(
        "spark-2",
        "b1",
        first_entry=1.0,
        last_entry=2.0,
        clean_shutdown=False,
        evidence={},
        incident_id=incident_id,
    )
    other = open_frozen(store, node="spark-1")
    store.record_action("spark-1", "off", device="pdu-a outlet 1", incident_id=other)

    timeline = store.incident(incident_id)
    assert timeline is not None
    assert timeline.incident == store.get_incident(incident_id)
    assert [s.step for s in timeline.steps] == ["incident_opened", "rung_started"]
    assert timeline.actions == (action,)
    assert timeline.serving_restarts == (restart,)
    assert [b.boot_id for b in timeline.boots] == ["b1"]
    assert store.incident(12345) is None
    with pytest.raises(UnknownRecord):
        store.get_incident(12345)


# -- the write-ahead log -------------------------------------------------------------


def test_steps_are_numbered_per_incident_and_read_back_in_order(
    store: HistoryStore, clock: Any
) -> None:
    first = open_frozen(store, node="spark-1")
    second = open_frozen(store, node="spark-2")
    for step in ["rung_started", "off_requested", "off_verified"]:
        clock.advance(1)
        store.add_step(first, step, node="spark-1", detail={"t": clock.now})
    store.add_step(second, "rung_started", node="spark-2")

    steps = store.steps(first)
    assert [(s.seq, s.step) for s in steps] == [
        (1, "incident_opened"),
        (2, "rung_started"),
        (3, "off_requested"),
        (4, "off_verified"),
    ]
    assert [s.at for s in steps[1:]] == [s.detail["t"] for s in steps[1:]]
    assert [s.seq for s in store.steps(second)] == [1, 2]
    assert store.steps(999) == []


def test_last_step_per_node_is_what_resume_needs(store: HistoryStore) -> None:
    incident = store.open_incident(
        "host_frozen", ["spark-1", "spark-2"], detected_at=1.0, evidence={}
    )
    store.add_step(incident.id, "off_requested", node="spark-1")
    store.add_step(incident.id, "off_verified", node="spark-1")
    store.add_step(incident.id, "hold_started", node="spark-1", detail={"seconds": 60})
    store.add_step(incident.id, "off_requested", node="spark-2")
    store.add_step(incident.id, "serving_stop_requested")

    spark1 = store.last_step(incident.id, "spark-1")
    spark2 = store.last_step(incident.id, "spark-2")
    assert spark1 is not None and spark2 is not None
    assert (spark1.step, spark1.detail) == ("hold_started", {"seconds": 60})
    assert spark2.step == "off_requested"
    latest = store.last_step(incident.id)
    assert latest is not None and (latest.step, latest.node) == ("serving_stop_requested", None)
    assert store.last_step(incident.id, "spark-3") is None


def test_steps_are_refused_after_resolution_and_for_unknown_incidents(
    store: HistoryStore,
) -> None:
    incident_id = open_frozen(store)
    store.resolve_incident(incident_id, "false_alarm")
    with pytest.raises(InvalidRecord, match="resolved"):
        store.add_step(incident_id, "rung_started")
    with pytest.raises(UnknownRecord, match="no incident 77"):
        store.add_step(77, "rung_started")
    with pytest.raises(InvalidRecord, match="snake_case"):
        store.add_step(open_frozen(store), "Off Requested")
    with pytest.raises(InvalidRecord, match="not JSON-serialisable"):
        store.add_step(open_frozen(store, "spark-3"), "rung_started", detail={"bytes": b"\x00"})


def test_a_node_has_one_open_fencing_incident(store: HistoryStore) -> None:
    first = open_frozen(store)
    with pytest.raises(IncidentAlreadyOpen, match="spark-2 already has open incident"):
        open_frozen(store)
    # Dry-run incidents and other kinds are not fencing: they may overlap.
    open_frozen(store, dry_run=True)
    store.open_incident("serving_dead", ["spark-2"], detected_at=store_now(store), evidence={})
    store.resolve_incident(first, "recovered")
    open_frozen(store)


# -- actions -------------------------------------------------------------------------


def test_action_with_its_write_ahead_steps(store: HistoryStore, clock: Any) -> None:
    incident_id = open_frozen(store)
    action = store.record_action(
        "spark-2",
        "off",
        device="snmp pdu-a outlet 2",
        incident_id=incident_id,
        rung=1,
        step="off_requested",
        step_detail={"outlet": 2},
    )
    assert (action.result, action.verified_at, action.requested_at) == ("pending", None, clock.now)
    requested = store.last_step(incident_id, "spark-2")
    assert requested is not None
    assert requested.step == "off_requested"
    assert requested.detail == {
        "action_id": action.id,
        "operation": "off",
        "device": "snmp pdu-a outlet 2",
        "outlet": 2,
    }

    clock.advance(4)
    done = store.finish_action(action.id, "verified", step="off_verified")
    assert (done.result, done.verified_at, done.error) == ("verified", clock.now, None)
    verified = store.last_step(incident_id, "spark-2")
    assert verified is not None
    assert verified.step == "off_verified"
    assert verified.detail == {"action_id": action.id, "result": "verified"}
    assert store.actions(incident_id=incident_id) == [done]


def test_ambiguous_action_may_be_settled_but_final_results_are_final(
    store: HistoryStore,
) -> None:
    incident_id = open_frozen(store)
    action = store.record_action("spark-2", "on", device="pdu", incident_id=incident_id)
    unsure = store.finish_action(action.id, "ambiguous", error="SET timed out")
    assert (unsure.result, unsure.error) == ("ambiguous", "SET timed out")
    # After re-reading the outlet the controller knows.
    settled = store.finish_action(action.id, "verified", verified_at=5.0)
    assert (settled.result, settled.verified_at) == ("verified", 5.0)
    with pytest.raises(InvalidRecord, match="already finished"):
        store.finish_action(action.id, "failed")
    with pytest.raises(InvalidRecord, match="pending"):
        store.finish_action(action.id, "pending")
    with pytest.raises(UnknownRecord, match="no action 404"):
        store.finish_action(404, "failed")


def test_dry_run_action_is_recorded_as_dry_run_and_final(store: HistoryStore) -> None:
    incident_id = open_frozen(store, dry_run=True)
    action = store.record_action(
        "spark-2", "cycle", device="pdu", incident_id=incident_id, dry_run=True
    )
    assert (action.result, action.dry_run) == ("dry_run", True)
    with pytest.raises(InvalidRecord, match="already finished"):
        store.finish_action(action.id, "verified")


def test_operator_action_has_no_incident(store: HistoryStore) -> None:
    action = store.record_action("spark-4", "ssh_reboot", device="ssh spark-4")
    assert action.incident_id is None
    assert store.actions(node="spark-4") == [action]
    with pytest.raises(InvalidRecord, match="without an incident"):
        store.record_action("spark-4", "off", device="pdu", step="off_requested")


@pytest.mark.parametrize(
    ("kw", "complaint"),
    [
        ({"operation": "reboot"}, "operation must be one of"),
        ({"device": ""}, "device"),
        ({"rung": "1"}, "rung"),
        ({"node": ""}, "not a node name"),
    ],
)
def test_record_action_validates(store: HistoryStore, kw: dict[str, Any], complaint: str) -> None:
    args: dict[str, Any] = {"node": "spark-1", "operation": "off", "device": "pdu", **kw}
    with pytest.raises(InvalidRecord, match=complaint):
        store.record_action(args.pop("node"), args.pop("operation"), **args)
    assert store.actions() == []


# -- budgets -------------------------------------------------------------------------


def test_power_cycle_budget_counts_every_attempt_that_may_have_cut_power(
    store: HistoryStore, clock: Any
) -> None:
    six_hours = 6 * 3600
    incident_id = open_frozen(store, node="spark-1")

    def act(node: str, operation: str, result: str | None, *, dry_run: bool = False) -> None:
        clock.advance(60)
        action = store.record_action(
            node, operation, device="pdu", incident_id=incident_id, dry_run=dry_run
        )
        if result is not None and not dry_run:
            store.finish_action(action.id, result)

    act("spark-1", "cycle", "verified")  # counts
    act("spark-1", "off", "failed")  # counts: may have cut power before failing
    act("spark-1", "off", "ambiguous")  # counts: fate unknown
    act("spark-1", "cycle", None)  # counts: pending (crashed mid-action)
    act("spark-1", "on", "verified")  # not a power cut
    act("spark-1", "agent_restart", "verified")  # not a power cut
    act("spark-1", "ssh_reboot", "verified")  # not a power cut
    act("spark-1", "cycle", None, dry_run=True)  # nothing was sent
    act("spark-2", "cycle", "verified")  # another node
    store.record_action("spark-1", "cycle", device="pdu", at=clock.advance(60))  # operator

    since = clock.now - six_hours
    assert store.power_cycles_since("spark-1", since) == 5
    assert store.power_cycles_since("spark-2", since) == 1
    assert store.power_cycles_since("spark-3", since) == 0
    assert store.cluster_power_cycles_since(since) == 6
    times = store.power_cut_times(since, node="spark-1")
    assert times == sorted(times) and len(times) == 5

    # The window slides: six hours after the second cut only the later ones count.
    later = times[1] + six_hours + 1
    assert store.power_cycles_since("spark-1", later - six_hours) == 3


# -- serving restarts ----------------------------------------------------------------


def test_serving_restart_round_trip(store: HistoryStore, clock: Any) -> None:
    incident_id = open_frozen(store)
    started = store.start_serving_restart("safe", incident_id=incident_id)
    assert (started.result, started.finished_at, started.step_durations) == ("running", None, {})
    clock.advance(92.5)
    steps = {"stop_head": 2.0, "stop_workers": 3.5, "start_workers": 40.0, "start_head": 47.0}
    done = store.finish_serving_restart(started.id, "succeeded", step_durations=steps)
    assert (done.result, done.duration_s, done.finished_at) == ("succeeded", 92.5, clock.now)
    assert list(done.step_durations.items()) == list(steps.items())  # order kept
    with pytest.raises(InvalidRecord, match="already finished"):
        store.finish_serving_restart(started.id, "failed", step_durations={})

    operator = store.start_serving_restart("fast")
    failed = store.finish_serving_restart(
        operator.id, "profile_mismatch", step_durations={}, error="cudagraph_mode stayed FULL"
    )
    assert failed.incident_id is None and failed.error == "cudagraph_mode stayed FULL"
    assert [r.id for r in store.serving_restarts()] == [operator.id, started.id]
    with pytest.raises(InvalidRecord, match="step_durations"):
        store.finish_serving_restart(
            store.start_serving_restart("safe").id,
            "failed",
            step_durations={"x": "slow"},  # type: ignore[dict-item]
        )


# -- holds ---------------------------------------------------------------------------


def test_hold_release_round_trip(store: HistoryStore, clock: Any) -> None:
    held = store.hold("spark-2", "replacing PSU", by="alice")
    assert held.active and not held.cluster_wide
    again = store.hold("spark-2", "another reason", by="controller")
    assert again == held  # one active hold per target; the first reason stands
    assert store.active_holds() == [held]
    assert store.active_hold("spark-2") == held
    assert store.active_hold("spark-1") is None

    clock.advance(600)
    released = store.release("spark-2", by="bob")
    assert released is not None
    assert (released.released_at, released.released_by) == (clock.now, "bob")
    assert store.active_holds() == []
    assert store.release("spark-2", by="bob") is None
    assert store.holds() == [released]  # history kept


def test_cluster_hold_covers_every_node_and_node_hold_wins(store: HistoryStore) -> None:
    cluster = store.hold(CLUSTER, "circuit breaker tripped", by="controller")
    assert cluster.cluster_wide
    assert store.active_hold("spark-7") == cluster
    node = store.hold("spark-7", "budget exhausted", by="controller")
    assert store.active_hold("spark-7") == node
    assert store.release(CLUSTER, by="alice") is not None  # only the cluster hold
    assert store.active_holds() == [node]
    store.hold(CLUSTER, "again", by="alice")
    released = store.release_all(by="alice")
    assert {h.node for h in released} == {CLUSTER, "spark-7"}
    assert store.active_holds() == []


@pytest.mark.parametrize(("reason", "by"), [("", "alice"), ("ok", ""), ("  ", "alice")])
def test_hold_needs_a_reason_and_a_name(store: HistoryStore, reason: str, by: str) -> None:
    with pytest.raises(InvalidRecord):
        store.hold("spark-1", reason, by=by)


# -- settings ------------------------------------------------------------------------


def test_settings_round_trip(store: HistoryStore, clock: Any) -> None:
    assert store.setting("serving_profile") is None
    store.set_setting("serving_profile", "default", by="alice")
    clock.advance(10)
    profile = store.set_setting("serving_profile", "safe", by="controller")
    breaker = {"tripped": True, "why": "3 of 4 nodes unhealthy in 120 s", "at": clock.now}
    store.set_setting("circuit_breaker", breaker, by="controller")

    assert (profile.value, profile.changed_by, profile.changed_at) == (
        "safe",
        "controller",
        clock.now,
    )
    settings = store.settings()
    assert list(settings) == ["circuit_breaker", "serving_profile"]
    assert settings["circuit_breaker"].value == breaker
    with pytest.raises(InvalidRecord, match="setting key"):
        store.set_setting("Bad Key", 1, by="alice")
    with pytest.raises(InvalidRecord, match="not JSON-serialisable"):
        store.set_setting("x", {1, 2}, by="alice")


# -- JSON cells on the way out ---------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "column", "reader", "named"),
    [
        ("incidents", "evidence", lambda s, i: s.get_incident(i), "incident 1 evidence"),
        ("incident_steps", "detail", lambda s, i: s.steps(i), "incident 1 step 1 detail"),
        ("settings", "value", lambda s, i: s.settings(), "setting 'serving_profile' value"),
    ],
)
def test_corrupt_json_cell_names_the_row(
    sqlite_store: HistoryStore, db_path: Path, table: str, column: str, reader: Any, named: str
) -> None:
    incident_id = open_frozen(sqlite_store)
    sqlite_store.set_setting("serving_profile", "safe", by="alice")
    raw = sqlite3.connect(db_path)
    with raw:
        raw.execute(f"UPDATE {table} SET {column} = '{{not json'")
    raw.close()
    with pytest.raises(StoreCorrupt, match=named) as caught:
        reader(sqlite_store, incident_id)
    assert str(db_path) in str(caught.value)
    assert isinstance(caught.value, StoreError) and isinstance(caught.value, WatchdogError)


def test_json_cell_of_the_wrong_shape_is_corrupt(sqlite_store: HistoryStore, db_path: Path) -> None:
    incident_id = open_frozen(sqlite_store)
    raw = sqlite3.connect(db_path)
    with raw:
        raw.execute("UPDATE incidents SET evidence = '[1, 2]'")
    raw.close()
    with pytest.raises(StoreCorrupt, match="should be a JSON object"):
        sqlite_store.get_incident(incident_id)


# -- two stores, threads -----------------------------------------------------------------


def test_cli_and_controller_stores_see_each_others_writes(db_path: Path, clock: Any) -> None:
    with (
        HistoryStore(db_path, clock=clock) as controller,
        HistoryStore(db_path, clock=clock) as cli,
    ):
        assert controller.active_holds() == []
        cli.hold("spark-3", "maintenance", by="alice")
        assert [h.node for h in controller.active_holds()] == ["spark-3"]
        incident_id = open_frozen(controller, node="spark-1")
        assert [i.id for i in cli.list_incidents()] == [incident_id]
        cli.release("spark-3", by="alice")
        assert controller.active_holds() == []
        with HistoryStore(db_path, read_only=True) as reader:
            assert [i.id for i in reader.open_incidents()] == [incident_id]


def test_steps_from_many_threads_and_two_stores_get_unique_contiguous_seqs(
    db_path: Path,
) -> None:
    stores = [HistoryStore(db_path), HistoryStore(db_path)]
    incident_id = open_frozen(stores[0])
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for k in range(10):
                stores[n % 2].add_step(incident_id, "probe", detail={"worker": n, "k": k})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    steps = stores[1].steps(incident_id)
    assert [s.seq for s in steps] == list(range(1, 62))
    for n in range(6):  # each worker's steps kept their own order
        mine = [s.detail["k"] for s in steps if s.detail.get("worker") == n]
        assert mine == list(range(10))
    for s in stores:
        s.close()


def test_closed_store_says_so(db_path: Path) -> None:
    store = HistoryStore(db_path)
    store.close()
    store.close()  # twice is fine
    with pytest.raises(StoreError, match="closed"):
        store.active_holds()
