"""The tools of the benches that put the controller beside a vLLM rank: the
weight its unit gives it, the CPU hog, and the controller lowered to that
weight."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from bench._beside_rank import CpuHog, lower_priority, unit_weight

# Threads started at once and one started a second later, from a thread
# lowered by then: it must inherit the lowered priority.
THREADS = """import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
time.sleep(1.0)
threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
time.sleep(30)
"""


def test_the_controller_unit_weighs_less_than_the_rank() -> None:
    weight = unit_weight()
    # systemd's default CPUWeight and IOWeight are 100, its default nice 0.
    assert weight.cpu_weight is not None and weight.cpu_weight < 100
    assert weight.io_weight is not None and weight.io_weight < 100
    assert weight.nice > 0


def test_an_unweighted_unit_reads_as_the_defaults(tmp_path: Path) -> None:
    unit = tmp_path / "plain.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n# Nice=10 in a comment\n")
    weight = unit_weight(unit)
    assert (weight.nice, weight.cpu_weight, weight.io_weight) == (0, None, None)


def test_every_thread_of_the_controller_is_lowered_and_later_ones_inherit() -> None:
    child = subprocess.Popen([sys.executable, "-c", THREADS], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).num_threads() < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        done = lower_priority(child.pid, 7, settle=0.05)
        assert done["threads_nice"] == [7]
        time.sleep(1.5)  # the late thread has started
        threads = psutil.Process(child.pid).threads()
        assert len(threads) == 5
        assert {os.getpriority(os.PRIO_PROCESS, t.id) for t in threads} == {7}
        if done["autogroup"] is not None:  # the kernel groups sessions: the group too
            assert done["autogroup"].endswith("nice 7")
    finally:
        child.kill()
        child.wait()


def test_the_hog_loads_each_core_from_a_session_of_its_own() -> None:
    hog = CpuHog(2)
    with hog.running():
        children = [psutil.Process(pid) for pid in hog.pids()]
        assert len(children) == 2
        assert all(c.nice() == os.getpriority(os.PRIO_PROCESS, 0) for c in children)
        assert all(os.getsid(c.pid) == c.pid for c in children)  # leaders of their own
        time.sleep(0.5)
        assert hog.cores_busy() > 0.2  # busy, even on a loaded machine
    assert all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children)
