"""Two real controller processes on one PostgreSQL history (controller/pair.py).

A simulated cluster of real processes (agents, SSH banners, the SNMP PDU
stand-in), a real PostgreSQL server, and two ``spark-watchdog controller``
processes with short leadership timings. Faults are real signals: SIGKILL
and SIGSTOP of the leader, SIGSTOP of a node's process tree (a freeze).

What is checked, from the PDU's own log and the history: the standby takes
over and recovers a node that froze meanwhile, with exactly one off and one
on; every step of it carries the new epoch; a leader paused past its lease
wakes deposed and exits without sending anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.history.leadership import Leader, current
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.lab.cluster import LabCluster, LabNode
from spark_watchdog.lab.hardware.postgres_server import PostgresServer

pytestmark = pytest.mark.integration

# Short, and holding together: give_up_after + 2 x send_deadline + 1 <= lease. The
# lab's SNMP timeout (1 s, one retry) and SSH connect timeout (2 s) are within
# the send deadline.
HA = [sys.executable, "-m", "spark_watchdog", "ha"]
LEADERSHIP = {
    "lease": 7.0,
    "renew_every": 0.5,
    "give_up_after": 1.5,
    "send_deadline": 2.0,
    "settle": 0.5,
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    cluster = LabCluster(tmp_path_factory.mktemp("lab"), size=2).start()
    try:
        cluster.wait_agents()
        cluster.start_serving()
        yield cluster
    finally:
        cluster.stop()


def wait_for(check: Callable[[], object], timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


class Pair:
    """The controller processes of one test, on one database."""

    def __init__(self, lab: LabCluster, server: PostgresServer, url: str, tmp: Path) -> None:
        self.lab = lab
        self.server = server
        self.url = url
        self.tmp = tmp
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.store = PostgresHistoryStore(url, password_file=str(server.password_file))

    def start(self, name: str) -> subprocess.Popen[bytes]:
        config: dict[str, Any] = self.lab.controller_config(
            Path("unused"), leadership=LEADERSHIP, guards={"boot_timeout": 30.0}
        )
        config["history"] = self.url
        config["history_password_file"] = str(self.server.password_file)
        path = self.tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        log = (self.tmp / f"{name}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "spark_watchdog", "controller", "--config", str(path)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def leader(self) -> Leader | None:
        return current(self.store)

    def leads(self, name: str, epoch: int | None = None) -> bool:
        leader = self.leader()
        pid = self.processes[name].pid
        return (
            leader is not None
            and not leader.expired
            and leader.holder.split(":")[1] == str(pid)
            and (epoch is None or leader.epoch == epoch)
        )

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                with_cont = [signal.SIGCONT, signal.SIGKILL]
                for sig in with_cont:
                    os.kill(process.pid, sig)
                process.wait(30)
        self.store.close()


@pytest.fixture
def pair(
    lab: LabCluster, postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> Iterator[Pair]:
    made = Pair(lab, postgres_server, postgres_url, tmp_path)
    yield made
    made.close()
    for node in lab.nodes:
        lab.thaw(node)
    wait_for(lambda: all(lab.agent_state(n) for n in lab.nodes), 60, "agents back")


def sets(lab: LabCluster, node: LabNode) -> list[int]:
    assert lab.pdu is not None
    return [int(str(s.value)) for s in lab.pdu.standin.sets_for(node.outlet)]


def recovered(pair: Pair) -> Any:
    found = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    return found and found[0].status == "resolved" and found[0]


def test_the_standby_takes_over_a_killed_leader_and_recovers_a_freeze(pair: Pair) -> None:
    lab = pair.lab
    pair.start("a")
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    pair.start("b")
    wait_for(lambda: "standby:" in pair.log("b"), 60, "controller b standing by")
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    boot_before = node.boot_id()
    pair.processes["a"].kill()
    killed_at = time.monotonic()
    lab.freeze(node)  # froze while nobody leads
    took = wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
    assert took <= LEADERSHIP["lease"] + 3 * LEADERSHIP["renew_every"] + 5
    incident = wait_for(lambda: recovered(pair), 90, "the freeze recovered")
    assert incident is not None
    (found,) = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    assert found.resolution == "recovered" and found.nodes == ("spark-2",)
    assert node.boot_id() != boot_before
    assert sets(lab, node)[before:] == [2, 1]  # one off, one on, from b
    epochs = {s.epoch for s in pair.store.steps(found.id)}
    assert epochs == {2}, epochs
    print(f"failover: leader killed -> recovered in {time.monotonic() - killed_at:.1f}s")
    # What an operator sees: ha status, and the leader's own /v1/status.
    b = pair.processes["b"]
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_watchdog",
            "ha",
            "status",
            "--config",
            str(pair.tmp / "b.yaml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    leader = json.loads(shown.stdout)["leader"]
    assert leader["epoch"] == 2 and leader["holder"].split(":")[1] == str(b.pid)
    port = yaml.safe_load((pair.tmp / "b.yaml").read_text())["listen"]["port"]
    status = requests.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()
    assert status["leadership"] == {"holder": leader["holder"], "epoch": 2}
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "\nspark_watchdog_controller_leader_epoch 2.0\n" in metrics
    # ha step-down: the leader's next renewal fails; it stops and exits.
    ended = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_watchdog",
            "ha",
            "step-down",
            "--config",
            str(pair.tmp / "b.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "ended the lease of" in ended.stdout and "(epoch 2): it stops now" in ended.stdout
    assert b.wait(30) == 1 and "stopped leading" in pair.log("b")


def steps_of_freeze(pair: Pair) -> list[str]:
    found = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    return [s.step for s in pair.store.steps(found[0].id)] if found else []


def test_a_leader_paused_mid_cycle_wakes_deposed_and_sends_nothing(pair: Pair) -> None:
    """Paused in the off hold, after its off: the standby takes over, reads the
    outlet and finishes the cycle with the on; the old leader wakes with its on
    still to send, and sends nothing."""
    lab = pair.lab
    a = pair.start("a")
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    pair.start("b")
    wait_for(lambda: "standby:" in pair.log("b"), 60, "controller b standing by")
    node = lab.node("spark-1")
    before = len(sets(lab, node))
    lab.freeze(node)
    wait_for(lambda: "hold_started" in steps_of_freeze(pair), 60, "a's off verified, in the hold")
    os.kill(a.pid, signal.SIGSTOP)
    assert sets(lab, node)[before:] == [2]  # a's off
    wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
    incident = wait_for(lambda: recovered(pair), 90, "the cycle finished by b")
    assert incident is not None
    assert sets(lab, node)[before:] == [2, 1]  # b's on, and no second off
    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(60) == 1  # it found itself deposed and exited
    assert "stopped leading" in pair.log("a")
    time.sleep(4 * LEADERSHIP["renew_every"])
    assert sets(lab, node)[before:] == [2, 1]  # nothing from a after it woke
    assert pair.leads("b", 2)
    (found,) = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    assert found.resolution == "recovered"
    steps = pair.store.steps(found.id)
    by_epoch = {e: [s.step for s in steps if s.epoch == e] for e in (1, 2)}
    assert "off_requested" in by_epoch[1] and "off_requested" not in by_epoch[2]
    assert "on_requested" in by_epoch[2] and "on_requested" not in by_epoch[1]
    assert all(s.epoch in (1, 2) for s in steps)
