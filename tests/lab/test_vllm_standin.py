"""The vLLM stand-in as a separate process, the way the lab and the launcher run it."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import requests

from spark_watchdog.lab.hardware.vllm_standin import (
    VllmStandin,
    build_parser,
    effective_cudagraph_mode,
)
from spark_watchdog.probes.vllm import VllmScraper

DSPARK_ADAPTIVE = json.dumps(
    {"method": "dspark", "num_speculative_tokens": 3, "enable_adaptive_verification": True}
)
DECODE_ONLY = json.dumps({"cudagraph_mode": "FULL_DECODE_ONLY"})


class StandinProcess:
    """A running ``python -m spark_watchdog.lab.hardware vllm``; its stdout lines."""

    def __init__(self, *argv: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spark_watchdog.lab.hardware", "vllm", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, fragment: str, timeout: float = 60.0) -> str:  # a loaded machine
        seen: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line with {fragment!r}; saw {seen}") from None
            seen.append(line)
            if fragment in line:
                return line

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture
def launched() -> Iterator[list[StandinProcess]]:
    started: list[StandinProcess] = []
    yield started
    for each in started:
        if each.process.poll() is None:
            each.process.kill()
            each.process.wait()


def parsed(*argv: str) -> str:
    args, _extra = build_parser().parse_known_args(list(argv))
    return effective_cudagraph_mode(args)


def test_effective_cudagraph_mode_follows_the_compilation_config() -> None:
    assert parsed() == "FULL_AND_PIECEWISE"
    assert parsed("--compilation-config", DECODE_ONLY) == "FULL_DECODE_ONLY"
    assert (
        parsed("--compilation-config", DECODE_ONLY, "--speculative-config", DSPARK_ADAPTIVE)
        == "FULL_DECODE_ONLY"
    )


def test_legacy_build_forces_full_and_piecewise_under_adaptive_verification() -> None:
    # vllm #56626: without PR #55095 the asked-for mode is silently overridden.
    argv = ["--compilation-config", DECODE_ONLY, "--legacy-adaptive-verification"]
    assert parsed(*argv) == "FULL_DECODE_ONLY"
    assert parsed(*argv, "--speculative-config", DSPARK_ADAPTIVE) == "FULL_AND_PIECEWISE"


def test_set_mode_rejects_what_it_cannot_do() -> None:
    standin = VllmStandin(engines=2)
    try:
        with pytest.raises(ValueError, match="expected one of"):
            standin.set_mode("melted")
        with pytest.raises(ValueError, match="whole server"):
            standin.set_mode("dead", engine=0)
        with pytest.raises(ValueError, match=r"engine: expected 0\.\.1"):
            standin.set_mode("wedged", engine=2)
        standin.set_mode("wedged", engine=1)
        assert standin.mode == "mixed"
    finally:
        standin.stop()


@pytest.mark.integration
def test_process_prints_its_config_and_serves(launched: list[StandinProcess]) -> None:
    standin = StandinProcess(
        "--port",
        "0",
        "--model",
        "ds-v4",
        "--speculative-config",
        DSPARK_ADAPTIVE,
        "--compilation-config",
        DECODE_ONLY,
        "--tensor-parallel-size",
        "4",
        "--nnodes",
        "4",
    )
    launched.append(standin)

    config = standin.wait_for("Initializing a V1 LLM engine")
    assert "model='ds-v4'" in config
    assert "'enable_adaptive_verification': True" in config
    assert "'cudagraph_mode': <CUDAGraphMode.FULL_DECODE_ONLY: (2, 0)>" in config
    assert "'--tensor-parallel-size', '4'" in config  # unknown vLLM flags are echoed
    url = standin.wait_for("Uvicorn running on").split()[4]

    sample = VllmScraper(url, 2.0, 8 * 1024 * 1024).scrape()
    assert sample.reachable, sample.error
    assert sample.models == ("ds-v4",)
    assert standin.stop() == 0


@pytest.mark.integration
def test_legacy_build_shows_the_forced_mode(launched: list[StandinProcess]) -> None:
    standin = StandinProcess(
        "--port",
        "0",
        "--speculative-config",
        DSPARK_ADAPTIVE,
        "--compilation-config",
        DECODE_ONLY,
        "--legacy-adaptive-verification",
    )
    launched.append(standin)

    config = standin.wait_for("Initializing a V1 LLM engine")
    assert "CUDAGraphMode.FULL_AND_PIECEWISE" in config
    assert standin.stop() == 0


@pytest.mark.integration
def test_headless_rank_serves_nothing_and_stops_on_sigterm(
    launched: list[StandinProcess],
) -> None:
    standin = StandinProcess("--headless", "--node-rank", "1")
    launched.append(standin)

    standin.wait_for("headless rank")
    assert standin.stop() == 0
    remaining = []
    while not standin.lines.empty():
        remaining.append(standin.lines.get())
    assert not any("Uvicorn" in line for line in remaining)


@pytest.mark.integration
def test_bad_json_config_is_a_usage_error() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_watchdog.lab.hardware",
            "vllm",
            "--compilation-config",
            "{cudagraph_mode: FULL}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert done.returncode == 2
    assert "--compilation-config" in done.stderr
    assert "expected a JSON object" in done.stderr


def test_engine_death_exits_the_process_with_code_0_like_real_vllm(
    launched: list[StandinProcess],
) -> None:
    standin = StandinProcess("--port", "0")
    launched.append(standin)
    url = standin.wait_for("Uvicorn running on").split()[4]
    answer = requests.post(f"{url}/_standin/mode", json={"mode": "exit"}, timeout=10)
    assert answer.status_code == 200 and answer.json()["mode"] == "dead"
    assert standin.process.wait(timeout=30) == 0
    after = VllmScraper(url, 2.0, 1024 * 1024).scrape()
    assert after.refused and after.error is not None
    assert after.error.startswith("GET /health: connection refused by")


def test_a_hung_engine_queues_new_requests_as_waiting_with_none_running() -> None:
    with VllmStandin(mode="idle", step_rate=50.0) as standin:
        standin.set_mode("hung")
        before = standin.engine_steps()
        asking = threading.Thread(
            target=lambda: requests.post(
                f"{standin.url}/v1/completions",
                json={"model": standin.model, "prompt": "ping", "max_tokens": 1},
                timeout=30,
            ),
            daemon=True,
        )
        asking.start()
        sample = VllmScraper(standin.url, 2.0, 1024 * 1024).scrape()
        for _ in range(50):
            sample = VllmScraper(standin.url, 2.0, 1024 * 1024).scrape()
            if sample.engines["0"].waiting == 1:
                break
            time.sleep(0.1)
        assert sample.health_status == 200
        assert (sample.engines["0"].running, sample.engines["0"].waiting) == (0, 1)
        assert standin.engine_steps() == before
        standin.set_mode("progressing")  # the queued request is served, and leaves the queue
        asking.join(30)
        assert not asking.is_alive()
        assert standin.snapshot()["completions"] == 1
