"""An orderly stop, as the controller sees it: ``stopping`` in /v1/state, the
shutdown linger, and the systemd query behind ``stopping.system``.

The process tests run the real agent (``serve``, its signal handlers, HTTP, a
notify socket) in a child process with the systemd query replaced by a fixed
answer. Deadlines are generous: these must pass on a loaded 2-core machine.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.shutdown import system_shutting_down
from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.lab.ports import free_port as _free_port
from spark_watchdog.sdnotify import SystemdNotifier

REPO = Path(__file__).resolve().parents[2]

# The agent's own entry point (serve), with the systemd query replaced by argv[2].
LAUNCHER = """
import asyncio, logging, sys
from spark_watchdog import logs
from spark_watchdog.agent.daemon import serve
from spark_watchdog.config.agent import load_agent_config

answer = sys.argv[2] == "system"
logs.configure(logging.INFO, to_journal=False)
asyncio.run(serve(load_agent_config(sys.argv[1]), system_stopping=lambda: answer))
"""


def _settings(port: int, linger: float) -> dict[str, Any]:
    # Only the host probe: nothing to wait for, little load.
    return {
        "node": "spark-4",
        "listen": {"address": "127.0.0.1", "port": port},
        "loop_interval": 0.2,
        "shutdown_linger": linger,
        "probes": {
            "vllm": {"enabled": False},
            "gpu": {"enabled": False},
            "journal": {"enabled": False},
        },
    }


# --- the snapshot field, in process ---------------------------------------------


def _run_until_stopped(config: AgentConfig, answer: bool) -> list[dict[str, Any]]:
    """Run an agent, stop it, and return every snapshot published meanwhile."""
    agent = Agent(config, notifier=SystemdNotifier({}), system_stopping=lambda: answer)
    seen: list[dict[str, Any]] = []

    async def go() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        deadline = time.monotonic() + 30
        while not agent.ready.is_set():
            assert time.monotonic() < deadline, "agent never became ready"
            await asyncio.sleep(0.05)
        seen.append(agent.snapshot())
        stop.set()
        while not task.done():
            seen.append(agent.snapshot())
            await asyncio.sleep(0.05)
        await task
        seen.append(agent.snapshot())

    asyncio.run(asyncio.wait_for(go(), 60))
    return seen


def test_snapshot_says_stopping_only_once_asked_to_stop() -> None:
    config = parse_agent_config(_settings(_free_port(), 1.5))
    before = time.time()
    seen = _run_until_stopped(config, answer=True)
    assert seen[0]["stopping"] is None, "a running agent is not stopping"
    stopping = [s for s in seen if s["stopping"] is not None]
    assert stopping, "the stopping snapshot was never published"
    field = stopping[-1]["stopping"]
    assert set(field) == {"since", "system"}
    assert field["system"] is True
    assert isinstance(field["since"], float)
    assert before - 1 <= field["since"] <= time.time() + 1
    # The heartbeat keeps going through the linger (1.5 s, a loop every 0.2 s).
    assert stopping[-1]["seq"] > stopping[0]["seq"], [s["seq"] for s in stopping]


def test_snapshot_says_only_the_agent_stops() -> None:
    config = parse_agent_config(_settings(_free_port(), 1.5))
    seen = _run_until_stopped(config, answer=False)
    assert seen[0]["stopping"] is None
    assert seen[-1]["stopping"] is not None
    assert seen[-1]["stopping"]["system"] is False


def test_a_failing_query_counts_as_not_the_system() -> None:
    def broken() -> bool:
        raise RuntimeError("no bus")

    agent = Agent(
        parse_agent_config(_settings(_free_port(), 5.0)),
        notifier=SystemdNotifier({}),
        system_stopping=broken,
    )

    async def go() -> None:
        stop = asyncio.Event()
        stop.set()
        await agent.run(stop)

    asyncio.run(asyncio.wait_for(go(), 60))
    assert agent.snapshot()["stopping"]["system"] is False


def test_shutdown_linger_is_validated() -> None:
    assert parse_agent_config({"node": "n"}).shutdown_linger == 3.0
    assert parse_agent_config({"node": "n", "shutdown_linger": 0}).shutdown_linger == 0
    for bad in (-1, 11, "soon"):
        with pytest.raises(Exception, match="shutdown_linger"):
            parse_agent_config({"node": "n", "shutdown_linger": bad})


# --- the real agent process, SIGTERM ---------------------------------------------


class AgentChild:
    def __init__(self, tmp_path: Path, linger: float, answer: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = tmp_path / "agent.yaml"
        config.write_text(yaml.safe_dump(_settings(self.port, linger)))
        self.notify_path = tmp_path / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.notify_path))
        self.notify.setblocking(False)
        self.messages: list[str] = []
        env = dict(os.environ, NOTIFY_SOCKET=str(self.notify_path))
        env.pop("WATCHDOG_USEC", None)
        env.pop("JOURNAL_STREAM", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.log_path = tmp_path / "agent.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", LAUNCHER, str(config), answer],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp_path,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                return self.messages

    def state(self) -> dict[str, Any] | None:
        try:
            answer = requests.get(f"{self.base}/v1/state", timeout=3)
        except requests.RequestException:
            return None
        if answer.status_code != 200:
            return None
        body: dict[str, Any] = answer.json()
        return body

    def wait_ready(self) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the agent exited: {self.log()}"
            if any(m.startswith("READY=1") for m in self.drain()):
                state = self.state()
                if state is not None:
                    return state
            time.sleep(0.1)
        raise AssertionError(f"the agent never became ready: {self.log()}")

    def answers_until_exit(self, limit: float) -> tuple[list[dict[str, Any]], float]:
        """Poll /v1/state until the process exits; the answers and how long it took."""
        began = time.monotonic()
        answers: list[dict[str, Any]] = []
        while self.process.poll() is None:
            assert time.monotonic() - began < limit, f"still running after {limit} s: {self.log()}"
            state = self.state()
            if state is not None:
                answers.append(state)
            time.sleep(0.1)
        return answers, time.monotonic() - began

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.notify.close()
        self._log.close()


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Any]:
    started: list[AgentChild] = []

    def start(linger: float, answer: str) -> AgentChild:
        handle = AgentChild(tmp_path, linger, answer)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.close()


@pytest.mark.integration
def test_sigterm_during_a_system_shutdown_lingers_and_says_so(child: Any) -> None:
    linger = 3.0
    agent: AgentChild = child(linger, "system")
    assert agent.wait_ready()["stopping"] is None
    sent_at = time.time()
    agent.process.send_signal(signal.SIGTERM)
    answers, took = agent.answers_until_exit(linger + 30)
    assert agent.process.returncode == 0, agent.log()

    stopping = [a for a in answers if a["stopping"] is not None]
    assert stopping, f"no answer during the linger said stopping ({len(answers)} answers)"
    assert all(a["stopping"]["system"] is True for a in stopping)
    since = stopping[0]["stopping"]["since"]
    assert sent_at - 1 <= since <= sent_at + 30
    # seq keeps advancing while stopping: a stopping agent is not a frozen one.
    assert len(stopping) >= 2, stopping
    assert stopping[-1]["seq"] > stopping[0]["seq"], [a["seq"] for a in stopping]
    assert any(m.startswith("STOPPING=1") for m in agent.drain()), agent.messages
    assert "the system is going down" in agent.log()
    assert took < linger + 30


@pytest.mark.integration
def test_sigterm_of_only_the_agent_exits_promptly(child: Any) -> None:
    # A linger this long would show: the agent must not wait it out.
    linger = 10.0
    agent: AgentChild = child(linger, "agent-only")
    assert agent.wait_ready()["stopping"] is None
    agent.process.send_signal(signal.SIGTERM)
    answers, took = agent.answers_until_exit(linger + 30)
    assert agent.process.returncode == 0, agent.log()
    assert not any(a["stopping"] and a["stopping"]["system"] for a in answers), answers
    assert took < linger - 2, f"took {took:.1f} s: it lingered"
    assert any(m.startswith("STOPPING=1") for m in agent.drain()), agent.messages


@pytest.mark.integration
def test_a_second_signal_cuts_the_linger_short(child: Any) -> None:
    linger = 10.0
    agent: AgentChild = child(linger, "system")
    agent.wait_ready()
    agent.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while True:
        state = agent.state()
        if state is not None and state["stopping"] is not None:
            break
        assert time.monotonic() < deadline, f"never said stopping: {agent.log()}"
        time.sleep(0.1)
    agent.process.send_signal(signal.SIGINT)
    began = time.monotonic()
    agent.process.wait(linger + 30)
    assert agent.process.returncode == 0, agent.log()
    assert time.monotonic() - began < linger - 2


# --- the systemd query ------------------------------------------------------------


def _fake_systemctl(tmp_path: Path, state: str, jobs: str = "", sleep: float = 0) -> Path:
    """A systemctl that prints ``state`` for is-system-running and ``jobs`` for
    list-jobs, and records each call."""
    calls = tmp_path / "calls"
    script = tmp_path / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        # exec: the timeout's kill reaches the sleeper itself.
        f"[ {sleep} = 0 ] || exec sleep {sleep}\n"
        'case "$1" in\n'
        f"  is-system-running) printf '%s\\n' '{state}'; exit 1 ;;\n"
        f"  list-jobs) printf '%s' '{jobs}'; exit 0 ;;\n"
        "esac\n"
        "exit 1\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _calls(tmp_path: Path) -> list[str]:
    calls = tmp_path / "calls"
    return calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize(
    ("state", "jobs", "expected"),
    [
        ("stopping", "", True),
        ("running", "", False),
        ("degraded", "", False),
        ("maintenance", "", False),
        ("offline", "", False),
        # Boot not finished: only a queued shutdown.target job tells.
        ("starting", "431 shutdown.target start waiting\n", True),
        ("starting", "", False),
        ("initializing", "12 shutdown.target start waiting\n", True),
        ("starting", "88 shutdown.target.wants start waiting\n", False),
    ],
)
def test_system_shutting_down_reads_systemds_state(
    tmp_path: Path, state: str, jobs: str, expected: bool
) -> None:
    fake = _fake_systemctl(tmp_path, state, jobs)
    assert system_shutting_down(systemctl=str(fake), run_dir=str(tmp_path)) is expected
    calls = _calls(tmp_path)
    assert calls[0] == "is-system-running"
    if state in ("starting", "initializing"):
        assert calls[1].startswith("list-jobs") and "shutdown.target" in calls[1]
    else:
        assert len(calls) == 1


def test_without_systemd_nothing_is_asked(tmp_path: Path) -> None:
    fake = _fake_systemctl(tmp_path, "stopping")
    missing = tmp_path / "no-such-dir"
    assert system_shutting_down(systemctl=str(fake), run_dir=str(missing)) is False
    assert _calls(tmp_path) == []


def test_no_systemctl_or_no_answer_is_false(tmp_path: Path) -> None:
    missing = tmp_path / "no-systemctl"
    assert system_shutting_down(systemctl=str(missing), run_dir=str(tmp_path)) is False
    slow = _fake_systemctl(tmp_path, "stopping", sleep=60)
    began = time.monotonic()
    assert system_shutting_down(systemctl=str(slow), timeout=0.5, run_dir=str(tmp_path)) is False
    assert time.monotonic() - began < 30
