"""Stacks before a stop: py-spy against real processes, bounded, without secrets,
and the launcher keeping them for the controller and the serving log."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.agent.stacks import MAX_PROCESSES, dump_stacks, find_py_spy
from spark_watchdog.config.agent import parse_agent_config

pytestmark = pytest.mark.integration

# A rank stuck in a function with a telling name. The system Python: py-spy reads
# its layout (a pyenv build with a stripped libpython it cannot).
RANK = """
import sys, time
def wait_for_the_gpu_that_never_answers():
    time.sleep(120)
wait_for_the_gpu_that_never_answers()
"""
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin")


def _needs_tools() -> tuple[str, str]:
    tool = find_py_spy()
    if tool is None or SYSTEM_PYTHON is None:
        pytest.skip("needs py-spy (pip install py-spy) and /usr/bin/python3")
    return tool, SYSTEM_PYTHON


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    _, python = _needs_tools()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    process = subprocess.Popen([python, str(script), "--api-key", "s3cret-value"])
    time.sleep(1.0)  # in the function by now
    yield process
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait(10)


def test_a_real_process_stack_is_taken_without_its_secrets(
    rank: subprocess.Popen[bytes],
) -> None:
    record = dump_stacks([rank.pid], 10.0)
    (entry,) = record["processes"]
    assert entry["pid"] == rank.pid
    assert "wait_for_the_gpu_that_never_answers" in entry["stack"], entry
    assert "s3cret-value" not in entry["stack"] and "s3cret-value" not in entry["command"]
    assert "--api-key ***" in entry["command"]
    assert record["tool"] and record["duration_s"] < 10.0
    assert rank.poll() is None  # py-spy reads it from outside; it runs on


def test_without_py_spy_or_time_the_dump_says_why() -> None:
    missing = dump_stacks([1], 5.0, find=lambda: None, run=_never)
    assert "py-spy is not installed" in missing["note"] and missing["processes"] == []
    tool = lambda: "/bin/py-spy"  # noqa: E731

    def slow(argv: list[str], timeout: float) -> Any:
        raise subprocess.TimeoutExpired(argv, timeout)

    timed_out = dump_stacks([11, 12], 1.0, find=tool, run=slow)
    errors = [p["error"] for p in timed_out["processes"]]
    assert errors[0].startswith("py-spy did not finish within")
    assert errors[1] == "skipped: the time budget is spent" or "did not finish" in errors[1]

    def refused(argv: list[str], timeout: float) -> Any:
        return subprocess.CompletedProcess(argv, 1, "", "Error: Permission denied (os error 13)\n")

    record = dump_stacks(list(range(100, 120)), 5.0, find=tool, run=refused)
    assert len(record["processes"]) == MAX_PROCESSES and "first 8 dumped" in record["note"]
    assert record["processes"][0]["error"] == "Error: Permission denied (os error 13)"


def _never(argv: list[str], timeout: float) -> Any:
    raise AssertionError("py-spy must not run without a tool")


def test_the_launcher_takes_the_stacks_before_it_stops_the_rank(tmp_path: Path) -> None:
    _, python = _needs_tools()
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    config = parse_agent_config(
        {
            "node": "n1",
            "serving": {
                "enabled": True,
                "command": [python, str(script)],
                "token_file": str(tmp_path / "token"),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 5.0,
            },
        }
    )
    launcher = ServingLauncher(config.serving)
    assert launcher.status()["stacks"] is None
    launcher.start("plain")
    time.sleep(1.0)
    stopped = launcher.stop()
    assert stopped["state"] == "stopped"
    stack = stopped["stacks"]["processes"][0]["stack"]
    assert "wait_for_the_gpu_that_never_answers" in stack
    log = (tmp_path / "serving.log").read_text()
    assert log.index("wait_for_the_gpu_that_never_answers") < log.index("stop: SIGTERM")
    off = parse_agent_config(
        {"node": "n1", "serving": {**config_dict(config), "stack_dump": False}}
    )
    quiet = ServingLauncher(off.serving)
    quiet.start("plain")
    assert quiet.stop()["stacks"] is None


def config_dict(config: Any) -> dict[str, Any]:
    serving = config.serving
    return {
        "enabled": True,
        "command": list(serving.command),
        "token_file": serving.token_file,
        "log_file": serving.log_file,
        "stop_timeout": serving.stop_timeout,
    }


def test_a_py_spy_that_floods_and_leaves_a_child_is_bounded_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A stuck or broken py-spy: its output bounded, its time bounded, and what
    it started killed with it (agent/stacks.py uses child_run)."""
    pidfile = tmp_path / "child.pid"
    tool = tmp_path / "py-spy"
    tool.write_text(f"#!/bin/sh\nsleep 600 &\necho $! > {pidfile}\nexec yes\n")
    tool.chmod(0o755)
    started = time.monotonic()
    record = dump_stacks([1], 2.0, find=lambda: str(tool))
    assert time.monotonic() - started < 2.0 + 8.0  # generous: a loaded machine
    (entry,) = record["processes"]
    assert "did not finish" in entry["error"]
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 8.0
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if stat == "Z":
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


def test_a_py_spy_that_writes_megabytes_gives_a_bounded_stack(tmp_path: Path) -> None:
    tool = tmp_path / "py-spy"
    tool.write_text("#!/bin/sh\necho 'Python v3.11'\nhead -c 20000000 /dev/zero | tr '\\0' x\n")
    tool.chmod(0o755)
    record = dump_stacks([1], 30.0, find=lambda: str(tool))
    (entry,) = record["processes"]
    assert len(entry["stack"].encode()) <= 8 * 1024 + 64, len(entry["stack"])
