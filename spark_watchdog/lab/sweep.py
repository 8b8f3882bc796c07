"""Every process of a lab carries ``SPARK_WATCHDOG_LAB=<lab id>`` in its
environment (nodes, ranks, NVML workers, containers' processes, the
controller): :func:`sweep` finds and kills whatever of a lab is still alive,
wherever it was reparented."""

from __future__ import annotations

import contextlib
import os

import psutil

# Inherited by every process of a lab: how sweep() recognises them.
LAB_ENV = "SPARK_WATCHDOG_LAB"


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
