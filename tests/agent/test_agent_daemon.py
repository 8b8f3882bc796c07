"""The agent end to end, in-process: real HTTP, real notify socket, real children."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.probe_runner import Observation, ProbeFailure
from spark_watchdog.agent.sdnotify import SystemdNotifier
from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.lab.journal_writer import Ending, Fault, boot_entries, write_boot
from spark_watchdog.lab.vllm_standin import VllmStandin

pytestmark = pytest.mark.integration

HANGING_WORKER = """
import sys, time
sys.stdin.readline()
time.sleep(3600)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def node_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    root = tmp_path_factory.mktemp("node")
    boots = [uuid.uuid4().hex for _ in range(2)]
    start = datetime.now(timezone.utc) - timedelta(hours=5)
    journal = root / "journal"
    write_boot(
        journal,
        boot_entries(boots[0], start, faults=[Fault.XID_31], ending=Ending.POWER_LOSS),
    )
    write_boot(
        journal,
        boot_entries(
            boots[1], start + timedelta(hours=1), ending=Ending.POWER_LOSS, after_unclean=True
        ),
    )
    proc = root / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(str(uuid.UUID(boots[1])) + "\n")
    for name in ("meminfo", "uptime", "loadavg"):
        (proc / name).symlink_to(Path("/proc") / name)
    return journal, proc, boots


@pytest.fixture
def vllm() -> Iterator[VllmStandin]:
    with VllmStandin() as standin:
        yield standin


def _config(
    vllm_url: str, journal: Path, proc: Path, journal_interval: float, canary: bool
) -> AgentConfig:
    vllm = {"url": vllm_url, "interval": 0.3, "timeout": 1.0, "stall_after": 2.0}
    if canary:
        vllm["canary"] = {"enabled": True, "timeout": 1.0, "min_interval": 0.0}
    return parse_agent_config(
        {
            "node": "spark-2",
            "listen": {"address": "127.0.0.1", "port": _free_port()},
            "loop_interval": 0.2,
            "probes": {
                "vllm": vllm,
                "gpu": {"interval": 0.5, "deadline": 1.0},
                "journal": {"directory": str(journal), "interval": journal_interval},
                "host": {"proc_root": str(proc)},
            },
        }
    )


class RunningAgent:
    """Runs an Agent on its own event loop in a thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        async def go() -> None:
            await self.agent.run(self.stop)

        try:
            self.loop.run_until_complete(go())
        except BaseException as exc:
            self.error = exc

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.agent.config.listen.port}"

    def state(self) -> dict[str, Any]:
        body: dict[str, Any] = requests.get(f"{self.base}/v1/state", timeout=2).json()
        return body

    def wait(self, check: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(20)
        assert not self.thread.is_alive(), "agent did not stop"
        assert self.error is None, self.error


@pytest.fixture
def running(
    vllm: VllmStandin, node_tree: tuple[Path, Path, list[str]], tmp_path: Path
) -> Iterator[Callable[..., RunningAgent]]:
    started: list[RunningAgent] = []

    def start(
        notifier: SystemdNotifier | None = None,
        hang_gpu: bool = False,
        journal_interval: float = 5.0,
        canary: bool = False,
    ) -> RunningAgent:
        journal, proc, _ = node_tree
        argv = None
        if hang_gpu:
            script = tmp_path / "hanging_worker.py"
            script.write_text(HANGING_WORKER)
            argv = [sys.executable, str(script)]
        agent = Agent(
            _config(vllm.url, journal, proc, journal_interval, canary),
            notifier=notifier or SystemdNotifier({}),
            gpu_worker_argv=argv,
        )
        handle = RunningAgent(agent)
        started.append(handle)
        assert handle.wait(lambda: handle.agent.ready.is_set(), 30), "agent never became ready"
        return handle

    yield start
    for handle in started:
        handle.close()


def test_state_snapshot_contract(
    running: Callable[..., RunningAgent], node_tree: tuple[Path, Path, list[str]]
) -> None:
    agent = running()
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    first = agent.state()
    assert first["node"] == "spark-2"
    assert first["boot_id"] == node_tree[2][1]
    assert first["version"]
    datetime.fromisoformat(first["started_at"])
    for probe in ("vllm", "gpu", "journal", "host"):
        body = first["probes"][probe]
        assert isinstance(body["state"], str)
        datetime.fromisoformat(body["observed_at"])
    assert first["probes"]["gpu"]["state"] in {"ok", "unavailable"}
    assert first["probes"]["journal"]["previous_boot_clean_shutdown"] is False
    assert first["probes"]["host"]["mem_available_bytes"] > 0
    time.sleep(0.6)
    assert agent.state()["seq"] > first["seq"], "seq must advance every loop"


def test_boots_endpoint_serves_the_journal_analysis(
    running: Callable[..., RunningAgent], node_tree: tuple[Path, Path, list[str]]
) -> None:
    agent = running()
    boots = requests.get(f"{agent.base}/v1/boots", timeout=2).json()["boots"]
    assert [b["boot_id"] for b in boots] == node_tree[2]
    assert boots[0]["clean_shutdown"] is False
    assert any(e["kind"] == "xid" for e in boots[0]["evidence"])
    assert boots[1]["current"] is True and boots[1]["clean_shutdown"] is None


def test_metrics_endpoint_is_valid_exposition(running: Callable[..., RunningAgent]) -> None:
    agent = running()
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    text = requests.get(f"{agent.base}/metrics", timeout=2).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = (
        "spark_watchdog_probe_state",
        (("node", "spark-2"), ("probe", "vllm"), ("state", "progressing")),
    )
    assert samples[key] == 1.0
    assert samples[("spark_watchdog_agent_loops_total", (("node", "spark-2"),))] >= 1
    assert samples[("spark_watchdog_journal_previous_boot_clean", (("node", "spark-2"),))] == 0
    assert ("spark_watchdog_host_mem_available_bytes", (("node", "spark-2"),)) in samples


def test_unknown_path_is_a_clear_404(running: Callable[..., RunningAgent]) -> None:
    agent = running()
    answer = requests.get(f"{agent.base}/v2/nothing", timeout=2)
    assert answer.status_code == 404
    assert "no such path /v2/nothing" in answer.json()["error"]


def test_a_wedged_gpu_never_delays_the_heartbeat_or_the_other_probes(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    agent = running(hang_gpu=True)
    assert agent.state()["probes"]["gpu"]["state"] == "timeout"
    seq_before = agent.state()["seq"]
    vllm.set_mode("wedged")
    # stall_after is 2 s: the vllm probe must keep its own schedule.
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "stalled", 8)
    snap = agent.state()
    assert snap["probes"]["gpu"]["state"] == "timeout"
    assert "did not answer" in snap["probes"]["gpu"]["error"]
    # loop_interval is 0.2 s: over >2 s the heartbeat advanced about 10 times.
    assert snap["seq"] - seq_before >= 8


def test_watchdog_is_petted_only_while_the_loop_is_healthy(
    running: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})

    def messages(seconds: float) -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got.append(sock.recv(4096).decode())
        return got

    try:
        # The journal probe reports once at start, then not for a minute.
        agent = running(notifier=notifier, journal_interval=60.0)
        healthy = messages(1.5)
        assert any(m.startswith("READY=1") for m in healthy)
        assert sum(m == "WATCHDOG=1" for m in healthy) >= 3  # every ~0.2 s
        # A probe that stopped reporting long ago means a stuck task.
        journal = agent.agent.runners["journal"]
        stale = Observation(ProbeFailure("timeout", "stuck"), time.time() - 10_000, 0.0)
        agent.loop.call_soon_threadsafe(setattr, journal, "latest", stale)
        time.sleep(0.3)
        stuck = messages(1.5)
        assert not any(m == "WATCHDOG=1" for m in stuck), stuck
        assert agent.state()["healthy"] is False
    finally:
        sock.close()


def test_canary_is_sent_when_a_stall_is_suspected(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    agent = running(canary=True)
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    assert agent.state()["probes"]["vllm"]["canary"] is None  # no suspicion, no canary
    vllm.set_mode("wedged")

    def canary_outcome() -> str | None:
        canary = agent.state()["probes"]["vllm"]["canary"]
        return None if canary is None else str(canary["outcome"])

    # A wedged engine never answers the 1-token request: the canary times out.
    assert agent.wait(lambda: canary_outcome() == "timeout", 10)
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "stalled", 10)
