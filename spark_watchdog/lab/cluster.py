"""A simulated DGX Spark cluster on one machine: real processes, real protocols.

Each node is a process tree of its own (``sim_host``: an SSH banner
stand-in and the real agent, which launches the vLLM stand-in through its
real serving launcher). A stateful SNMP PDU (APC rPDU2 by default) powers
the nodes: outlet off kills the node's whole process group, like pulling
the plug; outlet on boots it again after ``boot_seconds`` with a new boot
id and a journal that shows the previous boot ended uncleanly.

Faults are injected the way they happen: ``freeze`` is SIGSTOP to the whole
tree (TCP still connects, nothing answers), ``wedge`` stops the engine while
``/health`` stays 200, ``crash`` makes ``/health`` answer 503.
"""

from __future__ import annotations

import contextlib
import functools
import json
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog.lab.journal_writer import FAULT_MESSAGES, Fault
from spark_watchdog.lab.pdu_standin import (
    HostProcess,
    PduStandin,
    PduStandinThread,
    StandinConfig,
)
from spark_watchdog.power.base import PowerState
from spark_watchdog.power.snmp_profiles import profile_by_name

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


@dataclass
class LabTimings:
    """Short, but in the production ratios (poll : freeze_after : off time)."""

    loop_interval: float = 0.5
    vllm_interval: float = 0.5
    stall_after: float = 4.0
    boot_seconds: float = 1.0


@dataclass
class LabNode:
    name: str
    outlet: int
    directory: Path
    agent_port: int
    ssh_port: int
    vllm_port: int
    head: bool
    host: HostProcess | None = None
    boots: int = 0

    @property
    def agent_url(self) -> str:
        return f"http://{LOOPBACK}:{self.agent_port}"

    @property
    def vllm_url(self) -> str:
        return f"http://{LOOPBACK}:{self.vllm_port}"

    @property
    def pgid(self) -> int | None:
        return None if self.host is None else self.host.pid

    def boot_id(self) -> str | None:
        path = self.directory / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip().replace("-", "")
        except OSError:
            return None


@dataclass
class LabCluster:
    root: Path
    size: int = 4
    timings: LabTimings = field(default_factory=LabTimings)
    vendor: str = "apc_rpdu2"
    nodes: list[LabNode] = field(default_factory=list)
    pdu: PduStandinThread | None = None
    token_file: Path | None = None
    community_file: Path | None = None

    # -- set-up -------------------------------------------------------------

    def start(self) -> LabCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.token_file = self._secret("serving-token", secrets.token_hex(16))
        self.community_file = self._secret("pdu-community", "lab-write")
        for i in range(self.size):
            self.nodes.append(self._make_node(i))
        standin = PduStandin(
            StandinConfig(
                profile=profile_by_name(self.vendor),
                outlets=max(8, self.size),
                names={n.outlet: n.name for n in self.nodes},
                write_community="lab-write",
            ),
            on_change=self._outlet_changed,
        )
        self.pdu = PduStandinThread(standin).start()
        for node in self.nodes:
            assert node.host is not None
            node.host.power_on()
        return self

    def _secret(self, name: str, value: str) -> Path:
        path = self.root / name
        path.write_text(value + "\n")
        path.chmod(0o600)
        return path

    def _make_node(self, index: int) -> LabNode:
        name = f"spark-{index + 1}"
        directory = self.root / name
        (directory / "proc").mkdir(parents=True, exist_ok=True)
        for entry in ("meminfo", "uptime", "loadavg"):
            link = directory / "proc" / entry
            if not link.exists():
                link.symlink_to(Path("/proc") / entry)
        node = LabNode(
            name=name,
            outlet=index + 1,
            directory=directory,
            agent_port=free_port(),
            ssh_port=free_port(),
            vllm_port=free_port(),
            head=index == 0,
        )
        (directory / "host.json").write_text(
            json.dumps({"name": name, "address": LOOPBACK, "ssh_port": node.ssh_port})
        )
        (directory / "agent.yaml").write_text(yaml.safe_dump(self._agent_config(node)))
        node.host = HostProcess(
            [sys.executable, "-m", "spark_watchdog.lab.sim_host", "--dir", str(directory)],
            boot_seconds=self.timings.boot_seconds,
            on_boot=functools.partial(self._booted, node),
        )
        return node

    def _booted(self, node: LabNode, pid: int) -> None:
        node.boots += 1

    def _agent_config(self, node: LabNode) -> dict[str, Any]:
        t = self.timings
        rank = ["--headless"] if not node.head else []
        command = [
            sys.executable,
            "-m",
            "spark_watchdog.lab.vllm_standin",
            "--host",
            LOOPBACK,
            "--port",
            str(node.vllm_port),
            "--model",
            "lab-model",
            "--speculative-config",
            json.dumps({"method": "dspark", "enable_adaptive_verification": True}),
            "--compilation-config",
            json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"}),
            *rank,
        ]
        return {
            "node": node.name,
            "listen": {"address": LOOPBACK, "port": node.agent_port},
            "loop_interval": t.loop_interval,
            "probes": {
                "vllm": {
                    "url": node.vllm_url if node.head else None,
                    "interval": t.vllm_interval,
                    "timeout": 1.0,
                    "stall_after": t.stall_after,
                },
                "gpu": {"enabled": False},
                "journal": {"directory": str(node.directory / "journal"), "interval": 5.0},
                "host": {"proc_root": str(node.directory / "proc")},
            },
            "serving": {
                "enabled": True,
                "command": command,
                "token_file": str(self.token_file),
                "log_file": str(node.directory / "serving.log"),
                "stop_timeout": 5.0,
                "default_profile": "plain",
            },
        }

    def _outlet_changed(self, outlet: int, state: PowerState) -> None:
        for node in self.nodes:
            if node.outlet == outlet and node.host is not None:
                if state is PowerState.OFF:
                    self._signal_tree(node, signal.SIGKILL)
                node.host.power(state)

    def tree(self, node: LabNode) -> list[psutil.Process]:
        """Every process of the simulated host, including the vLLM rank the
        agent launched in a session of its own: a power cut takes them all."""
        if node.pgid is None:
            return []
        try:
            root = psutil.Process(node.pgid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _signal_tree(self, node: LabNode, sig: signal.Signals) -> None:
        for process in self.tree(node):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.send_signal(sig)

    # -- the controller's view ------------------------------------------------

    def controller_config(self, history: Path, **overrides: Any) -> dict[str, Any]:
        assert self.pdu is not None
        config: dict[str, Any] = {
            "nodes": [
                {
                    "name": n.name,
                    "agent": n.agent_url,
                    "ssh_host": LOOPBACK,
                    "ssh_port": n.ssh_port,
                    "power": [
                        {
                            "type": "snmp",
                            "host": LOOPBACK,
                            "port": self.pdu.port,
                            "outlet": n.outlet,
                            "vendor": "auto",
                            "community_file": str(self.community_file),
                            "timeout": 1.0,
                        }
                    ],
                }
                for n in self.nodes
            ],
            "policy": {
                "power_off_seconds": 2.0,
                "power_timeout": 10.0,
                "power_poll_interval": 0.2,
                "min_command_interval": 0.5,
            },
            "detection": {
                "poll_interval": 0.5,
                "agent_timeout": 0.5,
                "freeze_after": 3.0,
                "banner_misses": 2,
                "banner_timeout": 0.5,
                "banner_interval": 5.0,
            },
            "guards": {"boot_timeout": 30.0},
            "serving": {
                "head": self.nodes[0].name,
                "token_file": str(self.token_file),
                "start_timeout": 30.0,
            },
            "listen": {"address": LOOPBACK, "port": free_port()},
            "history": str(history),
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        return config

    # -- serving and faults ---------------------------------------------------

    def _post(self, node: LabNode, path: str, body: dict[str, Any] | None = None) -> Any:
        assert self.token_file is not None
        token = self.token_file.read_text().strip()
        answer = requests.post(
            f"{node.agent_url}{path}",
            json=body or {},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        answer.raise_for_status()
        return answer.json()

    def wait_agents(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.nodes)
        while pending and time.monotonic() < deadline:
            for node in list(pending):
                with contextlib.suppress(requests.RequestException):
                    if requests.get(f"{node.agent_url}/v1/state", timeout=1).ok:
                        pending.remove(node)
            time.sleep(0.2)
        if pending:
            raise TimeoutError(f"agents not up: {', '.join(n.name for n in pending)}")

    def start_serving(self, profile: str = "plain", timeout: float = 60.0) -> None:
        """Workers first, then the head (FACTS "vLLM"); wait for progress."""
        for node in self.nodes[1:] + self.nodes[:1]:
            self._post(node, "/v1/serving/start", {"profile": profile})
        head = self.nodes[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException, ValueError, KeyError):
                state = requests.get(f"{head.agent_url}/v1/state", timeout=1).json()
                if state["probes"]["vllm"]["state"] == "progressing":
                    return
            time.sleep(0.3)
        raise TimeoutError("serving did not start progressing")

    def agent_state(self, node: LabNode) -> dict[str, Any] | None:
        try:
            body = requests.get(f"{node.agent_url}/v1/state", timeout=1).json()
        except (requests.RequestException, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def node(self, name: str) -> LabNode:
        return next(n for n in self.nodes if n.name == name)

    def freeze(self, node: LabNode, with_kernel_lines: bool = True) -> None:
        """The silent freeze: Xid lines may reach the journal, then everything stops."""
        if with_kernel_lines:
            self.kernel_lines(node, [Fault.NV_ERR_NO_MEMORY] * 5 + [Fault.XID_31])
        assert node.pgid is not None
        self._signal_tree(node, signal.SIGSTOP)

    def thaw(self, node: LabNode) -> None:
        self._signal_tree(node, signal.SIGCONT)

    def kernel_lines(self, node: LabNode, faults: list[Fault]) -> None:
        from datetime import datetime, timezone

        from spark_watchdog.lab.journal_writer import BootTimeline

        boot_id = node.boot_id()
        if boot_id is None:
            return
        timeline = BootTimeline(boot_id, datetime.now(timezone.utc), hostname=node.name)
        for fault in faults:
            timeline.kernel(FAULT_MESSAGES[fault], priority=3)
        timeline.write(node.directory / "journal")

    def switch(self, node: LabNode, on: bool) -> None:
        """Switch a node's outlet over real SNMP, as an operator at the PDU would."""
        import asyncio

        from spark_watchdog.config.controller import SnmpDevice
        from spark_watchdog.config.secrets import read_secret
        from spark_watchdog.power.base import PowerTiming, VerifiedPower
        from spark_watchdog.power.snmp import build_snmp_backend, close_snmp_backend

        assert self.pdu is not None and self.community_file is not None
        device = SnmpDevice(
            type="snmp",
            host=LOOPBACK,
            port=self.pdu.port,
            outlet=node.outlet,
            community_file=str(self.community_file),
        )
        secret = read_secret("lab.community_file", str(self.community_file))

        async def go() -> None:
            backend = build_snmp_backend(device, {"community_file": secret})
            power = VerifiedPower(backend, PowerTiming(poll_interval=0.2, min_command_interval=0))
            try:
                await (power.on() if on else power.off())
            finally:
                await close_snmp_backend(backend)

        asyncio.run(go())

    def vllm_mode(self, mode: str) -> None:
        head = self.nodes[0]
        requests.post(f"{head.vllm_url}/_standin/mode", json={"mode": mode}, timeout=5)

    # -- tear-down ------------------------------------------------------------

    def stop(self) -> None:
        """Every process the lab started is gone afterwards."""
        for node in self.nodes:
            self._signal_tree(node, signal.SIGKILL)
            if node.host is not None:
                node.host.power_off()
        if self.pdu is not None:
            self.pdu.stop()

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
