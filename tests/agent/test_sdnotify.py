"""sd_notify against a real AF_UNIX datagram socket."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.sdnotify import SystemdNotifier


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    yield sock, path
    sock.close()


def test_ready_watchdog_status_reach_the_socket(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert notifier.ready("first round done")
    assert sock.recv(4096) == b"READY=1\nSTATUS=first round done"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.status("line one\nline two")
    assert sock.recv(4096) == b"STATUS=line one line two"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1\nSTATUS=stopping"


def test_abstract_namespace_socket() -> None:
    name = f"spark-watchdog-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(2)
    try:
        assert SystemdNotifier({"NOTIFY_SOCKET": "@" + name}).watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        sock.close()


def test_outside_systemd_is_a_no_op() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    assert not notifier.ready("x")
    assert notifier.watchdog_interval is None


def test_gone_socket_does_not_raise(tmp_path: Path) -> None:
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")})
    assert notifier.watchdog() is False


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "zero"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(
    env: dict[str, str], expected: float | None
) -> None:
    assert SystemdNotifier(env).watchdog_interval == expected


def test_a_receiver_that_never_reads_does_not_block_the_sender(
    notify_socket: tuple[socket.socket, str],
) -> None:
    _, path = notify_socket
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path})
    # The kernel queues a few datagrams per socket; past that a blocking send
    # would hang the agent's loop. Every send must return, some with False.
    results = [notifier.watchdog() for _ in range(2000)]
    assert results[0] is True
    assert results[-1] is False
