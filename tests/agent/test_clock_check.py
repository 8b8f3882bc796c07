"""The post-boot clock-latch check: judged on busy readings only, once per agent start.

The rules on readings made here, then the real agent with its real NVML
worker process reading the lab's NVML stand-in in its latched and normal
modes, through ``/v1/state`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.agent.clock_check import ClockCheck, ClockPolicy
from spark_watchdog.agent.daemon import Agent
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.ports import free_port as _free_port
from spark_watchdog.probes.gpu import GpuDevice, GpuReading
from spark_watchdog.sdnotify import SystemdNotifier

POLICY = ClockPolicy(floor_mhz=1400, busy_util_pct=60, busy_samples=3, window_s=100.0)


def reading(util: int | None, clock: int | None, state: str = "ok") -> GpuReading:
    device = GpuDevice(0, "NVIDIA GB10", utilization_gpu_pct=util, sm_clock_mhz=clock)
    return GpuReading(state, (device,))  # type: ignore[arg-type]


def test_busy_readings_all_below_the_floor_are_a_latch() -> None:
    check = ClockCheck(POLICY, started=0.0)
    assert [check.observe(reading(95, 702), t) for t in (1, 2)] == ["pending", "pending"]
    assert check.observe(reading(97, 705), 3) == "latched"
    assert check.to_json()["max_busy_sm_clock_mhz"] == 705
    assert check.to_json()["busy_readings"] == 3
    # Judged once: a later full clock does not undo it on this boot.
    assert check.observe(reading(99, 2418), 4) == "latched"


def test_one_busy_reading_at_full_clock_clears_the_boot() -> None:
    check = ClockCheck(POLICY, started=0.0)
    check.observe(reading(95, 702), 1)
    assert check.observe(reading(90, 2418), 2) == "ok"
    assert check.to_json()["decided_after_s"] == 2.0


def test_an_idle_gpu_at_low_clocks_proves_nothing() -> None:
    check = ClockCheck(POLICY, started=0.0)
    for t in range(1, 50):
        assert check.observe(reading(3, 300), t) == "pending"
    # Readings without a clock or utilization, or failed reads, count for nothing either.
    check.observe(reading(None, 702), 50)
    check.observe(reading(95, None), 51)
    check.observe(GpuReading("timeout"), 52)
    assert check.busy == 0
    assert check.observe(reading(5, 300), 100) == "no_load"


def test_the_floor_itself_is_not_a_latch() -> None:
    check = ClockCheck(POLICY, started=0.0)
    assert check.observe(reading(95, 1400), 1) == "ok"


# -- the real agent and its NVML worker ----------------------------------------


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def _run_agent(root: Path, mode: str) -> tuple[dict[str, Any], str]:
    nvml = root / "nvml"
    nvml.mkdir(parents=True)
    shutil.copyfile(gpu_standin.__file__, nvml / "pynvml.py")
    gpu_standin.write_mode(root, mode)
    worker = [
        sys.executable,
        "-c",
        f"import os, runpy, sys; os.environ['SPARK_WATCHDOG_NODE_DIR'] = {str(root)!r}; "
        f"sys.path.insert(0, {str(nvml)!r}); "
        "runpy.run_module('spark_watchdog.probes.gpu_worker', run_name='__main__')",
    ]
    port = _free_port()
    config = parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "loop_interval": 0.5,
            "probes": {
                "vllm": {"enabled": False},
                "journal": {"enabled": False},
                "gpu": {"interval": 0.2, "deadline": 10.0},
            },
            "gpu_clock_check": {"busy_samples": 3},
        }
    )
    agent = Agent(config, notifier=SystemdNotifier({}), gpu_worker_argv=worker)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(agent.run(stop)))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                state = json.loads(_get(f"http://127.0.0.1:{port}/v1/state"))
            except OSError:
                state = {}
            check = state.get("gpu_clock_check", {})
            if check.get("state") not in (None, "pending"):
                break
            assert time.monotonic() < deadline, f"no judgement in time: {check}"
            time.sleep(0.2)
        metrics = _get(f"http://127.0.0.1:{port}/metrics").decode()
        return state, metrics
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


@pytest.mark.integration
def test_the_agent_reports_a_latched_gpu_from_its_real_nvml_worker(tmp_path: Path) -> None:
    state, metrics = _run_agent(tmp_path, "latched")
    check = state["gpu_clock_check"]
    assert check["state"] == "latched"
    assert check["max_busy_sm_clock_mhz"] == gpu_standin.LATCHED_SM_CLOCK_MHZ
    assert check["busy_readings"] >= 3
    assert 'spark_watchdog_gpu_clock_latched{node="spark-1"} 1.0' in metrics


@pytest.mark.integration
def test_the_agent_clears_a_gpu_that_reaches_its_clock(tmp_path: Path) -> None:
    state, metrics = _run_agent(tmp_path, "ok")
    assert state["gpu_clock_check"]["state"] == "ok"
    assert 'spark_watchdog_gpu_clock_latched{node="spark-1"} 0.0' in metrics
