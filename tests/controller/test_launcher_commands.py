"""The cluster launcher's commands on the controller's host: real processes,
their exit, their output (redacted), their environment, and a deadline that
takes the launcher and everything it started with it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from spark_watchdog.controller.serving.launcher_commands import LocalRunner


def test_a_command_runs_with_the_profile_in_its_environment_and_its_output_kept(
    tmp_path: Path,
) -> None:
    script = "import os; print('profile', os.environ['SPARK_WATCHDOG_PROFILE']); " + (
        "print('--api-key sk-live-1'); raise SystemExit(3)"
    )
    argv = [sys.executable, "-c", script]

    result = asyncio.run(
        LocalRunner(str(tmp_path)).run("start", argv, {"SPARK_WATCHDOG_PROFILE": "safe"}, 30.0)
    )

    assert result.end == "exited" and result.exit_code == 3 and not result.ok
    assert "profile safe" in result.output
    assert "sk-live-1" not in result.output and "--api-key ***" in result.output
    assert result.where == "controller" and "(exit 3)" in result.detail


def test_a_command_that_is_not_there_ran_nothing() -> None:
    result = asyncio.run(LocalRunner().run("stop", ["/nonexistent/launch-cluster.sh"], {}, 5.0))

    assert result.end == "not_found" and result.nothing_ran
    assert "nothing ran" in result.detail and "/nonexistent/launch-cluster.sh" in result.detail


def test_a_command_past_its_deadline_is_killed_with_everything_it_started(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        print("started the cluster's containers", flush=True)
        time.sleep(300)
        """
    )
    started = time.monotonic()

    # Long enough for two Python starts on a loaded 2-core machine (the Python 3.13
    # guest runs this file at nice 5 beside the rest of the suite).
    result = asyncio.run(LocalRunner().run("start", [sys.executable, "-c", script], {}, 10.0))

    assert time.monotonic() - started < 60
    assert result.end == "timed_out" and not result.ok and not result.nothing_ran
    assert "may have done part of its work" in result.detail
    assert "started the cluster's containers" in result.output
    for pid in map(int, pids.read_text().split()):
        assert _gone_within(pid, 30.0), pid


def _gone_within(pid: int, timeout: float) -> bool:
    """Dead within ``timeout``: no such process, or a zombie its new parent has not
    reaped yet. A SIGKILLed process still has to be scheduled to die: on a loaded
    machine (the Python 3.13 guest runs at nice 5) that is not at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def test_a_launcher_that_leaves_a_process_holding_its_output_ends_at_its_exit(
    tmp_path: Path,
) -> None:
    pid_file = tmp_path / "background"
    # A launcher that starts something in the background without redirecting it
    # (`nohup ... &`): the pipe stays open after the launcher itself has exited.
    script = f"echo started the head; sleep 120 & echo $! > {pid_file}; echo done"
    started = time.monotonic()
    try:
        result = asyncio.run(LocalRunner().run("start", ["sh", "-c", script], {}, 60.0))
        background_alive = psutil.pid_exists(int(pid_file.read_text()))
    finally:
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    # Its end is its exit: not held until the background process lets go of the
    # output (nor killed with it at the deadline).
    assert result.ok and result.end == "exited", result
    assert time.monotonic() - started < 50
    assert result.output == "started the head\ndone", result.output
    assert background_alive  # left running, as launched


def test_a_long_output_keeps_its_tail() -> None:
    script = "for i in range(20000): print('line', i)"

    result = asyncio.run(LocalRunner().run("start", [sys.executable, "-c", script], {}, 30.0))

    assert result.ok and result.output.endswith("line 19999")
    assert len(result.output) <= 4001


def test_what_systemd_gave_the_controller_alone_is_not_handed_to_the_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    given = {
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "30000000",
        "CREDENTIALS_DIRECTORY": "/run/credentials/spark-watchdog-controller.service",
        "OPERATOR_PATH_SETTING": "kept",
    }
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    script = f"import os; print(sorted(k for k in os.environ if k in {sorted(given)!r}))"

    result = asyncio.run(LocalRunner().run("start", [sys.executable, "-c", script], {}, 30.0))

    assert result.output == "['OPERATOR_PATH_SETTING']"
