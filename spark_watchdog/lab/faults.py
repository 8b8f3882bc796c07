"""The faults the lab injects by name (:data:`FAULTS`; ``spark-watchdog lab
inject``, the scenarios): :func:`inject` plays each on the cluster's nodes
through lab/cluster.py's own means (signals, the stand-ins' modes, the PDU).
Their names are the fault menu's (spark_watchdog/fault_menu.py), which the
simulation uses too."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any, Protocol

import psutil
import requests

from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.hardware.journal_writer import Fault
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.netns import Link
from spark_watchdog.lab.node import GIB, LabNode

MEM_COLLAPSE_RATE = 1 * GIB  # bytes/s, as seen before GB10 freezes (vllm #56824)

# Fault names accepted by LabCluster.inject (and `spark-watchdog lab inject`).
FAULTS: dict[str, str] = {
    "freeze": "SIGSTOP the node's whole process tree (Xid 31 lines first): the silent freeze",
    "thaw": "SIGCONT the node's tree (undo freeze without power)",
    "wedge": "the head's engine stops stepping while requests run; /health stays 200",
    "crash": "the head's /health answers 503 (EngineDeadError)",
    "crash-exit": "the head's vLLM rank exits with code 0 (vllm #53726)",
    "idle-wedge": "the head's engine hangs while idle: nothing runs, no step, new requests wait",
    "gpu-hang": "the node's NVML calls block (a wedged driver)",
    "xid": "the node's GPU reports Xid 31 (an MMU fault) live; its rank's CUDA context is gone",
    "clock-latch": "the node's GPU clock latches (702 MHz under load) and the node reboots",
    "mem-collapse": "the node's MemAvailable falls 1 GiB/s toward 1 GiB",
    "pdu-down": "the PDU stops answering SNMP (its management card is down)",
    "partition": "the node's links go dark, management and fabric (lab up --netns)",
    "mgmt-partition": "the node's management link goes dark, its fabric up (lab up --netns)",
    "fabric-partition": "the node's fabric link goes dark, its management up (lab up --netns)",
    "heal": "undo wedge/crash, gpu-hang, clock-latch, mem-collapse, pdu-down, freeze, partitions",
}
# The partitions: which of the node's links each cuts (lab/netns.py).
PARTITIONS: dict[str, tuple[Link, str]] = {
    "partition": ("both", "links, management and fabric, went"),
    "mgmt-partition": ("management", "management link went"),
    "fabric-partition": ("fabric", "fabric link went"),
}
# Faults of the head's engine, while its rank runs on.
ENGINE_FAULTS = frozenset({"wedge", "crash", "idle-wedge"})
# Faults about the serving head or the whole lab: the node argument is optional.
CLUSTER_FAULTS = frozenset({"wedge", "crash", "crash-exit", "idle-wedge", "pdu-down", "heal"})


class Faultable(Protocol):
    """The cluster the faults are played on (lab/cluster.py's LabCluster)."""

    nodes: list[LabNode]
    real_head: RealHead | None

    @property
    def head(self) -> LabNode: ...

    def freeze(self, node: LabNode, with_kernel_lines: bool = ...) -> None: ...

    def thaw(self, node: LabNode) -> None: ...

    def vllm_mode(self, mode: str) -> None: ...

    def crash_exit(self, node: LabNode | None = ...) -> int | None: ...

    def gpu_hang(self, node: LabNode, hang: bool = ...) -> None: ...

    def kernel_lines(self, node: LabNode, faults: list[Fault]) -> None: ...

    def clock_latch(self, node: LabNode) -> None: ...

    def mem_collapse(self, node: LabNode, rate: float = ..., floor: float = ...) -> None: ...

    def pdu_silent(self, silent: bool = ...) -> None: ...

    def partition(self, node: LabNode, cut: bool = ..., link: Link = ...) -> None: ...

    def heal(self, node: LabNode | None = ...) -> None: ...

    def mem_restore(self, node: LabNode) -> None: ...

    def agent_state(self, node: LabNode) -> dict[str, Any] | None: ...


def inject(lab: Faultable, fault: str, node: LabNode | None = None) -> str:
    """Inject a fault by name (see FAULTS); returns what was done, for people."""
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
    if node is None and fault not in CLUSTER_FAULTS:
        names = ", ".join(n.name for n in lab.nodes)
        raise ValueError(f"fault {fault} needs a node ({names})")
    target = node or lab.head
    if fault == "freeze":
        lab.freeze(target)
        return f"{target.name} froze: Xid 31 in its journal, then SIGSTOP of its whole tree"
    if fault == "thaw":
        lab.thaw(target)
        return f"{target.name} thawed (SIGCONT)"
    if fault in ENGINE_FAULTS:
        return _engine_fault(lab, fault)
    if fault == "crash-exit":
        pid = lab.crash_exit(target)
        if pid is None:
            raise ValueError(f"no vLLM rank runs on {target.name}")
        return f"{target.name}'s vLLM rank (pid {pid}) exited with code 0"
    if fault == "gpu-hang":
        lab.gpu_hang(target)
        return f"{target.name}'s NVML calls hang (a wedged driver)"
    if fault == "xid":
        # The driver's kernel line, and the event NVML delivers to its waiters.
        lab.kernel_lines(target, [Fault.XID_31])
        gpu_standin.inject_xid(target.directory, 31)
        return f"{target.name}'s GPU reported Xid 31 (an MMU fault)"
    if fault == "clock-latch":
        lab.clock_latch(target)
        return f"{target.name}'s GPU clock latched; {target.name} rebooted"
    if fault == "mem-collapse":
        lab.mem_collapse(target)
        return f"{target.name}'s MemAvailable falls {MEM_COLLAPSE_RATE / GIB:g} GiB/s"
    if fault == "pdu-down":
        lab.pdu_silent(True)
        return "the PDU stopped answering SNMP"
    if fault in PARTITIONS:
        link, what = PARTITIONS[fault]
        lab.partition(target, link=link)
        return f"{target.name}'s {what} dark (down in its namespace)"
    lab.heal(node)
    return "healed: " + (node.name if node is not None else "every node, serving and the PDU")


def _engine_fault(lab: Faultable, fault: str) -> str:
    """wedge, crash and idle-wedge: the head's engine, the stand-in's or the real one."""
    if lab.real_head is not None:
        return _real_fault(lab, fault)
    if fault == "idle-wedge":
        lab.vllm_mode("hung")
        return (
            f"{lab.head.name}'s engine hung while idle: nothing running, no step, "
            "new requests wait, /health 200"
        )
    lab.vllm_mode("wedged" if fault == "wedge" else "dead")
    return (
        f"{lab.head.name}'s engine wedged: requests running, no step, /health 200"
        if fault == "wedge"
        else f"{lab.head.name}'s engine died: /health answers 503"
    )


def _real_fault(lab: Faultable, fault: str) -> str:
    """wedge, crash and idle-wedge played on the real head's engine process."""
    assert lab.real_head is not None
    head = lab.head
    if fault == "crash":
        pid = lab.real_head.signal_engine(head.address, head.vllm_port, signal.SIGKILL)
        return f"{head.name}'s real engine (VLLM::EngineCore, pid {pid}) killed"
    if fault == "idle-wedge":
        lab.real_head.stop_traffic()
        _wait_head_idle(lab)
    pid = lab.real_head.signal_engine(head.address, head.vllm_port, signal.SIGSTOP)
    what = "idle: nothing running" if fault == "idle-wedge" else "requests running"
    return f"{head.name}'s real engine (VLLM::EngineCore, pid {pid}) stopped, {what}"


def _wait_head_idle(lab: Faultable, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = lab.agent_state(lab.head) or {}
        vllm = state.get("probes", {}).get("vllm", {})
        if vllm.get("state") == "idle":
            return
        time.sleep(0.3)
    raise TimeoutError(f"{lab.head.name}'s real vLLM did not go idle")


def heal(lab: Faultable, node: LabNode | None = None) -> None:
    """Undo every fault that a power cycle would not (serving, PDU, freeze):
    on ``node``, or on every node and the serving head and the PDU."""
    for each in [node] if node is not None else lab.nodes:
        if each.netns is not None:
            lab.partition(each, cut=False)
        lab.thaw(each)
        lab.mem_restore(each)
        each.clock_latched = False
        gpu_standin.write_mode(each.directory, "ok")
    if node is None:
        lab.pdu_silent(False)
        with contextlib.suppress(requests.RequestException):
            lab.vllm_mode("progressing")
        if lab.real_head is not None:
            head = lab.head
            with contextlib.suppress(ValueError, psutil.Error):
                lab.real_head.signal_engine(head.address, head.vllm_port, signal.SIGCONT)
            lab.real_head.start_traffic(head.vllm_url)
