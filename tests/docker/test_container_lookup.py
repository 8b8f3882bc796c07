"""Which container is the rank's, against a real Docker Engine: a
``serving.docker.name`` that is a prefix of another container's id never
adopts, stops, kills or removes that container
(docs/serving.md, "Which container is the rank")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.models.containers
import pytest
from docker_tier import Dockerd

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware.rank_image import rank_image

# The shell traps SIGTERM, so a stop ends it at once (a PID 1 without a handler ignores it).
_SLEEPER = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait", "rank"]


@pytest.fixture
def bystander(docker_client: docker.DockerClient) -> Iterator[docker.models.containers.Container]:
    """Another workload's container, running on the node."""
    image = rank_image(docker_client)
    container = docker_client.containers.run(
        image.tag,
        _SLEEPER,
        name="bystander",
        detach=True,
        network_mode="host",
        volumes=list(image.volumes),
    )
    yield container
    with contextlib.suppress(docker.errors.DockerException):
        container.remove(force=True)


def test_a_name_that_is_a_prefix_of_another_containers_id_never_touches_it(
    dockerd: Dockerd,
    docker_client: docker.DockerClient,
    bystander: docker.models.containers.Container,
    tmp_path: Path,
) -> None:
    prefix = str(bystander.id)[:12]
    # What the agent used to ask: docker inspect NAME answers with the bystander.
    assert docker_client.api.inspect_container(prefix)["Id"] == bystander.id
    image = rank_image(docker_client)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": {
            "image": image.tag,
            "name": prefix,
            "socket": str(dockerd.socket),
            "gpus": "none",
            "volumes": list(image.volumes),
        },
        "command": _SLEEPER,
        "token_file": str(token),
        "log_file": str(tmp_path / "serving.log"),
        "stop_timeout": 10.0,
        "stack_dump": False,
    }
    config = parse_agent_config({"node": "spark-1", "serving": serving}).serving
    launcher = ServingLauncher(config, node="spark-1")
    try:
        assert launcher.status()["state"] == "not_started", "the bystander was adopted"
        started = launcher.start("plain")
        assert started["state"] == "running" and started["container"]["name"] == prefix
        assert started["container"]["id"] != prefix
        stopped = launcher.stop()
        assert stopped["state"] == "stopped"
        # A second start removes the rank's own ended container, by its id.
        assert launcher.start("plain")["state"] == "running"
        launcher.stop()
    finally:
        launcher.close()
    bystander.reload()
    assert bystander.status == "running", "the bystander was stopped or killed"
    names = sorted(str(c.name) for c in docker_client.containers.list(all=True))
    assert names == sorted(["bystander", prefix])
