"""The lab's nodes in network namespaces of their own (``lab up --netns``,
the partition scenarios): each behind a veth pair on a point-to-point /30 of
TEST-NET-2 (RFC 5737), so nothing is routed anywhere else: its management
link, the only one the lab machine and the controller reach it over. The
nodes' second link, the fabric between them, is lab/fabric.py's. Root only."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from typing import Literal

from spark_watchdog.lab.node import LabNode

# Which of a node's links a partition cuts: what its name says, or both.
Link = Literal["management", "fabric", "both"]

# Addresses of nodes in network namespaces: TEST-NET-2, point-to-point /30 links.
NETNS_PREFIX = "198.51.100"
IP = shutil.which("ip") or "/usr/sbin/ip"


def make_namespace(node: LabNode, index: int, tag: str) -> None:
    """``spark-N`` in namespace ``swlab-<tag>-N`` at 198.51.100.(4i+2)/30, the lab
    machine at .(4i+1) on the other end of a veth pair."""
    node.netns = f"swlab-{tag}-{index + 1}"
    node.veth = f"swl{tag}h{index + 1}"
    node.link = inside = f"swl{tag}n{index + 1}"
    host_address = f"{NETNS_PREFIX}.{4 * index + 1}"
    node.address = f"{NETNS_PREFIX}.{4 * index + 2}"
    commands = (
        ["netns", "add", node.netns],
        ["link", "add", node.veth, "type", "veth", "peer", "name", inside],
        ["link", "set", inside, "netns", node.netns],
        ["addr", "add", f"{host_address}/30", "dev", node.veth],
        ["link", "set", node.veth, "up"],
        ["-n", node.netns, "addr", "add", f"{node.address}/30", "dev", inside],
        ["-n", node.netns, "link", "set", inside, "up"],
        # The node reaches its own address (agent -> its vLLM) over lo.
        ["-n", node.netns, "link", "set", "lo", "up"],
    )
    try:
        for command in commands:
            ip(*command)
    except OSError:
        # Not yet among the lab's nodes: remove_namespaces would not find it.
        ip("link", "del", node.veth, check=False)
        ip("netns", "del", node.netns, check=False)
        raise


def set_link(node: LabNode, *, up: bool, link: Link = "both") -> None:
    """Cut (or restore) the node's management link, its fabric link or both,
    from inside its namespace: the other ends keep their routes, so packets
    to the node go nowhere else; they vanish, as behind a dead switch port."""
    if node.netns is None or node.link is None:
        raise ValueError("partitions need the lab's network namespaces (lab up --netns)")
    if link == "fabric" and node.fabric_link is None:
        raise ValueError(f"{node.name} has no fabric link (lab up --netns wires one)")
    names = [node.link] if link != "fabric" else []
    if link != "management" and node.fabric_link is not None:
        names.append(node.fabric_link)
    for name in names:
        ip("-n", node.netns, "link", "set", name, "up" if up else "down")


def remove_namespaces(nodes: Iterable[LabNode]) -> None:
    """The nodes' namespaces and links, and the switches they are plugged into
    (the fabric's, lab/fabric.py; the management one, lab/mgmt_switch.py)."""
    switches: list[str] = []
    for node in nodes:
        if node.veth is not None:
            ip("link", "del", node.veth, check=False)
        if node.netns is not None:
            ip("netns", "del", node.netns, check=False)
        for switch in (node.fabric_switch, node.mgmt_switch):
            if switch is not None and switch not in switches:
                switches.append(switch)
    for switch in switches:
        ip("netns", "del", switch, check=False)


def ip(*args: str, check: bool = True) -> None:
    done = subprocess.run([IP, *args], capture_output=True, text=True, timeout=10)
    if check and done.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def netns_unavailable() -> str | None:
    """Why this machine cannot give nodes network namespaces; None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add, veth links)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"swlab-probe-{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot create a network namespace: {exc}"
    ip("netns", "del", probe, check=False)
    return None
