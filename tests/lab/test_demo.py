"""The lab's commands as a user runs them: `lab demo`, `lab run --json`,
`lab up` with `lab inject`, and Ctrl-C / SIGTERM in the middle of a run.
Each runs as a subprocess; afterwards no process of its lab may be left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "spark_watchdog"]


def _mentioning(path: Path) -> list[psutil.Process]:
    """Live processes whose command line or environment names ``path``: every
    process of a lab in that directory does (node dirs, configs, NODE_DIR)."""
    needle = str(path)
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == os.getpid() or process.status() == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(process.cmdline()) + " ".join(process.environ().values())
        except psutil.Error:
            continue
        if needle in text:
            found.append(process)
    return found


def _assert_nothing_left(path: Path) -> None:
    deadline = time.monotonic() + 5
    while _mentioning(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(p.pid, p.cmdline()[:4]) for p in _mentioning(path)]
    assert left == [], f"processes left behind: {left}"


class Running:
    """A CLI subprocess whose output is read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CLI, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.search(pattern, self.output):
                return
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} in the output:\n{self.output[-3000:]}")

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code


def test_demo_tells_the_story_and_leaves_its_history(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    demo = Running(["lab", "demo", "--dir", str(workdir)])
    code = demo.finish(timeout=120)
    out = demo.output
    assert code == 0, out[-3000:]
    for expected in (
        r"FAULT freeze: spark-3 froze",
        r"spark-3 host_frozen \(agent silent [\d.]+s, no ssh banner x2\): incident #1 opened",
        r"PDU outlet 3 off \(verified [\d.]+s\)",
        r"PDU outlet 3 on \(verified [\d.]+s\)",
        r"spark-3 booted: new boot id",
        r"serving restarted with profile safe \(adaptive verification off",
        r"incident #1 recovered: detected in [\d.]+s, recovered in [\d.]+s",
    ):
        assert re.search(expected, out), (expected, out[-3000:])
    match = re.search(r"^history database: (\S+)$", out, re.MULTILINE)
    assert match, out[-2000:]
    history = match.group(1)
    assert history == str((workdir / "history.db").resolve())
    show = subprocess.run(
        [*CLI, "show", "1", "--db", history], capture_output=True, text=True, timeout=60
    )
    assert show.returncode == 0, show.stderr
    assert "incident #1: host_frozen on spark-3" in show.stdout
    assert "status    recovered" in show.stdout
    assert "cycle spark-3 via snmp" in show.stdout
    listed = subprocess.run(
        [*CLI, "history", "--db", history, "--json"], capture_output=True, text=True, timeout=60
    )
    assert [i["resolution"] for i in json.loads(listed.stdout)["incidents"]] == ["recovered"]
    _assert_nothing_left(workdir)


def test_run_json_prints_the_contract_and_exits_0(tmp_path: Path) -> None:
    workdir = tmp_path / "crash"
    done = subprocess.run(
        [*CLI, "lab", "run", "--scenario", "crash", "--json", "--dir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["scenario"] == "crash" and report["outcome"] == "recovered"
    assert report["power_actions"] == 0 and report["false_power_actions"] == 0
    assert report["serving_restarts"] == 1 and report["incident_ids"] == [1]
    assert report["detected_after_s"] is not None and report["recovered_after_s"] is not None
    # The live timeline went to stderr, the JSON alone to stdout.
    assert "serving restarted with profile safe" in done.stderr
    _assert_nothing_left(workdir)


def test_run_usage_errors() -> None:
    too_few = subprocess.run(
        [*CLI, "lab", "run", "--scenario", "double-freeze", "--nodes", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert too_few.returncode == 2 and "at least 4 nodes" in too_few.stderr
    unknown = subprocess.run(
        [*CLI, "lab", "run", "--scenario", "meteor"], capture_output=True, text=True, timeout=60
    )
    assert unknown.returncode == 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_no_process(tmp_path: Path, sig: signal.Signals) -> None:
    workdir = tmp_path / "interrupted"
    run = Running(["lab", "run", "--scenario", "freeze", "--dir", str(workdir)])
    run.wait_for(r"FAULT freeze", timeout=150)  # a loaded CI machine starts 4 nodes slowly
    assert _mentioning(workdir), "the lab should be running now"
    run.process.send_signal(sig)
    time.sleep(0.3)
    run.process.send_signal(sig)  # impatient: the second one must not cut the clean-up
    assert run.finish(timeout=60) == 130
    _assert_nothing_left(workdir)


def test_lab_up_takes_injected_faults_until_ctrl_c(tmp_path: Path) -> None:
    workdir = tmp_path / "up"
    # The pointer file goes to XDG_RUNTIME_DIR: keep this test's apart.
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}
    up = Running(["lab", "up", "--nodes", "2", "--dir", str(workdir)], env=env)
    up.wait_for(r"lab up: running until Ctrl-C", timeout=60)
    assert "history     " + str(workdir / "history.db") in up.output
    pointer = tmp_path / "spark-watchdog-lab.json"
    assert pointer.stat().st_mode & 0o777 == 0o600

    def inject(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "lab", "inject", *args], capture_output=True, text=True, env=env, timeout=60
        )

    crash = inject("crash")
    assert crash.returncode == 0, crash.stderr
    assert "injected crash" in crash.stdout
    up.wait_for(r"incident #1 recovered", timeout=60)
    wrong = inject("freeze", "spark-9")
    assert wrong.returncode == 1 and "no node 'spark-9'" in wrong.stderr
    up.process.send_signal(signal.SIGINT)
    assert up.finish(timeout=60) == 0
    assert "no process left" in up.output
    assert not pointer.exists()
    _assert_nothing_left(workdir)
    # With no lab running, inject says so.
    gone = inject("freeze", "spark-1")
    assert gone.returncode == 1 and "no running lab" in gone.stderr
