"""The HTTP layer the agent and the controller share, with connections in
numbers: idle ones, slow senders and slow readers must not keep a real poll
out (issue 37, docs/design.md "The HTTP servers"), memory held for clients is
bounded, and bad input is refused without a token in any log line. Real
servers on loopback, real sockets; no timing asserted beyond generous
deadlines (the figures are bench/http_under_load.py's)."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from spark_watchdog.http import server as http_server
from spark_watchdog.http.framing import MAX_HEAD_BYTES
from spark_watchdog.http.server import HttpEndpoint, PostRoute, Response, json_response

pytestmark = pytest.mark.integration

TOKEN = "s3cret-load-token"
HTTP_LOGGER = "spark_watchdog.http"
BIG = 3 * 1024 * 1024
# A poll must be answered within this beside the crowd: generous, for a loaded CI machine.
POLL_TIMEOUT_S = 10.0


def _authorize(header: str | None) -> str | None:
    return None if header == f"Bearer {TOKEN}" else "invalid bearer token"


def _big() -> Response:
    return 200, "application/octet-stream", b"x" * BIG


def _endpoint(
    max_connections: int = http_server.MAX_CONNECTIONS, posts: dict[str, PostRoute] | None = None
) -> HttpEndpoint:
    return HttpEndpoint(
        "127.0.0.1",
        0,
        {"/v1/state": lambda: json_response({"seq": 1}), "/big": _big},
        {"/v1/serving/stop": lambda body: json_response({"got": body}), **(posts or {})},
        authorize=_authorize,
        max_connections=max_connections,
    )


@pytest.fixture
def endpoint() -> Iterator[HttpEndpoint]:
    server = _endpoint()
    server.start()
    yield server
    server.stop()


def _connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        # Before connecting, so the window offered stays small.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(POLL_TIMEOUT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def _poll(port: int) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}/v1/state", timeout=POLL_TIMEOUT_S)


def _wait_for(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _closed_by_server(sock: socket.socket, timeout: float = 0.2) -> bool:
    """True when the server closed ``sock`` (end of file or reset)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(65536) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@contextlib.contextmanager
def _crowd(port: int, idle: int) -> Iterator[list[socket.socket]]:
    """``idle`` silent connections, one dripping half a head, and one that
    asked for a large answer and reads none of it."""
    held: list[socket.socket] = []
    try:
        for _ in range(idle):
            held.append(_connect(port))
        dripping = _connect(port)
        dripping.sendall(b"GET /v1/state HTTP/1.1\r\nHost: x\r\n")
        held.append(dripping)
        reader = _connect(port, rcvbuf=4096)
        reader.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        held.append(reader)
        yield held
    finally:
        for sock in held:
            sock.close()


# --- 1. a crowd of idle and slow connections ---------------------------------------


def test_idle_and_slow_connections_do_not_keep_a_poll_out(endpoint: HttpEndpoint) -> None:
    before = threading.active_count()
    with _crowd(endpoint.port, idle=300) as held:
        # The server has the whole crowd open at once, on no thread of theirs.
        assert _wait_for(lambda: endpoint.server.open_connections >= len(held))
        # (Fewer is fine: a thread of an earlier test may end meanwhile.)
        assert threading.active_count() <= before
        # The slow reader's answer waits in this process, not refused.
        assert _wait_for(lambda: endpoint.server.held_bytes > 0)
        for _ in range(5):
            answer = _poll(endpoint.port)
            assert answer.status_code == 200 and answer.json() == {"seq": 1}
        # None of the crowd was closed to make room: there was room.
        assert not _closed_by_server(held[0])
        assert not _closed_by_server(held[-2])


def test_past_the_cap_the_oldest_connections_make_room(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    server = _endpoint(max_connections=16)
    server.start()
    try:
        with _crowd(server.port, idle=100) as held:
            answer = _poll(server.port)
            assert answer.status_code == 200 and answer.json() == {"seq": 1}
            assert server.server.open_connections <= 16
            # The oldest went first; the newest of the crowd are still served.
            assert _closed_by_server(held[0])
            assert not _closed_by_server(held[-1])
            assert not _closed_by_server(held[-2])
        assert any(
            r.getMessage().startswith("closed the oldest connection, from 127.0.0.1:")
            and r.getMessage().endswith("connections open, the most served at once")
            for r in caplog.records
        ), [r.getMessage() for r in caplog.records]
    finally:
        server.stop()


def test_a_slow_reader_is_closed_at_the_answer_deadline(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    monkeypatch.setattr(http_server, "ANSWER_DEADLINE_S", 1.0)
    reader = _connect(endpoint.port, rcvbuf=4096)
    try:
        peer = f"127.0.0.1:{reader.getsockname()[1]}"
        reader.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _wait_for(
            lambda: any(
                peer in r.getMessage()
                and "of its answer were not taken within 1 s" in r.getMessage()
                for r in caplog.records
            )
        ), [r.getMessage() for r in caplog.records]
        assert _wait_for(lambda: endpoint.server.held_bytes == 0)
    finally:
        reader.close()
    assert _poll(endpoint.port).status_code == 200


def test_a_silent_connection_is_closed_at_the_request_deadline_without_a_log_line(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    monkeypatch.setattr(http_server, "REQUEST_DEADLINE_S", 1.0)
    with _connect(endpoint.port) as sock:
        assert _closed_by_server(sock, timeout=POLL_TIMEOUT_S)
    assert not [r for r in caplog.records if r.name == HTTP_LOGGER]


def test_requests_sent_back_to_back_are_answered_in_turn(endpoint: HttpEndpoint) -> None:
    with _connect(endpoint.port) as sock:
        sock.sendall(
            b"GET /v1/state HTTP/1.1\r\nHost: x\r\n\r\n"
            b"HEAD /v1/state HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v1/state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answers = _read_all(sock)
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 3
    assert answers.count(b'{"seq":1}\n') == 2


def test_a_post_route_runs_beside_a_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving stop that waits for its process group keeps no poll waiting."""
    started, release = threading.Event(), threading.Event()

    def slow_stop(body: dict[str, Any]) -> Response:
        started.set()
        release.wait(POLL_TIMEOUT_S)
        return json_response({"stopped": True})

    server = _endpoint(posts={"/v1/serving/slow": slow_stop})
    server.start()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = f"http://127.0.0.1:{server.port}/v1/serving/slow"
        answers: list[requests.Response] = []
        post = threading.Thread(
            target=lambda: answers.append(requests.post(url, json={}, headers=headers, timeout=30))
        )
        post.start()
        try:
            assert started.wait(POLL_TIMEOUT_S)
            assert _poll(server.port).json() == {"seq": 1}
            assert not answers  # the POST still runs
        finally:
            release.set()
            post.join(30)
        assert answers[0].status_code == 200 and answers[0].json() == {"stopped": True}
    finally:
        server.stop()


def test_posts_past_the_running_limit_get_a_json_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server, "MAX_ROUTE_THREADS", 1)
    started, release = threading.Event(), threading.Event()

    def slow_stop(body: dict[str, Any]) -> Response:
        started.set()
        release.wait(POLL_TIMEOUT_S)
        return json_response({"stopped": True})

    server = _endpoint(posts={"/v1/serving/slow": slow_stop})
    server.start()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        url = f"http://127.0.0.1:{server.port}/v1/serving/slow"
        first = threading.Thread(
            target=requests.post, args=(url,), kwargs={"headers": headers, "timeout": 30}
        )
        first.start()
        try:
            assert started.wait(POLL_TIMEOUT_S)
            second = requests.post(url, headers=headers, timeout=POLL_TIMEOUT_S)
        finally:
            release.set()
            first.join(30)
        assert second.status_code == 503
        assert second.headers["Retry-After"] == "1"
        assert second.json() == {"error": "too many requests running: 1 at once; retry shortly"}
    finally:
        server.stop()


# --- 2. memory held for clients is bounded ----------------------------------------------


def test_a_head_that_never_ends_is_refused_past_its_limit(endpoint: HttpEndpoint) -> None:
    line = b"X-Long: " + b"a" * 60_000 + b"\r\n"
    with _connect(endpoint.port) as sock:
        sock.sendall(b"GET /v1/state HTTP/1.1\r\n" + line * 3)
        answer = _read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert head.endswith(b"\r\nConnection: close")
    assert json.loads(body) == {
        "error": f"request head longer than {MAX_HEAD_BYTES} bytes; send shorter headers"
    }


def test_past_the_held_bytes_limit_the_biggest_holder_is_closed(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    monkeypatch.setattr(http_server, "MAX_HELD_BYTES", 100_000)
    header = b"X-Part: " + b"a" * 20_000 + b"\r\n"
    # Header lines each: the third holds the most long before all pass the limit.
    sizes = (1, 1, 6)
    socks = [_connect(endpoint.port) for _ in sizes]
    try:
        for sock, lines in zip(socks, sizes, strict=True):
            sock.sendall(b"GET /v1/state HTTP/1.1\r\n" + header * lines)
            time.sleep(0.2)
        assert _closed_by_server(socks[2], timeout=POLL_TIMEOUT_S)
        assert not _closed_by_server(socks[0])
        assert not _closed_by_server(socks[1])
        assert _poll(endpoint.port).json() == {"seq": 1}
    finally:
        for sock in socks:
            sock.close()
    assert any("the most while all held over 100000" in r.getMessage() for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


# --- 3. bad input: a clear refusal, nothing logged that holds the token ------------------


def _reset_after(port: int, data: bytes) -> None:
    sock = _connect(port)
    sock.sendall(data)
    time.sleep(0.1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_bad_input_carrying_the_token_leaves_it_out_of_every_log_line(
    endpoint: HttpEndpoint,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(http_server, "REQUEST_DEADLINE_S", 1.0)
    port = endpoint.port
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    refusals = {
        # The token in a query string, on a request line that does not parse.
        f"GET /v1/state?token={TOKEN} HTTP/1.1 extra\r\n\r\n".encode(): 400,
        # A wrong token whose body holds the right one.
        b"POST /v1/serving/stop HTTP/1.1\r\nAuthorization: Bearer wrong\r\n"
        + b"Content-Length: %d\r\n\r\n" % (len(TOKEN) + 2)
        + f'"{TOKEN}"'.encode(): 401,
        # The right token and a body that is not JSON, echoing it.
        b"POST /v1/serving/stop HTTP/1.1\r\n"
        + auth
        + b"Content-Length: %d\r\n\r\n" % (len(TOKEN) + 1)
        + f"{{{TOKEN}".encode(): 400,
        # The right token in a head too large to keep.
        b"GET /v1/state HTTP/1.1\r\n" + auth + (b"X-Pad: " + b"p" * 60_000 + b"\r\n") * 3: 431,
        # The right token and a header line too long.
        b"GET /v1/state HTTP/1.1\r\n" + auth + b"X-Long: " + b"l" * 70_000 + b"\r\n\r\n": 431,
    }
    for request, status in refusals.items():
        with _connect(port) as sock:
            sock.sendall(request)
            answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 %d " % status), answer[:200]
    # Cut at the deadline, and reset mid-request, each with the token sent.
    with _connect(port) as sock:
        sock.sendall(b"GET /v1/state HTTP/1.1\r\n" + auth)
        assert _closed_by_server(sock, timeout=POLL_TIMEOUT_S)
    _reset_after(port, b"POST /v1/serving/stop HTTP/1.1\r\n" + auth)
    assert _wait_for(
        lambda: sum("broken by the client" in r.getMessage() for r in caplog.records) >= 1
    )
    assert _wait_for(lambda: any("was not in within 1 s" in r.getMessage() for r in caplog.records))
    # Nothing was served on the token's strength: the state is as it was.
    assert _poll(port).json() == {"seq": 1}
    for record in caplog.records:
        assert TOKEN not in record.getMessage()
        assert TOKEN not in (record.exc_text or "")
    captured = capfd.readouterr()
    assert TOKEN not in captured.err and TOKEN not in captured.out
