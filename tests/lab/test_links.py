"""A lab in network namespaces gives each node two links (lab/netns.py,
lab/fabric.py): management, the only one the controller reaches it over, and
the fabric between the nodes, which carries the agents' pulses and the TP
group's all-reduce. Each can be cut on its own."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.netns import IP, netns_unavailable

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # a loaded 2-core machine


def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:g}s: {what}")
        time.sleep(0.2)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[LabCluster]:
    why = netns_unavailable()
    if why is not None:
        pytest.skip(f"network namespaces: {why}")
    cluster = LabCluster(tmp_path / "lab", size=3, netns=True)
    try:
        cluster.start().serving()
        yield cluster
    finally:
        cluster.stop()
    tag = f"swlab-{cluster.lab_id[:6]}-"
    left = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout
    assert tag not in left, f"namespaces left behind: {left}"


def peers(lab: LabCluster, name: str) -> dict[str, str]:
    """What the node's agent last got from each peer, over the fabric."""
    state = lab.agent_state(lab.node(name)) or {}
    return {peer: seen["state"] for peer, seen in (state.get("peers") or {}).items()}


def head_vllm(lab: LabCluster) -> str | None:
    state: dict[str, Any] = lab.agent_state(lab.head) or {}
    vllm = (state.get("probes") or {}).get("vllm", {})
    return None if vllm.get("state") is None else str(vllm["state"])


@pytest.mark.xdist_group("lab-netns")
def test_each_link_carries_its_own_traffic_and_goes_dark_alone(lab: LabCluster) -> None:
    spark1, spark2, spark3 = lab.nodes
    config = yaml.safe_load((spark3.directory / "agent.yaml").read_text())
    assert config["listen"]["address"] == "0.0.0.0"  # both links of its namespace
    assert {p["url"] for p in config["peers"]} == {
        f"http://{spark1.fabric_address}:{spark1.agent_port}",
        f"http://{spark2.fabric_address}:{spark2.agent_port}",
    }
    assert spark1.address != spark1.fabric_address
    assert lab.controller_config(Path("h.db"))["serving"]["step_group"] == ["spark-2", "spark-3"]
    eventually(
        lambda: all(set(peers(lab, n.name).values()) == {"ok"} for n in lab.nodes),
        "every agent pulses every peer over the fabric",
    )

    assert "fabric link went dark" in lab.inject("fabric-partition", spark3)
    eventually(lambda: head_vllm(lab) == "stalled", "the head's engine stalls without a rank")
    eventually(
        lambda: (
            peers(lab, "spark-1")["spark-3"] == "silent"
            and set(peers(lab, "spark-3").values()) == {"silent"}
        ),
        "spark-3 and its peers lose each other",
    )
    assert lab.agent_state(spark3) is not None, "the management link stays up"

    lab.inject("heal", spark3)
    eventually(lambda: head_vllm(lab) == "progressing", "the head steps again")

    assert "management link went dark" in lab.inject("mgmt-partition", spark3)
    eventually(lambda: lab.agent_state(spark3) is None, "spark-3 gone from the management net")
    eventually(
        lambda: peers(lab, "spark-1")["spark-3"] == "ok" and head_vllm(lab) == "progressing",
        "the fabric still reaches spark-3",
    )
    lab.inject("heal", spark3)
    eventually(lambda: lab.agent_state(spark3) is not None, "spark-3 answers again")
