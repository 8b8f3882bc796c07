"""Ports for the lab's listeners, picked where nothing else will take them.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in the
ephemeral range (``net.ipv4.ip_local_port_range``), the range every outgoing
connection on the machine draws its source port from. Between the pick and
the listener's own bind, a connection of any process (a vLLM engine's
sockets, a probe, a test's client) can take that very port, and the
listener then fails with "Address already in use". The lab therefore picks
below the ephemeral range, at random, never the same port twice in one
process, and checks that TCP and UDP can both bind it now.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000
ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
# Not the random module's shared generator: a test that seeds it (hypothesis
# does) would make every process on the machine pick the same ports.
_chooser = random.SystemRandom()


def ephemeral_low(path: Path = PORT_RANGE_FILE) -> int | None:
    """The first port of the kernel's ephemeral range, or None where unknown."""
    try:
        low, _high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low


def _bindable(port: int, host: str) -> bool:
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                return False
    return True


def _kernel_pick(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_port(host: str = LOOPBACK, *, chooser: random.Random | None = None) -> int:
    """A port free for TCP and UDP on ``host``, outside the ephemeral range."""
    low = ephemeral_low()
    pick = chooser or _chooser
    with _lock:
        if low is not None and low > LOWEST + ATTEMPTS:
            for _ in range(ATTEMPTS):
                port = pick.randrange(LOWEST, low)
                if port not in _handed_out and _bindable(port, host):
                    _handed_out.add(port)
                    return port
        # No room below the ephemeral range: the kernel's pick, as before.
        port = _kernel_pick(host)
        _handed_out.add(port)
        return port
