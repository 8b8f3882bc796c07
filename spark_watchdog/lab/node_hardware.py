"""A lab node's hardware state, as faults and power cycles leave it: the
GPU stand-in's mode, a clock latch, the node's MemAvailable (its ``meminfo``,
which a collapse rewrites). The cluster (lab/cluster.py) plays them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.hardware.journal_writer import Fault
from spark_watchdog.lab.lab_configs import LAB_LATCH_CLEAR_S
from spark_watchdog.lab.node import GIB, MEM_AVAILABLE_BYTES, LabNode
from spark_watchdog.lab.node_journal import append_kernel_lines

MEM_COLLAPSE_FLOOR = 1 * GIB
# MemAvailable once a collapsing rank is gone: the model and the KV cache are free.
MEM_RELEASED_BYTES = 100 * GIB


def reset_hardware(node: LabNode, host_memory: bool) -> None:
    """What a power cycle clears: the GPU's hang, the memory pressure; a
    clock latch only after LAB_LATCH_CLEAR_S without power (a reboot or a
    short cut leaves it)."""
    node.mem_generation += 1
    if not host_memory:
        node.write_meminfo(MEM_AVAILABLE_BYTES)
    off_at, node.powered_off_at = node.powered_off_at, None
    if node.clock_latched and (off_at is None or time.monotonic() - off_at < LAB_LATCH_CLEAR_S):
        gpu_standin.write_mode(node.directory, "latched")
        return
    node.clock_latched = False
    gpu_standin.write_mode(node.directory, "ok")


def restore_memory(node: LabNode, host_memory: bool) -> None:
    """A collapse ends; the node's MemAvailable is back where it was."""
    node.mem_generation += 1
    if not host_memory:  # the machine's own memory is not the lab's to restore
        node.write_meminfo(MEM_AVAILABLE_BYTES)


def collapse_memory(
    node: LabNode,
    rate: float,
    floor: float,
    *,
    rank_alive: Callable[[], bool],
    running: Callable[[], bool],
    event: Callable[[str], None],
) -> None:
    """The driver's NV_ERR_NO_MEMORY lines reach the journal, then a thread
    lowers MemAvailable ``rate`` bytes/s toward ``floor`` while
    ``rank_alive()`` (and the lab is ``running()``); once the rank is gone
    its memory comes back (MEM_RELEASED_BYTES). ``node.mem_lowest`` keeps the
    lowest MemAvailable written. A newer collapse or a reset ends it."""
    node.mem_generation += 1
    generation = node.mem_generation
    node.mem_lowest = MEM_AVAILABLE_BYTES
    append_kernel_lines(node, [Fault.NV_ERR_NO_MEMORY] * 3)

    def fall() -> None:
        started = time.monotonic()
        while node.mem_generation == generation and running():
            if not rank_alive():
                node.write_meminfo(MEM_RELEASED_BYTES)
                event(f"{node.name}'s rank is gone: its memory is free again")
                return
            left = int(max(floor, MEM_AVAILABLE_BYTES - rate * (time.monotonic() - started)))
            node.mem_lowest = min(node.mem_lowest, left)
            node.write_meminfo(left)
            time.sleep(0.2)

    threading.Thread(target=fall, name=f"mem-collapse-{node.name}", daemon=True).start()
