"""The lab with every rank in a container (``spark-watchdog lab ... --serving
docker`` and ``--serving launcher``): the scenarios end as they do with
processes, with the same JSON, and the ranks were containers of the lab's own
dockerd throughout.

Each lab starts a dockerd of its own (not the tier's: the lab is the product's
main job, and brings what it needs), so each scenario is a group of its own
and runs beside the others.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scenario_contract import CONTRACT_KEYS

from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import lab_processes
from spark_watchdog.lab.hardware.dockerd import docker_unavailable
from spark_watchdog.lab.stories.scenario_kit import ScenarioResult
from spark_watchdog.lab.stories.scenarios import run_scenario

# The scenarios the issue names for containers, each in a group of its own.
DOCKER_SCENARIOS = ["crash", "wedge", "mem-collapse", "controller-kill"]
LAUNCHED = ["freeze", "crash"]


@pytest.fixture(autouse=True)
def _docker_here() -> None:
    if os.environ.get("SPARK_WATCHDOG_DOCKER") == "0":
        pytest.skip("SPARK_WATCHDOG_DOCKER=0: the Docker tier is off")
    why = docker_unavailable()
    if why is not None:
        if os.environ.get("SPARK_WATCHDOG_REQUIRE_DOCKER") == "1":
            pytest.fail(f"SPARK_WATCHDOG_REQUIRE_DOCKER=1 but {why}")
        pytest.skip(f"Docker tier skipped: {why}")


def _containers(value: Any) -> list[dict[str, Any]]:
    """Every ``container`` block the agents reported, anywhere in an incident."""
    found: list[dict[str, Any]] = []
    if isinstance(value, dict):
        block = value.get("container")
        if isinstance(block, dict) and "name" in block:
            found.append(block)
        for item in value.values():
            found += _containers(item)
    elif isinstance(value, list):
        for item in value:
            found += _containers(item)
    return found


def _incident(history: str, incident: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "show", str(incident), "--db", history, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def _lab_json(*args: str) -> dict[str, Any]:
    """``spark-watchdog lab ARGS --json``, as a script runs it: exit 0 and its JSON."""
    done = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "lab", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    loaded: dict[str, Any] = json.loads(done.stdout)
    return loaded


def _judged(report: dict[str, Any], lab_id: str | None) -> HistoryStore:
    assert set(report) >= CONTRACT_KEYS
    assert report["ok"], report
    assert report["false_power_actions"] == 0
    assert lab_id is not None and lab_processes(lab_id) == [], "lab processes left behind"
    assert report["history"] is not None
    return HistoryStore(report["history"], read_only=True)


@pytest.fixture
def store() -> Iterator[list[HistoryStore]]:
    opened: list[HistoryStore] = []
    yield opened
    for each in opened:
        each.close()


@pytest.mark.xdist_group("lab-docker-freeze")
def test_the_demo_with_containers_power_cycles_the_frozen_host_and_restarts_its_container(
    tmp_path: Path, store: list[HistoryStore]
) -> None:
    summary = _lab_json("demo", "--serving", "docker", "--dir", str(tmp_path / "demo"))
    report = summary["scenario"]
    assert summary["ok"] and report["outcome"] == "recovered"
    assert "a container the agent creates" in "\n".join(summary["timeline"])
    history = _judged(report, report["lab_id"])
    store.append(history)
    (incident,) = report["incident_ids"]
    assert [(a.operation, a.result) for a in history.actions(incident_id=incident)] == [
        ("cycle", "verified")
    ]
    restarts = history.serving_restarts()
    assert [(r.profile, r.result) for r in restarts] == [("safe", "succeeded")]
    # The frozen node's rank, as its agent reported it before the freeze: a container.
    names = {c["name"] for c in _containers(_incident(report["history"], incident))}
    assert "vllm_spark-3" in names, names


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xdist_group(f"lab-docker-{n}")) for n in DOCKER_SCENARIOS],
)
def test_a_scenario_ends_as_with_processes_when_the_agents_run_containers(
    name: str, tmp_path: Path, store: list[HistoryStore]
) -> None:
    result: ScenarioResult = run_scenario(name, workdir=tmp_path / name, serving="docker")
    report = result.to_json()
    history = _judged(report, result.lab_id)
    store.append(history)

    assert report["outcome"] == "recovered", report
    restarts = history.serving_restarts()
    assert restarts and restarts[0].profile == "safe" and restarts[0].result == "succeeded"
    if name == "controller-kill":
        assert report["power_actions"] == 2  # one off, one on
    else:
        assert report["power_actions"] == 0
    incident = _incident(report["history"], report["incident_ids"][0])
    names = {c["name"] for c in _containers(incident)}
    assert names and all(n.startswith("vllm_spark-") for n in names), names
    if name == "mem-collapse":
        # The guard killed the rank's container (its record names it; the container
        # may still read running when the record was taken, a moment after the kill),
        # and the rank was gone before the lab's exhaustion (the scenario's judgement).
        kill = incident["incident"]["evidence"]["agent_state"]["memory_guard"]["last_kill"]
        (killed,) = kill["killed"]
        assert killed["container"]["name"].startswith("vllm_spark-"), killed
        assert kill["result"] == "killed" and killed["pids"], kill


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xdist_group(f"lab-launcher-{n}")) for n in LAUNCHED],
)
def test_a_cluster_started_by_its_launcher_is_restarted_through_the_launcher(
    name: str, tmp_path: Path, store: list[HistoryStore]
) -> None:
    report = _lab_json(
        "run", "--scenario", name, "--serving", "launcher", "--dir", str(tmp_path / name)
    )
    history = _judged(report, report["lab_id"])
    store.append(history)
    assert report["outcome"] == "recovered"
    assert report["power_actions"] == (2 if name == "freeze" else 0)

    (restart,) = history.serving_restarts()
    assert (restart.profile, restart.result) == ("safe", "succeeded"), restart.error
    assert {"launcher stop", "launcher start"} <= set(restart.step_durations)
    incident = _incident(report["history"], report["incident_ids"][0])
    text = json.dumps(incident)
    # The launcher's own start, handed the head's config with the profile merged.
    assert "launch-cluster" in text and '\\"enable_adaptive_verification\\":false' in text
    assert all(c.get("adopted") for c in _containers(incident)), _containers(incident)
