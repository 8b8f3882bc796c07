"""The real servers the written API (docs/api/) is checked against.

One agent with every probe and serving control on (the vLLM stand-in as its
head, the lab's NVML stand-in behind the real GPU worker, lab-written journal
files), one with serving control off, and a real controller watching the first
agent, each on loopback with its real HTTP endpoint and route functions.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.controller.page.page_api import PageRoutes
from spark_watchdog.controller.page.page_auth import PageAuth
from spark_watchdog.controller.page.status_api import StandbyEndpoint
from spark_watchdog.http.server import HttpEndpoint
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.hardware.journal_writer import Ending, Fault, boot_entries, write_boot
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.lab_controller import ControllerThread
from spark_watchdog.lab.ports import free_port
from spark_watchdog.sdnotify import SystemdNotifier

TOKEN = "api-token-" + uuid.uuid4().hex
# A rank that lives until it is stopped; the profile flags land in its sys.argv.
RANK = [sys.executable, "-c", "import time; time.sleep(3600)"]


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


@dataclass
class RunningServer:
    base_url: str
    endpoint: HttpEndpoint
    # The bearer token of its POST routes; None where they take none.
    token: str | None = None


class _AgentThread:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        self.loop.run_until_complete(self.agent.run(self.stop))

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


def _node_tree(root: Path) -> tuple[Path, Path]:
    boots = [uuid.uuid4().hex for _ in range(2)]
    start = datetime.now(timezone.utc) - timedelta(hours=3)
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
    return journal, proc


def _agent_config(root: Path, vllm_url: str, serving: bool) -> dict[str, Any]:
    journal, proc = _node_tree(root)
    port = free_port()
    config: dict[str, Any] = {
        "node": "spark-1",
        "listen": {"address": "127.0.0.1", "port": port},
        # Its peers section in /v1/state is checked against the document: a peer
        # nothing answers for (silent) and one that answers as another node (this
        # agent itself: wrong_node).
        "peers": [
            {"name": "spark-2", "url": f"http://127.0.0.1:{free_port()}"},
            {"name": "spark-3", "url": f"http://localhost:{port}"},
        ],
        "loop_interval": 0.5,
        "probes": {
            "vllm": {
                "url": vllm_url,
                "interval": 0.5,
                "timeout": 1.0,
                "stall_after": 5.0,
                "canary": {"timeout": 1.0},
            },
            "gpu": {"interval": 1.0, "deadline": 5.0},
            "journal": {"directory": str(journal), "interval": 30.0},
            "host": {"proc_root": str(proc)},
        },
    }
    if serving:
        token_file = root / "serving-token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        config["serving"] = {
            "enabled": True,
            "command": RANK,
            "token_file": str(token_file),
            "log_file": str(root / "serving.log"),
            "stop_timeout": 5.0,
        }
    return config


def _start_agent(root: Path, vllm_url: str, serving: bool) -> _AgentThread:
    nvml = root / "nvml"
    nvml.mkdir(parents=True)
    shutil.copyfile(gpu_standin.__file__, nvml / "pynvml.py")
    worker = [
        sys.executable,
        "-c",
        f"import runpy, sys; sys.path.insert(0, {str(nvml)!r}); "
        "runpy.run_module('spark_watchdog.probes.gpu_worker', run_name='__main__')",
    ]
    agent = Agent(
        parse_agent_config(_agent_config(root, vllm_url, serving)),
        notifier=SystemdNotifier({}),
        gpu_worker_argv=worker,
    )
    running = _AgentThread(agent)
    wait_for(agent.ready.is_set, 60, "the agent's first probe round")
    return running


@pytest.fixture(scope="module")
def vllm() -> Iterator[VllmStandin]:
    with VllmStandin() as standin:
        yield standin


@pytest.fixture(scope="module")
def agent_server(
    tmp_path_factory: pytest.TempPathFactory, vllm: VllmStandin
) -> Iterator[RunningServer]:
    """The agent with serving control on (bearer token ``TOKEN``)."""
    running = _start_agent(tmp_path_factory.mktemp("agent"), vllm.url, serving=True)
    assert running.agent.http is not None
    base = f"http://127.0.0.1:{running.agent.http.port}"
    wait_for(
        lambda: (
            requests.get(f"{base}/v1/state", timeout=2).json()["probes"]["vllm"]["state"]
            == "progressing"
        ),
        30,
        "the vllm probe to see progress",
    )
    try:
        yield RunningServer(base, running.agent.http, TOKEN)
    finally:
        if running.agent.serving is not None:
            running.agent.serving.stop()
        running.close()


@pytest.fixture(scope="module")
def plain_agent_server(
    tmp_path_factory: pytest.TempPathFactory, vllm: VllmStandin
) -> Iterator[RunningServer]:
    """An agent with serving control off (no token, the POSTs answer 404)."""
    running = _start_agent(tmp_path_factory.mktemp("plain-agent"), vllm.url, serving=False)
    assert running.agent.http is not None
    try:
        yield RunningServer(f"http://127.0.0.1:{running.agent.http.port}", running.agent.http)
    finally:
        running.close()


@pytest.fixture(scope="module")
def controller_server(
    tmp_path_factory: pytest.TempPathFactory, agent_server: RunningServer
) -> Iterator[RunningServer]:
    """A real controller watching the agent (dry run: it never touches power)."""
    root = tmp_path_factory.mktemp("controller")
    community = root / "community"
    community.write_text("private\n")
    community.chmod(0o600)
    page_token = root / "page-token"
    page_token.write_text(TOKEN + "-page\n")
    page_token.chmod(0o600)
    port = free_port()
    config = {
        "nodes": [
            {
                "name": "spark-1",
                "agent": agent_server.base_url,
                "ssh_host": "127.0.0.1",
                "ssh_port": free_port(),
                "power": [
                    {
                        "type": "snmp",
                        "host": "127.0.0.1",
                        "port": free_port(),
                        "outlet": 1,
                        "vendor": "apc",
                        "community_file": str(community),
                        "timeout": 1.0,
                    }
                ],
            }
        ],
        "detection": {"poll_interval": 0.5, "agent_timeout": 1.0, "freeze_after": 30.0},
        "guards": {"dry_run": True},
        "listen": {"address": "127.0.0.1", "port": port, "token_file": str(page_token)},
        "history": str(root / "history.db"),
    }
    controller = ControllerThread(config).start()
    base = f"http://127.0.0.1:{port}"
    wait_for(
        lambda: requests.get(f"{base}/v1/status", timeout=2).json().get("ticks", 0) > 0,
        30,
        "the controller's first poll sweep",
    )
    try:
        yield RunningServer(base, controller.endpoint, TOKEN + "-page")
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def standby_server() -> Iterator[RunningServer]:
    """A standby of a controller pair's endpoint, with what a standby loop keeps
    (controller/pair/pair.py): the lease it last read, led by another controller."""
    view = {
        "holder": "mgmt-2:4242:0a1b2c3d",
        "history": "ok",
        "leader": {
            "holder": "mgmt-1:1717:9f8e7d6c",
            "epoch": 3,
            "acquired_at": 1764670000.0,
            "renewed_at": 1764670100.0,
            "expires_at": 1764670120.0,
            "lease_left_s": 18.5,
            "expired": False,
            "stepped_down_at": None,
        },
    }
    port = free_port()
    # What controller/page/page_api.py's standby_endpoint builds: the page, without its data.
    routes = PageRoutes(None, PageAuth(None), lambda: None)
    endpoint = StandbyEndpoint("127.0.0.1", port, lambda: dict(view), paths_of=routes)
    endpoint.start()
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", endpoint)
    finally:
        endpoint.stop()
