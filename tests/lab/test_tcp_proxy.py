"""The chaos tier's TCP proxy (lab/hardware/tcp_proxy.py) does what it says:
passes bytes, holds them in a blackhole and lets them through after, resets
links with an RST, delays each chunk."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from spark_watchdog.lab.hardware.tcp_proxy import TcpProxy


@pytest.fixture
def echo() -> Iterator[int]:
    """An echo server on loopback; its port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):  # a reset link ends it
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    server.close()


def _client(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=10)


def test_bytes_pass_and_a_blackhole_holds_them_until_healed(echo: int) -> None:
    with TcpProxy(echo) as proxy, _client(proxy) as client:
        client.sendall(b"one")
        assert client.recv(16) == b"one"
        proxy.blackhole()
        client.sendall(b"two")
        client.settimeout(0.5)
        with pytest.raises(TimeoutError):
            client.recv(16)  # nothing comes back, and nothing is refused
        proxy.heal()
        client.settimeout(10)
        assert client.recv(16) == b"two"


def test_a_reset_cuts_every_open_link_with_an_rst(echo: int) -> None:
    with TcpProxy(echo) as proxy, _client(proxy) as client:
        client.sendall(b"ping")
        assert client.recv(16) == b"ping"
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            client.sendall(b"after")
            client.recv(16)
        with _client(proxy) as again:  # new links pass
            again.sendall(b"new")
            assert again.recv(16) == b"new"


def test_a_delay_holds_each_chunk(echo: int) -> None:
    with TcpProxy(echo) as proxy, _client(proxy) as client:
        proxy.delay(0.3)
        started = time.monotonic()
        client.sendall(b"slow")
        assert client.recv(16) == b"slow"
        assert time.monotonic() - started >= 0.6  # once each way


def test_a_command_the_relay_does_not_know_is_refused_by_name(echo: int) -> None:
    with TcpProxy(echo) as proxy, _client(proxy) as client:
        with pytest.raises(RuntimeError, match="unknown command 'delay -1'"):
            proxy.delay(-1)
        client.sendall(b"still")  # the link is as it was
        assert client.recv(16) == b"still"


def test_the_relay_is_a_process_of_its_own_and_ends_with_stop(echo: int) -> None:
    proxy = TcpProxy(echo).start()
    process = proxy._process
    assert process is not None and process.pid != os.getpid()
    proxy.stop()
    assert process.returncode == 0
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
