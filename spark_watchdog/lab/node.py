"""One simulated Spark as the lab holds it (:class:`LabNode`): its addresses
and ports, its power-cut darkness, its meminfo, its services; and the stand-in
for a wedged agent (:class:`FrozenAgent`). The cluster (lab/cluster.py) makes
and drives them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.hardware.sim_host import SERVICES_ACK, SERVICES_FILE

LOOPBACK = "127.0.0.1"
GIB = 1024**3
# A GB10 as Linux sees it: ~119 GiB of its 128 GB unified memory in MemTotal;
# a serving node holds most of it (the model, the KV cache), MemFree sits near
# 1 GiB and MemAvailable is the headroom the host probe watches.
MEM_TOTAL_BYTES = 119 * GIB
MEM_AVAILABLE_BYTES = 36 * GIB
# How the lab starts a node's vLLM stand-in (python -m ...), and finds it again.
VLLM_STANDIN = "spark_watchdog.lab.hardware vllm"
# How long the lab keeps trying to hold a dark node's port (the killed
# processes' sockets take a moment to go).
DARK_BIND_S = 5.0


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
    # With the fabric (lab/fabric.py): the node's address on it, its fabric
    # link inside its namespace, and the namespace of the switch it is plugged into.
    fabric_address: str | None = None
    fabric_link: str | None = None
    fabric_switch: str | None = None
    # With controllers on the nodes: the management switch it is plugged into
    # (lab/mgmt_switch.py); None: its management link ends on the lab machine.
    mgmt_switch: str | None = None
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
    def fabric_agent_url(self) -> str | None:
        """The agent on the fabric, where its peers pulse it; None without a fabric."""
        if self.fabric_address is None:
            return None
        return f"http://{self.fabric_address}:{self.agent_port}"

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
    process; :meth:`HostLife.unwedge_agent` (lab/host_life.py) starts the real
    agent again.
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
