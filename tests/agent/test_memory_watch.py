"""The memory guard at work, with real processes: the kill helpers on real
process groups, the launcher's immediate kill, and the real agent (its own
process) killing a rank whose host runs out of memory and reporting it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import yaml

from spark_watchdog.agent.rank_kill import kill_groups, matching_groups
from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.ports import free_port as _free_port

pytestmark = pytest.mark.integration
GIB = 1024**3

# A rank as launchers start it: a leader and a child, both deaf to SIGTERM.
STUBBORN_RANK = """
import pathlib, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
    *sys.argv[2:]])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
child.wait()
"""


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, OSError, ValueError):
            value = check()
            if value:
                return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


@pytest.fixture
def sleepers() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(marker: str, *, own_group: bool) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(600)"
        process = subprocess.Popen(
            [sys.executable, "-c", code, marker], start_new_session=own_group
        )
        started.append(process)
        return process

    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait(10)


def test_matching_groups_spare_the_callers_group_and_the_rest_are_killed(
    sleepers: Callable[..., subprocess.Popen[bytes]],
) -> None:
    marker = f"rank-{uuid.uuid4().hex}"
    rank = sleepers(marker, own_group=True)
    beside_us = sleepers(marker, own_group=False)  # in this test's own process group
    other = sleepers(f"other-{uuid.uuid4().hex}", own_group=True)
    groups = _wait_for(lambda: matching_groups(marker))
    assert groups == {rank.pid: [rank.pid]}
    sent = kill_groups(groups)
    assert sent == [{"pgid": rank.pid, "pids": [rank.pid]}]
    assert rank.wait(10) == -signal.SIGKILL
    assert beside_us.poll() is None and other.poll() is None
    # A group gone before the signal is said, not raised.
    assert kill_groups({rank.pid: [rank.pid]})[0]["error"] == "gone before the signal"
    with pytest.raises(ValueError, match="non-empty"):
        matching_groups("")


def test_kill_now_ends_the_launchers_whole_group_without_waiting(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(STUBBORN_RANK)
    pid_file = tmp_path / "child.pid"
    config = parse_agent_config(
        {
            "node": "n1",
            "serving": {
                "enabled": True,
                "command": [sys.executable, str(script), str(pid_file)],
                "token_file": str(tmp_path / "token"),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 60.0,  # a stop would wait this long: kill_now must not
            },
        }
    )
    launcher = ServingLauncher(config.serving)
    assert launcher.kill_now("memory_guard") is None  # nothing started: nothing to kill
    leader = launcher.start("plain")["pid"]
    child = int(_wait_for(lambda: pid_file.exists() and pid_file.read_text()))
    time.sleep(0.2)  # the SIGTERM handlers are set
    began = time.monotonic()
    killed = launcher.kill_now("memory_guard")
    assert time.monotonic() - began < 1.0
    assert killed is not None and killed["pgid"] == leader
    _wait_for(lambda: not _alive(leader) and not _alive(child), 10)
    status = launcher.status()
    assert status["state"] == "stopped" and status["killed_by"] == "memory_guard"
    assert status["exit_signal"] == "SIGKILL" and status["group_alive"] is False
    assert "memory_guard: SIGKILL to process group" in (tmp_path / "serving.log").read_text()
    assert launcher.kill_now("memory_guard") is None


def _meminfo(available: int) -> str:
    lines = {"MemTotal": 119 * GIB, "MemFree": GIB, "MemAvailable": available}
    return "".join(f"{key}: {value // 1024} kB\n" for key, value in lines.items())


def test_the_agent_kills_a_collapsing_rank_and_reports_why(
    tmp_path: Path, sleepers: Callable[..., subprocess.Popen[bytes]]
) -> None:
    """The real agent process: MemAvailable falls 1 GiB/s; its guard SIGKILLs
    the launcher's group and a process_match group before the floor, and
    /v1/state says what it did and why."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(str(uuid.uuid4()) + "\n")
    for name in ("uptime", "loadavg", "pressure"):
        if Path("/proc", name).exists():
            (proc / name).symlink_to(Path("/proc") / name)
    meminfo = proc / "meminfo"
    meminfo.write_text(_meminfo(40 * GIB))
    token = tmp_path / "token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    marker = f"rank-{uuid.uuid4().hex}"
    script = tmp_path / "rank.py"
    script.write_text(STUBBORN_RANK)
    port = _free_port()
    config = {
        "node": "spark-2",
        "listen": {"address": "127.0.0.1", "port": port},
        "loop_interval": 0.25,
        "probes": {
            "vllm": {"url": None, "process_match": marker},
            "gpu": {"enabled": False},
            "journal": {"enabled": False},
            "host": {"proc_root": str(proc)},
        },
        "serving": {
            "enabled": True,
            "command": [sys.executable, str(script), str(tmp_path / "child.pid"), marker],
            "token_file": str(token),
            "log_file": str(tmp_path / "serving.log"),
            "default_profile": "plain",
        },
        "memory_guard": {"slope_window": 1.5},
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(config))
    agent = subprocess.Popen(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(tmp_path / "agent.yaml")],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": "Bearer " + "t" * 32}
    stop = threading.Event()
    try:
        _wait_for(lambda: requests.get(f"{base}/v1/state", timeout=2).ok, 30)
        started = requests.post(f"{base}/v1/serving/start", json={}, headers=headers, timeout=10)
        assert started.status_code == 200, started.text
        leader = started.json()["pid"]
        child = int(_wait_for(lambda: (tmp_path / "child.pid").read_text()))
        stray = sleepers(marker, own_group=True)  # a rank this agent did not start
        state = requests.get(f"{base}/v1/state", timeout=2).json()
        assert state["memory_guard"]["state"] == "clear" and state["memory_guard"]["kills"] == 0
        assert "mem_pressure_full_avg10" in state["probes"]["host"]
        lowest = [40 * GIB]

        def collapse() -> None:
            began = time.monotonic()
            while not stop.is_set():
                level = int(max(GIB // 2, 12 * GIB - GIB * (time.monotonic() - began)))
                lowest[0] = min(lowest[0], level)
                tmp = meminfo.with_name("meminfo.tmp")
                tmp.write_text(_meminfo(level))
                os.replace(tmp, meminfo)
                if not _alive(leader):
                    break  # the rank is gone: its memory would come back
                time.sleep(0.1)

        threading.Thread(target=collapse, daemon=True).start()
        guard = _wait_for(
            lambda: requests.get(f"{base}/v1/state", timeout=2).json()["memory_guard"]["last_kill"],
            40,
        )
        assert guard["result"] == "killed" and guard["id"] == 1
        by = {k["by"]: k for k in guard["killed"]}
        assert by["launcher"]["pgid"] == leader
        assert by["process_match"]["pgid"] == stray.pid
        assert any("falling" in reason for reason in guard["reasons"])
        assert guard["readings"] and guard["readings"][-1]["mem_available_bytes"] <= 6 * GIB
        _wait_for(lambda: not _alive(leader) and not _alive(child), 10)
        assert stray.wait(10) == -signal.SIGKILL
        assert lowest[0] > GIB, "the rank outlived the floor"
        serving = requests.get(f"{base}/v1/serving", timeout=2).json()
        assert serving["killed_by"] == "memory_guard"
        # One collapse, one kill: the guard waits for the memory to come back.
        time.sleep(1.5)
        after = requests.get(f"{base}/v1/state", timeout=2).json()["memory_guard"]
        assert after["kills"] == 1 and after["state"] == "cooling_down"
    finally:
        stop.set()
        agent.terminate()
        _, err = agent.communicate(timeout=20)
    assert b"memory guard:" in err and b"SIGKILL to" in err
