"""Every lab scenario end to end: a fresh 4-node lab each, the real controller,
the fault, and the expected outcome asserted twice: from the scenario's JSON
and from the history database the controller wrote (rows present, one cycle
per incident, no action against a healthy node). Afterwards no process of
the lab may be left (zombies do not count).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from scenario_contract import CONTRACT_KEYS

from spark_watchdog.cli.lab_cmd import FAULT_NAMES, SCENARIO_NAMES
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import LAB_LATCH_OFF_S, lab_processes
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.netns import netns_unavailable
from spark_watchdog.lab.stories.scenario_kit import PERSON_ALERTS, ScenarioResult
from spark_watchdog.lab.stories.scenarios import SCENARIOS, run_scenario
from spark_watchdog.lab.up import CONTROL_FAULTS
from spark_watchdog.probes.gpu import GpuProbe, GpuReading

pytestmark = pytest.mark.integration

# One fresh lab per scenario; 4 nodes (TP=4), as deployed.
NODES = 4
# Each scenario runs once per session; a second test about it reads the same run
# (so the tests of one scenario share its xdist group: tests/support/suite_plan.py).
_RUNS: dict[str, ScenarioResult] = {}


def test_the_cli_names_match_the_lab() -> None:
    assert set(SCENARIO_NAMES) == set(SCENARIOS)
    assert set(FAULT_NAMES) == set(CONTROL_FAULTS)


def test_the_nvml_standin_drives_the_real_gpu_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lab's GPU: the agent's real NVML worker imports the stand-in as pynvml."""
    shim = tmp_path / "nvml"
    shim.mkdir()
    shutil.copyfile(gpu_standin.__file__, shim / "pynvml.py")
    monkeypatch.setenv("PYTHONPATH", str(shim))
    monkeypatch.setenv("SPARK_WATCHDOG_NODE_DIR", str(tmp_path))

    async def reads() -> list[GpuReading]:
        async with GpuProbe(deadline=1.0) as probe:
            first = await probe.read()
            gpu_standin.write_mode(tmp_path, "hang")
            hung = await probe.read()
            gpu_standin.write_mode(tmp_path, "ok")
            return [first, hung, await probe.read()]

    ok, hung, healed = asyncio.run(reads())
    assert ok.state == "ok" and ok.devices[0].name == "NVIDIA GB10"
    assert ok.devices[0].power_w is not None and 45 <= ok.devices[0].power_w <= 90
    assert "memory_used_bytes" in ok.devices[0].not_supported  # unified memory
    assert hung.state == "timeout" and "did not answer within 1 s" in (hung.error or "")
    assert healed.state == "ok"


def _descendants() -> list[psutil.Process]:
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[Callable[[str], tuple[dict[str, Any], HistoryStore]]]:
    stores: list[HistoryStore] = []
    results: list[ScenarioResult] = []
    # What lived before the test (a worker's earlier tests may have left a
    # helper for its lifetime: multiprocessing's resource tracker) is not the lab's.
    earlier = {child.pid for child in _descendants()}

    def run(name: str) -> tuple[dict[str, Any], HistoryStore]:
        result = _RUNS.get(name)
        if result is None:
            result = _RUNS[name] = run_scenario(name, workdir=tmp_path / name, nodes=NODES)
            results.append(result)
        report = result.to_json()
        assert set(report) >= CONTRACT_KEYS
        assert report["ok"], report
        assert report["false_power_actions"] == 0
        assert report["history"] is not None
        store = HistoryStore(report["history"], read_only=True)
        stores.append(store)
        return report, store

    yield run
    for store in stores:
        store.close()
    time.sleep(0.2)
    for result in results:
        assert result.lab_id is not None
        assert lab_processes(result.lab_id) == [], "lab processes left behind"
    assert [c for c in _descendants() if c.pid not in earlier] == [], "child processes left behind"


def _no_action_against(store: HistoryStore, healthy: list[str]) -> None:
    for node in healthy:
        assert store.actions(node=node) == [], f"an action against healthy {node}"


def _one_cycle(store: HistoryStore, incident_id: int) -> None:
    actions = store.actions(incident_id=incident_id)
    assert [(a.operation, a.result) for a in actions] == [("cycle", "verified")]
    steps = [s.step for s in store.steps(incident_id)]
    assert steps.count("off_requested") == 1 and steps.count("on_requested") == 1
    assert steps.index("off_verified") < steps.index("on_requested") < steps.index("on_verified")
    assert steps.index("on_verified") < steps.index("new_boot_seen") < steps.index("resolved")


def _safe_restart(store: HistoryStore) -> None:
    restarts = store.serving_restarts()
    assert restarts and all(r.profile == "safe" for r in restarts)
    assert restarts[0].result == "succeeded"


@pytest.mark.xdist_group("scenario-freeze")
def test_freeze_is_recovered_with_one_verified_cycle(scenario: Any) -> None:
    report, store = scenario("freeze")
    assert report["outcome"] == "recovered"
    assert report["power_actions"] == 2
    assert report["pdu_commands"] == ["outlet 3 (spark-3) off", "outlet 3 (spark-3) on"]
    assert report["serving_restarts"] == 1 and report["incident_ids"] == [1]
    assert 3.0 <= report["detected_after_s"] < report["recovered_after_s"] < 60
    incident = store.get_incident(1)
    assert (incident.kind, incident.nodes, incident.resolution) == (
        "host_frozen",
        ("spark-3",),
        "recovered",
    )
    assert incident.time_to_detect_s is not None and incident.time_to_recover_s is not None
    _one_cycle(store, 1)
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-2", "spark-4"])
    # The boot that froze, as the rebooted agent's journal told it.
    frozen = [b for b in store.boots("spark-3") if b.incident_id == 1]
    assert frozen and frozen[0].clean_shutdown is False
    assert frozen[0].evidence["evidence_counts"]["xid"] >= 1


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        pytest.param(name, kind, marks=pytest.mark.xdist_group(f"scenario-{name}"))
        for name, kind in (
            ("wedge", "serving_stalled"),
            ("crash", "serving_dead"),
            ("crash-exit", "serving_dead"),
            ("idle-wedge", "serving_stalled"),
        )
    ],
)
def test_serving_faults_restart_serving_without_power(scenario: Any, name: str, kind: str) -> None:
    report, store = scenario(name)
    assert report["outcome"] == "recovered"
    assert report["power_actions"] == 0 and report["serving_restarts"] == 1
    assert report["incident_ids"] == [1]
    incident = store.get_incident(1)
    assert (incident.kind, incident.resolution) == (kind, "recovered")
    assert store.actions() == []
    _safe_restart(store)
    order = list(store.serving_restarts()[0].step_durations)
    assert order[0] == "stop spark-1" and order[-2] == "start spark-1"
    # Every running rank's agent took its processes' stacks (or said why not) before
    # the stop; a rank that had exited (crash-exit) has nothing to take.
    (stacks,) = [s for s in store.steps(1) if s.step == "stacks_recorded"]
    ranks = {"spark-2", "spark-3", "spark-4"} | (set() if name == "crash-exit" else {"spark-1"})
    assert set(stacks.detail["nodes"]) == ranks
    assert all(r["processes"] or r.get("note") for r in stacks.detail["nodes"].values())


@pytest.mark.xdist_group("scenario-pdu-down")
def test_pdu_down_gives_up_with_an_alert_and_no_command(scenario: Any) -> None:
    report, store = scenario("pdu-down")
    assert report["outcome"] in ("gave_up", "held")
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert {"gave_up", "held"} & set(report["alerts"])
    incident = store.get_incident(report["incident_ids"][0])
    assert incident.kind == "host_frozen" and incident.nodes == ("spark-3",)
    # The outlet could not even be read: no cycle was started, none is counted.
    assert store.actions() == []
    assert "rung_failed" in [s.step for s in store.steps(incident.id)]
    hold = store.active_hold("spark-3")
    assert hold is not None and "gave up" in hold.reason
    _no_action_against(store, ["spark-1", "spark-2", "spark-4"])


@pytest.mark.xdist_group("scenario-controller-kill")
def test_controller_killed_mid_cycle_resumes_with_one_off_and_one_on(scenario: Any) -> None:
    report, store = scenario("controller-kill")
    assert report["outcome"] == "recovered"
    assert report["pdu_commands"] == ["outlet 3 (spark-3) off", "outlet 3 (spark-3) on"]
    assert report["incident_ids"] == [1]
    steps = [s.step for s in store.steps(1)]
    assert "resumed" in steps
    # The restarted controller did not start the rung again.
    assert steps.count("rung_started") == 1
    _one_cycle(store, 1)
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-2", "spark-4"])


@pytest.mark.xdist_group("scenario-controller-kill")
def test_a_resumed_controller_compares_against_the_frozen_boot(scenario: Any) -> None:
    report, store = scenario("controller-kill")
    seen = [s for s in store.steps(report["incident_ids"][0]) if s.step == "new_boot_seen"]
    assert seen and seen[0].detail.get("boot_id_before") is not None


@pytest.mark.xdist_group("scenario-double-freeze")
def test_double_freeze_is_recovered_one_after_another(scenario: Any) -> None:
    report, store = scenario("double-freeze")
    assert report["outcome"] == "recovered"
    assert len(report["incident_ids"]) == 2 and report["power_actions"] == 4
    incidents = [store.get_incident(i) for i in report["incident_ids"]]
    assert {i.nodes for i in incidents} == {("spark-2",), ("spark-4",)}
    assert {i.resolution for i in incidents} == {"recovered"}
    spans = []
    for incident in incidents:
        _one_cycle(store, incident.id)
        at = {s.step: s.at for s in store.steps(incident.id)}
        spans.append((at["off_requested"], at["on_verified"]))
    spans.sort()
    assert spans[0][1] <= spans[1][0], "one power action at a time"
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-3"])


@pytest.mark.xdist_group("scenario-xid")
def test_a_live_xid_stops_the_rank_and_restarts_serving_without_power(scenario: Any) -> None:
    report, store = scenario("xid")
    assert report["outcome"] == "recovered", report
    assert report["power_actions"] == 0 and store.actions() == []
    (incident,) = [store.get_incident(i) for i in report["incident_ids"]]
    assert incident.kind == "gpu_fault" and incident.evidence["gpu_fault"]["xid"] == 31
    assert incident.evidence["gpu_fault"]["result"] == "stopped"
    _safe_restart(store)


@pytest.mark.xdist_group("scenario-xid-freeze")
def test_a_freeze_after_a_live_xid_names_it_though_the_journal_has_nothing(
    scenario: Any,
) -> None:
    report, store = scenario("xid-freeze")
    assert report["outcome"] == "recovered", report
    (incident,) = [store.get_incident(i) for i in report["incident_ids"]]
    assert incident.kind == "host_frozen"
    (live,) = [f for f in incident.evidence["live_gpu_faults"] if f["xid"] == 31]
    assert "before its agent went silent" in live["said"]
    _one_cycle(store, incident.id)


@pytest.mark.xdist_group("scenario-mem-collapse")
def test_mem_collapse_is_stopped_by_the_memory_guard_without_power(scenario: Any) -> None:
    report, store = scenario("mem-collapse")
    assert report["outcome"] == "recovered", report
    assert report["power_actions"] == 0 and store.actions() == []
    (incident,) = [store.get_incident(i) for i in report["incident_ids"]]
    assert incident.kind == "memory_exhausted" and incident.nodes == ("spark-2",)
    kill = incident.evidence["memory_guard"]
    assert kill["result"] == "killed"
    # The flight recorder kept the fall, off the node.
    recorder = incident.evidence["flight_recorder"]
    column = recorder["fields"].index("mem_available_bytes")
    fall = [s[column] for s in recorder["samples"]]
    assert len(fall) >= 10 and fall[0] > fall[-1] and fall[-1] <= 6 * 1024**3
    assert [k["by"] for k in kill["killed"]] == ["launcher"]
    assert kill["readings"] and kill["readings"][-1]["mem_available_bytes"] <= 6 * 1024**3
    steps = [s.step for s in store.steps(incident.id)]
    assert "serving_restart_done" in steps and incident.resolution == "recovered"
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-3", "spark-4"])


@pytest.mark.xdist_group("scenario-gpu-hang")
def test_gpu_hang_is_recovered_by_a_forced_reboot_over_ssh_without_power(scenario: Any) -> None:
    report, store = scenario("gpu-hang")
    if report["outcome"] == "not_available":
        pytest.skip("; ".join(report["notes"]))
    assert report["outcome"] == "recovered", report
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    (incident,) = [store.get_incident(i) for i in report["incident_ids"]]
    assert incident.kind == "gpu_wedged" and incident.nodes == ("spark-2",)
    steps = [s.step for s in store.steps(incident.id)]
    ladder = [
        "serving_restart_done",  # rung 1: the restart did not bring the GPU back
        "still_wedged",
        "reboot_requested",  # recorded before it is sent
        "reboot_sent",
        "new_boot_seen",
        "serving_restart_done",  # serving again with the safe profile
        "resolved",
    ]
    assert [s for s in steps if s in ladder] == ladder
    assert [(a.operation, a.result) for a in store.actions()] == [("ssh_reboot", "verified")]
    assert "forced_reboot" in report["alerts"]
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-3", "spark-4"])


@pytest.mark.xdist_group("scenario-clock-latch")
def test_a_clock_latch_is_cleared_by_a_halt_and_one_long_cut(scenario: Any) -> None:
    report, store = scenario("clock-latch")
    if report["outcome"] == "not_available":
        pytest.skip("; ".join(report["notes"]))
    assert report["outcome"] == "recovered", report
    latched, frozen = [store.get_incident(i) for i in report["incident_ids"]]
    assert latched.kind == "clock_latched" and frozen.kind == "host_frozen"
    ladder = ["halt_requested", "halt_sent", "handed_to_power_path"]
    assert [s.step for s in store.steps(latched.id) if s.step in ladder] == ladder
    (rung,) = [s for s in store.steps(frozen.id) if s.step == "rung_started"]
    assert isinstance(rung.detail, dict) and rung.detail["off_seconds"] == LAB_LATCH_OFF_S
    assert frozen.resolution == "recovered"
    assert report["alerts"].count("clock_latched") == 1
    assert len(report["pdu_commands"]) == 2  # one off, one on: the long cut
    _safe_restart(store)
    _no_action_against(store, ["spark-1", "spark-3", "spark-4"])


def _netns_or_skip(name: str, tmp_path: Path) -> None:
    """Where this machine cannot give nodes namespaces, the scenario says so."""
    why = netns_unavailable()
    if why is not None:
        result = run_scenario(name, workdir=tmp_path / name, nodes=NODES)
        assert result.outcome == "not_available" and not result.ok
        pytest.skip(f"{name}: {why}")


# The lab's network namespaces take fixed addresses: one such lab at a time.
@pytest.mark.xdist_group("lab-netns")
def test_partition_is_cycled_once_then_held(scenario: Any, tmp_path: Path) -> None:
    """Both links dark: nothing says the node lives."""
    _netns_or_skip("partition", tmp_path)
    report, store = scenario("partition")
    assert report["outcome"] in ("gave_up", "held")
    assert report["pdu_commands"] == ["outlet 3 (spark-3) off", "outlet 3 (spark-3) on"]
    incident = store.get_incident(report["incident_ids"][0])
    assert incident.kind == "host_frozen" and incident.resolution == "gave_up"
    steps = [s.step for s in store.steps(incident.id)]
    assert "boot_timeout" in steps and "new_boot_seen" not in steps
    assert [(a.operation, a.result) for a in store.actions()] == [("cycle", "verified")]
    assert store.active_hold("spark-3") is not None
    _no_action_against(store, ["spark-1", "spark-2", "spark-4"])


@pytest.mark.xdist_group("lab-netns")
def test_a_management_partition_is_unreachable_never_a_power_action(
    scenario: Any, tmp_path: Path
) -> None:
    """Management dark, fabric up: the peers see the node, the controller alerts."""
    _netns_or_skip("mgmt-partition", tmp_path)
    report, store = scenario("mgmt-partition")
    assert report["outcome"] == "unreachable"
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert "unreachable" in report["alerts"]
    assert not PERSON_ALERTS & set(report["alerts"])
    assert report["incident_ids"] == [] and store.list_incidents() == []
    assert store.actions() == [] and store.active_holds() == []
    assert store.serving_restarts(limit=10) == []
    assert report["detected_after_s"] is not None and report["detected_after_s"] < 30
    verdicts = next(n for n in report["notes"] if n.startswith("spark-3's verdicts"))
    assert "unreachable" in verdicts and verdicts.endswith("healthy")
    assert "host_frozen" not in verdicts


@pytest.mark.xdist_group("lab-netns")
def test_a_fabric_partition_is_serving_trouble_never_a_power_action(
    scenario: Any, tmp_path: Path
) -> None:
    """Fabric dark, management up: the TP group stalls; serving is restarted, no node cut."""
    _netns_or_skip("fabric-partition", tmp_path)
    report, store = scenario("fabric-partition")
    assert report["outcome"] == "recovered"
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert store.actions() == [] and store.active_holds() == []
    (incident,) = [store.get_incident(i) for i in report["incident_ids"]]
    assert (incident.kind, incident.nodes, incident.resolution) == (
        "serving_stalled",
        ("spark-1",),
        "recovered",
    )
    assert "serving_restart_started" in [s.step for s in store.steps(incident.id)]
    _safe_restart(store)
    assert "spark-1's pulses of spark-3: silent" in report["notes"]
    for note in (n for n in report["notes"] if "'s verdicts" in n):
        assert not {"host_frozen", "held", "unreachable"} & set(note.split()), note


@pytest.mark.xdist_group("scenario-reboot")
def test_a_planned_reboot_is_ridden_out_without_power(scenario: Any) -> None:
    """SIGTERM to the agent, SSH refusing for longer than freeze_after, a new boot:
    a live kernel going down is `rebooting`, never fenced."""
    report, store = scenario("reboot")
    assert report["outcome"] == "rebooted"
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert report["incident_ids"] == [] and store.list_incidents() == []
    assert store.actions() == [] and store.active_holds() == []
    # The controller said why it waited, within a few seconds of the shutdown.
    assert report["detected_after_s"] is not None and report["detected_after_s"] < 20
    assert report["recovered_after_s"] is not None and report["recovered_after_s"] < 90
    verdicts = next(n for n in report["notes"] if n.startswith("spark-3's verdicts"))
    assert "rebooting" in verdicts and "host_frozen" not in verdicts


@pytest.mark.xdist_group("scenario-stuck-agent")
def test_a_stuck_agent_is_agent_down_never_a_power_action(scenario: Any) -> None:
    """HTTP 200 with a seq that never advances: userland is alive."""
    report, store = scenario("stuck-agent")
    assert report["outcome"] == "agent_down"
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert "agent_down" in report["alerts"]
    assert report["detected_after_s"] is not None and report["detected_after_s"] < 30
    assert report["incident_ids"] == [] and store.list_incidents() == []
    # The agent restart over SSH is no power action (the lab host's sshd only reboots).
    assert {a.operation for a in store.actions()} <= {"agent_restart"}
    assert store.active_holds() == []
    verdicts = next(n for n in report["notes"] if n.startswith("spark-2's verdicts"))
    assert verdicts.endswith("agent_down -> healthy"), verdicts


@pytest.mark.xdist_group("scenario-outlet-off")
def test_an_outlet_switched_off_by_hand_is_held_and_never_switched_on(scenario: Any) -> None:
    report, store = scenario("outlet-off")
    assert report["outcome"] == "gave_up"
    # The person's switch is no SET; the controller sent none either (no on).
    assert report["power_actions"] == 0 and report["pdu_commands"] == []
    assert "outlet_off" in report["alerts"]
    (incident_id,) = report["incident_ids"]
    incident = store.get_incident(incident_id)
    assert (incident.kind, incident.nodes, incident.resolution) == (
        "host_frozen",
        ("spark-3",),
        "gave_up",
    )
    steps = [s.step for s in store.steps(incident_id)]
    assert "outlet_found_off" in steps
    assert not {"off_requested", "on_requested", "on_verified"} & set(steps)
    # Read before any cycle was recorded: nothing sent, nothing counted against a budget.
    assert store.actions() == []
    # Held by the controller, released by the operator's clean-up.
    (hold,) = [h for h in store.holds() if h.node == "spark-3"]
    assert hold.created_by == "controller" and "is off" in hold.reason
    assert hold.released_by == "lab operator"
    assert store.active_holds() == []
    _no_action_against(store, ["spark-1", "spark-2", "spark-4"])
