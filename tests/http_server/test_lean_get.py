"""The plain-GET path (spark_watchdog/http/lean.py) answers byte for byte as
the full request handler does, and leaves every other request to it."""

from __future__ import annotations

import contextlib
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.http.handler import Exchange, Routes, json_response
from spark_watchdog.http.lean import lean_get
from spark_watchdog.http.server import HardenedHTTPServer, PostRoute

CALLS: list[str] = []


def _pulse() -> tuple[int, str, bytes]:
    CALLS.append("pulse")
    return json_response({"node": "spark-2", "seq": 4, "boot_id": "b" * 32})


def _broken() -> tuple[int, str, bytes]:
    raise RuntimeError("no snapshot yet")


def _unready() -> tuple[int, str, bytes]:
    return json_response({"error": "starting"}, 503)


ROUTES = Routes({"/v1/pulse": _pulse, "/v1/broken": _broken, "/v1/unready": _unready})
_DATE = re.compile(rb"Date: [^\r]*\r\n")


def _full(request: bytes) -> bytes:
    return _DATE.sub(b"Date: -\r\n", Exchange(request, ("127.0.0.1", 1), ROUTES).answer)


def _lean(request: bytes) -> bytes | None:
    answer = lean_get(request, ROUTES)
    return None if answer is None else _DATE.sub(b"Date: -\r\n", answer)


PLAIN = [
    b"GET /v1/pulse HTTP/1.1\r\nHost: 198.51.100.2:9101\r\nAccept: application/json\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\n\n",  # bare line feeds
    b"GET  /v1/pulse  HTTP/1.1 \r\nUser-Agent: curl/8.5.0\r\nX-Odd:\r\n\r\n",
    b"GET /v1/broken HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/unready HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nConnection: Keep-Alive \r\nconnection:keep-alive\r\n\r\n",
]
FULL_PATH = [
    b"GET /v1/pulse HTTP/1.1\r\nConnection: close\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nconnection : close\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
    b"GET /v1/pulse HTTP/1.1\r\nX-A: b\r\n Connection: close\r\n\r\n",  # folded
    b"GET /v1/pulse HTTP/1.1\r\nnot a header line\r\n\r\n",
    b"GET /v1/pulse HTTP/1.0\r\n\r\n",
    b"HEAD /v1/pulse HTTP/1.1\r\n\r\n",
    b"POST /v1/pulse HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    b"GET /v1/pulse?x=1 HTTP/1.1\r\n\r\n",
    b"GET //v1/pulse HTTP/1.1\r\n\r\n",
    b"GET /v1/nothing HTTP/1.1\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", PLAIN)
def test_a_plain_get_is_answered_as_the_full_handler_answers_it(request_bytes: bytes) -> None:
    lean = _lean(request_bytes)
    assert lean is not None
    assert lean == _full(request_bytes)


@pytest.mark.parametrize("request_bytes", FULL_PATH)
def test_anything_else_takes_the_full_path(request_bytes: bytes) -> None:
    assert lean_get(request_bytes, ROUTES) is None


LINES = [b"GET /v1/pulse HTTP/1.1", b"GET /v1/pulse HTTP/1.0", b"GET /x HTTP/1.1"]


def test_random_heads_are_either_left_alone_or_answered_as_the_full_handler_would() -> None:
    rng = random.Random(34)
    names = [b"Host", b"Accept", b"Connection", b"connection", b"Expect", b"X-Y", b"", b" Folded"]
    values = [b"close", b"keep-alive", b"100-continue", b"x", b"", b" spaced "]
    answered = 0
    for _ in range(2000):
        line = rng.choice(
            [b"GET /v1/pulse HTTP/1.1", b"GET /v1/pulse HTTP/1.0", b"GET /x HTTP/1.1"]
        )
        headers = b"".join(
            rng.choice(names) + rng.choice([b":", b": ", b" "]) + rng.choice(values) + b"\r\n"
            for _ in range(rng.randrange(0, 5))
        )
        request = line + b"\r\n" + headers + b"\r\n"
        lean = _lean(request)
        if lean is not None:
            answered += 1
            assert lean == _full(request), request
            assert b"Connection: close" not in lean
    assert answered > 100  # the random heads reach the plain path too


@pytest.fixture
def server() -> Iterator[HardenedHTTPServer]:
    http = HardenedHTTPServer(("127.0.0.1", 0), ROUTES.get)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield http
    http.shutdown()
    thread.join(10)
    http.server_close()


def _read_answers(sock: socket.socket, count: int) -> bytes:
    data = b""
    while data.count(b"HTTP/1.1 ") < count or not data.endswith(b"}\n"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_pipelined_plain_and_full_requests_are_answered_in_order(
    server: HardenedHTTPServer,
) -> None:
    """Lean and full answers interleave on one kept-alive connection, each
    request answered once, in the order sent."""
    CALLS.clear()
    with socket.create_connection(server.server_address[:2], timeout=10) as sock:
        sock.sendall(PLAIN[0] + b"GET /v1/pulse?q=1 HTTP/1.1\r\n\r\n" + PLAIN[1])
        answers = _read_answers(sock, 3)
    assert answers.count(b"HTTP/1.1 200 OK") == 3
    assert CALLS == ["pulse"] * 3


def _slow_post(started: threading.Event) -> PostRoute:
    def route(body: dict[str, Any]) -> tuple[int, str, bytes]:
        started.set()
        time.sleep(0.5)
        return json_response({"ended": True})

    return route


@pytest.mark.parametrize("drain", [True, False])
def test_a_post_running_when_the_server_shuts_down_is_still_answered(
    drain: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's step-down ends the lease the controller's server goes down
    with: the person who pressed it hears the answer. Without the drain, the
    connection is cut unanswered."""
    from spark_watchdog.http import server as http_server

    if not drain:
        monkeypatch.setattr(http_server, "SHUTDOWN_DRAIN_S", 0.0)
    started = threading.Event()
    http = HardenedHTTPServer(("127.0.0.1", 0), {}, {"/v1/step": _slow_post(started)})
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    with socket.create_connection(http.server_address[:2], timeout=10) as sock:
        sock.sendall(b"POST /v1/step HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
        assert started.wait(10)
        # As the endpoint stops: the loop ends, then every connection is closed.
        http.shutdown()
        thread.join(10)
        http.server_close()
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    if drain:
        assert answer.startswith(b"HTTP/1.1 200 OK") and b'"ended":true' in answer
    else:
        assert answer == b""


def test_a_carried_pulse_goes_to_pulse_in_with_the_address_on_the_plain_path_only() -> None:
    heard: list[tuple[bytes, Any]] = []
    routes = Routes(
        {"/v1/pulse": _pulse}, pulse_in=lambda value, address: heard.append((value, address))
    )
    carried = b'{"node":"spark-1","seq":7,"boot_id":null}'
    head = b"GET /v1/pulse HTTP/1.1\r\nHost: x\r\nPulse: " + carried + b"\r\n\r\n"
    assert lean_get(head, routes, ("10.0.0.1", 4000)) is not None
    assert heard == [(carried, ("10.0.0.1", 4000))]
    # Left to the full path: nothing is heard from it.
    closing = head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
    assert lean_get(closing, routes, ("10.0.0.1", 4000)) is None
    assert len(heard) == 1

    # A pulse_in that fails does not fail the answer.
    def failing_pulse_in(value: bytes, address: Any) -> None:
        raise RuntimeError("a broken pulse_in")

    failing = Routes({"/v1/pulse": _pulse}, pulse_in=failing_pulse_in)
    answered, plain = lean_get(head, failing, ("10.0.0.1", 4000)), lean_get(head, ROUTES)
    assert answered is not None and plain is not None
    assert _DATE.sub(b"", answered) == _DATE.sub(b"", plain)


def test_a_long_answer_to_a_peer_shaped_request_is_written_in_pieces_and_read_on() -> None:
    """A request of a peer's shape, answered with more than the socket takes
    at once (2 MB through a 64 KB send buffer), is written piece by piece as
    any long answer is, and the connection is kept for the next request."""
    body = b"x" * (2 * 1024 * 1024)

    def big() -> tuple[int, str, bytes]:
        return 200, "application/json", body

    http = HardenedHTTPServer(("127.0.0.1", 0), {"/v1/pulse": big})
    # Accepted sockets take the listener's: a send buffer far short of the answer.
    http._listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    request = b"GET /v1/pulse HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n"
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # before connecting
            sock.settimeout(10)
            sock.connect(http.server_address[:2])
            for _ in range(2):
                sock.sendall(request)
                chunks: list[bytes] = []
                left = None
                while left is None or left > 0:
                    chunk = sock.recv(65536)
                    assert chunk, "the connection closed mid-answer"
                    chunks.append(chunk)
                    if left is not None:
                        left -= len(chunk)
                    elif b"\r\n\r\n" in b"".join(chunks):
                        left = len(body) - len(b"".join(chunks).partition(b"\r\n\r\n")[2])
                head, _, got = b"".join(chunks).partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK")
                assert b"Content-Length: %d" % len(body) in head
                assert got == body
        deadline = time.monotonic() + 10  # the server counts its last send after the client read it
        while http.held_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert http.held_bytes == 0
    finally:
        http.shutdown()
        thread.join(10)
        http.server_close()


def test_a_kept_answer_is_sent_again_only_for_the_same_body_and_status() -> None:
    """A pulse asked three times a second is built once a pulse: the same
    body object within the same second is the same answer; a new body, or
    the same body with another status, is built anew."""
    answer: list[tuple[int, str, bytes]] = [(200, "application/json", b'{"seq":1}\n')]
    routes = Routes({"/v1/pulse": lambda: answer[-1]})
    request = PLAIN[0]
    for _ in range(3):  # the same second for both, unless a second ends between them
        first, again = lean_get(request, routes), lean_get(request, routes)
        if first is again:
            break
    assert first is not None and first is again
    answer.append((200, "application/json", b'{"seq":2}\n'))
    second = lean_get(request, routes)
    assert second is not None and second.endswith(b'{"seq":2}\n')
    answer.append((503, "application/json", answer[-1][2]))
    unready = lean_get(request, routes)
    assert unready is not None and unready.startswith(b"HTTP/1.1 503 ")
    assert unready.endswith(b'{"seq":2}\n')
    big = b"x" * 4096  # past what is kept: a scrape is built each time
    answer.append((200, "text/plain", big))
    assert lean_get(request, routes) is not lean_get(request, routes)
