"""The controller beside a vLLM rank, for the benchmarks: the weight its unit
gives it (systemd/spark-watchdog-controller.service), a CPU hog standing for
the rank, and the controller lowered to that weight. The figures:
docs/benchmarks.md, "The controller beside the rank".

On a Spark the rank and the controller are units of their own, weighed by
the cgroup CPU controller (``CPUWeight=``); a plain machine has no such
units, so the bench lowers the controller's nice value to the unit's
``Nice=`` and, where the kernel groups each session (autogroup), its
session's nice value too: nice 10 against nice 0 weighs about a tenth,
less than ``CPUWeight=20`` against the rank's 100 (a fifth), so the bench
is the harder case. Each busy process of the hog runs in a session of its
own, as each of a rank's processes would weigh in a container's cgroup.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

UNIT = Path(__file__).resolve().parents[1] / "systemd" / "spark-watchdog-controller.service"
AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")
BUSY = "while True:\n    pass\n"


@dataclass(frozen=True)
class UnitWeight:
    """What the controller's unit says about its share of the machine."""

    nice: int
    cpu_weight: int | None
    io_weight: int | None


def unit_weight(unit: Path = UNIT) -> UnitWeight:
    """``Nice=``, ``CPUWeight=`` and ``IOWeight=`` of the unit (0 and None when unset)."""
    text = unit.read_text()

    def value(key: str) -> int | None:
        found = re.findall(rf"^{key}=(-?\d+)\s*$", text, re.M)
        return int(found[-1]) if found else None

    return UnitWeight(value("Nice") or 0, value("CPUWeight"), value("IOWeight"))


def lower_priority(pid: int, nice: int, settle: float = 0.2) -> dict[str, Any]:
    """Every thread of ``pid`` at ``nice`` (threads started later inherit it
    from the one that starts them), and its session's autogroup too where
    the kernel has one. Returns what was done, read back from the kernel."""
    process = psutil.Process(pid)
    done: set[int] = set()
    while True:  # a thread started while we renice the others: round again
        tids = {t.id for t in process.threads()} - done
        if not tids:
            break
        for tid in tids:
            with contextlib.suppress(ProcessLookupError):
                os.setpriority(os.PRIO_PROCESS, tid, nice)
        done |= tids
        time.sleep(settle)
    autogroup = Path(f"/proc/{pid}/autogroup")
    grouped = AUTOGROUP_SWITCH.exists() and AUTOGROUP_SWITCH.read_text().strip() == "1"
    if grouped and autogroup.exists():
        autogroup.write_text(str(nice))
    niceness = {os.getpriority(os.PRIO_PROCESS, t.id) for t in process.threads()}
    return {
        "pid": pid,
        "nice": nice,
        "threads_nice": sorted(niceness),
        "autogroup": autogroup.read_text().strip() if grouped and autogroup.exists() else None,
    }


@dataclass
class CpuHog:
    """One busy process per core at the bench's own priority (normal), each in
    a session of its own: every core loaded, as a rank loading them would."""

    processes: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    _children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _started: float = 0.0
    _cpu: float = 0.0

    def start(self) -> CpuHog:
        for _ in range(self.processes):
            self._children.append(
                subprocess.Popen(
                    [sys.executable, "-c", BUSY], stdin=subprocess.DEVNULL, start_new_session=True
                )
            )
        self._started = time.monotonic()
        return self

    def pids(self) -> list[int]:
        return [child.pid for child in self._children]

    def cores_busy(self) -> float:
        """The hog's CPU time so far over its wall time, in cores."""
        wall = time.monotonic() - self._started
        cpu = self._cpu
        for child in self._children:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(child.pid).cpu_times()
                cpu += times.user + times.system
        return cpu / wall if wall > 0 else 0.0

    def stop(self) -> dict[str, Any]:
        busy = self.cores_busy()
        for child in self._children:
            child.kill()
        for child in self._children:
            child.wait(10)
        self._children.clear()
        return {"processes": self.processes, "cores_busy": round(busy, 2)}

    @contextlib.contextmanager
    def running(self) -> Iterator[CpuHog]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


@dataclass
class RankLoad:
    """The detection bench's load: the hog on every core and the controller at
    its unit's weight, for as long as the lab runs its faults."""

    weight: UnitWeight = field(default_factory=unit_weight)
    processes: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    # What each lab saw: the controller's priority read back, the hog's load.
    seen: list[dict[str, Any]] = field(default_factory=list)

    @contextlib.contextmanager
    def beside(self, controller_pid: int | None) -> Iterator[None]:
        if controller_pid is None:
            raise RuntimeError("the controller runs in this process: it cannot be lowered alone")
        record = {"controller": lower_priority(controller_pid, self.weight.nice)}
        hog = CpuHog(self.processes).start()
        try:
            yield
        finally:
            record["hog"] = hog.stop()
            self.seen.append(record)

    def describe(self) -> str:
        """One line: the load the controller ran beside, as measured."""
        lines = [
            f"beside a CPU hog of {self.processes} busy processes: "
            f"{r['hog']['cores_busy']:.2f} cores busy on average; the controller's threads "
            f"at nice {r['controller']['threads_nice']}, its session's autogroup "
            f"{r['controller']['autogroup'] or 'none'} (unit: Nice={self.weight.nice}, "
            f"CPUWeight={self.weight.cpu_weight})"
            for r in self.seen
        ]
        return "\n".join(lines)

    def settings(self) -> dict[str, Any]:
        return {
            "hog_processes": self.processes,
            "controller_nice": self.weight.nice,
            "unit_cpu_weight": self.weight.cpu_weight,
            "seen": self.seen,
        }
