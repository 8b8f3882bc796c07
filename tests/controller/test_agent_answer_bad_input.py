"""Agent answers found by fuzzing (bench/fuzz.py, target ``snapshot``).

Whatever listens on an agent's port, the controller must end up with an
``HttpError`` or a noted error on the node, never an exception of another
type out of a poll or a serving restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError, request
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.serving.serving_restart import ServingNode, ServingRestart

pytestmark = pytest.mark.integration


class RawPeer:
    """A TCP server on loopback that answers every request with fixed bytes."""

    def __init__(self, answer: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.answer = answer
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1/state"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.recv(65536)
                conn.sendall(self.answer)


def _ask(answer: bytes) -> HttpError:
    peer = RawPeer(answer)
    try:
        with pytest.raises(HttpError) as caught:
            asyncio.run(request(peer.url, timeout=10.0))
    finally:
        peer.sock.close()
    return caught.value


def test_a_status_code_in_non_ascii_digits_is_not_an_http_answer() -> None:
    # "²00": str.isdigit() says yes, int() says no. Before: ValueError escaped.
    error = _ask(b"HTTP/1.1 \xb200 OK\r\nContent-Length: 0\r\n\r\n")
    assert str(error).endswith("not an HTTP answer (b'HTTP/1.1 \\xb200 OK\\r\\n')")


def test_a_negative_content_length_is_refused() -> None:
    # Before: ValueError (readexactly size can not be less than zero) escaped.
    error = _ask(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n")
    assert str(error).endswith("/v1/state: bad Content-Length '-1'; expected a number of bytes")


def test_a_header_line_over_the_stream_limit_is_refused() -> None:
    # Before: ValueError (Separator is not found, and chunk exceed the limit) escaped.
    error = _ask(b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n")
    assert "/v1/state: a status or header line is too long" in str(error)


def test_endless_headers_are_cut_off() -> None:
    error = _ask(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 150 + b"\r\n")
    assert str(error).endswith("/v1/state: more than 100 header lines")


def _watch() -> NodeWatch:
    return NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)


def test_json_nested_deeper_than_the_stack_is_life_but_not_a_snapshot() -> None:
    watch = _watch()
    # Before: RecursionError out of json.loads in the controller's poll.
    assert not watch.note_http_answer(200, b"[" * 100_000, 1.0, 1001.0)
    assert watch.agent_error == "/v1/state answered 200 with JSON nested too deeply"
    assert watch.agent_answer_at == 1.0 and watch.snapshot is None
    with pytest.raises(HttpError, match=r"^answer is not JSON \(nested too deeply\)$"):
        HttpAnswer(200, b"[" * 100_000).json()


def test_a_body_that_is_not_an_object_is_named() -> None:
    watch = _watch()
    watch.note_http_answer(200, b"[1, 2]", 1.0, 1001.0)
    assert watch.agent_error == "/v1/state answered 200 with JSON list; expected an object"
    watch.note_http_answer(503, b"", 2.0, 1002.0)
    assert watch.agent_error == "/v1/state answered 503"


@pytest.mark.parametrize(
    "quiet",
    [10**400, float("inf"), float("nan"), -5, "12", True],
    ids=["10**400", "inf", "nan", "-5", "str", "bool"],
)
def test_a_fault_onset_out_of_any_float_falls_back_to_the_agents_progress(quiet: Any) -> None:
    watch = _watch()
    body = json.dumps({"seq": 1, "probes": {"vllm": {"state": "stalled", "quiet": 0}}})
    watch.note_http_answer(200, body.encode(), 1.0, 1001.0)
    assert watch.snapshot is not None
    watch.snapshot["probes"]["vllm"]["seconds_without_progress"] = quiet
    # Before: float(10**400) raised OverflowError while opening the serving incident.
    assert watch.serving_fault_onset(2000.0) == 1001.0


def test_a_fault_onset_from_the_agent() -> None:
    watch = _watch()
    body = {"seq": 1, "probes": {"vllm": {"state": "stalled", "seconds_without_progress": 42.5}}}
    watch.note_http_answer(200, json.dumps(body).encode(), 1.0, 1001.0)
    assert watch.serving_fault_onset(2000.0) == 1957.5


class HeadAgent:
    """An agent whose /v1/state has a ``probes`` that is not an object."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _send(self, body: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/serving":  # the restart's preflight
                    self._send(b'{"enabled": true, "profiles": ["safe"]}')
                else:
                    self._send(b'{"seq": 3, "probes": ["vllm"], "serving": []}')

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(b"{}")

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def head_agent() -> Iterator[HeadAgent]:
    agent = HeadAgent()
    yield agent
    agent.server.shutdown()
    agent.server.server_close()


def test_a_serving_restart_reads_a_malformed_state_as_not_ready(head_agent: HeadAgent) -> None:
    restart = ServingRestart(
        ServingNode("spark-1", head_agent.base), [], "token", timeout=2.5, request_timeout=5.0
    )
    # Before: AttributeError ('list' object has no attribute 'get') out of run().
    report = asyncio.run(restart.run("safe"))
    assert report.result == "timed_out"
    assert (report.error or "").startswith("the head did not serve within 2.5s (")
