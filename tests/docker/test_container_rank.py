"""The serving launcher with ``serving.runtime: docker`` against a real Docker
Engine (tests/docker/conftest.py): the rank's container created, stopped,
killed by the memory guard, adopted after an agent restart, followed through
a daemon restart, and every way the Engine can be missing or wrong."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from docker_tier import Dockerd, bound_code, standin_command, wait_for

from spark_watchdog.agent.memory_watch import MemoryWatch
from spark_watchdog.agent.serving import LaunchFailed, ServingConflict, ServingLauncher
from spark_watchdog.config.agent import MemoryGuardConfig, ServingConfig, parse_agent_config
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.host import HostReading

GIB = 1024**3


def _serving(
    tmp_path: Path, socket_path: Path | str, image: str, port: int, **docker_settings: Any
) -> ServingConfig:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    volumes, environment = bound_code()
    settings = {"image": image, "socket": str(socket_path), "gpus": "none", "volumes": volumes}
    settings.update(docker_settings)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": settings,
        "command": standin_command(port),
        "environment": environment,
        "token_file": str(token),
        "log_file": str(tmp_path / "serving.log"),
        "stop_timeout": 10.0,
    }
    return parse_agent_config({"node": "spark-1", "serving": serving}).serving


def _healthy(port: int) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok
    return False


@pytest.fixture
def launchers() -> Iterator[list[ServingLauncher]]:
    made: list[ServingLauncher] = []
    yield made
    for launcher in made:
        with contextlib.suppress(Exception):
            launcher.stop()
        launcher.close()


def _launcher(made: list[ServingLauncher], config: ServingConfig) -> ServingLauncher:
    launcher = ServingLauncher(config, node="spark-1")
    made.append(launcher)
    return launcher


def test_the_rank_runs_as_a_container_and_a_restart_makes_it_anew_with_the_profile(
    dockerd: Dockerd,
    rank_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    port = free_port()
    launcher = _launcher(launchers, _serving(tmp_path, dockerd.socket, rank_image, port))
    started = launcher.start("plain")
    assert started["runtime"] == "docker" and started["state"] == "running"
    first = started["container"]
    assert first["name"] == "spark-watchdog-rank" and first["restart_policy"] == "no"
    wait_for(lambda: _healthy(port), 60, "the stand-in in its container")
    # The engine's startup line, from the container's logs, in the serving log.
    wait_for(
        lambda: launcher.status()["effective"]["cudagraph_mode"] == "FULL_AND_PIECEWISE",
        30,
        "the effective config read from the container's logs",
    )
    made = docker_client.containers.get("spark-watchdog-rank")
    assert made.labels["spark-watchdog.profile"] == "plain"
    assert made.labels["spark-watchdog.node"] == "spark-1"
    assert made.attrs["HostConfig"]["NetworkMode"] == "host"
    assert made.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"

    stopped = launcher.stop()
    assert stopped["state"] == "stopped" and stopped["exit_code"] == 0, stopped
    assert stopped["container"]["status"] == "exited" and not stopped["group_alive"]
    assert not _healthy(port)

    safe = launcher.start("safe")
    assert safe["container"]["id"] != first["id"], "a new container, not the old one restarted"
    wait_for(
        lambda: launcher.status()["effective"]["cudagraph_mode"] == "FULL_DECODE_ONLY",
        60,
        "the safe profile's effective config",
    )
    assert launcher.status()["effective_matches_profile"] is True
    # One container of the rank, ever: the old one was removed before the new one.
    assert [c.name for c in docker_client.containers.list(all=True)] == ["spark-watchdog-rank"]
    log = (tmp_path / "serving.log").read_text()
    assert log.count("starting the rank with profile") == 2
    assert "stop: SIGTERM to container spark-watchdog-rank" in log


def test_the_memory_guard_kills_a_root_rank_in_its_container(
    dockerd: Dockerd,
    rank_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    """As on a Spark: vLLM as root in a container (privileged there; this machine's
    kernel refuses a privileged container its capabilities). The guard's kill goes
    through the Engine's API and ends the whole container at once, without a stop."""
    port = free_port()
    config = _serving(tmp_path, dockerd.socket, rank_image, port)
    launcher = _launcher(launchers, config)
    serving = launcher.start("plain")
    wait_for(lambda: _healthy(port), 60, "the rank")
    top = docker_client.api.top(serving["container"]["id"], ps_args="-eo user,pid")
    assert {row[0] for row in top["Processes"]} == {"root"}, top
    watch = MemoryWatch(MemoryGuardConfig(), launcher=launcher, process_match=None)
    for t in range(30):
        reading = HostReading(
            state="ok",
            boot_id=None,
            uptime_s=None,
            mem_available_bytes=(12 - t) * GIB,
            mem_total_bytes=119 * GIB,
            mem_available_trend_bytes_per_s=None,
            load1=None,
            loop_lag_s=0.0,
        )
        if watch.observe(reading, float(t)).trip:
            break
    kill = watch.last_kill
    assert kill is not None and kill["result"] == "killed", kill
    (killed,) = kill["killed"]
    assert killed["container"]["name"] == "spark-watchdog-rank" and killed["pids"], killed
    wait_for(
        lambda: launcher.status()["container"]["status"] == "exited", 20, "the container ended"
    )
    status = launcher.status()
    assert status["container"]["exit_code"] == 137 and status["exit_signal"] == "SIGKILL"
    assert status["killed_by"] == "memory_guard" and not status["group_alive"]
    assert not _healthy(port)


def test_an_agent_restarted_under_its_running_container_adopts_it_and_starts_nothing_twice(
    dockerd: Dockerd,
    rank_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    port = free_port()
    config = _serving(tmp_path, dockerd.socket, rank_image, port)
    first = _launcher(launchers, config)
    original = first.start("safe")["container"]["id"]
    wait_for(lambda: _healthy(port), 60, "the rank")
    # The agent restarts (its process ends; the container runs on).
    again = _launcher(launchers, config)
    adopted = again.status()
    assert adopted["state"] == "running" and adopted["profile"] == "safe"
    assert adopted["container"]["id"] == original and adopted["container"]["adopted"] is True
    with pytest.raises(ServingConflict, match="still has live processes"):
        again.start("safe")
    assert len(docker_client.containers.list(all=True)) == 1
    assert again.stop()["state"] == "stopped"
    assert again.start("safe")["container"]["id"] != original
    wait_for(lambda: _healthy(port), 60, "the new rank")
    assert len(docker_client.containers.list(all=True)) == 1


def test_a_detached_container_of_the_operator_is_adopted_by_its_labels(
    dockerd: Dockerd,
    rank_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    """What `docker run -d` or a compose file leaves: another name, the operator's labels."""
    port = free_port()
    volumes, environment = bound_code()
    docker_client.containers.run(
        rank_image,
        standin_command(port),
        name="vllm-head",
        labels={"com.example.serving": "head"},
        environment=environment,
        volumes=volumes,
        network_mode="host",
        detach=True,
    )
    wait_for(lambda: _healthy(port), 60, "the operator's rank")
    config = _serving(
        tmp_path, dockerd.socket, rank_image, port, adopt_labels={"com.example.serving": "head"}
    )
    launcher = _launcher(launchers, config)
    status = launcher.status()
    assert status["container"]["name"] == "vllm-head" and status["container"]["adopted"]
    assert status["argv"] == standin_command(port) and status["profile"] == "unknown"
    stopped = launcher.stop()
    assert stopped["state"] == "stopped" and not _healthy(port)
    assert launcher.start("safe")["container"]["name"] == "spark-watchdog-rank"
    wait_for(lambda: _healthy(port), 60, "the rank the agent made")
    # Two containers with the labels: which one is the rank is not for the agent to guess.
    for name in ("twin-a", "twin-b"):
        docker_client.containers.create(
            rank_image, ["true"], name=name, labels={"com.example.twin": "x"}
        )
    twins = _serving(
        tmp_path,
        dockerd.socket,
        rank_image,
        free_port(),
        name="nobody",
        adopt_labels={"com.example.twin": "x"},
    )
    with pytest.raises(ServingConflict, match=r"match 2 containers \(twin-a, twin-b\)"):
        _launcher(launchers, twins).start("safe")


def test_the_launchers_container_is_adopted_as_it_starts_and_recreated_with_the_profile(
    dockerd: Dockerd,
    rank_image: str,
    docker_client: docker.DockerClient,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    """A cluster launcher (spark-vllm-docker, sparkrun) starts the rank's container
    after the agent; the agent is configured with neither command nor image."""
    port = free_port()
    config = _serving(
        tmp_path,
        dockerd.socket,
        rank_image,
        port,
        name="nobody",
        adopt_labels={"com.example.cluster": "head"},
    )
    config = dataclasses.replace(
        config, command=(), docker=dataclasses.replace(config.docker, image=None)
    )
    assert config.recreates_found_container
    launcher = _launcher(launchers, config)
    before = launcher.status()
    assert before["state"] == "not_started" and before["creates_from"]["source"] is None
    with pytest.raises(LaunchFailed, match="no container nobody or one labelled"):
        launcher.start("safe")

    volumes, environment = bound_code()
    docker_client.containers.run(
        rank_image,
        standin_command(port, "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}'),
        name="vllm_node",
        labels={"com.example.cluster": "head"},
        environment={**environment, "OPERATOR_SETTING": "kept"},
        volumes=volumes,
        network_mode="host",
        restart_policy={"Name": "always"},
        detach=True,
    )
    wait_for(
        lambda: launcher.status().get("container", {}).get("name") == "vllm_node",
        30,
        "the agent to adopt the container the launcher started",
    )
    adopted = launcher.status()
    assert adopted["state"] == "running" and adopted["container"]["adopted"]
    assert adopted["container"]["restart_policy"] == "always"
    assert adopted["creates_from"]["source"] == "found_container"
    wait_for(lambda: _healthy(port), 60, "the launcher's rank")

    assert launcher.stop()["state"] == "stopped"
    remade = launcher.start("safe")
    assert remade["container"]["name"] == "vllm_node" and not remade["container"]["adopted"]
    wait_for(
        lambda: launcher.status()["effective"]["cudagraph_mode"] == "FULL_DECODE_ONLY",
        60,
        "the safe profile merged into the launcher's command",
    )
    made = docker_client.containers.get("vllm_node")
    assert made.attrs["HostConfig"]["RestartPolicy"]["Name"] == "no"
    assert made.attrs["HostConfig"]["NetworkMode"] == "host"
    assert made.labels["com.example.cluster"] == "head"  # still found by its labels
    assert made.labels["spark-watchdog.profile"] == "safe"
    assert "OPERATOR_SETTING=kept" in made.attrs["Config"]["Env"]
    command = made.attrs["Config"]["Cmd"]
    merged = json.loads(command[command.index("--compilation-config") + 1])
    assert merged == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    wait_for(lambda: _healthy(port), 60, "the re-created rank")
    # The agent's own start is its own: the container's start event adopted nothing.
    time.sleep(1.0)
    assert not launcher.status()["container"]["adopted"]
    # The next profile goes into the launcher's command, not into the last profile's:
    # plain gives the launcher's own command back.
    assert launcher.stop()["state"] == "stopped"
    launcher.start("plain")
    again = docker_client.containers.get("vllm_node").attrs["Config"]["Cmd"]
    assert again == standin_command(port, "--compilation-config", '{"cudagraph_mode": "PIECEWISE"}')


def test_a_dockerd_restart_under_the_rank_is_followed(
    dockerd: Dockerd,
    rank_image: str,
    tmp_path: Path,
    launchers: list[ServingLauncher],
) -> None:
    port = free_port()
    launcher = _launcher(launchers, _serving(tmp_path, dockerd.socket, rank_image, port))
    launcher.start("plain")
    wait_for(lambda: _healthy(port), 60, "the rank")
    dockerd.stop()
    # The daemon is gone: nothing is called gone that was not seen gone.
    wait_for(lambda: launcher.status()["container"]["status"] == "unknown", 30, "unknown")
    down = launcher.status()
    assert down["group_alive"] and down["container"]["engine_reachable"] is False
    assert "docker.sock" in (down["container"]["engine_error"] or "")
    dockerd.start()
    # The daemon stopped its containers as it went down; the rank is seen exited.
    wait_for(lambda: launcher.status()["container"]["status"] == "exited", 60, "seen again")
    assert launcher.status()["state"] == "exited"
    launcher.start("safe")
    wait_for(lambda: _healthy(port), 60, "the rank started again after the restart")


def test_an_engine_that_is_missing_refuses_or_answers_garbage_is_a_clear_refusal(
    rank_image: str, tmp_path: Path
) -> None:
    missing = ServingLauncher(_serving(tmp_path, tmp_path / "no.sock", rank_image, free_port()))
    with pytest.raises(LaunchFailed, match=r"no\.sock: no such socket \(is dockerd running"):
        missing.start("safe")
    assert missing.status()["state"] == "not_started"
    # A socket that answers garbage.
    garbage = tmp_path / "garbage.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(garbage))
    server.listen()

    def answer() -> None:
        while True:
            try:
                peer, _ = server.accept()
            except OSError:
                return
            with peer:
                peer.recv(4096)
                peer.sendall(b"SSH-2.0-not-docker\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        confused = ServingLauncher(_serving(tmp_path, garbage, rank_image, free_port()))
        with pytest.raises(LaunchFailed, match=r"Docker Engine at .*garbage\.sock"):
            confused.start("safe")
        assert confused.status()["state"] == "not_started"
    finally:
        server.close()


def test_an_image_the_engine_does_not_have_is_named(
    dockerd: Dockerd, tmp_path: Path, docker_client: docker.DockerClient
) -> None:
    launcher = ServingLauncher(
        _serving(tmp_path, dockerd.socket, "spark-watchdog-test/none:1", free_port())
    )
    with pytest.raises(
        LaunchFailed, match=r"spark-watchdog-test/none:1: no such image .*docker pull"
    ):
        launcher.start("safe")
    assert docker_client.containers.list(all=True) == []
