"""The fabric between the lab's nodes in network namespaces (``lab up --netns``):
a DGX Spark cluster's second network, the ConnectX-7 links its ranks'
all-reduce and its agents' pulses go over (docs/design.md, "Peers").

A switch, a Linux bridge in a network namespace of its own (so that no
firewall rule of this machine sees its frames), and per node a veth pair
from a port of the switch to the node's ``fabric0`` at 203.0.113.(i+1)/24
(TEST-NET-3, RFC 5737). The lab machine has no address on it, and neither
has the controller: it reaches the nodes over their management links only
(lab/netns.py), as on a real cluster. Root only."""

from __future__ import annotations

from collections.abc import Sequence

from spark_watchdog.lab.netns import ip
from spark_watchdog.lab.node import LabNode

# Addresses on the fabric: TEST-NET-3, one /24 the switch joins.
FABRIC_PREFIX = "203.0.113"
# The node's end, inside its namespace (names there are the node's own).
FABRIC_LINK = "fabric0"
BRIDGE = "fabric"


def wire_fabric(nodes: Sequence[LabNode], tag: str) -> None:
    """The switch ``swlab-<tag>-fabric`` and every node plugged into it. The
    nodes' namespaces must exist (netns.make_namespace); the switch's goes
    with theirs (netns.remove_namespaces)."""
    switch = f"swlab-{tag}-fabric"
    ip("netns", "add", switch)
    for node in nodes:
        node.fabric_switch = switch
    ip("-n", switch, "link", "add", BRIDGE, "type", "bridge")
    ip("-n", switch, "link", "set", BRIDGE, "up")
    for index, node in enumerate(nodes):
        _plug_in(node, index, switch)


def _plug_in(node: LabNode, index: int, switch: str) -> None:
    if node.netns is None:
        raise ValueError(f"{node.name} has no network namespace for a fabric link")
    port = f"port{index + 1}"
    address = f"{FABRIC_PREFIX}.{index + 1}"
    veth = ["type", "veth", "peer", "name", FABRIC_LINK, "netns", node.netns]
    commands = (
        ["-n", switch, "link", "add", port, *veth],
        ["-n", switch, "link", "set", port, "master", BRIDGE],
        ["-n", switch, "link", "set", port, "up"],
        ["-n", node.netns, "addr", "add", f"{address}/24", "dev", FABRIC_LINK],
        ["-n", node.netns, "link", "set", FABRIC_LINK, "up"],
    )
    for command in commands:
        ip(*command)
    node.fabric_address, node.fabric_link = address, FABRIC_LINK
