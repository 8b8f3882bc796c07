"""Lines the lab adds to a running node's journal: a fault's kernel
messages, an orderly shutdown's. The cluster (lab/cluster.py) writes them as
it plays faults and reboots."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone

from spark_watchdog.lab.hardware.journal_writer import (
    FAULT_MESSAGES,
    BootTimeline,
    Fault,
    write_boot,
)
from spark_watchdog.lab.node import LabNode


def append_journal(node: LabNode, build: Callable[[BootTimeline], None]) -> None:
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


def append_kernel_lines(node: LabNode, faults: list[Fault]) -> None:
    """Each fault's kernel message, at error priority, in the running boot's journal."""

    def lines(timeline: BootTimeline) -> None:
        for fault in faults:
            timeline.kernel(FAULT_MESSAGES[fault], priority=3)

    append_journal(node, lines)
