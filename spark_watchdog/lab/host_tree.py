"""A lab node's processes: its host's process tree and its rank's container,
which a power cut, a freeze or a forced reboot all reach (lab/cluster.py)."""

from __future__ import annotations

import contextlib
import signal

import psutil

from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.rank_containers import RankContainers


def host_tree(node: LabNode, containers: RankContainers | None) -> list[psutil.Process]:
    """Every process of the simulated host, including the vLLM rank the
    agent launched in a session of its own: a power cut takes them all."""
    if node.pgid is None:
        return []
    try:
        root = psutil.Process(node.pgid)
        host = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        host = []
    return host + (containers.tree(node) if containers is not None else [])


def signal_processes(processes: list[psutil.Process], sig: signal.Signals) -> None:
    """``sig`` to each process still there."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            process.send_signal(sig)


def live_rank(node: LabNode, processes: list[psutil.Process]) -> bool:
    """Whether a live process (no zombie) of ``processes`` is the node's vLLM rank."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            if node.process_match in " ".join(process.cmdline()):
                return True
    return False


def terminate_rank(node: LabNode, processes: list[psutil.Process]) -> int | None:
    """SIGTERM to the first of ``processes`` that is the node's vLLM rank; its pid."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if node.process_match in " ".join(process.cmdline()):
                process.terminate()
                return int(process.pid)
    return None


def halt_host(host: HostProcess, doomed: list[psutil.Process]) -> None:
    """The host halts: what is left of its boot (``doomed``) is killed, the
    host process reaped, and the killed processes waited for."""
    for process in doomed:
        with contextlib.suppress(psutil.Error):
            process.kill()
    host.power_off()  # the host process, reaped
    psutil.wait_procs(doomed, timeout=5)
