"""The lab's port picks stay out of the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from spark_watchdog.lab import ports


def test_picks_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    low = ports.ephemeral_low()
    assert low is not None, "this kernel publishes net.ipv4.ip_local_port_range"
    picks = [ports.free_port(chooser=random.Random(7)) for _ in range(50)]
    assert len(set(picks)) == len(picks)
    assert all(ports.LOWEST <= port < low for port in picks)


def test_a_pick_can_be_listened_on_at_once() -> None:
    port = ports.free_port()
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, port))
        listener.listen()


class _BusyFirst(random.Random):
    """Offers the busy port first, then any."""

    def __init__(self, busy: int) -> None:
        super().__init__(11)
        self.offers = [busy]

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return self.offers.pop() if self.offers else super().randrange(start, stop, step)


def test_a_port_in_use_is_not_picked() -> None:
    busy_port = ports.free_port()
    with socket.socket() as busy:
        busy.bind((ports.LOOPBACK, busy_port))
        busy.listen()
        picked = ports.free_port(chooser=_BusyFirst(busy_port))
    assert picked != busy_port


def test_an_unreadable_range_falls_back_to_the_kernels_pick(tmp_path: Path) -> None:
    assert ports.ephemeral_low(tmp_path / "missing") is None
    (tmp_path / "range").write_text("garbage\n")
    assert ports.ephemeral_low(tmp_path / "range") is None
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ports.ephemeral_low(tmp_path / "range") == 32768
