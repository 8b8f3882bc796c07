"""What a launch hands on to Docker is checked at load, naming the key
(docs/serving.md, "Checked at load"): Docker's size and image grammar and a
container user."""

from __future__ import annotations

from typing import Any

import pytest

from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.launch_values import SHM_SIZE_MAX, SHM_SIZE_MIN, size_bytes
from spark_watchdog.errors import ConfigError

GIB = 1024**3


def _docker(docker: dict[str, Any] | None = None, **serving: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "enabled": True,
        "runtime": "docker",
        "docker": {"image": "nvcr.io/nvidia/vllm:25.11-py3", **(docker or {})},
        "command": ["vllm", "serve", "m"],
        "token_file": "/etc/spark-watchdog/serving-token",
    }
    base.update(serving)
    return {"node": "spark-1", "serving": base}


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(data)
    return caught.value.problems


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16g", 16 * GIB),
        ("16G", 16 * GIB),
        ("16gb", 16 * GIB),
        ("16GiB", 16 * GIB),
        ("1.5g", GIB + GIB // 2),
        ("512m", 512 * 1024**2),
        ("1 t", 1024 * GIB),
        (str(1024**2), 1024**2),
    ],
)
def test_a_shm_size_is_read_with_dockers_grammar(text: str, size: int) -> None:
    config = parse_agent_config(_docker({"shm_size": text}))
    assert config.serving.docker.shm_size_bytes == size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lots", "expected a size as Docker reads it"),
        ("16 gigs", "expected a size as Docker reads it"),
        ("-1g", "expected a size as Docker reads it"),
        ("1e3g", "expected a size as Docker reads it"),
        ("16x", "expected a size as Docker reads it"),
        ("1024", "expected a size from 1m to 1t"),
        ("2t", "expected a size from 1m to 1t"),
        ("9" * 40 + "t", "expected a size as Docker reads it"),
    ],
)
def test_a_shm_size_docker_would_refuse_later_is_refused_naming_the_key(
    text: str, expected: str
) -> None:
    problems = _problems(_docker({"shm_size": text}))
    assert problems[0].startswith(f"serving.docker.shm_size: {expected}"), problems


def test_the_size_bounds_are_the_documented_ones() -> None:
    assert size_bytes("k", "1m", SHM_SIZE_MIN, SHM_SIZE_MAX) == SHM_SIZE_MIN
    assert size_bytes("k", "1t", SHM_SIZE_MIN, SHM_SIZE_MAX) == SHM_SIZE_MAX


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai:latest",
        "nvcr.io/nvidia/vllm:25.11-py3",
        "localhost:5000/team/vllm_server__x:v1.2",
        "[fe80::1]:5000/vllm",
        "vllm@sha256:" + "a" * 64,
        "spark-watchdog-lab/rank:1c3e452a6a4c",
    ],
)
def test_image_references_docker_takes_load(image: str) -> None:
    assert parse_agent_config(_docker({"image": image})).serving.docker.image == image


@pytest.mark.parametrize(
    "image",
    ["VLLM/Server:1", "vllm server", "vllm:", "vllm:tag:more", ":latest", "a//b", "v\x1b[2J"],
)
def test_an_image_reference_docker_would_refuse_is_refused_naming_the_key(image: str) -> None:
    problems = _problems(_docker({"image": image}))
    assert problems[0].startswith("serving.docker.image: expected an image reference"), problems
    assert "\x1b" not in problems[0]


def test_a_container_user_is_docker_users_grammar() -> None:
    for user in ("vllm", "1000", "1000:1000", "vllm:video"):
        assert parse_agent_config(_docker({"user": user})).serving.docker.user == user
    for user in ("root; rm -rf /", "a:b:c", "-u"):
        problems = _problems(_docker({"user": user}))
        assert problems[0].startswith("serving.docker.user: expected a user"), problems
