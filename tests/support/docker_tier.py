"""Helpers of the Docker tier (tests/docker): a dockerd of the tests' own, and
what gives a container this checkout's code (the lab's vLLM stand-in)."""

from __future__ import annotations

import contextlib
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import requests

from spark_watchdog.lab.hardware.dockerd import Dockerd

__all__ = ["ROOT", "SITE_PACKAGES", "Dockerd", "bound_code", "standin_command", "wait_for"]

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


def wait_for(check: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``check`` (an agent not answering yet counts as not yet) until true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException):
            if check():
                return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
