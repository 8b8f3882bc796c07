"""The real vLLM as the rank's container: its EngineCore SIGKILLed is seen
dead, and the safe-profile restart is confirmed from the engine's own startup
line, read from the container's logs.

The real server runs from the real-vLLM tier's venv and its Python, bound in
read-only at the paths they have here, on the tier's image (Debian 12 with
libnuma, which the CPU build links). One vLLM at a time: the test runs in the
real-vLLM tier's group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from docker_tier import Dockerd
from real_vllm_tier import vllm_python_or_skip, wait_serving

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware import real_vllm
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.vllm import ProgressTracker, VllmScraper

pytestmark = [pytest.mark.real_vllm, pytest.mark.xdist_group("real-vllm")]

START_TIMEOUT = 420.0


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return vllm_python_or_skip()


@pytest.fixture(scope="module")
def tiny_model(vllm_python: Path) -> Path:
    return real_vllm.tiny_model(vllm_python)


def _bound(path: Path) -> str:
    return f"{path}:{path}:ro"


@pytest.fixture
def launcher(
    dockerd: Dockerd, rank_image: str, vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> Iterator[tuple[ServingLauncher, str]]:
    port = free_port()
    venv = vllm_python.parent.parent.resolve()
    # The venv's interpreter is a link to the Python it was made from (pyvenv.cfg's home).
    base = Path(os.path.realpath(vllm_python)).parent.parent
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    config = parse_agent_config(
        {
            "node": "spark-1",
            "serving": {
                "enabled": True,
                "runtime": "docker",
                "docker": {
                    "image": rank_image,
                    "socket": str(dockerd.socket),
                    "gpus": "none",
                    "volumes": [_bound(venv), _bound(base), _bound(tiny_model.resolve())],
                },
                # The lab head's command: --compilation-config as operators write it.
                "command": real_vllm.RealHead(
                    venv / "bin" / "python", tiny_model.resolve()
                ).command("127.0.0.1", port),
                "environment": real_vllm.server_environment(base={}),
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 20.0,
            },
        }
    )
    made = ServingLauncher(config.serving, node="spark-1")
    try:
        yield made, f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            made.stop()
        made.close()


def _engine_core(launcher: ServingLauncher) -> psutil.Process:
    """The container's VLLM::EngineCore, as this host numbers it."""
    status = launcher.status()
    assert status["pid"] is not None
    for process in psutil.Process(status["pid"]).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(process.cmdline()) or process.name()
            if title.startswith(real_vllm.ENGINE_NAME):
                return process
    pytest.fail("no VLLM::EngineCore in the rank's container")


def test_a_real_engine_killed_in_its_container_is_seen_dead_and_comes_back_safe(
    launcher: tuple[ServingLauncher, str],
) -> None:
    serving, url = launcher
    assert serving.start("plain")["container"]["status"] in ("created", "running")
    plain = wait_serving(serving, url, START_TIMEOUT)
    # Read from the real "Initializing a V1 LLM engine ... with config:" line, via docker logs.
    assert plain["effective"]["cudagraph_mode"] == "NONE"
    assert plain["requested"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"

    scraper = VllmScraper(url, 2.0, 8 * 1024 * 1024)
    tracker = ProgressTracker(15.0, dead_after=0.0)
    sample = scraper.scrape()
    assert tracker.update(sample, sample.observed_at).state in ("progressing", "idle")

    # The fault's shape on a Spark: the engine dies, the API server follows.
    _engine_core(serving).send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 60.0
    verdict = None
    while time.monotonic() < deadline:
        sample = scraper.scrape()
        verdict = tracker.update(sample, sample.observed_at).state
        if verdict == "dead" and serving.status()["state"] == "exited":
            break
        time.sleep(0.5)
    after = serving.status()
    assert verdict == "dead", verdict
    assert after["state"] == "exited" and after["container"]["status"] == "exited", after
    # vLLM exits 0 after its engine died: the exit code is no health signal.
    print(f"container exit after the EngineCore's SIGKILL: {after['exit_code']}", file=sys.stderr)

    safe = serving.start("safe")
    assert safe["container"]["id"] != plain["container"]["id"]
    safe = wait_serving(serving, url, START_TIMEOUT)
    assert safe["requested"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    # The CPU build captures no graphs whatever is asked: as safe, never "confirmed".
    assert safe["effective"]["cudagraph_mode"] == "NONE"
    assert safe["effective_safe"] is True and safe["effective_matches_profile"] is False
    answer = requests.post(
        f"{url}/v1/completions",
        json={"model": real_vllm.SERVED_MODEL, "prompt": "The watchdog", "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
