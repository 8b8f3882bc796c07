"""The docker settings checked at load reach a real Docker Engine as meant:
``shm_size`` in Docker's own grammar, handed on in bytes
(docs/serving.md, "Checked at load")."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from docker_tier import Dockerd

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware.rank_image import rank_image

_SLEEPER = ["/bin/sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait", "rank"]


@pytest.mark.parametrize(("shm_size", "size"), [("1GiB", 1024**3), ("1.5g", 3 * 512 * 1024**2)])
def test_the_shm_size_reaches_the_container_in_bytes(
    dockerd: Dockerd, docker_client: docker.DockerClient, tmp_path: Path, shm_size: str, size: int
) -> None:
    image = rank_image(docker_client)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": {
            "image": image.tag,
            "socket": str(dockerd.socket),
            "gpus": "none",
            "volumes": list(image.volumes),
            "shm_size": shm_size,
        },
        "command": _SLEEPER,
        "token_file": str(token),
        "log_file": str(tmp_path / "serving.log"),
        "stack_dump": False,
    }
    launcher = ServingLauncher(parse_agent_config({"node": "spark-1", "serving": serving}).serving)
    try:
        assert launcher.start("plain")["state"] == "running"
        made = docker_client.containers.get("spark-watchdog-rank")
        assert made.attrs["HostConfig"]["ShmSize"] == size
        launcher.stop()
    finally:
        launcher.close()
