"""The real-vLLM environment for the tiers that run the real server (tests/real_vllm,
and tests/docker's real server in a container)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.lab.hardware import real_vllm

ROOT = Path(__file__).resolve().parents[2]


def built_python() -> Path | None:
    """scripts/real_vllm_env.py's venv python, if it is built."""
    spec = importlib.util.spec_from_file_location(
        "real_vllm_env", ROOT / "scripts/real_vllm_env.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: Path | None = module.built_python()
    return found


def vllm_python_or_skip() -> Path:
    """The real vLLM's python; the tier is skipped without it (failed where
    ``SPARK_WATCHDOG_REQUIRE_REAL_VLLM=1``, as scripts/test.sh sets once it built it)."""
    if os.environ.get("SPARK_WATCHDOG_REAL_VLLM") == "0":
        pytest.skip("SPARK_WATCHDOG_REAL_VLLM=0: the real-vLLM tier is off")
    explicit = os.environ.get(real_vllm.PYTHON_VARIABLE)
    python = Path(explicit) if explicit else built_python()
    if python is None or not python.is_file():
        message = (
            "the real-vLLM environment is not built; run `python3 scripts/real_vllm_env.py "
            f"build` (scripts/test.sh does) or set {real_vllm.PYTHON_VARIABLE}"
        )
        if os.environ.get("SPARK_WATCHDOG_REQUIRE_REAL_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


def wait_serving(launcher: ServingLauncher, url: str, timeout: float) -> dict[str, Any]:
    """Until /health says 200 and the launcher has read the engine's config line;
    the test fails with the log's tail if the rank ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = launcher.status()
        if status["state"] != "running":
            log = Path(status["log_file"]).read_text(errors="replace")[-3000:]
            pytest.fail(f"the rank is {status['state']} (exit {status['exit_code']}):\n{log}")
        with contextlib.suppress(requests.RequestException):
            healthy = requests.get(f"{url}/health", timeout=2).status_code == 200
            if healthy and status["effective"]["cudagraph_mode"] is not None:
                return status
        time.sleep(0.2)  # often: every second seen late is a second the test waits
    pytest.fail(f"not serving after {timeout:.0f} s: {launcher.status()}")
