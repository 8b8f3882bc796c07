"""Two Sparks, no third machine: the controllers on the lab's nodes themselves
(lab/colocated.py; docs/design.md, "Controllers on the Sparks"). Each row of
the case table the lab plays runs as its scenario
(lab/stories/colocated_scenarios.py), judged from every controller's own
history, from its /v1/status and from the PDU. The two-node rows share one lab,
one after another, as a cluster lives through them; each four-node order has
a lab of its own. The labs are on the fixed network-namespace addresses, so
the module shares the ``lab-netns`` group (tests/support/suite_plan.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from scenario_contract import CONTRACT_KEYS

from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import lab_processes
from spark_watchdog.lab.colocated_session import ColocatedLab
from spark_watchdog.lab.netns import IP, netns_unavailable
from spark_watchdog.lab.stories.colocated_scenarios import (
    NO_UNREACHABLE_ALERT,
    play,
    run_colocated,
)
from spark_watchdog.lab.up import LabControl

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("lab-netns")]

CLI = [sys.executable, "-m", "spark_watchdog"]


def _netns_or_skip() -> None:
    why = netns_unavailable()
    if why is not None:
        pytest.skip(f"network namespaces: {why}")


def _nothing_left(lab_id: str) -> None:
    time.sleep(0.2)
    assert lab_processes(lab_id) == [], "lab processes left behind"
    left = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
    assert f"swlab-{lab_id[:6]}-" not in left, f"namespaces left behind: {left}"


@pytest.fixture(scope="class")
def two_sparks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ColocatedLab]:
    _netns_or_skip()
    colo = ColocatedLab(tmp_path_factory.mktemp("two-sparks"), nodes=2)
    try:
        yield colo.start()
    finally:
        colo.stop()
    if colo.cluster is not None:
        _nothing_left(colo.cluster.lab_id)


def _report(result: Any) -> dict[str, Any]:
    report: dict[str, Any] = result.to_json()
    assert set(report) >= CONTRACT_KEYS
    assert report["ok"], report
    assert report["false_power_actions"] == 0, report
    return report


def _histories(colo: ColocatedLab) -> dict[str, HistoryStore]:
    return {name: colo.store(name) for name in colo.placed}


class TestTwoSparks:
    """The two-node rows, in turn on one lab (torn down before the four-node ones:
    two labs cannot hold the same addresses at once)."""

    def test_one_config_serves_both_sparks_and_each_controller_runs_on_its_node(
        self, two_sparks: ColocatedLab
    ) -> None:
        config = yaml.safe_load(two_sparks.config_path.read_text())
        assert config["listen"]["address"] == "0.0.0.0"
        assert [c["node"] for c in config["colocated"]["controllers"]] == ["spark-1", "spark-2"]
        assert config["history"] == "controller-history.db"  # each in its node's directory
        for name, placed in two_sparks.placed.items():
            status = placed.status()  # over the node's management link, from the lab machine
            assert status is not None and status["colocated"]["node"] == name
            assert status["colocated"]["order"] == ["spark-1", "spark-2"]
            assert placed.history.is_file()
            tree = two_sparks.lab.tree(placed.node)
            assert placed.process(tree) is not None, (
                f"{name}'s controller is not in its host's tree"
            )

    def test_the_fabric_cable_pulled_is_serving_trouble_for_the_first_controller_only(
        self, two_sparks: ColocatedLab
    ) -> None:
        report = _report(play(two_sparks, "colocated-fabric-cut"))
        assert report["outcome"] == "no_power" and report["power_actions"] == 0
        assert report["serving_restarts"] >= 1

    def test_a_management_link_cut_is_unreachable_over_the_fabric_never_cut(
        self, two_sparks: ColocatedLab
    ) -> None:
        report = _report(play(two_sparks, "colocated-mgmt-cut"))
        assert report["outcome"] == "unreachable" and report["power_actions"] == 0
        assert any(
            n.startswith("spark-2's controller, asked over the fabric: witness unreachable")
            for n in report["notes"]
        ), report["notes"]
        # spark-1's controller is spark-2's first actor: it tells, though it may not act
        # while spark-2's controller answers over the fabric.
        assert NO_UNREACHABLE_ALERT not in report["notes"], report["notes"]
        assert "unreachable" in report["alerts"]

    def test_the_total_partition_sends_nothing(self, two_sparks: ColocatedLab) -> None:
        report = _report(play(two_sparks, "colocated-partition"))
        assert report["outcome"] == "no_power" and report["power_actions"] == 0

    def test_spark_2_frozen_is_cycled_once_by_spark_1s_controller(
        self, two_sparks: ColocatedLab
    ) -> None:
        report = _report(play(two_sparks, "colocated-freeze"))
        assert report["outcome"] == "recovered"
        assert report["pdu_commands"] == ["outlet 2 (spark-2) off", "outlet 2 (spark-2) on"]
        assert report["history"] == str(two_sparks.placed["spark-1"].history)

    def test_the_frozen_head_is_cycled_once_by_spark_2s_controller_after_the_fence_delay(
        self, two_sparks: ColocatedLab
    ) -> None:
        report = _report(play(two_sparks, "colocated-head-freeze"))
        assert report["outcome"] == "recovered"
        assert report["pdu_commands"] == ["outlet 1 (spark-1) off", "outlet 1 (spark-1) on"]
        assert report["history"] == str(two_sparks.placed["spark-2"].history)
        # Over the whole life of the lab: no controller ever cycled its own host.
        for name, store in _histories(two_sparks).items():
            cycled = [a.node for a in store.actions() if a.operation == "cycle"]
            assert name not in cycled, (name, cycled)

    def test_lab_up_control_kills_a_nodes_controller_and_its_host_starts_it_again(
        self, two_sparks: ColocatedLab
    ) -> None:
        control = LabControl(two_sparks).start()
        try:
            described = control.describe()
        finally:
            control.stop()
        assert [c["node"] for c in described["controllers"]] == ["spark-1", "spark-2"]
        assert described["pdu"]["snmp"].startswith("udp://198.51.100.1:")
        placed = two_sparks.placed["spark-2"]
        before = placed.status()
        assert before is not None
        sets = len(two_sparks.lab.outlet_commands())
        killed = time.monotonic()
        assert "SIGKILLed" in control._apply("controller-kill", placed.node)
        two_sparks.wait_for(
            lambda: (placed.status() or {}).get("started_at") not in (None, before["started_at"]),
            60,
            "spark-2's controller started again",
        )
        assert time.monotonic() - killed >= 4.5  # its unit's RestartSec, 5 s
        assert (placed.status() or {})["colocated"]["observing"] is True  # it listens first
        assert len(two_sparks.lab.outlet_commands()) == sets


@pytest.mark.parametrize(
    ("name", "outcome", "commands", "actor"),
    [
        ("colocated-both-frozen", "no_power", [], None),
        (
            "colocated-both-frozen-all",
            "recovered",
            [f"outlet {i} (spark-{i}) {c}" for i in (1, 2) for c in ("off", "on")],
            "spark-3",
        ),
    ],
)
def test_four_sparks_both_first_controllers_hosts_frozen(
    tmp_path: Path, name: str, outcome: str, commands: list[str], actor: str | None
) -> None:
    _netns_or_skip()
    report = _report(run_colocated(name, workdir=tmp_path / name))
    assert report["outcome"] == outcome
    assert sorted(report["pdu_commands"]) == sorted(commands)
    if actor is not None:
        assert report["history"] == str(tmp_path / name / "nodes" / actor / "controller-history.db")
    assert report["lab_id"] is not None
    _nothing_left(report["lab_id"])


def test_lab_up_colocated_usage_errors() -> None:
    one = subprocess.run(
        [*CLI, "lab", "up", "--colocated", "--controllers", "spark-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert one.returncode == 2 and "two or more different nodes" in one.stderr
    alone = subprocess.run(
        [*CLI, "lab", "up", "--controllers", "spark-1,spark-2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 2 and "goes with --colocated" in alone.stderr
    sized = subprocess.run(
        [*CLI, "lab", "run", "--scenario", "colocated-freeze", "--nodes", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sized.returncode == 2 and "runs on 2 nodes" in sized.stderr
