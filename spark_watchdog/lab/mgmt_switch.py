"""The management network of a lab whose controllers run on the nodes
(``lab up --colocated``; docs/design.md, "Controllers on the Sparks").

With a controller on the lab machine (lab/netns.py) each node's management
link is a point-to-point /30 to the lab machine, and nodes never talk to
each other over it. A controller on a node must reach the other nodes'
agents, SSH banners and controllers, the PDU and the witness, all over
management, as on a real cluster: so here the management links meet at a
switch, a Linux bridge in a network namespace of its own (like the fabric's,
lab/fabric.py: no firewall rule of this machine sees its frames), and the
lab machine is plugged into it too, at :data:`GATEWAY`: the network's
gateway, where the PDU, the witness target and the alert receiver listen.

Node ``i`` is at 198.51.100.(4i+2)/24 (TEST-NET-2, RFC 5737; the same
address as without the switch) on ``mgmt0`` inside its namespace; cutting
that link (lab/netns.py's ``set_link``) takes it off the switch. Root only.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from spark_watchdog.lab.netns import NETNS_PREFIX, ip
from spark_watchdog.lab.node import LabNode

# The lab machine on the management switch: the gateway, the PDU, the witness.
GATEWAY = f"{NETNS_PREFIX}.1"
PREFIX_LENGTH = 24
BRIDGE = "mgmt"
# The node's end of its management link, inside its namespace.
MGMT_LINK = "mgmt0"
UPLINK = "uplink"


def switch_namespace(tag: str) -> str:
    return f"swlab-{tag}-mgmt"


def wire_switch(tag: str) -> str:
    """The switch's namespace and bridge, and the lab machine's leg into it at
    :data:`GATEWAY`; the switch's namespace (its removal takes every link
    plugged into it, the lab machine's leg included)."""
    switch = switch_namespace(tag)
    leg = f"swl{tag}g"
    ip("netns", "add", switch)
    commands = (
        ["-n", switch, "link", "add", BRIDGE, "type", "bridge"],
        ["-n", switch, "link", "set", BRIDGE, "up"],
        ["link", "add", leg, "type", "veth", "peer", "name", UPLINK, "netns", switch],
        ["-n", switch, "link", "set", UPLINK, "master", BRIDGE],
        ["-n", switch, "link", "set", UPLINK, "up"],
        ["addr", "add", f"{GATEWAY}/{PREFIX_LENGTH}", "dev", leg],
        ["link", "set", leg, "up"],
    )
    try:
        for command in commands:
            ip(*command)
    except OSError:
        remove_switch(switch)
        raise
    return switch


def plug_in(node: LabNode, index: int, tag: str, switch: str) -> None:
    """``spark-N`` in namespace ``swlab-<tag>-N``, its ``mgmt0`` on a port of the switch."""
    node.netns = f"swlab-{tag}-{index + 1}"
    node.veth = None  # the switch's end goes with the switch
    node.link = MGMT_LINK
    node.mgmt_switch = switch
    node.address = f"{NETNS_PREFIX}.{4 * index + 2}"
    port = f"port{index + 1}"
    veth = ["type", "veth", "peer", "name", MGMT_LINK, "netns", node.netns]
    commands = (
        ["netns", "add", node.netns],
        ["-n", switch, "link", "add", port, *veth],
        ["-n", switch, "link", "set", port, "master", BRIDGE],
        ["-n", switch, "link", "set", port, "up"],
        ["-n", node.netns, "addr", "add", f"{node.address}/{PREFIX_LENGTH}", "dev", MGMT_LINK],
        ["-n", node.netns, "link", "set", MGMT_LINK, "up"],
        ["-n", node.netns, "link", "set", "lo", "up"],
    )
    try:
        for command in commands:
            ip(*command)
    except OSError:
        ip("netns", "del", node.netns, check=False)
        raise


def remove_switch(switch: str) -> None:
    ip("netns", "del", switch, check=False)


class Gateway:
    """The gateway's answer to a TCP connect (the controllers' witness target):
    a listener on :data:`GATEWAY` that accepts and closes, in a thread."""

    def __init__(self, address: str = GATEWAY) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, 0))
        self._sock.listen(64)
        self.address = address
        self.port = int(self._sock.getsockname()[1])
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="lab-gateway", daemon=True)

    @property
    def target(self) -> str:
        return f"tcp://{self.address}:{self.port}"

    def start(self) -> Gateway:
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError):
                conn.close()

    def stop(self) -> None:
        self._stopped.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)
