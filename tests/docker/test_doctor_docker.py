"""Doctor's check of a containerized rank against the real Docker Engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import docker
from docker_tier import Dockerd, bound_code, standin_command

from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.doctor.docker_checks import check_docker


def _agent(tmp_path: Path, socket: Path | str, image: str, **docker_settings: Any) -> AgentConfig:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    settings: dict[str, Any] = {"image": image, "socket": str(socket), "gpus": "none"}
    settings.update(docker_settings)
    return parse_agent_config(
        {
            "node": "spark-1",
            "serving": {
                "enabled": True,
                "runtime": "docker",
                "docker": settings,
                "command": standin_command(8000),
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
            },
        }
    )


def test_a_ready_engine_with_the_caches_on_volumes_passes(
    dockerd: Dockerd, rank_image: str, tmp_path: Path
) -> None:
    volumes = ["/var/cache/vllm:/root/.cache/vllm", "/srv/models:/models:ro"]
    found = check_docker(_agent(tmp_path, dockerd.socket, rank_image, volumes=volumes))
    assert found.status == "ok", found
    assert "Docker Engine 20." in found.detail and "/root/.cache/vllm" in found.detail


def test_without_cache_volumes_doctor_says_what_a_restart_costs(
    dockerd: Dockerd, rank_image: str, tmp_path: Path
) -> None:
    found = check_docker(_agent(tmp_path, dockerd.socket, rank_image))
    assert found.status == "warn" and "every restart compiles again" in found.detail
    assert found.fix is not None and "volumes:" in found.fix


def test_a_missing_image_socket_or_a_restarting_container_fails_with_the_fix(
    dockerd: Dockerd, rank_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    missing = check_docker(_agent(tmp_path, dockerd.socket, "spark-watchdog-test/none:1"))
    assert missing.status == "fail" and "no such image" in missing.detail
    assert missing.fix is not None and "docker pull spark-watchdog-test/none:1" in missing.fix
    nowhere = check_docker(_agent(tmp_path, tmp_path / "none.sock", rank_image))
    assert nowhere.status == "fail" and "no such socket" in nowhere.detail
    volumes, environment = bound_code()
    # What a compose file's `restart: unless-stopped` leaves on the container.
    docker_client.api.create_container(
        rank_image,
        standin_command(8000),
        name="spark-watchdog-rank",
        environment=environment,
        host_config=docker_client.api.create_host_config(
            binds=volumes, restart_policy={"Name": "unless-stopped"}
        ),
    )
    restarting = check_docker(_agent(tmp_path, dockerd.socket, rank_image))
    assert restarting.status == "fail" and "restart policy unless-stopped" in restarting.detail
    assert restarting.fix is not None
    assert "docker update --restart no spark-watchdog-rank" in restarting.fix


def test_the_launchers_container_is_checked_by_its_own_image_and_volumes(
    dockerd: Dockerd, rank_image: str, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": {"socket": str(dockerd.socket), "name": "vllm_node"},
        "token_file": str(token),
        "log_file": str(tmp_path / "serving.log"),
    }
    config = parse_agent_config({"node": "spark-1", "serving": serving})

    before = check_docker(config)
    docker_client.containers.create(
        rank_image, ["true"], name="vllm_node", volumes=["/var/cache/vllm:/root/.cache/vllm"]
    )
    after = check_docker(config)

    assert before.status == "warn" and "nothing to re-create from" in before.detail
    assert after.status == "ok", after
    assert rank_image in after.detail and "/root/.cache/vllm" in after.detail
