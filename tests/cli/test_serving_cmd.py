"""``spark-watchdog serving profile|restart`` against a real agent on loopback,
whose serving launcher runs a real (idle) rank."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.cli.main import main
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.ports import free_port as _free_port
from spark_watchdog.sdnotify import SystemdNotifier

pytestmark = pytest.mark.integration

TOKEN = "serving-t0ken"
IDLE_RANK = [sys.executable, "-c", "import time; time.sleep(600)"]


def _wait_for(check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


class RunningAgent:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(agent.run(self.stop)), daemon=True
        )
        self.thread.start()
        _wait_for(agent.ready.is_set)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.agent.config.listen.port}"

    def serving(self) -> dict[str, Any]:
        body: dict[str, Any] = requests.get(f"{self.base}/v1/serving", timeout=5).json()
        return body

    def close(self) -> None:
        if self.agent.serving is not None:
            self.agent.serving.stop()
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(20)
        self.loop.close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    config = parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": _free_port()},
            "loop_interval": 0.2,
            "probes": {"gpu": {"enabled": False}, "journal": {"enabled": False}},
            "serving": {
                "enabled": True,
                "command": IDLE_RANK,
                "profiles": {"fast": {"extra_args": ["--fast"]}},
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 5.0,
            },
        }
    )
    running = RunningAgent(Agent(config, notifier=SystemdNotifier({})))
    try:
        yield running
    finally:
        running.close()


def _controller_config(tmp_path: Path, agent_url: str) -> Path:
    path = tmp_path / "controller.yaml"
    config = {
        "nodes": [{"name": "spark-1", "agent": agent_url}],
        "serving": {"head": "spark-1", "token_file": str(tmp_path / "token")},
        "history": str(tmp_path / "history.db"),
    }
    path.write_text(yaml.safe_dump(config))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unknown_profile_is_refused_and_nothing_changes(
    agent: RunningAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _controller_config(tmp_path, agent.base)
    code, out, err = run(["serving", "profile", "fast", "--config", str(config)], capsys)
    assert (code, out, err) == (0, "serving profile: fast\n", "")
    code, out, err = run(["serving", "profile", "no-such-profile", "--config", str(config)], capsys)
    assert (code, out) == (2, "")
    assert err == (
        'spark-watchdog serving: unknown profile "no-such-profile": spark-1 offers fast, '
        "plain, safe (GET /v1/serving); nothing was changed\n"
    )
    with HistoryStore(tmp_path / "history.db", read_only=True) as store:
        setting = store.setting("serving_profile")
        assert setting is not None and setting.value == "fast"


def test_restart_with_an_unknown_profile_stops_nothing(
    agent: RunningAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _controller_config(tmp_path, agent.base)
    assert agent.agent.serving is not None
    pid = agent.agent.serving.start("plain")["pid"]
    argv = ["serving", "restart", "--profile", "no-such-profile", "--config", str(config)]
    code, out, err = run(argv, capsys)
    assert (code, out) == (2, "")
    assert err == (
        'spark-watchdog serving: restart: unknown profile "no-such-profile": spark-1 offers '
        "fast, plain, safe; nothing was stopped\n"
    )
    serving = agent.serving()
    assert serving["state"] == "running" and serving["pid"] == pid
    with HistoryStore(tmp_path / "history.db", read_only=True) as store:
        assert store.serving_restarts() == []


def test_a_profile_cannot_be_checked_without_an_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "token").chmod(0o600)
    url = f"http://127.0.0.1:{_free_port()}"
    config = _controller_config(tmp_path, url)
    code, out, err = run(["serving", "profile", "fast", "--config", str(config)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(
        'spark-watchdog serving: cannot check profile "fast": no agent with serving control '
        f"answered GET /v1/serving (spark-1: GET {url}/v1/serving: "
    )
    assert err.endswith(
        "nothing was changed. Set it once the agents are up, or pick a built-in profile "
        "(plain, safe)\n"
    )
    # A built-in profile is on every agent: it is set, with a note.
    code, out, err = run(["serving", "profile", "safe", "--config", str(config)], capsys)
    assert (code, out) == (0, "serving profile: safe\n")
    assert err.startswith("spark-watchdog serving: note: no agent could be asked (spark-1: ")
    assert err.endswith("; safe is built into every agent\n")
    # A restart with no agent to ask stops nothing either.
    code, out, err = run(["serving", "restart", "--config", str(config)], capsys)
    assert (code, out) == (1, "")
    assert err.startswith(f"spark-watchdog serving: restart: spark-1: GET {url}/v1/serving: ")
    assert err.endswith("; nothing was stopped\n")


def test_an_operators_restart_is_listed_by_history_and_show(
    agent: RunningAgent, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The idle rank never serves: the restart runs to its end and times out,
    # which is recorded like any other ending.
    path = _controller_config(tmp_path, agent.base)
    config = yaml.safe_load(path.read_text())
    config["serving"]["start_timeout"] = 2.0
    path.write_text(yaml.safe_dump(config))
    code, out, err = run(
        ["serving", "restart", "--profile", "fast", "--json", "--config", str(path)], capsys
    )
    body = json.loads(out)
    assert (code, body["result"]) == (1, "timed_out"), err
    incident = body["incident"]

    code, out, _ = run(["history", "--json", "--config", str(path)], capsys)
    listed = json.loads(out)["incidents"]
    assert code == 0 and [(i["id"], i["kind"]) for i in listed] == [(incident, "serving_restart")]
    assert listed[0]["resolution"] == "gave_up" and listed[0]["nodes"] == ["spark-1"]
    code, out, _ = run(["history", "--config", str(path)], capsys)
    assert code == 0 and "serving_restart" in out

    code, out, _ = run(["show", str(incident), "--json", "--config", str(path)], capsys)
    shown = json.loads(out)
    assert code == 0
    assert [(r["profile"], r["result"]) for r in shown["serving_restarts"]] == [
        ("fast", "timed_out")
    ]
    steps = [s["step"] for s in shown["steps"]]
    assert "serving_restart_started" in steps and "serving_restart_done" in steps
    code, out, _ = run(["show", str(incident), "--config", str(path)], capsys)
    assert code == 0 and "serving restart (fast): timed_out" in out
    assert "asked by a person (CLI)" in out
