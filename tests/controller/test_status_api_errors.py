"""The controller's status endpoint against wrong and broken requests: the same
JSON errors, limits and one-line logs as the agent's (real server on loopback)."""

from __future__ import annotations

import json
import logging
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.controller.record.tallies import Tallies

pytestmark = pytest.mark.integration


class _Source:
    def __init__(self) -> None:
        self.published: dict[str, Any] = {"ticks": 7, "nodes": []}
        self.tallies = Tallies()


@pytest.fixture
def base() -> Iterator[str]:
    endpoint = StatusEndpoint("127.0.0.1", 0, _Source())
    endpoint.start()
    yield f"http://127.0.0.1:{endpoint.port}"
    endpoint.stop()


def test_the_routes_it_registers() -> None:
    endpoint = StatusEndpoint("127.0.0.1", 0, _Source())
    assert endpoint.operations() == {
        "/metrics": ("GET", "HEAD"),
        "/v1/status": ("GET", "HEAD"),
    }


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_a_json_405(base: str, method: str) -> None:
    answer = requests.request(method, f"{base}/v1/status", timeout=5)
    assert answer.status_code == 405
    assert answer.headers["Allow"] == "GET, HEAD"
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.json() == {"error": f"{method} is not allowed on /v1/status; use GET or HEAD"}


def test_head_is_get_without_the_body(base: str) -> None:
    head = requests.head(f"{base}/v1/status", timeout=5)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == str(len(requests.get(f"{base}/v1/status").content))


def test_an_unknown_path_lists_the_paths(base: str) -> None:
    answer = requests.get(f"{base}/v1/state", timeout=5)
    assert answer.status_code == 404
    assert answer.json() == {"error": "no such path /v1/state; paths: /metrics, /v1/status"}


def test_a_malformed_request_line_is_a_json_400(base: str) -> None:
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"hello there\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert b"Content-Type: application/json" in head
    assert json.loads(body) == {
        "error": "Bad request syntax ('hello there'); expected a request line METHOD /path HTTP/1.1"
    }


def test_a_client_that_resets_costs_one_line(
    base: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger="spark_watchdog.http")
    port = int(base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    # Half a request head: the server is reading it when the reset comes.
    # Other servers of this test process (earlier tests' labs) log under the same
    # name: count only the lines about this client.
    peer = f"127.0.0.1:{sock.getsockname()[1]}"
    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    time.sleep(0.2)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()

    def about_this_client() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "spark_watchdog.http" and peer in r.getMessage()
        ]

    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not about_this_client():
        time.sleep(0.05)
    time.sleep(0.5)
    messages = about_this_client()
    assert len(messages) == 1 and "broken by the client" in messages[0], messages
    assert "Traceback" not in capfd.readouterr().err


def test_idle_and_slow_connections_leave_the_status_answering(base: str) -> None:
    """Issue 37: hundreds of silent connections, a dripping one and one that
    reads nothing of its answer do not turn the status into a 503."""
    port = int(base.rsplit(":", 1)[1])
    held = []
    try:
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        dripping = socket.create_connection(("127.0.0.1", port), timeout=10)
        dripping.sendall(b"GET /v1/status HTTP/1.1\r\n")
        held.append(dripping)
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", port))
        reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(reader)
        for _ in range(5):
            answer = requests.get(f"{base}/v1/status", timeout=10)
            assert answer.status_code == 200
            assert answer.json()["ticks"] == 7
    finally:
        for sock in held:
            sock.close()
