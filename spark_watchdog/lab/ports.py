"""Ports for the lab's listeners, picked where nothing else will take them.

A port the kernel hands out for ``bind(("127.0.0.1", 0))`` lies in the
ephemeral range (``net.ipv4.ip_local_port_range``), the range every outgoing
connection on the machine draws its source port from. Between the pick and
the listener's own bind, a connection of any process (a vLLM engine's
sockets, a probe, a test's client) can take that very port, and the
listener then fails with "Address already in use". The lab therefore picks
below the ephemeral range, at random, never the same port twice in one
process, and checks that TCP and UDP can both bind it now.

Labs side by side on one machine (the test suite's parallel workers, or two
``lab up`` of two people) keep out of each other's way with
``SPARK_WATCHDOG_PORTS=LOW-HIGH``: every pick of this process and of the
processes it starts (they inherit the variable) then lies in that range,
which a pick of another range can never meet.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

LOOPBACK = "127.0.0.1"
PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
RANGE_VARIABLE = "SPARK_WATCHDOG_PORTS"
LOWEST = 10000
ATTEMPTS = 200

_handed_out: set[int] = set()
_lock = threading.Lock()
# Not the random module's shared generator: a test that seeds it (hypothesis
# does) would make every process on the machine pick the same ports.
_chooser = random.SystemRandom()


class PortRangeError(ValueError):
    """``SPARK_WATCHDOG_PORTS`` is not a usable range."""


def ephemeral_low(path: Path = PORT_RANGE_FILE) -> int | None:
    """The first port of the kernel's ephemeral range, or None where unknown."""
    try:
        low, _high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low


def assigned_range(value: str | None = None) -> tuple[int, int] | None:
    """The range ``SPARK_WATCHDOG_PORTS`` gives this process (``LOW-HIGH``,
    both included), or None where it gives none."""
    text = os.environ.get(RANGE_VARIABLE) if value is None else value
    if not text:
        return None
    low_text, dash, high_text = text.partition("-")
    try:
        low, high = int(low_text), int(high_text)
    except ValueError:
        low, high = 0, -1
    if not dash or not 1024 <= low <= high <= 65535:
        raise PortRangeError(
            f"{RANGE_VARIABLE}={text!r}: expected LOW-HIGH, two ports from 1024 to 65535 "
            f"with LOW <= HIGH (e.g. {RANGE_VARIABLE}=20000-23999), or unset it"
        )
    return low, high


def worker_range(index: int, count: int, within: tuple[int, int] | None = None) -> tuple[int, int]:
    """Slice ``index`` of ``count`` equal slices of ``within`` (by default the
    ports from :data:`LOWEST` up to the ephemeral range): what each of
    ``count`` side-by-side labs is given."""
    if not 0 <= index < count:
        raise ValueError(f"slice {index} of {count}: expected 0 <= index < count")
    low, high = within or (LOWEST, (ephemeral_low() or 32768) - 1)
    size = (high - low + 1) // count
    if size < ATTEMPTS:
        raise ValueError(f"{count} slices of {low}-{high} leave {size} ports each")
    first = low + index * size
    return first, first + size - 1


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


def _pick(low: int, high: int, host: str, pick: random.Random) -> int | None:
    for _ in range(ATTEMPTS):
        port = pick.randrange(low, high + 1)
        if port not in _handed_out and _bindable(port, host):
            _handed_out.add(port)
            return port
    return None


def free_port(host: str = LOOPBACK, *, chooser: random.Random | None = None) -> int:
    """A port free for TCP and UDP on ``host``: in this process's range where
    it has one (:data:`RANGE_VARIABLE`), else below the ephemeral range."""
    pick = chooser or _chooser
    assigned = assigned_range()
    with _lock:
        if assigned is not None:
            port = _pick(*assigned, host, pick)
            if port is None:
                raise OSError(f"no free port in {RANGE_VARIABLE}={assigned[0]}-{assigned[1]}")
            return port
        low = ephemeral_low()
        if low is not None and low > LOWEST + ATTEMPTS:
            port = _pick(LOWEST, low - 1, host, pick)
            if port is not None:
                return port
        # No room below the ephemeral range: the kernel's pick, as before.
        port = _kernel_pick(host)
        _handed_out.add(port)
        return port
