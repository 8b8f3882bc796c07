"""Two real controller processes on one PostgreSQL history (controller/pair/pair.py).

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
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.controller.pair.pair import STOP_WITHIN_S
from spark_watchdog.history.leadership import Lease
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.controller_pair import (
    LEADERSHIP,
    RESTART_S,
    RESTARTED,
    ControllerPair,
    wait_for,
)
from spark_watchdog.lab.hardware.tcp_proxy import TcpProxy
from spark_watchdog.lab.node import LabNode

pytestmark = pytest.mark.integration

HA = [sys.executable, "-m", "spark_watchdog", "ha"]


def _ha(pair: ControllerPair, *args: str, name: str = "b") -> subprocess.CompletedProcess[str]:
    """``spark-watchdog ha`` with controller ``name``'s config."""
    return subprocess.run(
        [*HA, args[0], "--config", str(pair.config_path(name)), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def sets(lab: LabCluster, node: LabNode) -> list[int]:
    assert lab.pdu is not None
    return [int(str(s.value)) for s in lab.pdu.standin.sets_for(node.outlet)]


def recovered(pair: ControllerPair) -> Any:
    found = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    return found and found[0].status == "resolved" and found[0]


def test_the_standby_takes_over_a_killed_leader_and_recovers_a_freeze(pair: ControllerPair) -> None:
    lab = pair.lab
    pair.start("a")
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    b = pair.start("b")
    wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
    # What an operator sees of the standby: ha status, and its own endpoint.
    listed = json.loads(_ha(pair, "status", "--json").stdout)["standbys"]
    assert [s["holder"].split(":")[1] for s in listed] == [str(b.pid)]
    port = yaml.safe_load(pair.config_path("b").read_text())["listen"]["port"]
    waiting = requests.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()["standby"]
    assert waiting["leader"]["epoch"] == 1 and waiting["history"] == "ok"
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "\nspark_watchdog_controller_leader_epoch 0.0\n" in metrics
    assert "\nspark_watchdog_controller_seen_leader_epoch 1.0\n" in metrics
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
    shown = json.loads(_ha(pair, "status", "--json").stdout)
    leader = shown["leader"]
    assert leader["epoch"] == 2 and leader["holder"].split(":")[1] == str(b.pid)
    assert shown["standbys"] == []  # a is dead, b leads
    assert "no standby seen" in _ha(pair, "status").stdout
    status = requests.get(f"http://127.0.0.1:{port}/v1/status", timeout=10).json()
    assert status["leadership"] == {"holder": leader["holder"], "epoch": 2}
    metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert "\nspark_watchdog_controller_leader_epoch 2.0\n" in metrics
    # ha step-down: the leader's next renewal fails; it stops and exits.
    ended = _ha(pair, "step-down")
    assert "ended the lease of" in ended.stdout and "(epoch 2): it stops now" in ended.stdout
    assert b.wait(30) == 1 and "stopped leading" in pair.log("b")


def test_a_controller_that_exits_is_started_again_as_its_unit_would(pair: ControllerPair) -> None:
    """``restart=True``: the lab starts an exited controller again after
    ``RESTART_S`` (the unit's RestartSec); the log keeps both starts."""
    a = pair.start("a", restart=True)
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    assert "ended the lease of" in _ha(pair, "step-down", name="a").stdout
    assert a.wait(30) == 1
    exited = time.monotonic()
    wait_for(lambda: pair.leads("a", 2), 60, "controller a started again, leading at epoch 2")
    assert time.monotonic() - exited >= RESTART_S - 0.5
    again = pair.processes["a"]
    assert again.pid != a.pid and again.poll() is None
    # The lease says it leads before its log line is read back: wait for the line.
    wait_for(
        lambda: "leading at epoch 2" in pair.log("a").split(RESTARTED)[-1],
        30,
        "the second start's log telling it leads at epoch 2",
    )
    first, second = pair.log("a").split(RESTARTED)
    assert "stopped leading" in first and "(it exited with 1)" in second
    assert "leading at epoch 2" in second


def steps_of_freeze(pair: ControllerPair) -> list[str]:
    found = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    return [s.step for s in pair.store.steps(found[0].id)] if found else []


def test_a_leader_paused_mid_cycle_wakes_deposed_and_sends_nothing(pair: ControllerPair) -> None:
    """Paused in the off hold, after its off: the standby takes over, reads the
    outlet and finishes the cycle with the on; the old leader wakes with its on
    still to send, and sends nothing."""
    lab = pair.lab
    a = pair.start("a")
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    pair.start("b")
    wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
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
    asleep = len(pair.log("a"))
    os.kill(a.pid, signal.SIGCONT)
    assert a.wait(60) == 1  # it found itself deposed and exited
    said = pair.log("a")[asleep:]
    assert "stopped leading" in said
    # Deposed, it says nothing about nodes (the new leader recovered this one)
    # and resumes nothing; one leadership_lost at most.
    assert pair.said_while_deposed("a", asleep) == [], said
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


def test_a_leader_whose_history_link_goes_dark_exits_while_it_stays_dark(
    pair: ControllerPair,
) -> None:
    """In the off hold, the leader's link to the history goes dark and stays dark.
    It gives up after give_up_after, cancels its hold (whose on a dark history
    could not record), and the process exits with 1 within the bound
    docs/design.md states, although threads of it are still blocked on the
    link. The standby takes over and finishes the cycle."""
    lab = pair.lab
    with TcpProxy(pair.server.port) as link:
        a = pair.start("a", via=link)
        wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
        wait_for(lambda: pair.sees_every_node_healthy("a"), 60, "controller a seeing every node")
        pair.start("b")
        wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
        node = lab.node("spark-2")
        before = len(sets(lab, node))
        lab.freeze(node)
        wait_for(lambda: "hold_started" in steps_of_freeze(pair), 60, "a's off, in the hold")
        lit = len(pair.log("a"))
        link.blackhole()
        dark_at = time.monotonic()
        # give_up_after, the epoch's tasks and its alert (STOP_WITHIN_S each),
        # and a loaded machine's scheduling.
        bound = LEADERSHIP["give_up_after"] + 2 * STOP_WITHIN_S + 10.0
        try:
            status = a.wait(bound)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a did not exit within {bound:g}s of its link going dark")
        exited_after = time.monotonic() - dark_at
        said = pair.log("a")[lit:]
        assert status == 1, said
        assert "leadership_lost" in said and "cancelling every task" in said
        assert "hold_done" not in said.split("leadership_lost", 1)[1]
        assert pair.said_while_deposed("a", lit) == [], said
        wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
        wait_for(lambda: recovered(pair), 120, "the cycle finished by b")
        assert sets(lab, node)[before:] == [2, 1]  # a's off, b's on
        assert exited_after >= LEADERSHIP["give_up_after"] - 1.0


def test_a_new_leader_tries_again_an_off_its_predecessor_recorded_but_never_sent(
    pair: ControllerPair,
) -> None:
    """A leader recorded its off and died before the datagram left (epoch 1,
    written here through a lease of the test's own). The next leader finds the
    outlet on and no new boot: it sends nothing for the boot timeout (the off
    may have landed and the node be booting), then tries the rung once more
    through its preflight. One off and one on in all, and the node recovered."""
    lab = pair.lab
    node = lab.node("spark-2")
    before = len(sets(lab, node))
    boot_before = node.boot_id()
    lease = Lease(
        pair.store, lease_s=LEADERSHIP["lease"], send_deadline_s=LEADERSHIP["send_deadline"]
    )
    assert lease.acquire().epoch == 1
    lab.freeze(node)
    pair.store.set_fence(lease)
    try:
        opened = pair.store.open_incident(
            "host_frozen", [node.name], detected_at=time.time(), evidence={"test": "a dead leader"}
        )
        pair.store.record_action(
            node.name,
            "cycle",
            device="lab pdu",
            incident_id=opened.id,
            rung=0,
            step="rung_started",
            step_detail={"rung": 0, "boot_id_before": boot_before},
        )
        pair.store.add_step(
            opened.id, "off_requested", node=node.name, detail={"rung": 0, "detail": ""}
        )
    finally:
        pair.store.set_fence(None)  # the leader dies: its lease runs out
    pair.start("b")
    wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
    wait_for(lambda: recovered(pair), 180, "the freeze recovered by b")
    (found,) = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    assert found.id == opened.id and found.resolution == "recovered"
    assert node.boot_id() != boot_before
    assert sets(lab, node)[before:] == [2, 1]  # the second try's off and on, nothing else
    steps = pair.store.steps(opened.id)
    names = [s.step for s in steps]
    resumed = next(s for s in steps if s.step == "resumed")
    assert resumed.detail == {"last_step": "off_requested", "state": "on"}
    timed_out = next(s for s in steps if s.step == "boot_timeout")
    second = next(s for s in steps if s.step == "rung_started" and s.epoch == 2)
    assert second.detail.get("attempt") == 2 and second.seq > timed_out.seq
    config = yaml.safe_load(pair.config_path("b").read_text())
    assert timed_out.at - resumed.at >= config["guards"]["boot_timeout"] - 1.0
    assert names.count("off_requested") == 2 and names.count("on_requested") == 1
    assert {s.epoch for s in steps if s.seq > resumed.seq - 1} == {2}


def _faketime_library() -> Path:
    """Debian's libfaketime (package faketime): it moves a process's clocks."""
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
    if not found:
        why = "libfaketime is not installed (apt-get install faketime; scripts/setup.sh does)"
        if os.environ.get("SPARK_WATCHDOG_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL tier required but {why}")
        pytest.skip(why)
    return found[0]


def test_a_new_leader_with_a_clock_ahead_holds_the_off_for_all_of_the_hold(
    pair: ControllerPair,
) -> None:
    """The standby's host clock runs SKEW seconds ahead of the leader's (libfaketime).
    The leader is killed in the off hold; the new leader resumes that hold from the
    recorded off. Both record and measure on the database's clock, so the on comes
    no sooner than the whole hold after the off (on the host clock the hold would
    look over at once). The new leader's steps carry database times too."""
    skew, hold = 120.0, 25.0
    lab = pair.lab
    policy = {"power_off_seconds": hold}
    a = pair.start("a", policy=policy)
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    ahead = {"LD_PRELOAD": str(_faketime_library()), "FAKETIME": f"+{skew:g}s"}
    seen = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **ahead},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert float(seen.stdout) - time.time() > skew - 10  # the standby's clock is ahead
    pair.start("b", env=ahead, policy=policy)
    wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
    node = lab.node("spark-1")
    before = len(sets(lab, node))
    lab.freeze(node)
    wait_for(lambda: "hold_started" in steps_of_freeze(pair), 60, "a's off verified, in the hold")
    a.kill()
    wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
    wait_for(lambda: recovered(pair), 120, "the cycle finished by b")
    assert lab.pdu is not None
    off, on = lab.pdu.standin.sets_for(node.outlet)[before:]
    assert (off.value, on.value) == (2, 1)  # a's off, b's on, nothing else
    assert on.at - off.at >= hold, f"the outlet was off for {on.at - off.at:.1f}s"
    (found,) = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    steps = pair.store.steps(found.id)
    resumed = next(s for s in steps if s.step == "hold_started" and s.epoch == 2)
    assert resumed.detail["resumed"] is True
    assert 0 < resumed.detail["remaining_s"] < hold
    assert all(abs(s.at - time.time()) < skew / 2 for s in steps if s.epoch == 2)


def test_the_page_steps_the_leader_down_and_a_standby_serves_only_the_page(
    pair: ControllerPair, tmp_path: Path
) -> None:
    """docs/page.md: the step-down a person presses on the leader's page is
    `ha step-down`'s; a standby's page has neither data nor actions."""
    token_file = tmp_path / "page-token"
    token_file.write_text("pair-page-token\n")
    token_file.chmod(0o600)
    listen = {"token_file": str(token_file)}
    a = pair.start("a", listen=listen)
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    pair.start("b", listen=listen)
    wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
    ports = {n: yaml.safe_load(pair.config_path(n).read_text())["listen"]["port"] for n in "ab"}
    standby = f"http://127.0.0.1:{ports['b']}"
    assert requests.get(standby + "/", timeout=10).status_code == 200
    refused = requests.post(
        standby + "/v1/actions/step-down",
        json={},
        headers={"Authorization": "Bearer pair-page-token"},
        timeout=10,
    )
    assert refused.status_code == 503 and "stands by" in refused.json()["error"]
    leader = f"http://127.0.0.1:{ports['a']}"
    wrong = requests.post(
        leader + "/v1/actions/step-down", json={}, headers={"Authorization": "Bearer x"}, timeout=10
    )
    assert wrong.status_code == 401 and pair.leads("a", 1)
    answer = requests.post(
        leader + "/v1/actions/step-down",
        json={},
        headers={"Authorization": "Bearer pair-page-token"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["ended"]["epoch"] == 1
    assert answer.json()["ended"]["stepped_down_at"] is not None
    assert a.wait(30) == 1 and "stopped leading" in pair.log("a")
    wait_for(lambda: pair.leads("b", 2), 60, "controller b leading at epoch 2")
