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


def test_a_port_in_use_is_not_picked() -> None:
    with socket.socket() as busy:
        busy.bind((ports.LOOPBACK, 0))
        taken = int(busy.getsockname()[1])
        assert not ports._bindable(taken, ports.LOOPBACK)


def test_an_unreadable_range_falls_back_to_the_kernels_pick(tmp_path: Path) -> None:
    assert ports.ephemeral_low(tmp_path / "missing") is None
    (tmp_path / "range").write_text("garbage\n")
    assert ports.ephemeral_low(tmp_path / "range") is None
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ports.ephemeral_low(tmp_path / "range") == 32768
