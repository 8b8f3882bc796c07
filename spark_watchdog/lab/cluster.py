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

A node without power is dark: nothing answers at its address, so the lab
holds its SSH and agent ports while its outlet is off and a connection to
them times out (on loopback a free port would refuse, and a refusal is what a
live kernel sends). Short of a power cut, a node's services can be stopped
and started on their own (:meth:`LabNode.set_services`): a planned reboot
(:meth:`LabCluster.shut_down`, then :meth:`LabCluster.boot_again`) and a
wedged agent (:meth:`LabCluster.wedge_agent`) are played that way, and a
person can switch an outlet at the PDU itself (:meth:`LabCluster.switch_by_hand`).

A node's rank runs in one of three ways (``serving``, :data:`SERVING`): a
process the agent forks (``process``); a container the agent creates on a
dockerd of the lab's own (``docker``); or a container that a cluster launcher
started (``launcher``: the lab's ``launch-cluster``, playing spark-vllm-docker's
``launch-cluster.sh``), which the agent adopts and the controller restarts by
running the launcher's stop and start. A container's processes belong to its
node: a power cut kills them with the rest, a freeze stops them. The lab's one
dockerd stands for every node's own (a real power cut takes the node's dockerd
with it; here it stays up, and the container is left exited, as after a boot).

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
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog.lab.hardware import gpu_standin, lab_sshd
from spark_watchdog.lab.hardware.dockerd import Dockerd, DockerUnavailable, docker_unavailable
from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.hardware.journal_writer import (
    FAULT_MESSAGES,
    JOURNAL_STOP,
    LOGIND_SHUTDOWN,
    BootTimeline,
    Fault,
    write_boot,
)
from spark_watchdog.lab.hardware.lab_sshd import LabSshKeys
from spark_watchdog.lab.hardware.pdu_standin import (
    PduStandin,
    PduStandinThread,
    StandinConfig,
)
from spark_watchdog.lab.hardware.rank_image import RankImage, rank_image
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.hardware.sim_host import CLEAN_SHUTDOWN_MARK, SERVICES_ACK, SERVICES_FILE
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import PowerState, close_quietly
from spark_watchdog.power.snmp_profiles import profile_by_name

LOOPBACK = "127.0.0.1"
# Inherited by every process of a lab (nodes, ranks, NVML workers, the
# controller): how sweep() recognises them.
LAB_ENV = "SPARK_WATCHDOG_LAB"
# A real vLLM head takes 30-60 s to start here (model load, KV cache, warm-up);
# the limit leaves room for a loaded machine.
REAL_START_TIMEOUT_S = 420.0
GIB = 1024**3
# A GB10 as Linux sees it: ~119 GiB of its 128 GB unified memory in MemTotal;
# a serving node holds most of it (the model, the KV cache), MemFree sits near
# 1 GiB and MemAvailable is the headroom the host probe watches.
MEM_TOTAL_BYTES = 119 * GIB
MEM_AVAILABLE_BYTES = 36 * GIB
# How the lab starts a node's vLLM stand-in (python -m ...), and finds it again.
VLLM_STANDIN = "spark_watchdog.lab.hardware vllm"
MEM_COLLAPSE_RATE = 1 * GIB  # bytes/s, as seen before GB10 freezes (vllm #56824)
MEM_COLLAPSE_FLOOR = 1 * GIB
# MemAvailable once a collapsing rank is gone: the model and the KV cache are free.
MEM_RELEASED_BYTES = 100 * GIB
PDU_SWITCH_DELAY_S = 0.3
# The lab's off hold. The PDU's own outlet reboot is shorter, so a lab cycle
# is a plain one (the PDU cannot time it: doctor and the record say so); a
# test lengthens the reboot to stage a self-timed cycle.
LAB_POWER_OFF_S = 2.0
LAB_PDU_REBOOT_S = 1.0
# Seconds without power that clear a GPU clock latch in the lab (on a GB10:
# minutes; docs/facts.md, "Clock latch").
LAB_LATCH_CLEAR_S = 6.0
LAB_LATCH_OFF_S = 8.0
# How long a forced reboot keeps the host dark before its boot starts.
FORCED_REBOOT_DARK_S = 2.0
# How long the lab keeps trying to hold a dark node's port (the killed
# processes' sockets take a moment to go).
DARK_BIND_S = 5.0
# Addresses of nodes in network namespaces: TEST-NET-2, point-to-point /30 links.
NETNS_PREFIX = "198.51.100"
_IP = shutil.which("ip") or "/usr/sbin/ip"

# How a node's rank runs (LabCluster.serving; `spark-watchdog lab ... --serving`).
SERVING: dict[str, str] = {
    "process": "a process the agent forks (serving.runtime: process)",
    "docker": "a container the agent creates on the lab's dockerd (serving.runtime: docker)",
    "launcher": "containers a cluster launcher starts (the lab's launch-cluster, playing "
    "spark-vllm-docker's launch-cluster.sh); the agents adopt them, the controller "
    "restarts serving through the launcher (serving.launcher: command)",
}
# Where a containerized lab keeps its dockerd: a short path (a socket's path
# must fit in a sockaddr_un), not under the lab's own directory.
DOCKERD_PREFIX = "swlab-dk-"

# Fault names accepted by LabCluster.inject (and `spark-watchdog lab inject`).
FAULTS: dict[str, str] = {
    "freeze": "SIGSTOP the node's whole process tree (Xid 31 lines first): the silent freeze",
    "thaw": "SIGCONT the node's tree (undo freeze without power)",
    "wedge": "the head's engine stops stepping while requests run; /health stays 200",
    "crash": "the head's /health answers 503 (EngineDeadError)",
    "crash-exit": "the head's vLLM rank exits with code 0 (vllm #53726)",
    "idle-wedge": "the head's engine hangs while idle: nothing runs, no step, new requests wait",
    "gpu-hang": "the node's NVML calls block (a wedged driver)",
    "clock-latch": "the node's GPU clock latches (702 MHz under load) and the node reboots",
    "mem-collapse": "the node's MemAvailable falls 1 GiB/s toward 1 GiB",
    "pdu-down": "the PDU stops answering SNMP (its management card is down)",
    "partition": "the node's network link goes dark (network namespaces: lab up --netns)",
    "heal": "undo wedge/crash, gpu-hang, clock-latch, mem-collapse, pdu-down and freeze",
}
# Faults about the serving head or the whole lab: the node argument is optional.
CLUSTER_FAULTS = frozenset({"wedge", "crash", "crash-exit", "idle-wedge", "pdu-down", "heal"})


@dataclass
class LabTimings:
    """Short, but in the production ratios (poll : freeze_after : off time)."""

    loop_interval: float = 0.5
    vllm_interval: float = 0.5
    stall_after: float = 4.0
    boot_seconds: float = 1.0
    gpu_interval: float = 1.0  # production 2 s, deadline 3 s
    gpu_deadline: float = 1.5
    # An idle head gets a canary soon: an idle hang shows in seconds
    # (production: a 5 s timeout after 10 s idle).
    canary_timeout: float = 2.0
    canary_idle_after: float = 2.0


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
    # The real sshd of the host (lab_sshd), for the controller's forced reboot; None
    # where this machine has no sshd.
    sshd_port: int | None = None
    # With network namespaces: the node's namespace and the host end of its link.
    netns: str | None = None
    veth: str | None = None
    link: str | None = None  # the node's end of the veth pair, inside its namespace
    host: HostProcess | None = None
    boots: int = 0
    # Bumped by each mem-collapse and each boot: an older collapse thread stops.
    mem_generation: int = 0
    mem_lowest: int = 0  # the lowest MemAvailable of the last mem-collapse
    forced_reboots: int = 0  # forced reboots acted out (lab_sshd)
    rebooting_forced: bool = False
    # The GPU clock latch: survives a reboot, cleared only by LAB_LATCH_CLEAR_S
    # without power (the lab's "minutes without AC").
    clock_latched: bool = False
    powered_off_at: float | None = None  # monotonic, while its outlet is off
    # The generation of the last services.json the lab wrote (see sim_host).
    services_generation: int = 0
    # While its outlet is off: the sockets that keep its SSH and agent ports dark.
    dark_ports: list[socket.socket] = field(default_factory=list, repr=False)
    dark_generation: int = 0
    _dark_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # The stand-in for a wedged agent, while one serves this node's agent port.
    frozen_agent: FrozenAgent | None = field(default=None, repr=False)
    # The next boot follows a planned shutdown (for the lab's own narration).
    planned_reboot: bool = False
    # Its rank is the real vLLM CPU server (the head, with --vllm real).
    real_vllm: bool = False

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
        if self.real_vllm:
            return RealHead.process_match(self.address, self.vllm_port)
        return f"{VLLM_STANDIN} --host {self.address} --port {self.vllm_port}"

    def boot_id(self) -> str | None:
        path = self.directory / "proc/sys/kernel/random/boot_id"
        try:
            return path.read_text().strip().replace("-", "")
        except OSError:
            return None

    def set_services(self, *, agent: bool, ssh: bool, timeout: float = 30.0) -> None:
        """Stop or start the node's agent and SSH stand-in without touching its
        power, as systemd does on a live host: a stopped agent got SIGTERM and
        exited, a stopped SSH stand-in's port refuses connections. Returns once
        the host has done it (see :mod:`spark_watchdog.lab.hardware.sim_host`)."""
        pid = None if self.host is None else self.host.pid
        if pid is None:
            raise RuntimeError(f"{self.name} is not running (no power, or halted)")
        self.services_generation += 1
        generation = self.services_generation
        wanted = self.directory / SERVICES_FILE
        tmp = wanted.with_name(SERVICES_FILE + ".tmp")
        tmp.write_text(json.dumps({"generation": generation, "agent": agent, "ssh": ssh}))
        os.replace(tmp, wanted)
        os.kill(pid, signal.SIGUSR1)
        ack = self.directory / SERVICES_ACK
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if int(ack.read_text()) >= generation:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not set agent={agent}, ssh={ssh} within {timeout:g}s")

    def go_dark(self) -> None:
        """Power is gone: from now on nothing answers at the node's SSH and
        agent ports (a connection times out), as at the address of a machine
        without power. In the background: the killed processes' sockets take
        a moment to go. Nodes in a network namespace are left as they are
        (the lab cannot bind their address)."""
        if self.netns is not None:
            return
        with self._dark_lock:
            self.dark_generation += 1
            generation = self.dark_generation
        threading.Thread(
            target=self._hold_dark, args=(generation,), name=f"dark-{self.name}", daemon=True
        ).start()

    def _hold_dark(self, generation: int) -> None:
        deadline = time.monotonic() + DARK_BIND_S
        for port in (self.ssh_port, self.agent_port):
            while True:
                with self._dark_lock:
                    if self.dark_generation != generation:
                        return  # power came back meanwhile
                    try:
                        self.dark_ports += _dark_port(self.address, port)
                        break
                    except OSError:
                        pass
                if time.monotonic() >= deadline:
                    break  # left refusing, as before the lab held dark ports
                time.sleep(0.05)

    def light_up(self) -> None:
        """Power is back: the ports are free for the booting host."""
        with self._dark_lock:
            self.dark_generation += 1
            for sock in self.dark_ports:
                with contextlib.suppress(OSError):
                    sock.close()
            self.dark_ports.clear()

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


def _dark_port(address: str, port: int) -> list[socket.socket]:
    """A listener on ``address:port`` whose accept queue is full and never
    drained: the kernel drops further SYNs, so a client's connect times out,
    as to a dark host. The filler and the listener, to close later."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, port))
        listener.listen(0)  # an accept queue of one
    except OSError:
        listener.close()
        raise
    held = [listener]
    # The one queued connection: ours. Should a client's SYN have come first,
    # its connection fills the queue instead and ours times out: dark all the same.
    with contextlib.suppress(OSError):
        held.insert(0, socket.create_connection((address, port), timeout=0.5))
    return held


class FrozenAgent:
    """A node's agent whose loop is wedged, as the controller sees it: every
    GET /v1/state answers HTTP 200 with the same snapshot (same ``seq``, same
    boot id, same start time), forever; other paths answer 404.

    The real agent cannot be wedged this way from outside: its HTTP threads
    serve what its loop last published, and a signal stops or ends the whole
    process, threads and all. So the lab stops the real agent (SIGTERM) and
    serves its last snapshot, frozen, on the agent's port, in the lab's own
    process; :meth:`LabCluster.unwedge_agent` starts the real agent again.
    """

    def __init__(self, address: str, port: int, state: bytes, bind_timeout: float = 10.0) -> None:
        body = state

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] == "/v1/state":
                    status, payload = 200, body
                else:
                    status, payload = 404, b'{"error": "not found"}'
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Connection", "close")
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        deadline = time.monotonic() + bind_timeout
        while True:
            try:
                self.server = ThreadingHTTPServer((address, port), Handler)
                break
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name=f"frozen-agent-{port}", daemon=True
        )

    def start(self) -> FrozenAgent:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(5)
        self.server.server_close()


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
    # The nodes read this machine's own /proc/meminfo instead of a lab file
    # (a soak judges the memory guard on real memory); mem-collapse is refused.
    host_memory: bool = False
    # Called (from a lab thread) with each outlet change and boot, for a timeline.
    on_event: Callable[[str], None] | None = None
    # The head's rank: the lab's stand-in, or the real vLLM CPU server (the
    # build from scripts/real_vllm_env.py; RealVllmMissing at start if none).
    vllm: str = "standin"
    real_head: RealHead | None = None
    ssh_keys: LabSshKeys | None = None
    # How each node's rank runs (SERVING); docker and launcher need root and dockerd.
    serving_mode: str = "process"
    dockerd: Dockerd | None = None
    image: RankImage | None = None
    _stopped: bool = False

    # -- set-up -------------------------------------------------------------

    def start(self) -> LabCluster:
        self._check_serving()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.vllm == "real":
            self.real_head = RealHead.prepare()
        elif self.vllm != "standin":
            raise ValueError(f"vllm must be standin or real, not {self.vllm!r}")
        self._start_docker()
        self.token_file = self._secret("serving-token", secrets.token_hex(16))
        self.community_file = self._secret("pdu-community", "lab-write")
        self._install_nvml_standin()
        if lab_sshd.unavailable() is None:
            self.ssh_keys = LabSshKeys.create(self.root / "ssh")
        for i in range(self.size):
            self.nodes.append(self._make_node(i))
        if self.serving_mode == "launcher":
            self._write_launcher_recipe()
        standin = PduStandin(
            StandinConfig(
                profile=profile_by_name(self.vendor),
                outlets=max(8, self.size),
                names={n.outlet: n.name for n in self.nodes},
                write_community="lab-write",
                # A relay behind a management card takes a moment to switch.
                switch_delay=PDU_SWITCH_DELAY_S,
                reboot_seconds=LAB_PDU_REBOOT_S,
            ),
            on_change=self._outlet_changed,
        )
        self.pdu = PduStandinThread(standin).start()
        for node in self.nodes:
            assert node.host is not None
            node.host.power_on()
        if self.ssh_keys is not None:
            threading.Thread(target=self._watch_reboots, name="lab-reboots", daemon=True).start()
        return self

    def _check_serving(self) -> None:
        """What ``serving_mode`` cannot be combined with, before anything starts."""
        if self.serving_mode not in SERVING:
            expected = ", ".join(SERVING)
            raise ValueError(f"--serving must be one of {expected}, not {self.serving_mode!r}")
        if self.serving_mode == "process":
            return
        if self.netns:
            raise ValueError(
                f"--serving {self.serving_mode} runs the ranks on this machine's own network; "
                "the nodes' network namespaces (lab up --netns, the partition scenario) "
                "need --serving process"
            )
        if self.vllm != "standin":
            raise ValueError(
                f"--serving {self.serving_mode} runs the lab's vLLM stand-in in containers; "
                "with --vllm real use --serving process"
            )

    def _start_docker(self) -> None:
        """The lab's dockerd and the ranks' image, for ``serving`` docker and launcher."""
        if self.serving_mode == "process":
            return
        why = docker_unavailable()
        if why is not None:
            raise DockerUnavailable(f"--serving {self.serving_mode}: {why}")
        # Kept before it starts: stop() stops a dockerd that never answered, too.
        self.dockerd = Dockerd(Path(tempfile.mkdtemp(prefix=DOCKERD_PREFIX)))
        self.dockerd.start()
        with contextlib.closing(self.dockerd.client()) as client:
            self.image = rank_image(client)

    def container_name(self, node: LabNode) -> str:
        """The container of the node's rank (with serving docker or launcher)."""
        return f"vllm_{node.name}"

    @property
    def launcher_recipe(self) -> Path:
        return self.root / "launch-cluster.json"

    def _write_launcher_recipe(self) -> None:
        """What the lab's launch-cluster starts on each node (its recipe)."""
        assert self.dockerd is not None and self.image is not None
        recipe = {
            "socket": str(self.dockerd.socket),
            "image": self.image.tag,
            "volumes": list(self.image.volumes),
            "environment": self._rank_environment(),
            "nodes": [
                {
                    "name": n.name,
                    "container": self.container_name(n),
                    "command": self._rank_command(n),
                    "labels": {"spark-watchdog.lab": self.lab_id},
                }
                for n in self.nodes
            ],
        }
        self.launcher_recipe.write_text(json.dumps(recipe, indent=2))

    def launcher_argv(self, action: str) -> list[str]:
        """The lab's launch-cluster, as a person (or the controller) runs it."""
        return [
            sys.executable,
            "-m",
            "spark_watchdog.lab.hardware",
            "launch-cluster",
            "--recipe",
            str(self.launcher_recipe),
            action,
        ]

    def _rank_environment(self) -> dict[str, str]:
        # The lab's tag: sweep() finds a container's processes like any other.
        return {LAB_ENV: self.lab_id, "PYTHONDONTWRITEBYTECODE": "1"}

    def _container_tree(self, node: LabNode) -> list[psutil.Process]:
        """The processes of the node's rank container, as this machine sees them."""
        if self.dockerd is None:
            return []
        import docker.errors  # the docker extra: there when a dockerd runs

        try:
            with contextlib.closing(self.dockerd.client(timeout=5)) as client:
                attrs = client.api.inspect_container(self.container_name(node))
        except (docker.errors.DockerException, requests.RequestException, OSError):
            return []
        pid = int((attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return []
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _stop_docker(self) -> None:
        if self.dockerd is None:
            return
        import docker.errors

        gone = (docker.errors.DockerException, requests.RequestException, OSError)
        with contextlib.suppress(*gone), contextlib.closing(self.dockerd.client()) as client:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        self.dockerd.stop()
        self.dockerd.unmount()
        shutil.rmtree(self.dockerd.root, ignore_errors=True)

    def _watch_reboots(self) -> None:
        """Act out each forced reboot a node's sshd was asked for (lab_sshd)."""
        while not self._stopped:
            for node in self.nodes:
                command = lab_sshd.take_request(node.directory)
                if command is not None and not self._stopped:
                    if "halt" in command:
                        self._event(f"{node.name}: halt requested over ssh")
                        self.shut_down(node)  # and stays down: no boot_again
                        node.go_dark()  # halted: its ports time out, like a frozen machine
                    else:
                        self.forced_reboot(node)
            time.sleep(0.2)

    def forced_reboot(self, node: LabNode) -> None:
        """sysrq's restart: the host drops at once (its ports go dark, nothing
        says goodbye) and boots again with a new boot id, the outlet untouched."""
        assert node.host is not None
        if self._stopped:
            return
        self._event(f"{node.name}: forced reboot requested over ssh: the host drops now")
        self._stop_frozen_agent(node)
        self._signal_tree(node, signal.SIGKILL)
        node.host.power(PowerState.OFF)
        node.go_dark()
        node.forced_reboots += 1
        node.rebooting_forced = True

        def come_back() -> None:
            if not self._stopped:
                node.light_up()  # before the boot, which binds the ports again
                assert node.host is not None
                node.host.power(PowerState.ON)

        timer = threading.Timer(FORCED_REBOOT_DARK_S, come_back)
        timer.daemon = True
        timer.start()

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
            "spark_watchdog.lab.hardware",
            "host",
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
        # The lab machine's own uptime, load and memory pressure (PSI, where its
        # kernel has it); meminfo is the node's own (written below).
        for entry in ("uptime", "loadavg", "pressure"):
            link = directory / "proc" / entry
            if not link.exists() and not link.is_symlink() and (Path("/proc") / entry).exists():
                link.symlink_to(Path("/proc") / entry)
        node = LabNode(
            name=name,
            outlet=index + 1,
            directory=directory,
            agent_port=free_port(),
            ssh_port=free_port(),
            vllm_port=free_port(),
            head=index == 0,
            real_vllm=index == 0 and self.real_head is not None,
        )
        if self.netns:
            self._make_namespace(node, index)
        (directory / "host.json").write_text(
            json.dumps({"name": name, "address": node.address, "ssh_port": node.ssh_port})
        )
        (directory / lab_sshd.CONFIG).unlink(missing_ok=True)
        (directory / lab_sshd.REQUEST).unlink(missing_ok=True)
        if self.ssh_keys is not None:
            node.sshd_port = free_port()
            self.ssh_keys.add_node(directory, node.address, node.sshd_port)
        (directory / "agent.yaml").write_text(yaml.safe_dump(self._agent_config(node)))
        # A file, not a link to /proc/meminfo: mem-collapse rewrites it
        # (unless the lab runs on the machine's own memory).
        meminfo = directory / "proc" / "meminfo"
        meminfo.unlink(missing_ok=True)
        if self.host_memory:
            meminfo.symlink_to("/proc/meminfo")
        # A lab directory used before: no stale service requests or marks.
        for stale in (SERVICES_FILE, SERVICES_ACK, CLEAN_SHUTDOWN_MARK):
            (directory / stale).unlink(missing_ok=True)
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
        """What a power cycle clears: the GPU's hang, the memory pressure; a
        clock latch only after LAB_LATCH_CLEAR_S without power (a reboot or a
        short cut leaves it)."""
        node.mem_generation += 1
        if not self.host_memory:
            node.write_meminfo(MEM_AVAILABLE_BYTES)
        off_at, node.powered_off_at = node.powered_off_at, None
        if node.clock_latched and (off_at is None or time.monotonic() - off_at < LAB_LATCH_CLEAR_S):
            gpu_standin.write_mode(node.directory, "latched")
            return
        node.clock_latched = False
        gpu_standin.write_mode(node.directory, "ok")

    def _booted(self, node: LabNode, pid: int) -> None:
        node.boots += 1
        if node.boots > 1:
            self._reset_hardware(node)
            how = "restarting after its shutdown" if node.planned_reboot else "powered on"
            if node.rebooting_forced:
                how = "restarting after its forced reboot"
            node.planned_reboot = node.rebooting_forced = False
            self._event(f"{node.name} {how}: booting (boot {node.boots})")

    def _event(self, text: str) -> None:
        if self.on_event is not None and not self._stopped:
            with contextlib.suppress(Exception):
                self.on_event(text)

    def _rank_command(self, node: LabNode) -> list[str]:
        """The stand-in rank's command line; in a container, this machine's Python bound in."""
        rank = ["--headless"] if not node.head else []
        python = self.image.python if self.image is not None else sys.executable
        return [
            python,
            "-m",
            *VLLM_STANDIN.split(),
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

    def _agent_config(self, node: LabNode) -> dict[str, Any]:
        t = self.timings
        command = self._rank_command(node)
        environment: dict[str, str] = {}
        stop_timeout = 5.0
        if node.real_vllm and self.real_head is not None:
            command = self.real_head.command(node.address, node.vllm_port)
            environment = self.real_head.environment()
            stop_timeout = 15.0
        serving: dict[str, Any] = {
            "enabled": True,
            "command": command,
            "token_file": str(self.token_file),
            "log_file": str(node.directory / "serving.log"),
            "stop_timeout": stop_timeout,
            "default_profile": "plain",
            "environment": environment,
        }
        if self.dockerd is not None and self.image is not None:
            docker_settings: dict[str, Any] = {
                "socket": str(self.dockerd.socket),
                "name": self.container_name(node),
                "gpus": "none",
            }
            if self.serving_mode == "docker":
                docker_settings.update(image=self.image.tag, volumes=list(self.image.volumes))
                serving["environment"] = self._rank_environment()
            else:  # the launcher's container, adopted: its own spec is re-created
                del serving["command"], serving["environment"]
            serving.update(runtime="docker", docker=docker_settings)
        return {
            "node": node.name,
            "listen": {"address": node.address, "port": node.agent_port},
            "loop_interval": t.loop_interval,
            "probes": {
                "vllm": {
                    "url": node.vllm_url if node.head else None,
                    "interval": t.vllm_interval,
                    "timeout": 2.0 if node.real_vllm else 1.0,
                    "stall_after": t.stall_after,
                    # Without it a rank that exited 0 only looks "unreachable".
                    "process_match": node.process_match,
                    "canary": {"timeout": t.canary_timeout, "idle_after": t.canary_idle_after},
                },
                "gpu": {"interval": t.gpu_interval, "deadline": t.gpu_deadline},
                "journal": {"directory": str(node.directory / "journal"), "interval": 5.0},
                "host": {"proc_root": str(node.directory / "proc")},
            },
            "serving": serving,
        }

    def _outlet_changed(self, outlet: int, state: PowerState) -> None:
        for node in self.nodes:
            if node.outlet == outlet and node.host is not None:
                if state is PowerState.OFF:
                    node.powered_off_at = time.monotonic()
                    self._stop_frozen_agent(node)  # a wedged agent dies with the rest
                    self._signal_tree(node, signal.SIGKILL)
                    self._event(f"{node.name} lost power (outlet {outlet} off): tree killed")
                    node.host.power(state)
                    node.go_dark()
                else:
                    node.light_up()  # before the boot, which binds the ports again
                    node.host.power(state)

    def tree(self, node: LabNode) -> list[psutil.Process]:
        """Every process of the simulated host, including the vLLM rank the
        agent launched in a session of its own: a power cut takes them all."""
        if node.pgid is None:
            return []
        try:
            root = psutil.Process(node.pgid)
            host = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            host = []
        return host + self._container_tree(node)

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
                        },
                        *self._ssh_devices(n),
                    ],
                }
                for n in self.nodes
            ],
            "policy": {
                "power_off_seconds": LAB_POWER_OFF_S,
                # Long enough to clear the lab's clock latch (LAB_LATCH_CLEAR_S).
                "clock_latch_off_seconds": LAB_LATCH_OFF_S,
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
                "gpu_wedged_after": 6.0,
            },
            "guards": {"boot_timeout": 30.0},
            "serving": {
                "head": self.nodes[0].name,
                "token_file": str(self.token_file),
                "start_timeout": REAL_START_TIMEOUT_S if self.real_head else 30.0,
                **self._launcher_settings(),
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

    def _launcher_settings(self) -> dict[str, Any]:
        """With serving launcher: the controller restarts serving with the lab's
        launch-cluster, the profile's flags appended to its start."""
        if self.serving_mode != "launcher":
            return {}
        return {
            "launcher": {
                "type": "command",
                "stop": self.launcher_argv("stop"),
                "start": [*self.launcher_argv("start"), "{vllm_args}"],
                "stop_timeout": 60.0,
                "start_timeout": 60.0,
            }
        }

    def _ssh_devices(self, node: LabNode) -> list[dict[str, Any]]:
        keys = self.ssh_keys
        if keys is None or node.sshd_port is None:
            return []
        return [
            {
                "type": "ssh",
                "host": node.address,
                "port": node.sshd_port,
                "user": keys.user,
                "key_file": str(keys.client),
                "known_hosts_file": str(keys.known_hosts),
                "connect_timeout": 2.0,
            }
        ]

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
        """Until every node's agent answers; at once an error where a node's
        agent exited, or its host is off (switch it on first)."""
        deadline = time.monotonic() + timeout
        pending = list(self.nodes)
        while pending and time.monotonic() < deadline:
            for node in list(pending):
                with contextlib.suppress(requests.RequestException):
                    if requests.get(f"{node.agent_url}/v1/state", timeout=1).ok:
                        pending.remove(node)
            time.sleep(0.2)
            if any(_host_ended(n) for n in pending):
                break  # its agent exited (it says why in its log): no use waiting
        if pending:
            raise TimeoutError(
                f"agents not up: {', '.join(n.name for n in pending)}"
                + "".join(_agent_log_tail(n) for n in pending)
            )

    def serving(self, profile: str = "plain") -> LabCluster:
        """Every agent up, then serving started: what most tests begin from."""
        self.wait_agents()
        self.start_serving(profile)
        return self

    def start_serving(self, profile: str = "plain", timeout: float | None = None) -> None:
        """Workers first, then the head (docs/facts.md, "Multi-node serving"); wait
        for progress. A real head steps only with requests: the lab's traffic starts
        with it."""
        if self.serving_mode == "launcher":
            self._launch(profile)
        else:
            for node in self.nodes[1:] + self.nodes[:1]:
                self._post(node, "/v1/serving/start", {"profile": profile})
        head = self.nodes[0]
        if self.real_head is not None:
            self.real_head.start_traffic(head.vllm_url)
        if timeout is None:
            timeout = REAL_START_TIMEOUT_S if self.real_head is not None else 60.0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException, ValueError, KeyError):
                state = requests.get(f"{head.agent_url}/v1/state", timeout=1).json()
                if state["probes"]["vllm"]["state"] == "progressing":
                    return
            time.sleep(0.3)
        raise TimeoutError("serving did not start progressing")

    def _launch(self, profile: str) -> None:
        """The operator's first start with the cluster's launcher (the recipe's
        own flags: profile plain); the agents adopt the containers it starts."""
        if profile != "plain":
            raise ValueError("--serving launcher: the launcher starts the recipe (profile plain)")
        done = subprocess.run(
            self.launcher_argv("start"),
            capture_output=True,
            text=True,
            timeout=120,
            env=self.environment(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"launch-cluster start exited {done.returncode}: {done.stderr}")
        for node in self.nodes:
            self._wait_adopted(node)

    def _wait_adopted(self, node: LabNode, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException, ValueError):
                answer = requests.get(f"{node.agent_url}/v1/serving", timeout=2).json()
                if answer.get("state") == "running":
                    return
            time.sleep(0.2)
        raise TimeoutError(f"{node.name}'s agent did not adopt {self.container_name(node)}")

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
        def lines(timeline: BootTimeline) -> None:
            for fault in faults:
                timeline.kernel(FAULT_MESSAGES[fault], priority=3)

        self._append_journal(node, lines)

    def _append_journal(self, node: LabNode, build: Callable[[BootTimeline], None]) -> None:
        """Append lines to the running boot's journal, stamped now, 10 ms apart.

        Their monotonic clock counts from the boot (the boot id file's time),
        as the kernel's does, so lines appended later sort after earlier ones
        (sd-journal orders one boot's entries by it).
        """
        boot_id = node.boot_id()
        if boot_id is None:
            return
        path = node.directory / "proc/sys/kernel/random/boot_id"
        try:
            since_boot = max(0.0, time.time() - path.stat().st_mtime)
        except OSError:
            since_boot = 0.0
        step = timedelta(milliseconds=10)
        timeline = BootTimeline(boot_id, datetime.now(timezone.utc), hostname=node.name, step=step)
        build(timeline)
        base = int(since_boot * 1_000_000)
        entries = [replace(e, monotonic_usec=e.monotonic_usec + base) for e in timeline.entries]
        if entries:
            write_boot(node.directory / "journal", entries)

    def switch(self, node: LabNode, on: bool) -> None:
        """Switch a node's outlet over real SNMP, as an operator at the PDU would."""
        import asyncio

        from spark_watchdog.config.controller import SnmpDevice
        from spark_watchdog.config.secrets import read_secret
        from spark_watchdog.power.base import PowerTiming, VerifiedPower
        from spark_watchdog.power.snmp import build_snmp_backend

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
                await close_quietly(backend)

        asyncio.run(go())

    def switch_by_hand(self, node: LabNode, on: bool, timeout: float = 10.0) -> None:
        """A person switches the node's outlet at the PDU itself (front panel,
        web page): no SNMP, so no SET is recorded; the node loses or gets power
        as after any switch. Returns once the PDU reads the new state."""
        assert self.pdu is not None
        standin = self.pdu.standin
        wanted = PowerState.ON if on else PowerState.OFF
        self._event(f"a person switches outlet {node.outlet} ({node.name}) {wanted.value} by hand")
        self.pdu.call(lambda: standin.switch_by_hand(node.outlet, on))
        deadline = time.monotonic() + timeout
        while standin.state(node.outlet) is not wanted:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"outlet {node.outlet} did not switch {wanted.value}")
            time.sleep(0.05)

    def shut_down(self, node: LabNode) -> None:
        """The first half of a planned reboot, as it looks from outside; the
        outlet stays on and nothing goes through the PDU.

        sshd and the agent stop (SIGTERM: the agent exits; the SSH port then
        refuses connections), the journal records an orderly shutdown ending
        in journald's "Journal stopped", and the host halts: what is left of
        the boot (the vLLM rank, which the agent leaves running) is killed.
        Until :meth:`boot_again` nothing listens on the node's ports: on
        loopback they refuse, like a host between its sshd stopping and its
        reboot.
        """
        assert node.host is not None
        doomed = self.tree(node)  # the rank too, while the agent is still its parent
        node.set_services(agent=False, ssh=False)
        self._append_journal(node, _shutdown_lines)
        for process in doomed:
            with contextlib.suppress(psutil.Error):
                process.kill()
        node.host.power_off()  # the host process, reaped
        psutil.wait_procs(doomed, timeout=5)
        (node.directory / CLEAN_SHUTDOWN_MARK).write_text("")
        node.planned_reboot = True
        self._event(f"{node.name} shut down for a reboot (outlet {node.outlet} still on)")

    def boot_again(self, node: LabNode) -> None:
        """The second half of a planned reboot: the host starts again after
        ``boot_seconds`` with a new boot id, a new journal file (its previous
        boot ended cleanly) and its agent and SSH stand-in running."""
        assert node.host is not None
        node.host.power_on()

    def wedge_agent(self, node: LabNode) -> dict[str, Any]:
        """Replace the node's agent by a :class:`FrozenAgent` serving its
        current snapshot; the host and its SSH stand-in carry on. Returns the
        frozen snapshot."""
        if node.netns is not None:
            raise ValueError("wedge_agent needs nodes on loopback (not lab up --netns)")
        if node.frozen_agent is not None:
            raise ValueError(f"{node.name}'s agent is already wedged")
        answer = requests.get(f"{node.agent_url}/v1/state", timeout=5)
        answer.raise_for_status()
        snapshot = answer.json()
        node.set_services(agent=False, ssh=True)
        node.frozen_agent = FrozenAgent(node.address, node.agent_port, answer.content).start()
        return snapshot if isinstance(snapshot, dict) else {}

    def unwedge_agent(self, node: LabNode) -> None:
        """The frozen stand-in goes, the real agent starts again (same boot)."""
        self._stop_frozen_agent(node)
        node.set_services(agent=True, ssh=True)

    def _stop_frozen_agent(self, node: LabNode) -> None:
        frozen, node.frozen_agent = node.frozen_agent, None
        if frozen is not None:
            frozen.stop()

    def vllm_mode(self, mode: str) -> None:
        """The stand-in head's mode (nothing for a real head)."""
        head = self.nodes[0]
        if head.real_vllm:
            return
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

    def clock_latch(self, node: LabNode) -> None:
        """The node's GPU latches its clock (702 MHz under load) and the node
        reboots, as after the fault: its agent's post-boot check finds it."""
        node.clock_latched = True
        gpu_standin.write_mode(node.directory, "latched")
        self.shut_down(node)
        self.boot_again(node)

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
        """MemAvailable falls ``rate`` bytes/s toward ``floor`` while the node's
        rank lives (a thread rewrites meminfo); once the rank is gone its memory
        comes back (MEM_RELEASED_BYTES), as it does when a rank's process ends.
        ``node.mem_lowest`` keeps the lowest MemAvailable written."""
        if self.host_memory:
            raise ValueError("mem-collapse rewrites a lab meminfo: not with host_memory")
        node.mem_generation += 1
        generation = node.mem_generation
        node.mem_lowest = MEM_AVAILABLE_BYTES
        self.kernel_lines(node, [Fault.NV_ERR_NO_MEMORY] * 3)

        def fall() -> None:
            started = time.monotonic()
            while node.mem_generation == generation and not self._stopped:
                if not self.rank_alive(node):
                    node.write_meminfo(MEM_RELEASED_BYTES)
                    self._event(f"{node.name}'s rank is gone: its memory is free again")
                    return
                left = int(max(floor, MEM_AVAILABLE_BYTES - rate * (time.monotonic() - started)))
                node.mem_lowest = min(node.mem_lowest, left)
                node.write_meminfo(left)
                time.sleep(0.2)

        threading.Thread(target=fall, name=f"mem-collapse-{node.name}", daemon=True).start()

    def rank_alive(self, node: LabNode) -> bool:
        """Whether a live process of the node's tree is its vLLM rank."""
        for process in self.tree(node):
            with contextlib.suppress(psutil.Error):
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                if node.process_match in " ".join(process.cmdline()):
                    return True
        return False

    def mem_restore(self, node: LabNode) -> None:
        node.mem_generation += 1
        if not self.host_memory:  # the machine's own memory is not the lab's to restore
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
        if self.real_head is not None and fault in ("wedge", "crash", "idle-wedge"):
            return self._real_fault(fault)
        if fault == "idle-wedge":
            self.vllm_mode("hung")
            return (
                f"{self.head.name}'s engine hung while idle: nothing running, no step, "
                "new requests wait, /health 200"
            )
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
        if fault == "clock-latch":
            self.clock_latch(target)
            return f"{target.name}'s GPU clock latched; {target.name} rebooted"
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

    def _real_fault(self, fault: str) -> str:
        """wedge, crash and idle-wedge played on the real head's engine process."""
        assert self.real_head is not None
        head = self.head
        if fault == "crash":
            pid = self.real_head.signal_engine(head.address, head.vllm_port, signal.SIGKILL)
            return f"{head.name}'s real engine (VLLM::EngineCore, pid {pid}) killed"
        if fault == "idle-wedge":
            self.real_head.stop_traffic()
            self._wait_head_idle()
        pid = self.real_head.signal_engine(head.address, head.vllm_port, signal.SIGSTOP)
        what = "idle: nothing running" if fault == "idle-wedge" else "requests running"
        return f"{head.name}'s real engine (VLLM::EngineCore, pid {pid}) stopped, {what}"

    def _wait_head_idle(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.agent_state(self.head) or {}
            vllm = state.get("probes", {}).get("vllm", {})
            if vllm.get("state") == "idle":
                return
            time.sleep(0.3)
        raise TimeoutError(f"{self.head.name}'s real vLLM did not go idle")

    def heal(self, node: LabNode | None = None) -> None:
        """Undo every fault that a power cycle would not (serving, PDU, freeze)."""
        for each in [node] if node is not None else self.nodes:
            if each.netns is not None:
                self.partition(each, cut=False)
            self.thaw(each)
            self.mem_restore(each)
            each.clock_latched = False
            gpu_standin.write_mode(each.directory, "ok")
        if node is None:
            self.pdu_silent(False)
            with contextlib.suppress(requests.RequestException):
                self.vllm_mode("progressing")
            if self.real_head is not None:
                head = self.head
                with contextlib.suppress(ValueError, psutil.Error):
                    self.real_head.signal_engine(head.address, head.vllm_port, signal.SIGCONT)
                self.real_head.start_traffic(head.vllm_url)

    # -- tear-down ------------------------------------------------------------

    def stop(self) -> None:
        """Every process the lab started is gone afterwards."""
        self._stopped = True
        for node in self.nodes:
            node.mem_generation += 1
            with contextlib.suppress(Exception):
                self._stop_frozen_agent(node)
            self._signal_tree(node, signal.SIGKILL)
            if node.host is not None:
                node.host.power_off()
            node.light_up()
        if self.real_head is not None:
            # After the trees: a request stuck on a stopped engine now fails at once.
            self.real_head.stop_traffic(wait=1.0)
        if self.pdu is not None:
            self.pdu.stop()
        self._stop_docker()
        sweep(self.lab_id)
        self._remove_namespaces()

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host_ended(node: LabNode) -> bool:
    return node.host is not None and node.host.ended


def _agent_log_tail(node: LabNode, lines: int = 5) -> str:
    """The last lines an agent logged: why it did not come up, when it said."""
    try:
        with (node.directory / "agent.log").open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    tail = text.strip().splitlines()[-lines:]
    return "".join(f"\n  {node.name}: {line}" for line in tail)


def _shutdown_lines(boot: BootTimeline) -> None:
    """How a reboot ends a boot's journal: logind, PID 1, systemd-shutdown,
    then journald's "Journal stopped" (what makes a boot's end clean)."""
    boot.add(
        "System is rebooting.",
        transport="journal",
        identifier="systemd-logind",
        message_id=LOGIND_SHUTDOWN,
        pid=980,
    )
    boot.add("Stopped spark-watchdog-agent.service.", transport="journal", identifier="systemd")
    boot.add("Shutting down.", transport="journal", identifier="systemd", pid=1)
    boot.add("Syncing filesystems and block devices.", identifier="systemd-shutdown", pid=1)
    boot.journald("Received SIGTERM from PID 1 (systemd-shutdown).")
    boot.journald("Journal stopped", JOURNAL_STOP)


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
