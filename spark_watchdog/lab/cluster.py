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
takes any of them by name; :data:`FAULTS` (lab/faults.py) lists them.

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
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog.lab import faults, netns
from spark_watchdog.lab.faults import CLUSTER_FAULTS as CLUSTER_FAULTS
from spark_watchdog.lab.faults import FAULTS as FAULTS
from spark_watchdog.lab.faults import MEM_COLLAPSE_RATE as MEM_COLLAPSE_RATE
from spark_watchdog.lab.hardware import gpu_standin, lab_sshd
from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.hardware.journal_writer import (
    FAULT_MESSAGES,
    BootTimeline,
    Fault,
    shutdown_lines,
    write_boot,
)
from spark_watchdog.lab.hardware.lab_sshd import LabSshKeys
from spark_watchdog.lab.hardware.pdu_standin import (
    PduStandin,
    PduStandinThread,
    StandinConfig,
)
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.hardware.sim_host import CLEAN_SHUTDOWN_MARK, SERVICES_ACK, SERVICES_FILE
from spark_watchdog.lab.lab_configs import LAB_LATCH_CLEAR_S as LAB_LATCH_CLEAR_S
from spark_watchdog.lab.lab_configs import LAB_LATCH_OFF_S as LAB_LATCH_OFF_S
from spark_watchdog.lab.lab_configs import LAB_PDU_REBOOT_S as LAB_PDU_REBOOT_S
from spark_watchdog.lab.lab_configs import LAB_POWER_OFF_S as LAB_POWER_OFF_S
from spark_watchdog.lab.lab_configs import REAL_START_TIMEOUT_S as REAL_START_TIMEOUT_S
from spark_watchdog.lab.lab_configs import LabTimings as LabTimings
from spark_watchdog.lab.lab_configs import agent_config, controller_config, rank_command
from spark_watchdog.lab.node import (
    GIB,
    LOOPBACK,
    MEM_AVAILABLE_BYTES,
    FrozenAgent,
    LabNode,
)
from spark_watchdog.lab.ports import free_port
from spark_watchdog.lab.rank_containers import SERVING, RankContainers, serving_conflict
from spark_watchdog.lab.sweep import LAB_ENV as LAB_ENV
from spark_watchdog.lab.sweep import lab_processes as lab_processes
from spark_watchdog.lab.sweep import sweep
from spark_watchdog.power.base import PowerState, close_quietly
from spark_watchdog.power.snmp_profiles import profile_by_name

MEM_COLLAPSE_FLOOR = 1 * GIB
# MemAvailable once a collapsing rank is gone: the model and the KV cache are free.
MEM_RELEASED_BYTES = 100 * GIB
PDU_SWITCH_DELAY_S = 0.3
# How long a forced reboot keeps the host dark before its boot starts.
FORCED_REBOOT_DARK_S = 2.0


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
    containers: RankContainers | None = None
    _stopped: bool = False

    # -- set-up -------------------------------------------------------------

    def start(self) -> LabCluster:
        self._check_serving()
        self.root.mkdir(parents=True, exist_ok=True)
        if self.vllm == "real":
            self.real_head = RealHead.prepare()
        elif self.vllm != "standin":
            raise ValueError(f"vllm must be standin or real, not {self.vllm!r}")
        if self.serving_mode != "process":
            self.containers = RankContainers(
                self.serving_mode, (LAB_ENV, self.lab_id), self.root / "launch-cluster.json"
            )
            self.containers.start()
        self.token_file = self._secret("serving-token", secrets.token_hex(16))
        self.community_file = self._secret("pdu-community", "lab-write")
        self._install_nvml_standin()
        if lab_sshd.unavailable() is None:
            self.ssh_keys = LabSshKeys.create(self.root / "ssh")
        for i in range(self.size):
            self.nodes.append(self._make_node(i))
        if self.containers is not None and self.serving_mode == "launcher":
            self.containers.write_recipe(self.nodes, self._rank_command)
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
        conflict = serving_conflict(self.serving_mode, netns=self.netns, vllm=self.vllm)
        if conflict is not None:
            raise ValueError(conflict)

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
        inside = [netns.IP, "netns", "exec", node.netns] if node.netns else []
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
            netns.make_namespace(node, index, self.lab_id[:6])
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

    def partition(self, node: LabNode, cut: bool = True) -> None:
        """Cut (or restore) the node's link (lab/netns.py)."""
        netns.set_link(node, up=not cut)

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
        return rank_command(self, node)

    def _agent_config(self, node: LabNode) -> dict[str, Any]:
        return agent_config(self, node)

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
        return host + (self.containers.tree(node) if self.containers is not None else [])

    def _signal_tree(self, node: LabNode, sig: signal.Signals) -> None:
        for process in self.tree(node):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                process.send_signal(sig)

    # -- the controller's view ------------------------------------------------

    def controller_config(self, history: Path, **overrides: Any) -> dict[str, Any]:
        return controller_config(self, history, overrides)

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
        if self.containers is not None and self.serving_mode == "launcher":
            if profile != "plain":
                raise ValueError("--serving launcher: the launcher starts the recipe (plain)")
            self.containers.launch(self.nodes, self.environment())
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
        from spark_watchdog.power.snmp_outlet import build_snmp_backend

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
        self._append_journal(node, shutdown_lines)
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
        """Inject a fault by name (lab/faults.py); returns what was done, for people."""
        return faults.inject(self, fault, node)

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
        if self.containers is not None:
            self.containers.stop()
        sweep(self.lab_id)
        netns.remove_namespaces(self.nodes)

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
