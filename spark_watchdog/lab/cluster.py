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
(:meth:`HostLife.shut_down`, then :meth:`HostLife.boot_again`) and a wedged
agent (:meth:`HostLife.wedge_agent`) are played that way (``LabCluster.hosts``,
lab/host_life.py, with the power cuts and forced reboots), and a person can
switch an outlet at the PDU itself (:meth:`LabCluster.switch_by_hand`).

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
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from spark_watchdog.lab import agent_calls, faults, mgmt_switch, netns
from spark_watchdog.lab.colocated import Colocation
from spark_watchdog.lab.faults import CLUSTER_FAULTS as CLUSTER_FAULTS
from spark_watchdog.lab.faults import FAULTS as FAULTS
from spark_watchdog.lab.faults import MEM_COLLAPSE_RATE as MEM_COLLAPSE_RATE
from spark_watchdog.lab.hardware import gpu_standin, lab_sshd
from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.hardware.journal_writer import Fault
from spark_watchdog.lab.hardware.lab_sshd import LabSshKeys
from spark_watchdog.lab.hardware.pdu_standin import (
    PduStandinThread,
)
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.host_life import HostLife
from spark_watchdog.lab.host_tree import (
    host_tree,
    live_rank,
    signal_processes,
    terminate_rank,
)
from spark_watchdog.lab.lab_configs import LAB_LATCH_CLEAR_S as LAB_LATCH_CLEAR_S
from spark_watchdog.lab.lab_configs import LAB_LATCH_OFF_S as LAB_LATCH_OFF_S
from spark_watchdog.lab.lab_configs import LAB_PDU_REBOOT_S as LAB_PDU_REBOOT_S
from spark_watchdog.lab.lab_configs import LAB_POWER_OFF_S as LAB_POWER_OFF_S
from spark_watchdog.lab.lab_configs import REAL_START_TIMEOUT_S as REAL_START_TIMEOUT_S
from spark_watchdog.lab.lab_configs import LabTimings as LabTimings
from spark_watchdog.lab.lab_configs import agent_config, controller_config, rank_command
from spark_watchdog.lab.lab_pdu import outlet_commands, start_pdu, switch_over_snmp, wait_for_outlet
from spark_watchdog.lab.netns import Link
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.node_hardware import MEM_COLLAPSE_FLOOR as MEM_COLLAPSE_FLOOR
from spark_watchdog.lab.node_hardware import MEM_RELEASED_BYTES as MEM_RELEASED_BYTES
from spark_watchdog.lab.node_hardware import collapse_memory, reset_hardware, restore_memory
from spark_watchdog.lab.node_journal import append_kernel_lines
from spark_watchdog.lab.node_setup import (
    host_argv,
    install_nvml_standin,
    join_fabric,
    lab_environment,
    lay_out_node,
    write_secret,
)
from spark_watchdog.lab.rank_containers import RankContainers, check_serving
from spark_watchdog.lab.sweep import LAB_ENV as LAB_ENV
from spark_watchdog.lab.sweep import lab_processes as lab_processes
from spark_watchdog.lab.sweep import sweep
from spark_watchdog.power.base import PowerState


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
    # Each node in a network namespace of its own, with a management link and a
    # fabric link (root only; see netns_unavailable): what partitions need.
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
    colocation: Colocation | None = None  # controllers on the nodes (lab/colocated.py)
    _stopped: bool = False
    # Each node's host going down and coming back (lab/host_life.py).
    hosts: HostLife = field(init=False)

    def __post_init__(self) -> None:
        self.hosts = HostLife(
            self.nodes, self.tree, self._event, lambda: self._stopped, self.host_memory
        )

    # -- set-up -------------------------------------------------------------

    def start(self) -> LabCluster:
        check_serving(self.serving_mode, netns=self.netns, vllm=self.vllm)
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
        self.token_file = write_secret(self.root, "serving-token", secrets.token_hex(16))
        self.community_file = write_secret(self.root, "pdu-community", "lab-write")
        install_nvml_standin(self.root)
        if lab_sshd.unavailable() is None:
            self.ssh_keys = LabSshKeys.create(self.root / "ssh")
        if self.colocation is not None:  # before the nodes: their management switch
            self.colocation.wire(self.lab_id[:6], self.netns)
        for i in range(self.size):
            self.nodes.append(self._make_node(i))
        if self.netns:  # the second link: agents pulse their peers, the ranks step over it
            join_fabric(self.nodes, self.lab_id[:6], self._agent_config)
        if self.containers is not None and self.serving_mode == "launcher":
            self.containers.write_recipe(self.nodes, self._rank_command)
        gateway = None if self.colocation is None else mgmt_switch.GATEWAY
        self.pdu = start_pdu(self.vendor, self.nodes, self.hosts.outlet_changed, gateway)
        if self.colocation is not None:
            self.colocation.configure(self)
        for node in self.nodes:
            assert node.host is not None
            node.host.power_on()
        if self.ssh_keys is not None:
            reboots = self.hosts.watch_reboots
            threading.Thread(target=reboots, name="lab-reboots", daemon=True).start()
        return self

    def environment(self) -> dict[str, str]:
        """The environment of every process the lab starts (lab/node_setup.py)."""
        return lab_environment(self.root, self.lab_id)

    def _make_node(self, index: int) -> LabNode:
        node = lay_out_node(
            self.root,
            index,
            lab_id=self.lab_id,
            in_netns=self.netns,
            real_head=self.real_head is not None,
            ssh_keys=self.ssh_keys,
            host_memory=self.host_memory,
            agent_config=self._agent_config,
            colocation=self.colocation,
        )
        reset_hardware(node, self.host_memory)
        node.host = HostProcess(
            host_argv(node, self.environment()),
            boot_seconds=self.timings.boot_seconds,
            on_boot=functools.partial(self.hosts.booted, node),
        )
        return node

    def partition(self, node: LabNode, cut: bool = True, link: Link = "both") -> None:
        """Cut (or restore) the node's management or fabric link, or both (lab/netns.py)."""
        netns.set_link(node, up=not cut, link=link)

    def _event(self, text: str) -> None:
        if self.on_event is not None and not self._stopped:
            with contextlib.suppress(Exception):
                self.on_event(text)

    def _rank_command(self, node: LabNode) -> list[str]:
        return rank_command(self, node)

    def _agent_config(self, node: LabNode) -> dict[str, Any]:
        return agent_config(self, node)

    def tree(self, node: LabNode) -> list[psutil.Process]:
        """Every process of the simulated host, its rank's container's too."""
        return host_tree(node, self.containers)

    def _signal_tree(self, node: LabNode, sig: signal.Signals) -> None:
        signal_processes(self.tree(node), sig)

    # -- the controller's view ------------------------------------------------

    def controller_config(self, history: Path, **overrides: Any) -> dict[str, Any]:
        return controller_config(self, history, overrides)

    # -- serving and faults ---------------------------------------------------

    def _post(self, node: LabNode, path: str, body: dict[str, Any] | None = None) -> Any:
        assert self.token_file is not None
        return agent_calls.post_to_agent(node, self.token_file, path, body)

    def wait_agents(self, timeout: float = 60.0) -> None:
        """Until every node's agent answers (lab/agent_calls.py)."""
        agent_calls.wait_agents(self.nodes, timeout)

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
        agent_calls.wait_progressing(head, timeout)

    def agent_state(self, node: LabNode) -> dict[str, Any] | None:
        return agent_calls.agent_state(node)

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
        append_kernel_lines(node, faults)

    def switch(self, node: LabNode, on: bool) -> None:
        """Switch a node's outlet over real SNMP, as an operator at the PDU would."""
        assert self.pdu is not None and self.community_file is not None
        switch_over_snmp(self.pdu.port, self.community_file, node.outlet, on, self.pdu.standin.host)

    def switch_by_hand(self, node: LabNode, on: bool, timeout: float = 10.0) -> None:
        """A person switches the node's outlet at the PDU itself (front panel,
        web page): no SNMP, so no SET is recorded; the node loses or gets power
        as after any switch. Returns once the PDU reads the new state."""
        assert self.pdu is not None
        standin = self.pdu.standin
        wanted = PowerState.ON if on else PowerState.OFF
        self._event(f"a person switches outlet {node.outlet} ({node.name}) {wanted.value} by hand")
        self.pdu.call(lambda: standin.switch_by_hand(node.outlet, on))
        wait_for_outlet(standin, node.outlet, wanted, timeout)

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
        return outlet_commands(self.pdu.standin, since)

    def crash_exit(self, node: LabNode | None = None) -> int | None:
        """The rank exits with code 0 (vLLM can, after an illegal memory access:
        vllm #53726): SIGTERM, which the stand-in answers by exiting cleanly."""
        node = node or self.head
        return terminate_rank(node, self.tree(node))

    def clock_latch(self, node: LabNode) -> None:
        """The node's GPU latches its clock (702 MHz under load) and the node
        reboots, as after the fault: its agent's post-boot check finds it."""
        node.clock_latched = True
        gpu_standin.write_mode(node.directory, "latched")
        self.hosts.shut_down(node)
        self.hosts.boot_again(node)

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
        rank lives; once the rank is gone its memory comes back
        (lab/node_hardware.py). ``node.mem_lowest`` keeps the lowest written."""
        if self.host_memory:
            raise ValueError("mem-collapse rewrites a lab meminfo: not with host_memory")
        collapse_memory(
            node,
            rate,
            floor,
            rank_alive=lambda: self.rank_alive(node),
            running=lambda: not self._stopped,
            event=self._event,
        )

    def rank_alive(self, node: LabNode) -> bool:
        """Whether a live process of the node's tree is its vLLM rank."""
        return live_rank(node, self.tree(node))

    def mem_restore(self, node: LabNode) -> None:
        restore_memory(node, self.host_memory)

    def pdu_silent(self, silent: bool = True) -> None:
        assert self.pdu is not None
        self.pdu.standin.silent = silent

    def inject(self, fault: str, node: LabNode | None = None) -> str:
        """Inject a fault by name (lab/faults.py); returns what was done, for people."""
        return faults.inject(self, fault, node)

    def heal(self, node: LabNode | None = None) -> None:
        """Undo every fault that a power cycle would not (serving, PDU, freeze)."""
        faults.heal(self, node)

    # -- tear-down ------------------------------------------------------------

    def stop(self) -> None:
        """Every process the lab started is gone afterwards."""
        self._stopped = True
        for node in self.nodes:
            node.mem_generation += 1
            with contextlib.suppress(Exception):
                self.hosts.stop_frozen_agent(node)
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
        if self.colocation is not None:
            self.colocation.stop()

    def __enter__(self) -> LabCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
