"""Helpers of the Docker tier (tests/docker): a dockerd of the tests' own, and
what gives a container this checkout's code (the lab's vLLM stand-in)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from spark_watchdog.lab.hardware.dockerd import Dockerd

__all__ = ["ROOT", "SITE_PACKAGES", "Dockerd", "bound_code", "standin_command"]

ROOT = Path(__file__).resolve().parents[2]
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])


def standin_command(port: int, *extra: str) -> list[str]:
    """The lab's vLLM stand-in, run by the image's python3 (the argv inside the container)."""
    return [
        "python3",
        "-m",
        "spark_watchdog.lab.hardware",
        "vllm",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *extra,
    ]


def bound_code() -> tuple[list[str], dict[str, str]]:
    """The volumes and environment that give the container this checkout and its dependencies."""
    volumes = [f"{ROOT}:{ROOT}:ro", f"{SITE_PACKAGES}:{SITE_PACKAGES}:ro"]
    return volumes, {"PYTHONPATH": f"{SITE_PACKAGES}:{ROOT}", "PYTHONDONTWRITEBYTECODE": "1"}
