"""A simulated DGX Spark cluster on one machine: real processes, real protocols.

Each node is a process tree of its own (``sim_host``: an SSH banner
stand-in and the real agent, which launches the vLLM stand-in through its
real serving launcher). A stateful SNMP PDU (APC rPDU2 by default) powers
the nodes: outlet off kills the node's whole process group, like pulling
the plug; outlet on boots it again after ``boot_seconds`` with a new boot
id and a journal that shows the previous boot ended uncleanly.

Faults are injected the way they happen: ``freeze`` is SIGSTOP to the whole
tree (TCP still connects, nothing answers), ``wedge`` stops the engine while
``/health`` stays 200, ``crash`` makes ``/health`` answer 503 and
``crash-exit`` makes the head's rank exit with code 0, ``gpu-hang`` makes the
node's NVML calls block (the lab's NVML stand-in, ``gpu_standin``),
``mem-collapse`` makes MemAvailable fall 1 GiB/s (each node's ``meminfo`` is
a file the lab writes), ``pdu-down`` silences the PDU. :meth:`LabCluster.inject`
takes any of them by name; :data:`FAULTS` lists them.

Every process a lab starts carries ``SPARK_WATCHDOG_LAB=<lab id>`` in its
environment, so :func:`sweep` finds and kills any that escaped its tree (a
rank whose agent died, say): nothing is left behind when the lab stops.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog.lab import gpu_standin
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
# Inherited by every process of a lab (nodes, ranks, NVML workers, the
# controller): how sweep() recognises them.
LAB_ENV = "SPARK_WATCHDOG_LAB"
GIB = 1024**3
# A GB10 as Linux sees it: ~119 GiB of its 128 GB unified memory in MemTotal;
# a serving node holds most of it (the model, the KV cache), MemFree sits near
# 1 GiB and MemAvailable is the headroom the host probe watches.
MEM_TOTAL_BYTES = 119 * GIB
MEM_AVAILABLE_BYTES = 36 * GIB
MEM_COLLAPSE_RATE = 1 * GIB  # bytes/s, as seen before GB10 freezes (vllm #56824)
MEM_COLLAPSE_FLOOR = 1 * GIB
PDU_SWITCH_DELAY_S = 0.3
# Addresses of nodes in network namespaces: TEST-NET-2, point-to-point /30 links.
NETNS_PREFIX = "198.51.100"
_IP = shutil.which("ip") or "/usr/sbin/ip"

# Fault names accepted by LabCluster.inject (and `spark-watchdog lab inject`).
FAULTS: dict[str, str] = {
    "freeze": "SIGSTOP the node's whole process tree (Xid 31 lines first): the silent freeze",
    "thaw": "SIGCONT the node's tree (undo freeze without power)",
    "wedge": "the head's engine stops stepping while requests run; /health stays 200",
    "crash": "the head's /health answers 503 (EngineDeadError)",
    "crash-exit": "the head's vLLM rank exits with code 0 (vllm #53726)",
    "gpu-hang": "the node's NVML calls block (a wedged driver)",
    "mem-collapse": "the node's MemAvailable falls 1 GiB/s toward 1 GiB",
    "pdu-down": "the PDU stops answering SNMP (its management card is down)",
    "partition": "the node's network link goes dark (network namespaces: lab up --netns)",
    "heal": "undo wedge/crash, gpu-hang, mem-collapse, pdu-down and freeze",
}
# Faults about the serving head or the whole lab: the node argument is optional.
CLUSTER_FAULTS = frozenset({"wedge", "crash", "crash-exit", "pdu-down", "heal"})


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
    gpu_interval: float = 1.0  # production 2 s, deadline 3 s
    gpu_deadline: float = 1.5


@dataclass
class LabNode:
    name: str
    outlet: int
    directory: Path
    agent_port: int
    ssh_port: int
    vllm_port: int
    head: bool
    address: str = LOOPBACK
    # With network namespaces: the node's namespace and the host end of its link.
    netns: str | None = None
    veth: str | None = None
    link: str | None = None  # the node's end of the veth pair, inside its namespace
    host: HostProcess | None = None
    boots: int = 0
    # Bumped by each mem-collapse and each boot: an older collapse thread stops.
    mem_generation: int = 0

    @property
    def agent_url(self) -> str:
        return f"http://{self.address}:{self.agent_port}"

    @property
    def vllm_url(self) -> str:
        return f"http://{self.address}:{self.vllm_port}"

    @property
    def pgid(self) -> int | None:
        return None if self.host is None else self.host.pid

    @property
    def process_match(self) -> str:
        """A fragment of this node's rank command line, unique on the lab machine
        (every node's rank runs here, so the bare module name would not do)."""
        return f"spark_watchdog.lab.vllm_standin --host {self.address} --port {self.vllm_port}"

    def boot_id(self) -> str | None:
        path = self.directory / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip().replace("-", "")
        except OSError:
            return None

    def write_meminfo(self, available: int) -> None:
        """The node's ``/proc/meminfo``, rewritten atomically (the agent may be reading)."""
        free = min(available, GIB)
        lines = {
            "MemTotal": MEM_TOTAL_BYTES,
            "MemFree": free,
            "MemAvailable": available,
            "Buffers": 64 * 1024**2,
            "Cached": max(0, available - free),
            "SwapCached": 0,
            "Active": MEM_TOTAL_BYTES - available,
            "SwapTotal": 0,
            "SwapFree": 0,
        }
        text = "".join(f"{key + ':':<16}{value // 1024:>10} kB\n" for key, value in lines.items())
        path = self.directory / "proc" / "meminfo"
        tmp = path.with_name("meminfo.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


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
    lab_id: str = field(default_factory=lambda: secrets.token_hex(6))
    # Each node in a network namespace of its own behind a veth link (root
    # only; see netns_unavailable): what the partition fault needs.
    netns: bool = False
    # Called (from a lab thread) with each outlet change and boot, for a timeline.
    on_event: Callable[[str], None] | None = None
    _stopped: bool = False

    # -- set-up -------------------------------------------------------------

    def start(self) -> LabCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.token_file = self._secret("serving-token", secrets.token_hex(16))
        self.community_file = self._secret("pdu-community", "lab-write")
        self._install_nvml_standin()
        for i in range(self.size):
            self.nodes.append(self._make_node(i))
        standin = PduStandin(
            StandinConfig(
                profile=profile_by_name(self.vendor),
                outlets=max(8, self.size),
                names={n.outlet: n.name for n in self.nodes},
                write_community="lab-write",
                # A relay behind a management card takes a moment to switch.
                switch_delay=PDU_SWITCH_DELAY_S,
            ),
            on_change=self._outlet_changed,
        )
        self.pdu = PduStandinThread(standin).start()
        for node in self.nodes:
            assert node.host is not None
            node.host.power_on()
        return self

    def environment(self) -> dict[str, str]:
        """The environment of every process the lab starts: the lab tag, and the
        NVML stand-in ahead of the real pynvml on the module path."""
        nvml = str(self.root / "nvml")
        path = os.pathsep.join(p for p in (nvml, os.environ.get("PYTHONPATH")) if p)
        return {**os.environ, LAB_ENV: self.lab_id, "PYTHONPATH": path}

    def _install_nvml_standin(self) -> None:
        # A copy named pynvml: the agent's real NVML worker imports it as NVML.
        target = self.root / "nvml"
        target.mkdir(exist_ok=True)
        shutil.copyfile(gpu_standin.__file__, target / "pynvml.py")

    def _host_argv(self, node: LabNode) -> list[str]:
        # HostProcess starts its argv with the lab's own environment; `env`
        # adds the lab tag and the NVML path (and execs: the pid stays the
        # host's, as it does through `ip netns exec`).
        directory = node.directory
        env = self.environment()
        settings = [f"{key}={env[key]}" for key in (LAB_ENV, "PYTHONPATH")]
        inside = [_IP, "netns", "exec", node.netns] if node.netns else []
        return [
            *inside,
            shutil.which("env") or "/usr/bin/env",
            *settings,
            sys.executable,
            "-m",
            "spark_watchdog.lab.sim_host",
            "--dir",
            str(directory),
        ]

    def _secret(self, name: str, value: str) -> Path:
        path = self.root / name
        path.write_text(value + "\n")
        path.chmod(0o600)
        return path

    def _make_node(self, index: int) -> LabNode:
        name = f"spark-{index + 1}"
        directory = self.root / name
        (directory / "proc").mkdir(parents=True, exist_ok=True)
        for entry in ("uptime", "loadavg"):
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
        if self.netns:
            self._make_namespace(node, index)
        (directory / "host.json").write_text(
            json.dumps({"name": name, "address": node.address, "ssh_port": node.ssh_port})
        )
        (directory / "agent.yaml").write_text(yaml.safe_dump(self._agent_config(node)))
        # A file, not a link to /proc/meminfo: mem-collapse rewrites it.
        (directory / "proc" / "meminfo").unlink(missing_ok=True)
        self._reset_hardware(node)
        node.host = HostProcess(
            self._host_argv(node),
            boot_seconds=self.timings.boot_seconds,
            on_boot=functools.partial(self._booted, node),
        )
        return node

    def _make_namespace(self, node: LabNode, index: int) -> None:
        """``spark-N`` in namespace ``swlab-<id>-N`` at 198.51.100.(4i+2)/30, the lab
        machine at .(4i+1) on the other end of a veth pair. TEST-NET-2 addresses
        (RFC 5737) on a point-to-point /30: nothing is routed anywhere else."""
        tag = self.lab_id[:6]
        node.netns = f"swlab-{tag}-{index + 1}"
        node.veth = f"swl{tag}h{index + 1}"
        node.link = inside = f"swl{tag}n{index + 1}"
        host_address = f"{NETNS_PREFIX}.{4 * index + 1}"
        node.address = f"{NETNS_PREFIX}.{4 * index + 2}"
        commands = (
            ["netns", "add", node.netns],
            ["link", "add", node.veth, "type", "veth", "peer", "name", inside],
            ["link", "set", inside, "netns", node.netns],
            ["addr", "add", f"{host_address}/30", "dev", node.veth],
            ["link", "set", node.veth, "up"],
            ["-n", node.netns, "addr", "add", f"{node.address}/30", "dev", inside],
            ["-n", node.netns, "link", "set", inside, "up"],
            # The node reaches its own address (agent -> its vLLM) over lo.
            ["-n", node.netns, "link", "set", "lo", "up"],
        )
        try:
            for command in commands:
                _ip(*command)
        except OSError:
            # Not yet in self.nodes: stop() would not find what was made.
            _ip("link", "del", node.veth, check=False)
            _ip("netns", "del", node.netns, check=False)
            raise

    def partition(self, node: LabNode, cut: bool = True) -> None:
        """Cut (or restore) the node's link from inside its namespace: the
        machine's end keeps its route, so packets to the node go nowhere
        else; they vanish, as behind a dead switch port."""
        if node.netns is None or node.link is None:
            raise ValueError("partition needs the lab's network namespaces (lab up --netns)")
        _ip("-n", node.netns, "link", "set", node.link, "down" if cut else "up")

    def _remove_namespaces(self) -> None:
        for node in self.nodes:
            if node.veth is not None:
                _ip("link", "del", node.veth, check=False)
            if node.netns is not None:
                _ip("netns", "del", node.netns, check=False)

    def _reset_hardware(self, node: LabNode) -> None:
        """What a power cycle clears: the GPU's hang, the memory pressure."""
        node.mem_generation += 1
        node.write_meminfo(MEM_AVAILABLE_BYTES)
        gpu_standin.write_mode(node.directory, "ok")

    def _booted(self, node: LabNode, pid: int) -> None:
        node.boots += 1
        if node.boots > 1:
            self._reset_hardware(node)
            self._event(f"{node.name} powered on: booting (boot {node.boots})")

    def _event(self, text: str) -> None:
        if self.on_event is not None and not self._stopped:
            with contextlib.suppress(Exception):
                self.on_event(text)

    def _agent_config(self, node: LabNode) -> dict[str, Any]:
        t = self.timings
        rank = ["--headless"] if not node.head else []
        command = [
            sys.executable,
            "-m",
            "spark_watchdog.lab.vllm_standin",
            "--host",
            node.address,
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
            "listen": {"address": node.address, "port": node.agent_port},
            "loop_interval": t.loop_interval,
            "probes": {
                "vllm": {
                    "url": node.vllm_url if node.head else None,
                    "interval": t.vllm_interval,
                    "timeout": 1.0,
                    "stall_after": t.stall_after,
                    # Without it a rank that exited 0 only looks "unreachable".
                    "process_match": node.process_match,
                },
                "gpu": {"interval": t.gpu_interval, "deadline": t.gpu_deadline},
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
                    self._event(f"{node.name} lost power (outlet {outlet} off): tree killed")
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
                    "ssh_host": n.address,
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

    @property
    def head(self) -> LabNode:
        return self.nodes[0]

    def outlet_commands(self, since: int = 0) -> list[tuple[int, str]]:
        """(outlet, "on" | "off" | value) for each SET the PDU received, in order."""
        assert self.pdu is not None
        profile = self.pdu.standin.profile
        names = {profile.control_on.value: "on", profile.control_off.value: "off"}
        return [
            (s.outlet or 0, names.get(s.value, str(s.value)) if isinstance(s.value, int) else "?")
            for s in list(self.pdu.standin.set_requests)[since:]
        ]

    def crash_exit(self, node: LabNode | None = None) -> int | None:
        """The rank exits with code 0 (vLLM can, after an illegal memory access:
        vllm #53726): SIGTERM, which the stand-in answers by exiting cleanly."""
        node = node or self.head
        for process in self.tree(node):
            with contextlib.suppress(psutil.Error):
                if node.process_match in " ".join(process.cmdline()):
                    process.terminate()
                    return int(process.pid)
        return None

    def gpu_hang(self, node: LabNode, hang: bool = True) -> None:
        if hang:
            # A task stuck in the driver is what the kernel reports first.
            self.kernel_lines(node, [Fault.HUNG_TASK])
        gpu_standin.write_mode(node.directory, "hang" if hang else "ok")

    def mem_collapse(
        self,
        node: LabNode,
        rate: float = MEM_COLLAPSE_RATE,
        floor: float = MEM_COLLAPSE_FLOOR,
    ) -> None:
        """MemAvailable falls ``rate`` bytes/s to ``floor`` (a thread rewrites meminfo)."""
        node.mem_generation += 1
        generation = node.mem_generation
        self.kernel_lines(node, [Fault.NV_ERR_NO_MEMORY] * 3)

        def fall() -> None:
            started = time.monotonic()
            while node.mem_generation == generation and not self._stopped:
                left = MEM_AVAILABLE_BYTES - rate * (time.monotonic() - started)
                node.write_meminfo(int(max(floor, left)))
                time.sleep(0.2)

        threading.Thread(target=fall, name=f"mem-collapse-{node.name}", daemon=True).start()

    def mem_restore(self, node: LabNode) -> None:
        node.mem_generation += 1
        node.write_meminfo(MEM_AVAILABLE_BYTES)

    def pdu_silent(self, silent: bool = True) -> None:
        assert self.pdu is not None
        self.pdu.standin.silent = silent

    def inject(self, fault: str, node: LabNode | None = None) -> str:
        """Inject a fault by name (see FAULTS); returns what was done, for people."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
        if node is None and fault not in CLUSTER_FAULTS:
            names = ", ".join(n.name for n in self.nodes)
            raise ValueError(f"fault {fault} needs a node ({names})")
        target = node or self.head
        if fault == "freeze":
            self.freeze(target)
            return f"{target.name} froze: Xid 31 in its journal, then SIGSTOP of its whole tree"
        if fault == "thaw":
            self.thaw(target)
            return f"{target.name} thawed (SIGCONT)"
        if fault in ("wedge", "crash"):
            self.vllm_mode("wedged" if fault == "wedge" else "dead")
            return (
                f"{self.head.name}'s engine wedged: requests running, no step, /health 200"
                if fault == "wedge"
                else f"{self.head.name}'s engine died: /health answers 503"
            )
        if fault == "crash-exit":
            pid = self.crash_exit(target)
            if pid is None:
                raise ValueError(f"no vLLM rank runs on {target.name}")
            return f"{target.name}'s vLLM rank (pid {pid}) exited with code 0"
        if fault == "gpu-hang":
            self.gpu_hang(target)
            return f"{target.name}'s NVML calls hang (a wedged driver)"
        if fault == "mem-collapse":
            self.mem_collapse(target)
            return f"{target.name}'s MemAvailable falls {MEM_COLLAPSE_RATE / GIB:g} GiB/s"
        if fault == "pdu-down":
            self.pdu_silent(True)
            return "the PDU stopped answering SNMP"
        if fault == "partition":
            self.partition(target)
            return f"{target.name}'s network link went dark (its namespace's veth down)"
        self.heal(node)
        return "healed: " + (node.name if node is not None else "every node, serving and the PDU")

    def heal(self, node: LabNode | None = None) -> None:
        """Undo every fault that a power cycle would not (serving, PDU, freeze)."""
        for each in [node] if node is not None else self.nodes:
            if each.netns is not None:
                self.partition(each, cut=False)
            self.thaw(each)
            self.mem_restore(each)
            gpu_standin.write_mode(each.directory, "ok")
        if node is None:
            self.pdu_silent(False)
            with contextlib.suppress(requests.RequestException):
                self.vllm_mode("progressing")

    # -- tear-down ------------------------------------------------------------

    def stop(self) -> None:
        """Every process the lab started is gone afterwards."""
        self._stopped = True
        for node in self.nodes:
            node.mem_generation += 1
            self._signal_tree(node, signal.SIGKILL)
            if node.host is not None:
                node.host.power_off()
        if self.pdu is not None:
            self.pdu.stop()
        sweep(self.lab_id)
        self._remove_namespaces()

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def lab_processes(lab_id: str) -> list[psutil.Process]:
    """Every live process carrying this lab's tag, wherever it was reparented."""
    found = []
    me = os.getpid()
    for process in psutil.process_iter():
        if process.pid == me:
            continue
        with contextlib.suppress(psutil.Error):
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(LAB_ENV) == lab_id:
                found.append(process)
    return found


def sweep(lab_id: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL whatever of this lab is still alive (also stopped processes:
    SIGKILL ends them too); returns the pids that had to be killed."""
    leftovers = lab_processes(lab_id)
    for process in leftovers:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(leftovers, timeout=timeout)
    return [p.pid for p in leftovers]


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run([_IP, *args], capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def netns_unavailable() -> str | None:
    """Why this machine cannot give nodes network namespaces; None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth links)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"swlab-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", probe, check=False)
    return None
