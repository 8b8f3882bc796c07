"""The agent's log of live GPU faults (agent/gpu_faults.py): a fault that ends the
rank's CUDA context stops the rank once, any other is evidence only."""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.gpu_faults import FAULTS_KEPT, GpuFaultLog
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.xid_events import XidEvent, XidReport
from spark_watchdog.sdnotify import SystemdNotifier


def report(*xids: int, watcher: str = "on", dropped: int = 0) -> XidReport:
    events = tuple(XidEvent(x, 0, 100.0 + i) for i, x in enumerate(xids))
    return XidReport(watcher, None, events, dropped)


def test_a_context_ending_fault_stops_the_rank_once_per_read_and_others_are_evidence() -> None:
    stops: list[str] = []

    async def stop_rank() -> str:
        stops.append("stop")
        return "stopped"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(79, 31, 43)))
    faults = log.to_json()["faults"]
    assert [(f["id"], f["xid"], f["result"]) for f in faults] == [
        (1, 79, "evidence"),
        (2, 31, "stopped"),
        (3, 43, "stopped"),
    ]
    assert stops == ["stop"]  # one rank, one stop
    assert faults[1]["what"] == "Xid 31 (GPU memory page fault (MMU fault))"
    asyncio.run(log.take(None))  # a reading without a watcher changes nothing
    assert log.to_json()["watcher"] == "on" and len(log.to_json()["faults"]) == 3


def test_a_stop_that_fails_is_said_and_a_refused_watcher_is_reported() -> None:
    async def stop_rank() -> str:
        return "stop_failed"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(31)))
    assert log.to_json()["faults"][0]["result"] == "stop_failed"
    asyncio.run(log.take(XidReport("refused", "GPU 0: Not Supported")))
    assert log.to_json()["watcher"] == "refused"
    assert log.to_json()["detail"] == "GPU 0: Not Supported"


def test_a_flood_is_bounded_and_counted() -> None:
    async def stop_rank() -> str:
        return "no_rank"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(*([79] * (FAULTS_KEPT + 5)), dropped=7)))
    body = log.to_json()
    assert len(body["faults"]) == FAULTS_KEPT and body["dropped"] == 12
    assert body["faults"][-1]["id"] == FAULTS_KEPT + 5


# -- the real agent, its real NVML worker and the lab's NVML stand-in ---------


def _wait(check: Any, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.2)


@pytest.mark.integration
def test_a_live_xid_31_stops_the_agent_s_rank_and_an_unnamed_xid_is_evidence(
    tmp_path: Path,
) -> None:
    nvml = tmp_path / "nvml"
    nvml.mkdir()
    shutil.copyfile(gpu_standin.__file__, nvml / "pynvml.py")
    gpu_standin.write_mode(tmp_path, "ok")
    worker = [
        sys.executable,
        "-c",
        f"import os, runpy, sys; os.environ['SPARK_WATCHDOG_NODE_DIR'] = {str(tmp_path)!r}; "
        f"sys.path.insert(0, {str(nvml)!r}); "
        "runpy.run_module('spark_watchdog.probes.gpu_worker', run_name='__main__')",
    ]
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    port = free_port()
    config = parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "loop_interval": 0.5,
            "probes": {
                "vllm": {"enabled": False},
                "journal": {"enabled": False},
                "gpu": {"interval": 0.3, "deadline": 10.0},
            },
            "serving": {
                "enabled": True,
                "command": [sys.executable, "-c", "import time; time.sleep(600)"],
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 5.0,
            },
        }
    )
    agent = Agent(config, notifier=SystemdNotifier({}), gpu_worker_argv=worker)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(agent.run(stop)), daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"

    def state() -> dict[str, Any]:
        return dict(requests.get(f"{base}/v1/state", timeout=5).json())

    try:
        _wait(lambda: agent.ready.is_set())
        started = requests.post(
            f"{base}/v1/serving/start",
            json={"profile": "plain"},
            headers={"Authorization": "Bearer t0ken"},
            timeout=15,
        )
        assert started.status_code == 200, started.text
        _wait(lambda: state().get("gpu_faults", {}).get("watcher") == "on")
        gpu_standin.inject_xid(tmp_path, 79)
        (other,) = _wait(lambda: state()["gpu_faults"]["faults"])
        assert other["xid"] == 79 and other["result"] == "evidence"
        assert state()["serving"]["state"] == "running"
        gpu_standin.inject_xid(tmp_path, 31)
        faults = _wait(
            lambda: len(state()["gpu_faults"]["faults"]) == 2 and state()["gpu_faults"]["faults"]
        )
        assert faults[1]["xid"] == 31 and faults[1]["result"] == "stopped"
        assert faults[1]["what"] == "Xid 31 (GPU memory page fault (MMU fault))"
        assert state()["serving"]["state"] == "stopped"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
