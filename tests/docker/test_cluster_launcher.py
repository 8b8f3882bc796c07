"""A serving restart through the cluster's own launcher (``serving.launcher:
command``) against a real Docker Engine: a launcher script playing
spark-vllm-docker's ``launch-cluster.sh`` (the lab's, spark_watchdog/lab/hardware/launch_cluster.py)
starts each node's container; two real agents adopt them as they start; the
controller's restart runs the launcher's stop and start, hands it the profile,
and verifies the result from the agents."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from docker_tier import Dockerd, bound_code, standin_command, wait_for

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.controller import LauncherConfig
from spark_watchdog.controller.serving.cluster_launcher import LauncherRestart
from spark_watchdog.controller.serving.launcher_commands import LocalRunner
from spark_watchdog.controller.serving.serving_restart import ServingNode
from spark_watchdog.lab.ports import free_port
from spark_watchdog.sdnotify import SystemdNotifier

LAUNCHER = (sys.executable, "-m", "spark_watchdog.lab.hardware", "launch-cluster")
TOKEN = "t0ken-of-the-serving-api"
NODES = ("spark-1", "spark-2")  # spark-1 is the head


class RunningAgent:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.loop.run_until_complete(self.agent.run(self.stop))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.agent.config.listen.port}"

    def serving(self) -> dict[str, Any]:
        body: dict[str, Any] = requests.get(f"{self.url}/v1/serving", timeout=5).json()
        return body

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


@dataclass
class Cluster:
    recipe: Path
    agents: dict[str, RunningAgent]
    head_port: int

    def launcher(self, **changes: Any) -> LauncherConfig:
        settings: dict[str, Any] = {
            "type": "command",
            "stop": (*LAUNCHER, "--recipe", str(self.recipe), "stop"),
            "start": (
                *LAUNCHER,
                "--recipe",
                str(self.recipe),
                "start",
                "{vllm_args}",
            ),
            "stop_timeout": 60.0,
            "start_timeout": 60.0,
        }
        settings.update(changes)
        return LauncherConfig(**settings)

    def restart(self, profile: str, timeout: float = 60.0, **changes: Any) -> Any:
        head, *workers = (ServingNode(n, self.agents[n].url) for n in NODES)
        restart = LauncherRestart(
            head,
            workers,
            TOKEN,
            launcher=self.launcher(**changes),
            runner=LocalRunner(),
            timeout=timeout,
        )
        return asyncio.run(restart.run(profile))

    def set_recipe(self, **changes: Any) -> None:
        recipe = json.loads(self.recipe.read_text())
        recipe.update(changes)
        self.recipe.write_text(json.dumps(recipe))


def _agent_config(tmp_path: Path, socket: str, node: str, head_port: int | None) -> Any:
    token = tmp_path / f"{node}-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    vllm: dict[str, Any] = {"enabled": False}
    if head_port is not None:
        vllm = {
            "url": f"http://127.0.0.1:{head_port}",
            "interval": 0.3,
            "timeout": 1.0,
            "stall_after": 3.0,
        }
    return parse_agent_config(
        {
            "node": node,
            "listen": {"address": "127.0.0.1", "port": free_port()},
            "loop_interval": 0.2,
            "probes": {"vllm": vllm, "gpu": {"enabled": False}, "journal": {"enabled": False}},
            "serving": {
                "enabled": True,
                "runtime": "docker",
                "docker": {"socket": socket, "name": f"vllm_{node}", "gpus": "none"},
                "token_file": str(token),
                "log_file": str(tmp_path / f"{node}-serving.log"),
                "stop_timeout": 10.0,
            },
        }
    )


@pytest.fixture
def cluster(
    dockerd: Dockerd, rank_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> Iterator[Cluster]:
    head_port = free_port()
    volumes, environment = bound_code()
    recipe = tmp_path / "recipe.json"
    recipe.write_text(
        json.dumps(
            {
                "socket": str(dockerd.socket),
                "image": rank_image,
                "volumes": volumes,
                "environment": environment,
                "nodes": [
                    {
                        "name": "spark-1",
                        "container": "vllm_spark-1",
                        "command": standin_command(head_port),
                    },
                    {
                        "name": "spark-2",
                        "container": "vllm_spark-2",
                        "command": standin_command(free_port(), "--headless"),
                    },
                ],
            }
        )
    )
    agents = {
        node: RunningAgent(
            Agent(
                _agent_config(
                    tmp_path, str(dockerd.socket), node, head_port if node == "spark-1" else None
                ),
                notifier=SystemdNotifier({}),
            )
        )
        for node in NODES
    }
    made = Cluster(recipe, agents, head_port)
    try:
        for running in agents.values():
            wait_for(running.agent.ready.is_set, 60, "the agent's first round")
        yield made
    finally:
        for running in agents.values():
            running.close()
        for container in docker_client.containers.list(all=True):
            container.remove(force=True)


def _launch_by_hand(cluster: Cluster, *extra: str) -> None:
    """The operator's own first start (``launch-cluster.sh start``)."""
    import subprocess

    subprocess.run(
        [*LAUNCHER, "--recipe", str(cluster.recipe), "start", *extra],
        check=True,
        capture_output=True,
    )
    for node in NODES:
        wait_for(
            lambda node=node: cluster.agents[node].serving()["state"] == "running",  # type: ignore[misc]
            60,
            f"{node}'s agent to adopt the launcher's container",
        )


def test_a_restart_through_the_launcher_brings_every_rank_back_with_the_safe_profile(
    cluster: Cluster, docker_client: docker.DockerClient
) -> None:
    _launch_by_hand(cluster)
    head = cluster.agents["spark-1"]
    wait_for(
        lambda: head.serving()["effective"]["cudagraph_mode"] == "FULL_AND_PIECEWISE",
        60,
        "the launcher's first rank and its config",
    )
    first = {n: cluster.agents[n].serving()["container"]["id"] for n in NODES}

    report = cluster.restart("safe")

    assert report.result == "succeeded", (report.error, report.launcher)
    commands = report.launcher["commands"]
    assert [c["which"] for c in commands] == ["stop", "start"]
    assert all(c["end"] == "exited" and c["exit_code"] == 0 for c in commands)
    assert "started vllm_spark-1 on spark-1" in commands[1]["output"]
    ranks = report.launcher["ranks"]
    assert ranks["before"] == {"spark-1": "running", "spark-2": "running"}
    assert all(state != "running" for state in ranks["after_stop"].values()), ranks
    assert ranks["after_start"] == {"spark-1": "running", "spark-2": "running"}
    # The launcher got the profile's flags and passed them to vLLM: the engine says so.
    assert head.serving()["effective"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    for node in NODES:
        now = cluster.agents[node].serving()["container"]
        assert now["id"] != first[node] and now["adopted"], now
    assert {"launcher stop", "launcher start", "wait ready"} <= set(report.step_durations)
    command = docker_client.containers.get("vllm_spark-1").attrs["Config"]["Cmd"]
    assert command[-2:] == ["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']


def test_a_launcher_that_drops_the_profile_is_a_profile_mismatch(cluster: Cluster) -> None:
    _launch_by_hand(cluster)

    # A start command without {vllm_args}: the launcher starts the recipe unchanged.
    start = (*LAUNCHER, "--recipe", str(cluster.recipe), "start")
    report = cluster.restart("safe", start=start)

    assert report.result == "profile_mismatch", (report.error, report.launcher)
    assert "effective config on spark-1 is not profile safe" in (report.error or "")


def test_a_failed_stop_starts_nothing_and_says_what_runs(cluster: Cluster) -> None:
    _launch_by_hand(cluster)
    cluster.set_recipe(fail={"stop": 3})

    report = cluster.restart("safe")

    assert report.result == "failed"
    assert "(exit 3)" in (report.error or "") and "nothing was started" in (report.error or "")
    assert "cannot reach the nodes" in (report.error or "")
    assert [c["which"] for c in report.launcher["commands"]] == ["stop"]
    assert report.launcher["ranks"]["after_stop"] == {"spark-1": "running", "spark-2": "running"}


def test_a_launcher_that_says_done_while_a_rank_stays_down_times_out_naming_it(
    cluster: Cluster,
) -> None:
    _launch_by_hand(cluster)
    cluster.set_recipe(fail={"start_only": ["spark-1"]})

    report = cluster.restart("safe", timeout=8.0)

    assert report.result == "timed_out", (report.error, report.launcher)
    assert "ranks on spark-2 did not run" in (report.error or "")
    assert report.launcher["commands"][1]["exit_code"] == 0
    assert report.launcher["ranks"]["after_start"]["spark-1"] == "running"
    assert report.launcher["ranks"]["after_start"]["spark-2"] != "running"


def test_a_start_command_that_is_not_there_is_a_failed_restart_with_every_rank_stopped(
    cluster: Cluster,
) -> None:
    _launch_by_hand(cluster)

    report = cluster.restart("safe", start=("/nonexistent/launch-cluster.sh", "start"))

    assert report.result == "failed"
    assert "cannot run '/nonexistent/launch-cluster.sh'" in (report.error or "")
    assert all(s != "running" for s in report.launcher["ranks"]["after_start"].values())


def test_a_stop_that_says_done_while_ranks_run_starts_nothing(cluster: Cluster) -> None:
    _launch_by_hand(cluster)
    cluster.set_recipe(fail={"stop_does_nothing": True})

    report = cluster.restart("safe")

    assert report.result == "failed", (report.error, report.launcher)
    assert "not every rank is down (still running or not known: spark-1, spark-2)" in (
        report.error or ""
    )
    assert [c["which"] for c in report.launcher["commands"]] == ["stop"]
