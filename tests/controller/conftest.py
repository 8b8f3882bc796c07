"""Shared fixtures of the controller tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """Accepts TCP connections and never says a word (a frozen host's kernel:
    the handshake completes, no SSH banner or HTTP answer follows)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield int(sock.getsockname()[1])
    sock.close()
