"""The controller end to end: a simulated 4-node cluster of real processes.

Real agents (each in its own process tree with an SSH banner stand-in),
vLLM stand-ins started by the agents' serving launchers, a stateful SNMP
PDU whose outlets kill and boot the trees, and the real controller. Faults
are real signals: SIGSTOP freezes a whole tree.
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import LAB_PDU_REBOOT_S, LabCluster
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import PowerState

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    with LabCluster(tmp_path_factory.mktemp("lab"), size=4) as cluster:
        yield cluster.serving()


class Receiver:
    """A webhook receiver on loopback that keeps what it is sent."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                outer.events.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.events]


class RunningController:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = parse_controller_config(config)
        self.store = HistoryStore(self.config.history)
        self.controller = Controller(self.config, self.store)
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.loop.run_until_complete(self.controller.run(self.stop_event))

    def verdicts(self) -> dict[str, str]:
        return {n["name"]: n["verdict"] for n in self.controller.published.get("nodes", [])}

    def ticks(self) -> int:
        """How many polls the controller has finished."""
        return int(self.controller.ticks)

    def quiet_for(self, polls: int) -> None:
        """Until the controller has polled ``polls`` more times: a window in which
        it had every chance to act, counted in its decisions, not in seconds (on
        a loaded machine a second may hold no poll at all)."""
        until = self.ticks() + polls
        wait_for(lambda: self.ticks() >= until, 30 + 10 * polls, f"{polls} more polls")

    def node_status(self, name: str) -> dict[str, Any]:
        """The node as ``GET /v1/status`` shows it."""
        nodes = self.controller.published.get("nodes", [])
        return next((n for n in nodes if n["name"] == name), {})

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(30)
        self.store.close()


def wait_for(check: Callable[[], object], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


@pytest.fixture
def controller(lab: LabCluster, tmp_path: Path) -> Iterator[Callable[..., RunningController]]:
    started: list[RunningController] = []

    def start(**overrides: Any) -> RunningController:
        running = RunningController(lab.controller_config(tmp_path / "history.db", **overrides))
        started.append(running)
        wait_for(lambda: set(running.verdicts().values()) == {"healthy"}, 30, "every node healthy")
        return running

    yield start
    for running in started:
        running.close()
    for node in lab.nodes:
        lab.thaw(node)
    lab.vllm_mode("progressing")
    wait_for(lambda: all(lab.agent_state(n) for n in lab.nodes), 60, "agents back")


def _wait_every_node_healthy(config: dict[str, Any]) -> None:
    """Until the controller started with ``config`` says every node is healthy
    (its ``GET /v1/status``): it has seen each node's boot before a fault."""
    url = f"http://127.0.0.1:{config['listen']['port']}/v1/status"

    def healthy() -> bool:
        try:
            nodes = requests.get(url, timeout=2).json()["nodes"]
        except (requests.RequestException, ValueError, KeyError):
            return False
        return bool(nodes) and all(n["verdict"] == "healthy" for n in nodes)

    wait_for(healthy, 60, "every node healthy")


def _steps_of_first_incident(store: HistoryStore) -> list[str]:
    incidents = store.list_incidents()
    return [s.step for s in store.steps(incidents[0].id)] if incidents else []


def sets(lab: LabCluster, node: LabNode) -> list[int]:
    assert lab.pdu is not None
    return [int(str(s.value)) for s in lab.pdu.standin.sets_for(node.outlet)]


def test_a_frozen_host_is_cycled_once_and_serving_comes_back_safe(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller()
    node = lab.node("spark-3")
    before_sets = len(sets(lab, node))
    boot_before = node.boot_id()
    lab.freeze(node)
    wait_for(lambda: running.store.list_incidents(), 20, "an incident")
    incident = running.store.list_incidents()[0]
    wait_for(lambda: running.store.get_incident(incident.id).status == "resolved", 60, "resolution")
    incident = running.store.get_incident(incident.id)
    assert incident.kind == "host_frozen" and incident.nodes == ("spark-3",)
    assert incident.resolution == "recovered"
    assert incident.time_to_detect_s is not None and 3.0 <= incident.time_to_detect_s < 12
    assert node.boot_id() != boot_before
    # Exactly one off and one on reached the PDU (rPDU2: 2 = off, 1 = on).
    assert sets(lab, node)[before_sets:] == [2, 1]
    steps = [s.step for s in running.store.steps(incident.id)]
    for expected in (
        "incident_opened",
        "rung_started",
        "off_requested",
        "off_verified",
        "hold_started",
        "on_requested",
        "on_verified",
        "power_restored",
        "new_boot_seen",
        "serving_restart_done",
        "resolved",
    ):
        assert expected in steps
    assert steps.index("off_requested") < steps.index("off_verified") < steps.index("on_requested")
    actions = running.store.actions(incident_id=incident.id)
    assert [(a.operation, a.result) for a in actions] == [("cycle", "verified")]
    # The status counts the cycle within a few polls, not at the next periodic
    # refresh (minutes later).
    wait_for(
        lambda: running.node_status("spark-3").get("power_cycles_total") == 1,
        10,
        "the cycle counted in the status",
    )
    # The previous boot, as the rebooted agent's journal tells it: unclean, with its Xid.
    boots = {b.boot_id: b for b in running.store.boots("spark-3")}
    assert boot_before is not None
    assert boots[boot_before].clean_shutdown is False
    assert boots[boot_before].incident_id == incident.id
    restart = running.store.serving_restarts()[0]
    assert restart.profile == "safe" and restart.result == "succeeded"
    serving = lab.agent_state(lab.nodes[0])
    assert serving is not None and serving["serving"]["profile"] == "safe"
    assert serving["serving"]["effective_matches_profile"] is True
    # Nothing touched the healthy nodes.
    for other in lab.nodes:
        if other is not node:
            assert running.store.actions(node=other.name) == []


def test_a_node_that_freezes_again_is_cycled_again(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    """A second freeze of a recovered node is a new incident with the whole
    ladder available, not "no power path left" from the first one."""
    running = controller()
    node = lab.node("spark-2")
    before_sets = len(sets(lab, node))
    for round_ in (1, 2):
        lab.freeze(node)
        wait_for(
            functools.partial(lambda n: len(running.store.list_incidents()) >= n, round_),
            20,
            f"incident {round_}",
        )
        wait_for(
            lambda: all(i.status == "resolved" for i in running.store.list_incidents()),
            60,
            f"incident {round_} resolved",
        )
        wait_for(lambda: running.verdicts().get(node.name) == "healthy", 30, "healthy again")
    incidents = sorted(running.store.list_incidents(), key=lambda i: i.id)
    assert [(i.kind, i.resolution) for i in incidents] == [("host_frozen", "recovered")] * 2
    assert running.store.active_hold(node.name) is None
    assert sets(lab, node)[before_sets:] == [2, 1, 2, 1]


def test_wedged_serving_is_restarted_with_no_power_action(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller()
    assert lab.pdu is not None
    sets_before = len(lab.pdu.standin.set_requests)
    lab.vllm_mode("wedged")
    wait_for(lambda: running.store.list_incidents(), 30, "a serving incident")
    incident = running.store.list_incidents()[0]
    assert incident.kind == "serving_stalled"
    wait_for(lambda: running.store.get_incident(incident.id).status == "resolved", 60, "resolution")
    assert running.store.get_incident(incident.id).resolution == "recovered"
    restart = running.store.serving_restarts()[0]
    assert restart.result == "succeeded" and restart.profile == "safe"
    order = list(restart.step_durations)
    assert order[0] == "stop spark-1" and order[-2] == "start spark-1"
    assert order.index("start spark-2") < order.index("start spark-1")
    assert len(lab.pdu.standin.set_requests) == sets_before
    assert running.store.actions() == []


def test_a_serving_fault_that_returns_waits_for_the_restart_cooldown(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    cooldown = 12.0
    running = controller(serving={"restart_cooldown": cooldown})
    lab.vllm_mode("wedged")
    wait_for(lambda: len(running.store.serving_restarts()) == 1, 30, "the first restart")
    wait_for(lambda: running.store.serving_restarts()[0].result != "running", 60, "it to finish")
    first_done = time.time()
    lab.vllm_mode("wedged")  # the new ranks wedge again at once
    # The lab's stall_after is 4 s: seen as stalled well inside the cooldown, not acted on.
    wait_for(lambda: running.verdicts().get("spark-1") == "serving_stalled", 10, "stalled again")
    assert time.time() - first_done < cooldown
    assert len(running.store.serving_restarts()) == 1
    wait_for(lambda: len(running.store.serving_restarts()) == 2, 30, "the second restart")
    second = sorted(running.store.serving_restarts(), key=lambda r: r.id)[1]
    assert second.started_at - first_done >= cooldown - 0.5
    wait_for(
        lambda: all(r.result != "running" for r in running.store.serving_restarts()),
        60,
        "the second restart to finish",
    )


def test_witness_unreachable_means_no_fencing(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller(witness=[f"tcp://127.0.0.1:{free_port()}"])
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    lab.freeze(node, with_kernel_lines=False)
    wait_for(lambda: running.verdicts().get("spark-2") == "isolated", 20, "isolated")
    running.quiet_for(3)
    assert len(sets(lab, node)) == before
    assert running.store.actions() == []


def test_spent_budget_holds_the_node_and_alerts(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    receiver = Receiver()
    running = controller(guards={"node_budget": 0}, notify={"webhooks": [{"url": receiver.url}]})
    node = lab.node("spark-4")
    before = len(sets(lab, node))
    lab.freeze(node, with_kernel_lines=False)
    wait_for(lambda: running.verdicts().get("spark-4") == "held", 20, "held")
    wait_for(lambda: "held" in receiver.kinds(), 10, "a held notification")
    assert len(sets(lab, node)) == before
    hold = running.store.active_hold("spark-4")
    assert hold is not None and "budget" in hold.reason


def test_operator_hold_means_no_action(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller()
    running.store.hold("spark-2", "maintenance", by="test")
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    lab.freeze(node, with_kernel_lines=False)
    wait_for(lambda: running.verdicts().get("spark-2") == "held", 10, "held")
    running.quiet_for(6)
    assert len(sets(lab, node)) == before
    assert running.store.list_incidents() == []


def test_dry_run_records_the_decision_and_sends_nothing(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller(guards={"dry_run": True})
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    lab.freeze(node, with_kernel_lines=False)
    wait_for(lambda: running.store.list_incidents(), 20, "a dry-run incident")
    incident = running.store.list_incidents()[0]
    assert incident.dry_run and incident.kind == "host_frozen"
    # The incident is written first, the action it would have taken a moment after.
    wait_for(lambda: running.store.actions(incident_id=incident.id), 20, "the dry-run action")
    actions = running.store.actions(incident_id=incident.id)
    assert [(a.operation, a.result, a.dry_run) for a in actions] == [("cycle", "dry_run", True)]
    running.quiet_for(2)
    assert len(sets(lab, node)) == before


def test_two_frozen_nodes_are_recovered_one_after_another(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    running = controller()
    a, b = lab.node("spark-2"), lab.node("spark-4")
    lab.freeze(a, with_kernel_lines=False)
    lab.freeze(b, with_kernel_lines=False)
    wait_for(lambda: len(running.store.list_incidents()) == 2, 30, "two incidents")
    wait_for(
        lambda: all(i.status == "resolved" for i in running.store.list_incidents()),
        90,
        "both resolved",
    )
    incidents = running.store.list_incidents()
    assert {i.resolution for i in incidents} == {"recovered"}
    spans = []
    for incident in incidents:
        steps = {s.step: s.at for s in running.store.steps(incident.id)}
        spans.append((steps["off_requested"], steps["on_verified"]))
    spans.sort()
    # max_concurrent_power_actions = 1: the second off waits for the first on.
    assert spans[0][1] <= spans[1][0]


def test_controller_killed_during_the_off_hold_resumes_without_a_second_cycle(
    lab: LabCluster, tmp_path: Path
) -> None:
    config = lab.controller_config(tmp_path / "history.db", policy={"power_off_seconds": 6.0})
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "spark_watchdog", "controller", "--config", str(path)]
    log = (tmp_path / "controller.log").open("wb")
    node = lab.node("spark-3")
    assert lab.pdu is not None
    before = len(sets(lab, node))
    first = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_every_node_healthy(config)
        lab.freeze(node, with_kernel_lines=False)
        wait_for(lambda: sets(lab, node)[before:] == [2], 30, "the off")
        store = HistoryStore(config["history"], read_only=True)
        # Inside the 6 s hold: the off verified and the hold recorded.
        wait_for(lambda: _steps_of_first_incident(store)[-1:] == ["hold_started"], 10, "the hold")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        second = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        wait_for(
            lambda: bool(store.list_incidents()) and store.list_incidents()[0].status == "resolved",
            60,
            "the incident resolved by the second controller",
        )
        incident = store.list_incidents()[0]
        assert incident.resolution == "recovered"
        assert sets(lab, node)[before:] == [2, 1], "exactly one off and one on"
        steps = [s.step for s in store.steps(incident.id)]
        assert steps.count("off_requested") == 1 and steps.count("on_requested") == 1
        assert "resumed" in steps
        held = [s for s in store.steps(incident.id) if s.step == "hold_started"]
        assert held and all(
            s.step != "rung_started" for s in store.steps(incident.id)[steps.index("resumed") :]
        )
        store.close()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(20)
        log.close()
        lab.thaw(node)
    wait_for(lambda: lab.agent_state(node) is not None, 60, "spark-3 back")


def test_a_controller_dead_through_a_self_timed_hold_leaves_no_node_dark(
    lab: LabCluster, tmp_path: Path
) -> None:
    """The PDU's own outlet reboot (6 s, covering the 5 s hold) brings power back
    while no controller runs; the next controller sends nothing and sees the boot."""
    config = lab.controller_config(tmp_path / "history.db", policy={"power_off_seconds": 5.0})
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [sys.executable, "-m", "spark_watchdog", "controller", "--config", str(path)]
    log = (tmp_path / "controller.log").open("wb")
    node = lab.node("spark-2")
    assert lab.pdu is not None
    standin = lab.pdu.standin
    before = len(sets(lab, node))
    standin.cfg.reboot_seconds = 6.0
    first = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    second: subprocess.Popen[bytes] | None = None
    try:
        _wait_every_node_healthy(config)
        lab.freeze(node, with_kernel_lines=False)
        wait_for(lambda: sets(lab, node)[before:] == [3], 30, "the outlet reboot")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        # Nobody is watching: the PDU switches the outlet off, then on by itself.
        wait_for(lambda: standin.state(node.outlet) is PowerState.OFF, 10, "the PDU's off")
        wait_for(lambda: standin.state(node.outlet) is PowerState.ON, 20, "the PDU's own on")
        second = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        store = HistoryStore(config["history"], read_only=True)
        wait_for(
            lambda: bool(store.list_incidents()) and store.list_incidents()[0].status == "resolved",
            60,
            "the incident resolved by the second controller",
        )
        incident = store.list_incidents()[0]
        assert incident.resolution == "recovered"
        assert sets(lab, node)[before:] == [3], "one outlet reboot, and no command after it"
        steps = store.steps(incident.id)
        names = [s.step for s in steps]
        assert "resumed" in names and "on_requested" not in names
        off = next(s for s in steps if s.step == "off_requested")
        assert isinstance(off.detail, dict) and off.detail.get("on_after_s") == 6.0
        store.close()
    finally:
        standin.cfg.reboot_seconds = LAB_PDU_REBOOT_S
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(20)
        log.close()
        lab.thaw(node)
    wait_for(lambda: lab.agent_state(node) is not None, 60, "spark-2 back")


def test_operator_restarts_serving_with_another_profile(lab: LabCluster, tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(lab.controller_config(tmp_path / "history.db")))
    base = [sys.executable, "-m", "spark_watchdog", "serving"]
    result = subprocess.run(
        [*base, "restart", "--profile", "plain", "--config", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["result"] == "succeeded" and report["profile"] == "plain"
    state = lab.agent_state(lab.nodes[0])
    assert state is not None and state["serving"]["profile"] == "plain"
    shown = subprocess.run(
        [*base, "profile", "--config", str(path), "--json"], capture_output=True, text=True
    )
    assert json.loads(shown.stdout) == {"profile": "plain"}


def test_a_locked_history_means_hold_not_blind_action(
    lab: LabCluster, controller: Callable[..., RunningController], tmp_path: Path
) -> None:
    import sqlite3

    receiver = Receiver()
    running = controller(notify={"webhooks": [{"url": receiver.url}]})
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    # Another process holds the write lock: nothing can be recorded first.
    blocker = sqlite3.connect(running.config.history, timeout=0.1)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        lab.freeze(node, with_kernel_lines=False)
        wait_for(lambda: running.verdicts().get("spark-2") == "held", 30, "held")
        wait_for(lambda: "history_unwritable" in receiver.kinds(), 10, "an alert")
        running.quiet_for(2)
        assert len(sets(lab, node)) == before, "no power action that could not be recorded"
    finally:
        blocker.rollback()
        blocker.close()


def test_three_of_four_frozen_are_all_recovered_one_after_another(
    lab: LabCluster, controller: Callable[..., RunningController]
) -> None:
    """A TP=4 freeze cascade: three hosts frozen at once (the kernel still completes
    TCP, userland is silent) is not a network problem, so the circuit breaker stays
    shut and each host is cycled once, one after another."""
    receiver = Receiver()
    running = controller(notify={"webhooks": [{"url": receiver.url}]})
    frozen = [lab.node("spark-2"), lab.node("spark-3"), lab.node("spark-4")]
    before = {node.name: len(sets(lab, node)) for node in frozen}  # the lab outlives a test
    for node in frozen:
        lab.freeze(node, with_kernel_lines=False)
    wait_for(lambda: len(running.store.list_incidents()) == 3, 60, "three incidents")
    wait_for(
        lambda: all(i.status == "resolved" for i in running.store.list_incidents()),
        180,
        "all three resolved",
    )
    incidents = running.store.list_incidents()
    assert [i.resolution for i in incidents] == ["recovered"] * 3
    assert "circuit_breaker" not in receiver.kinds()
    assert running.store.active_holds() == []
    for node in frozen:
        # APC rPDU2: 2 is off, 1 is on; one cycle each.
        assert sets(lab, node)[before[node.name] :] == [2, 1], node.name
