"""The lab cluster: power cuts and freezes reach the whole simulated host."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from spark_watchdog.lab.cluster import LabCluster

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    """Running or stopped; a zombie waiting for its reaper is gone for our purpose."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_power_cut_freeze_and_stop_reach_every_process(tmp_path: Path) -> None:
    lab = LabCluster(tmp_path / "lab", size=2).start()
    try:
        lab.wait_agents()
        lab.start_serving()
        head = lab.nodes[0]
        pids = [p.pid for p in lab.tree(head)]
        # sim_host, the agent, and the vLLM rank the agent launched in its own session
        assert len(pids) >= 3
        boot_before = head.boot_id()
        lab.freeze(head, with_kernel_lines=False)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not all(
            psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in pids
        ):
            time.sleep(0.05)  # signals are delivered asynchronously
        assert all(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in pids)
        lab.thaw(head)
        lab.switch(head, on=False)
        time.sleep(0.5)
        assert not any(alive(pid) for pid in pids), "a power cut kills everything"
        lab.switch(head, on=True)
        lab.wait_agents()
        assert head.boot_id() != boot_before
        every = [p.pid for node in lab.nodes for p in lab.tree(node)]
    finally:
        lab.stop()
    time.sleep(0.5)
    assert not [pid for pid in every if alive(pid)], "processes left behind"


def test_an_agent_that_cannot_listen_is_reported_at_once_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from spark_watchdog.lab import node_setup, ports

    with socket.socket() as busy:
        busy.bind((ports.LOOPBACK, ports.free_port()))
        busy.listen()
        taken = int(busy.getsockname()[1])
        picks = iter([taken])
        monkeypatch.setattr(node_setup, "free_port", lambda: next(picks, None) or ports.free_port())
        lab = LabCluster(tmp_path / "lab", size=1).start()
        try:
            began = time.monotonic()
            with pytest.raises(TimeoutError) as failed:
                lab.wait_agents(timeout=300)
            waited = time.monotonic() - began
        finally:
            lab.stop()
    assert "agents not up: spark-1" in str(failed.value)
    assert f"cannot bind 127.0.0.1:{taken}" in str(failed.value)
    assert waited < 120, "an agent that exited is not waited for until the deadline"
