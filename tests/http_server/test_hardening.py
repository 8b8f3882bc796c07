"""The HTTP layer the agent and the controller share, against hostile or broken
clients: real servers on loopback, real sockets, the real log records."""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from spark_watchdog.http import server as http_server
from spark_watchdog.http.line_budget import LineBudget
from spark_watchdog.http.server import (
    MAX_BODY_DEPTH,
    HttpEndpoint,
    Response,
    json_response,
)

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
HTTP_LOGGER = "spark_watchdog.http"


def _authorize(header: str | None) -> str | None:
    return None if header == f"Bearer {TOKEN}" else "invalid bearer token"


def _slow_state() -> Response:
    # Long enough for a client's reset to arrive before the answer is written.
    time.sleep(0.3)
    return json_response({"big": "x" * 200_000})


def _echo(body: dict[str, Any]) -> Response:
    return json_response({"got": body})


@pytest.fixture
def endpoint() -> Iterator[HttpEndpoint]:
    server = HttpEndpoint(
        "127.0.0.1",
        0,
        {"/v1/state": lambda: json_response({"seq": 1}), "/slow": _slow_state},
        {"/v1/serving/stop": _echo},
        authorize=_authorize,
    )
    server.start()
    yield server
    server.stop()


def _base(endpoint: HttpEndpoint) -> str:
    return f"http://127.0.0.1:{endpoint.port}"


def _raw(endpoint: HttpEndpoint, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` as is and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        # The server closes with part of an oversized request unread: the kernel
        # then resets the connection, after the answer, which is read first.
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def _parse(answer: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers, body


def _wait_for(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _reset_after_request(port: int) -> None:
    """Send a request, then close with a TCP reset before the (slow) answer comes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# --- 1. broken connections: one line each, no traceback, bounded ---------------


def _http_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == HTTP_LOGGER]


def test_a_client_that_resets_gets_one_log_line_and_no_traceback(
    endpoint: HttpEndpoint, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    for _ in range(3):
        _reset_after_request(endpoint.port)
    assert _wait_for(lambda: len(_http_records(caplog)) >= 3)
    time.sleep(0.8)  # anything more would come now
    records = _http_records(caplog)
    assert len(records) == 3, [r.getMessage() for r in records]
    for record in records:
        assert record.exc_info is None
        assert record.levelno == logging.INFO
        message = record.getMessage()
        assert message.startswith("connection from 127.0.0.1:"), message
        assert " broken by the client (" in message, message
        assert "\n" not in message
    assert "Traceback" not in capfd.readouterr().err
    # The server is unharmed.
    assert requests.get(f"{_base(endpoint)}/v1/state", timeout=5).json() == {"seq": 1}


def test_a_flood_of_resets_is_logged_at_a_bounded_rate(
    endpoint: HttpEndpoint, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    burst = http_server.BROKEN_LOG_BURST
    for _ in range(burst + 15):
        _reset_after_request(endpoint.port)
    # Every connection is handled; only the burst and one notice are logged.
    assert _wait_for(lambda: len(_http_records(caplog)) >= burst + 1)
    time.sleep(1.0)
    messages = [r.getMessage() for r in _http_records(caplog)]
    assert len(messages) == burst + 1, messages
    assert messages[-1] == (
        f"{burst} broken connections logged in {http_server.BROKEN_LOG_WINDOW_S:.0f} s; "
        "further ones in that time are counted, not logged"
    )
    assert "Traceback" not in capfd.readouterr().err


def test_the_suppressed_count_is_reported_when_the_window_ends() -> None:
    lines: list[str] = []
    now = [0.0]
    budget = LineBudget(2, 60.0, clock=lambda: now[0])

    def note(text: str) -> None:
        budget.log(lambda message, *args: lines.append(message % args), text)

    for i in range(6):
        note(f"event {i}")
    budget.flush(lambda message, *args: lines.append(message % args))
    assert lines == [
        "event 0",
        "event 1",
        "2 broken connections logged in 60 s; further ones in that time are counted, not logged",
    ]
    now[0] = 61.0
    budget.flush(lambda message, *args: lines.append(message % args))
    assert lines[-1] == "4 more broken connections in the last 61 s were not logged"
    note("event 6")
    assert lines[-1] == "event 6"


# --- 2. slow requests (connections in numbers: test_under_load.py) -------------


def test_a_dripping_client_is_cut_at_the_request_deadline(
    endpoint: HttpEndpoint, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each header line comes well within the socket timeout, but the request
    never completes: the server closes it at REQUEST_DEADLINE_S, and the slot
    is free again."""
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    monkeypatch.setattr(http_server, "REQUEST_DEADLINE_S", 2.0)
    # The deadline runs from the connection's opening: timed from before it.
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=10) as sock:
        peer = f"127.0.0.1:{sock.getsockname()[1]}"
        sock.sendall(b"GET /v1/state HTTP/1.1\r\n")
        closed_after = None
        sock.settimeout(0.5)
        for i in range(40):  # 20 s of one header line every 0.5 s
            try:
                with contextlib.suppress(TimeoutError):
                    if sock.recv(65536) == b"":
                        closed_after = time.monotonic() - started
                        break
                sock.sendall(b"X-Drip-%d: 1\r\n" % i)
            except (BrokenPipeError, ConnectionResetError):
                # Closed with a line that came as the deadline fell still
                # unread: the kernel resets the stream instead of ending it.
                closed_after = time.monotonic() - started
                break
    assert closed_after is not None, "the server never closed the dripping connection"
    assert 2.0 <= closed_after < 10.0
    assert _wait_for(
        lambda: any(
            "its request was not in within 2 s" in r.getMessage() and peer in r.getMessage()
            for r in caplog.records
        )
    )
    # A complete request on a fresh connection is served at once.
    assert requests.get(f"{_base(endpoint)}/v1/state", timeout=5).json() == {"seq": 1}


def test_a_slow_route_is_not_cut_by_the_request_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The deadline covers the request's arrival, not the route: a serving stop
    that waits for a process group answers however long it takes."""
    monkeypatch.setattr(http_server, "REQUEST_DEADLINE_S", 0.5)

    def slow_stop(body: dict[str, Any]) -> Response:
        time.sleep(2.0)
        return json_response({"stopped": True})

    server = HttpEndpoint("127.0.0.1", 0, {}, {"/v1/serving/stop": slow_stop})
    server.start()
    try:
        answer = requests.post(f"{_base(server)}/v1/serving/stop", json={}, timeout=10)
    finally:
        server.stop()
    assert answer.status_code == 200 and answer.json() == {"stopped": True}


# --- 3. body depth ----------------------------------------------------------------


def _post(endpoint: HttpEndpoint, path: str, data: bytes) -> requests.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    return requests.post(f"{_base(endpoint)}{path}", data=data, headers=headers, timeout=10)


def test_a_deeply_nested_body_is_a_400_not_a_recursion_error(
    endpoint: HttpEndpoint, capfd: pytest.CaptureFixture[str]
) -> None:
    deep = b"[" * 32_000 + b"]" * 32_000
    answer = _post(endpoint, "/v1/serving/stop", deep)
    assert answer.status_code == 400
    assert answer.json() == {
        "error": f"body nests 32000 levels of arrays and objects; at most {MAX_BODY_DEPTH} "
        "are accepted (a serving request is one flat object)"
    }
    assert "Traceback" not in capfd.readouterr().err


def test_the_depth_limit_counts_brackets_inside_strings_as_text(endpoint: HttpEndpoint) -> None:
    inner: Any = {}
    for _ in range(MAX_BODY_DEPTH - 1):
        inner = {"a": inner}
    fits = json.dumps(inner | {"text": "[[[[{{{{" * 10}).encode()
    assert _post(endpoint, "/v1/serving/stop", fits).status_code == 200
    too_deep = json.dumps({"a": inner}).encode()
    answer = _post(endpoint, "/v1/serving/stop", too_deep)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(f"body nests {MAX_BODY_DEPTH + 1} levels")


# --- 4. JSON for every method and every error ---------------------------------------


@pytest.mark.parametrize("method", ["OPTIONS", "PUT", "DELETE", "PATCH", "TRACE", "QUERY"])
def test_other_methods_get_a_json_405_with_allow(endpoint: HttpEndpoint, method: str) -> None:
    base = _base(endpoint)
    state = requests.request(method, f"{base}/v1/state", timeout=5)
    assert state.status_code == 405
    assert state.headers["Allow"] == "GET, HEAD"
    assert state.headers["Content-Type"] == "application/json"
    assert state.json() == {"error": f"{method} is not allowed on /v1/state; use GET or HEAD"}
    post = requests.request(method, f"{base}/v1/serving/stop", timeout=5)
    assert post.status_code == 405 and post.headers["Allow"] == "POST"
    assert post.json() == {"error": f"{method} is not allowed on /v1/serving/stop; use POST"}
    missing = requests.request(method, f"{base}/nowhere", timeout=5)
    assert missing.status_code == 404
    assert missing.json() == {
        "error": "no such path /nowhere; paths: /slow, /v1/serving/stop, /v1/state"
    }


def test_head_answers_like_get_without_a_body(endpoint: HttpEndpoint) -> None:
    base = _base(endpoint)
    head = requests.head(f"{base}/v1/state", timeout=5)
    get = requests.get(f"{base}/v1/state", timeout=5)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Type"] == "application/json"
    assert head.headers["Content-Length"] == str(len(get.content))
    not_here = requests.head(f"{base}/v1/serving/stop", timeout=5)
    assert not_here.status_code == 405 and not_here.headers["Allow"] == "POST"
    assert requests.head(f"{base}/nowhere", timeout=5).status_code == 404


def test_get_and_post_on_each_others_paths_say_which_method(endpoint: HttpEndpoint) -> None:
    base = _base(endpoint)
    get = requests.get(f"{base}/v1/serving/stop", timeout=5)
    assert get.status_code == 405 and get.headers["Allow"] == "POST"
    assert get.json() == {"error": "GET is not allowed on /v1/serving/stop; use POST"}
    post = requests.post(f"{base}/v1/state", timeout=5)
    assert post.status_code == 405 and post.headers["Allow"] == "GET, HEAD"
    assert post.json() == {"error": "POST is not allowed on /v1/state; use GET or HEAD"}


LONG_HEADER = b"X-Long: " + b"a" * 70_000
MANY_HEADERS = b"".join(b"X-%d: 1\r\n" % i for i in range(120))

REQUEST_LINE = "; expected a request line METHOD /path HTTP/1.1"
MALFORMED = [
    (b"BREW /v1/state HTTP/1.1\r\n\r\n", 501, "unsupported method 'BREW'; use GET, HEAD or POST"),
    (b"garbage\r\n\r\n", 400, f"Bad request syntax ('garbage'){REQUEST_LINE}"),
    (b"GET /v1/state HTTP/1.1 extra\r\n\r\n", 400, f"Bad request version ('extra'){REQUEST_LINE}"),
    (b"GET /v1/state HTTP/x\r\n\r\n", 400, f"Bad request version ('HTTP/x'){REQUEST_LINE}"),
    (
        b"GET /v1/state HTTP/2.0\r\n\r\n",
        505,
        "Invalid HTTP version (2.0); send HTTP/1.1 requests",
    ),
    (
        b"GET /v1/state\r\n",
        505,
        "HTTP/0.9 is not supported; send HTTP/1.0 or HTTP/1.1 requests",
    ),
    (
        b"POST /v1/serving/stop\r\n",
        400,
        f"Bad request syntax ('POST /v1/serving/stop'){REQUEST_LINE}",
    ),
    (
        b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
        414,
        "request line longer than 65536 bytes; shorten the URL",
    ),
    (
        b"GET /v1/state HTTP/1.1\r\n" + LONG_HEADER + b"\r\n\r\n",
        431,
        "a header line longer than 65536 bytes; send shorter headers",
    ),
    (
        b"GET /v1/state HTTP/1.1\r\n" + MANY_HEADERS + b"\r\n",
        431,
        "more than 100 headers; send fewer",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "message"), MALFORMED)
def test_malformed_requests_get_a_json_error_with_a_status_line(
    endpoint: HttpEndpoint, request_bytes: bytes, status: int, message: str
) -> None:
    status_line, headers, body = _parse(_raw(endpoint, request_bytes))
    assert status_line.startswith(f"HTTP/1.1 {status} "), status_line
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert int(headers["content-length"]) == len(body)
    assert json.loads(body) == {"error": message}


def test_post_errors_are_json(endpoint: HttpEndpoint) -> None:
    base = _base(endpoint)
    unauth = requests.post(f"{base}/v1/serving/stop", json={}, timeout=5)
    assert unauth.status_code == 401 and unauth.json() == {"error": "invalid bearer token"}
    chunked = requests.post(
        f"{base}/v1/serving/stop",
        data=iter([b"{}"]),
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=5,
    )
    assert chunked.status_code == 411
    assert chunked.json() == {"error": "send the body with a Content-Length (no chunked bodies)"}
    status_line, _, body = _parse(
        _raw(
            endpoint,
            b"POST /v1/serving/stop HTTP/1.1\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b"\r\nContent-Length: lots\r\n\r\n",
        )
    )
    assert status_line.startswith("HTTP/1.1 400 ")
    assert json.loads(body) == {"error": "Content-Length: expected a byte count, got 'lots'"}


def test_a_stopped_endpoint_answers_no_kept_alive_connection() -> None:
    """A scraper reusing one connection must not go on being answered by an
    endpoint that stopped (a standby's, once its controller leads)."""
    served = HttpEndpoint("127.0.0.1", 0, {"/v1/state": lambda: json_response({"who": "old"})})
    served.start()
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
    conn.request("GET", "/v1/state")
    first = conn.getresponse()
    assert json.loads(first.read()) == {"who": "old"}
    assert not first.will_close  # kept alive
    served.stop()
    with pytest.raises((http.client.HTTPException, OSError)):
        conn.request("GET", "/v1/state")
        conn.getresponse().read()
    conn.close()
