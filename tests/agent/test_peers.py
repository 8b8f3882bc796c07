"""Agents watching each other over a second path: the pulse, the pulse thread, /v1/state's peers.

Real HTTP on loopback: real agents, and stub servers that answer a pulse, garbage,
another node's name, or nothing at all. The ages are checked through an injected
clock where a test drives the pulses itself; the real thread is waited on with
generous deadlines, never timed.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.peers import PeerView, PeerWatch
from spark_watchdog.config.agent import AgentConfig, PeerConfig, PeeringConfig, parse_agent_config
from spark_watchdog.http.handler import json_response
from spark_watchdog.http.server import HttpEndpoint
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.pulse import (
    OwnPulse,
    Pulse,
    PulseAnswer,
    PulseClient,
    ask_once,
    parse_pulse,
    pulse_bytes,
)
from spark_watchdog.sdnotify import SystemdNotifier

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("agent-peers")]

BOOT = "0123456789abcdef0123456789abcdef"


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True


class StubPeer:
    """A server on loopback answering ``/v1/pulse`` the way ``mode`` says."""

    def __init__(self, node: str = "spark-2", port: int = 0) -> None:
        self.node = node
        self.seq = 0
        self.boot_id = BOOT
        self.mode = "ok"  # ok, garbage, status, wrong_node
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, status = stub.answer()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = _Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self) -> tuple[bytes, int]:
        if self.mode == "garbage":
            return b"<html>not a pulse</html>", 200
        if self.mode == "status":
            return b'{"error": "nope"}', 404
        node = "spark-9" if self.mode == "wrong_node" else self.node
        return json.dumps({"node": node, "seq": self.seq, "boot_id": self.boot_id}).encode(), 200

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stub() -> Iterator[StubPeer]:
    peer = StubPeer()
    yield peer
    peer.close()


def _watch(url: str, clock: Callable[[], float], name: str = "spark-2") -> PeerWatch:
    return PeerWatch((PeerConfig(name, url),), PeeringConfig(1.0, 0.5), clock=clock)


def test_a_pulse_is_a_node_a_seq_and_a_boot_id() -> None:
    assert parse_pulse(b'{"node": "a", "seq": 3, "boot_id": "b"}') is not None
    assert parse_pulse(b'{"node": "a", "seq": 3, "boot_id": null}') is not None
    for body in (
        b"[]",
        b"not json",
        b'{"node": "a", "seq": true, "boot_id": "b"}',
        b'{"node": "a", "seq": -1, "boot_id": "b"}',
        b'{"node": "a", "seq": 1.5, "boot_id": "b"}',
        b'{"node": "", "seq": 1, "boot_id": "b"}',
        b'{"seq": 1, "boot_id": "b"}',
        b'{"node": "a", "seq": 1, "boot_id": 7}',
        b'{"node": "a", "seq": 1, "boot_id": "b", "pad": "' + b"x" * 2000 + b'"}',
    ):
        assert parse_pulse(body) is None, body


def test_a_peer_whose_seq_advances_is_seen_progressing(stub: StubPeer) -> None:
    clock = FakeClock()
    watch = _watch(stub.url, clock)
    assert watch.to_json()["spark-2"]["state"] == "pending"
    watch.pulse_all()
    first = watch.to_json()["spark-2"]
    # The first pulse is a baseline: nothing was seen to advance yet.
    assert first["state"] == "ok" and first["seq"] == 0 and first["boot_id"] == BOOT
    assert first["progress_ago_s"] is None and first["answer_ago_s"] == 0.0
    assert first["via"] == stub.url and first["error"] is None
    clock.now += 1.0
    stub.seq = 1
    watch.pulse_all()
    assert watch.to_json()["spark-2"]["progress_ago_s"] == 0.0
    # The seq stops: still ok, but its progress ages.
    for _ in range(3):
        clock.now += 1.0
        watch.pulse_all()
    seen = watch.to_json()["spark-2"]
    assert seen["state"] == "ok" and seen["seq"] == 1
    assert seen["progress_ago_s"] == 3.0 and seen["answer_ago_s"] == 0.0
    # Ages are as of the asking, not of the last pulse.
    assert watch.to_json(clock.now + 2.5)["spark-2"]["progress_ago_s"] == 5.5
    # A new boot id is a baseline of its own: its next advance is progress.
    clock.now += 1.0
    stub.boot_id, stub.seq = "f" * 32, 0
    watch.pulse_all()
    assert watch.to_json()["spark-2"]["progress_ago_s"] == 4.0
    clock.now += 1.0
    stub.seq = 1
    watch.pulse_all()
    assert watch.to_json()["spark-2"]["progress_ago_s"] == 0.0


def test_garbage_and_another_node_s_pulse_are_never_evidence(stub: StubPeer) -> None:
    clock = FakeClock()
    watch = _watch(stub.url, clock)
    watch.pulse_all()
    for mode, state in (
        ("garbage", "garbage"),
        ("status", "garbage"),
        ("wrong_node", "wrong_node"),
    ):
        stub.mode = mode
        stub.seq += 5
        clock.now += 1.0
        watch.pulse_all()
        seen = watch.to_json()["spark-2"]
        assert seen["state"] == state, seen
        assert seen["progress_ago_s"] is None and seen["seq"] == 0, seen
        assert seen["error"]
    # The right node again: its seq moved since the last pulse of its own.
    stub.mode = "ok"
    clock.now += 1.0
    watch.pulse_all()
    assert watch.to_json()["spark-2"]["progress_ago_s"] == 0.0


def test_a_peer_that_does_not_answer_is_silent() -> None:
    # Nothing listening on one port; on the other a socket that accepts (its
    # backlog does) and never answers.
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)
    try:
        peers = (
            PeerConfig("spark-2", f"http://127.0.0.1:{free_port()}"),
            PeerConfig("spark-3", f"http://127.0.0.1:{hung.getsockname()[1]}"),
        )
        watch = PeerWatch(peers, PeeringConfig(1.0, 0.5))
        watch.pulse_all()
        seen = watch.to_json()
        for name in ("spark-2", "spark-3"):
            assert seen[name]["state"] == "silent", seen
            assert seen[name]["progress_ago_s"] is None and seen[name]["error"]
        assert "timeout" in seen["spark-3"]["error"]
    finally:
        hung.close()


def test_a_peer_that_goes_silent_keeps_its_last_progress_and_comes_back() -> None:
    clock = FakeClock()
    peer = StubPeer()
    port = peer.server.server_address[1]
    watch = _watch(peer.url, clock)
    watch.pulse_all()
    clock.now += 1.0
    peer.seq = 1
    watch.pulse_all()
    peer.close()
    clock.now += 2.0
    watch.pulse_all()
    seen = watch.to_json()["spark-2"]
    assert seen["state"] == "silent" and seen["progress_ago_s"] == 2.0
    assert seen["answer_ago_s"] == 2.0
    back = _stub_on(port)
    try:
        back.seq = 2
        clock.now += 1.0
        watch.pulse_all()
        seen = watch.to_json()["spark-2"]
        assert seen["state"] == "ok" and seen["progress_ago_s"] == 0.0
    finally:
        back.close()


def _stub_on(port: int) -> StubPeer:
    deadline = time.monotonic() + 30
    while True:
        try:
            return StubPeer(port=port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


# -- real agents ---------------------------------------------------------------


class _AgentThread:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(agent.run(self.stop)), daemon=True
        )
        self.thread.start()
        _wait(agent.ready.is_set, "the agent to be ready")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.agent.config.listen.port}"

    def state(self) -> dict[str, Any]:
        body: dict[str, Any] = requests.get(f"{self.base}/v1/state", timeout=5).json()
        return body

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(60)
        assert not self.thread.is_alive(), "agent did not stop"


def _wait(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def _agent_config(node: str, port: int, peers: dict[str, int]) -> AgentConfig:
    return parse_agent_config(
        {
            "node": node,
            "listen": {"address": "127.0.0.1", "port": port},
            "loop_interval": 0.2,
            "probes": {
                "vllm": {"enabled": False},
                "gpu": {"enabled": False},
                "journal": {"enabled": False},
            },
            "peers": [
                {"name": name, "url": f"http://localhost:{peer_port}"}
                for name, peer_port in peers.items()
            ],
            "peering": {"interval": 0.2, "timeout": 0.2},
        }
    )


def _start(node: str, port: int, peers: dict[str, int]) -> _AgentThread:
    agent = Agent(_agent_config(node, port, peers), notifier=SystemdNotifier({}))
    return _AgentThread(agent)


def test_the_pulse_names_the_node_and_its_seq() -> None:
    running = _start("spark-1", free_port(), {})
    try:
        first = requests.get(f"{running.base}/v1/pulse", timeout=5).json()
        assert set(first) == {"node", "seq", "boot_id", "run"} and first["node"] == "spark-1"
        assert parse_pulse(json.dumps(first).encode()) is not None
        _wait(
            lambda: (
                requests.get(f"{running.base}/v1/pulse", timeout=5).json()["seq"] > first["seq"]
            ),
            "the seq to advance",
        )
        # No peers configured: no peers section.
        assert "peers" not in running.state()
        answer = ask_once("spark-1", running.base, 5.0)
        assert answer.state == "ok"
        assert ask_once("spark-7", running.base, 5.0).state == "wrong_node"
    finally:
        running.close()


def test_agents_see_each_other_and_a_peer_that_stops_and_comes_back() -> None:
    ports = {"spark-1": free_port(), "spark-2": free_port()}
    one = _start("spark-1", ports["spark-1"], {"spark-2": ports["spark-2"]})
    two = _start("spark-2", ports["spark-2"], {"spark-1": ports["spark-1"]})
    try:

        def sees(agent: _AgentThread, name: str) -> dict[str, Any]:
            peer: dict[str, Any] = agent.state()["peers"][name]
            return peer

        _wait(lambda: sees(one, "spark-2")["progress_ago_s"] is not None, "spark-1 to see spark-2")
        _wait(lambda: sees(two, "spark-1")["progress_ago_s"] is not None, "spark-2 to see spark-1")
        seen = sees(one, "spark-2")
        assert seen["state"] == "ok" and seen["via"] == f"http://localhost:{ports['spark-2']}"
        assert seen["boot_id"] == two.state()["boot_id"]
        two.close()
        _wait(lambda: sees(one, "spark-2")["state"] == "silent", "spark-2 to fall silent")
        stalled = sees(one, "spark-2")["progress_ago_s"]
        _wait(
            lambda: sees(one, "spark-2")["progress_ago_s"] > stalled + 0.5,
            "spark-2's last progress to age",
        )
        two = _start("spark-2", ports["spark-2"], {"spark-1": ports["spark-1"]})
        _wait(
            lambda: (
                sees(one, "spark-2")["state"] == "ok"
                and sees(one, "spark-2")["progress_ago_s"] < 5.0
            ),
            "spark-2 to be seen again",
        )
    finally:
        one.close()
        if two.thread.is_alive():
            two.close()


def test_an_agent_restarted_on_the_same_boot_is_seen_alive_at_once() -> None:
    """An agent that ran for days (its seq high), restarted on the same boot:
    its peer sees it advancing again within a few pulses, not days later."""
    ports = {"spark-1": free_port(), "spark-2": free_port()}
    one = _start("spark-1", ports["spark-1"], {"spark-2": ports["spark-2"]})
    long_run = Agent(
        _agent_config("spark-2", ports["spark-2"], {"spark-1": ports["spark-1"]}),
        notifier=SystemdNotifier({}),
    )
    long_run.seq = 10**9  # as after years of loops
    two = _AgentThread(long_run)
    try:

        def seen() -> dict[str, Any]:
            peer: dict[str, Any] = one.state()["peers"]["spark-2"]
            return peer

        _wait(
            lambda: (seen()["seq"] or 0) > 10**9 and seen()["progress_ago_s"] is not None,
            "spark-1 to see spark-2's long run advancing",
        )
        two.close()
        _wait(lambda: seen()["state"] == "silent", "spark-2 to fall silent")
        stalled = seen()["progress_ago_s"]
        _wait(lambda: seen()["progress_ago_s"] > stalled + 0.5, "spark-2's last progress to age")
        two = _start("spark-2", ports["spark-2"], {"spark-1": ports["spark-1"]})
        _wait(
            lambda: seen()["state"] == "ok" and seen()["progress_ago_s"] < 1.0,
            "spark-2's new run to be seen advancing",
            timeout=30.0,
        )
        assert seen()["seq"] < 10**6
    finally:
        one.close()
        if two.thread.is_alive():
            two.close()


def test_the_head_s_progress_age_is_as_of_the_answer() -> None:
    with VllmStandin() as vllm:
        config = parse_agent_config(
            {
                "node": "spark-1",
                "listen": {"address": "127.0.0.1", "port": free_port()},
                "loop_interval": 0.2,
                "probes": {
                    "vllm": {"url": vllm.url, "interval": 0.2, "timeout": 1.0},
                    "gpu": {"enabled": False},
                    "journal": {"enabled": False},
                },
            }
        )
        running = _AgentThread(Agent(config, notifier=SystemdNotifier({})))
        try:

            def progress_ago() -> Any:
                return running.state()["probes"]["vllm"].get("progress_ago_s")

            _wait(lambda: progress_ago() is not None, "the head's engine to be seen stepping")
            vllm.set_mode("wedged")
            _wait(lambda: progress_ago() > 3.0, "the wedged head's progress to age")
            # Aged as of each answer, not of the loop that built the snapshot.
            loop_age = running.agent.snapshot()["probes"]["vllm"]["progress_ago_s"]
            assert progress_ago() >= loop_age
            vllm.set_mode("progressing")
            _wait(lambda: progress_ago() < 2.0, "the head to step again")
        finally:
            running.close()


def test_another_node_is_logged_once_and_failures_once_a_minute(
    stub: StubPeer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    watch = _watch(stub.url, clock)
    caplog.set_level("INFO", logger="spark_watchdog.agent.peers")
    stub.mode = "wrong_node"
    for _ in range(3):
        clock.now += 1.0
        watch.pulse_all()
    stub.mode = "garbage"
    for _ in range(30):
        clock.now += 1.0
        watch.pulse_all()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("spark-9" in line for line in lines) == 1, lines
    assert sum("garbage" in line for line in lines) == 1, lines
    clock.now += 60.0
    watch.pulse_all()
    assert sum("garbage" in r.getMessage() for r in caplog.records) == 2


class RawPeer:
    """A TCP server on loopback that reads a request and answers ``reply`` bytes,
    then closes (``close``) or keeps the connection for the next request."""

    def __init__(self, reply: bytes, close: bool = True) -> None:
        self.reply, self.close_after = reply, close
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(10)
                try:
                    while conn.recv(4096):
                        conn.sendall(self.reply)
                        if self.close_after:
                            break
                except OSError:
                    pass

    def stop(self) -> None:
        self.sock.close()


def _http(body: bytes, headers: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body


PULSE = b'{"node": "spark-2", "seq": 4, "boot_id": "' + BOOT.encode() + b'"}'


@pytest.mark.parametrize(
    ("reply", "state"),
    [
        (_http(PULSE), "ok"),
        (_http(PULSE, "Connection: close\r\n"), "ok"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", "garbage"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            "garbage",
        ),
        (b"HTTP/1.1 200 OK\r\n\r\n" + PULSE, "garbage"),
        (_http(b"x" * 5000), "garbage"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n" + PULSE, "garbage"),
        (b"", "silent"),
    ],
)
def test_what_a_raw_answer_is(reply: bytes, state: str) -> None:
    peer = RawPeer(reply)
    try:
        answer = ask_once("spark-2", peer.url, 5.0)
        assert answer.state == state, answer
    finally:
        peer.stop()


class TricklingPeer(RawPeer):
    """Answers each request in two pieces, ``gap`` seconds apart, after ``delays[i]``
    seconds for the i-th request on its one connection."""

    def __init__(self, reply: bytes, delays: list[float], gap: float) -> None:
        self.delays, self.gap = delays, gap
        self.stopped = threading.Event()
        super().__init__(reply)

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(30)
            try:
                for delay in self.delays:
                    if not conn.recv(4096) or self.stopped.wait(delay):
                        return
                    conn.sendall(self.reply[:20])
                    if self.stopped.wait(self.gap):
                        return
                    conn.sendall(self.reply[20:])
            except OSError:
                pass

    def stop(self) -> None:
        self.stopped.set()
        super().stop()


def test_an_answer_trickling_past_the_timeout_is_silence() -> None:
    """The timeout bounds the whole answer, not each piece of it."""
    peer = TricklingPeer(_http(PULSE), delays=[0.0], gap=30.0)
    try:
        started = time.monotonic()
        answer = ask_once("spark-2", peer.url, 0.5)
        took = time.monotonic() - started
    finally:
        peer.stop()
    assert answer.state == "silent" and answer.error is not None and "timeout" in answer.error
    assert took < 10.0, took  # the peer would hold it for 30 s


def test_a_wait_shortened_for_one_answer_is_whole_again_for_the_next() -> None:
    """The first answer's second piece comes 3 s in, so its wait was cut to
    what was left of 4 s; the second answer, 2 s in, gets the whole 4 s."""
    peer = TricklingPeer(_http(PULSE, "Connection: keep-alive\r\n"), delays=[2.9, 2.0], gap=0.1)
    client = PulseClient("spark-2", peer.url, 4.0)
    try:
        assert client.ask().state == "ok"
        second = client.ask()
        assert second.state == "ok", second
    finally:
        client.close()
        peer.stop()


def test_a_kept_alive_connection_is_reused_and_renewed_when_the_peer_closed_it() -> None:
    from spark_watchdog.probes.pulse import PulseClient

    peer = RawPeer(_http(PULSE), close=False)
    client = PulseClient("spark-2", peer.url, 5.0)
    try:
        assert client.ask().state == "ok"
        first = client._sock
        assert client.ask().state == "ok" and client._sock is first
        # The peer drops its idle connections: the next pulse still gets through.
        peer.close_after = True
        assert client.ask().state == "ok"
        assert client.ask().state == "ok"
    finally:
        client.close()
        peer.stop()


def test_a_kept_alive_connection_the_peer_reset_is_renewed() -> None:
    """A peer that drops an idle connection just as the next request arrives
    answers it with a reset (ECONNRESET on reading, not an end of stream): the
    pulse is asked again on a new connection."""
    import struct

    from spark_watchdog.probes.pulse import PulseClient

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        conn.recv(4096)
        conn.sendall(_http(PULSE))
        conn.recv(4096)  # the second request: dropped unanswered, with a reset
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(10)
            conn.recv(4096)
            conn.sendall(_http(PULSE))

    threading.Thread(target=serve, daemon=True).start()
    client = PulseClient("spark-2", f"http://127.0.0.1:{listener.getsockname()[1]}", 5.0)
    try:
        assert client.ask().state == "ok"
        first = client._sock
        answer = client.ask()
        assert answer.state == "ok", answer
        assert client._sock is not first
    finally:
        client.close()
        listener.close()


# -- a pulse carried in the asking agent's request ------------------------------------


class PulsingNode:
    """A peer watch behind a real HTTP server that answers its node's pulse and
    hears the pulses its peers' requests carry; it counts the pulses asked of it."""

    def __init__(self, node: str, clock: FakeClock) -> None:
        self.node = node
        self.seq = 0
        self.asked = 0
        self.clock = clock
        self.watch: PeerWatch | None = None

        def pulse() -> tuple[int, str, bytes]:
            self.asked += 1
            return json_response({"node": node, "seq": self.seq, "boot_id": BOOT})

        def heard(value: bytes, address: Any) -> None:
            if self.watch is not None:
                self.watch.heard(value, address)

        self.endpoint = HttpEndpoint("127.0.0.1", 0, {"/v1/pulse": pulse}, pulse_in=heard)
        self.endpoint.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.endpoint.port}"

    def peer_with(self, other: PulsingNode, host: str = "127.0.0.1") -> None:
        url = other.url.replace("127.0.0.1", host)
        self.watch = PeerWatch(
            (PeerConfig(other.node, url),),
            PeeringConfig(1.0, 0.5),
            clock=self.clock,
            carry=lambda: pulse_bytes(self.node, self.seq, BOOT),
        )

    def sees(self, other: PulsingNode) -> dict[str, Any]:
        assert self.watch is not None
        seen: dict[str, Any] = self.watch.to_json()[other.node]
        return seen

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.endpoint.stop()


@pytest.fixture
def pair_of_nodes() -> Iterator[tuple[PulsingNode, PulsingNode]]:
    clock = FakeClock()
    one, two = PulsingNode("spark-1", clock), PulsingNode("spark-2", clock)
    one.peer_with(two)
    two.peer_with(one)
    yield one, two
    one.close()
    two.close()


def test_of_two_agents_one_asks_and_the_other_hears_its_pulse_in_the_request(
    pair_of_nodes: tuple[PulsingNode, PulsingNode],
) -> None:
    one, two = pair_of_nodes
    assert one.watch is not None and two.watch is not None
    clock = one.clock
    one.watch.pulse_all()  # asks spark-2, carrying its own pulse
    assert two.asked == 1
    heard = two.sees(one)
    assert heard["state"] == "ok" and heard["seq"] == 0 and heard["heard_ago_s"] == 0.0
    assert one.sees(two)["state"] == "ok" and one.sees(two)["heard_ago_s"] is None
    # Half an interval later spark-2's round does not ask: it just heard spark-1.
    clock.now += 0.5
    two.watch.pulse_all()
    assert one.asked == 0
    # spark-1 asks again with an advanced seq: spark-2 sees it progress.
    clock.now += 0.5
    one.seq = 1
    one.watch.pulse_all()
    assert two.asked == 2 and two.sees(one)["progress_ago_s"] == 0.0
    # Then spark-1 falls quiet: spark-2's next round past the share asks it itself.
    clock.now += 0.8
    two.watch.pulse_all()
    assert one.asked == 1
    assert one.sees(two)["heard_ago_s"] == 0.0  # and spark-1 heard spark-2's pulse in it
    assert two.sees(one)["heard_ago_s"] == 0.8 and two.sees(one)["answer_ago_s"] == 0.0


def test_a_carried_pulse_from_another_address_or_not_a_peer_s_is_not_evidence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    one, two = PulsingNode("spark-1", clock), PulsingNode("spark-2", clock)
    caplog.set_level("INFO", logger="spark_watchdog.agent.peers")
    try:
        one.peer_with(two)
        two.peer_with(one, host="127.0.0.2")  # spark-2 knows spark-1 by another address
        assert one.watch is not None and two.watch is not None
        for _ in range(3):
            one.watch.pulse_all()
            clock.now += 1.0
        assert two.asked == 3
        seen = two.sees(one)
        assert seen["heard_ago_s"] is None and seen["seq"] is None and seen["state"] == "pending"
        # Not a peer's pulse, and not a pulse: heard, taken for nothing.
        client = PulseClient("spark-2", two.url, 5.0, carry=lambda: pulse_bytes("spark-7", 1, BOOT))
        assert client.ask().state == "ok"
        client.close()
        client = PulseClient("spark-2", two.url, 5.0, carry=lambda: b"not a pulse")
        assert client.ask().state == "ok"
        client.close()
        assert two.sees(one)["heard_ago_s"] is None
        lines = [r.getMessage() for r in caplog.records]
        # One line per source address: 127.0.0.1 sent all five.
        assert sum("not evidence of anything" in line for line in lines) == 1, lines
        assert "a pulse of spark-1, not from its address" in lines[0]
    finally:
        one.close()
        two.close()


def test_within_a_boot_the_seq_seen_never_goes_back() -> None:
    view = PeerView("spark-1", "http://127.0.0.1:1")
    view.note(PulseAnswer("ok", Pulse("spark-1", 100, BOOT)), 1.0)
    # A pulse read before that answer but arriving after it.
    view.note(PulseAnswer("ok", Pulse("spark-1", 99, BOOT)), 2.0)
    assert view.seq == 100
    view.note(PulseAnswer("ok", Pulse("spark-1", 100, BOOT)), 3.0)
    assert view.progress_at is None  # 100 again is no progress
    view.note(PulseAnswer("ok", Pulse("spark-1", 3, "f" * 32)), 4.0)
    assert view.seq == 3 and view.progress_at is None  # a new boot starts over: a baseline
    view.note(PulseAnswer("ok", Pulse("spark-1", 4, "f" * 32)), 5.0)
    assert view.seq == 4 and view.progress_at == 5.0


def test_an_agent_s_own_pulse_is_encoded_once_per_seq() -> None:
    now: list[Any] = [1, BOOT]
    own = OwnPulse("spark-1", lambda: (now[0], now[1]))
    first = own.encoded()
    assert own.encoded() is first  # the same bytes while nothing changed
    assert parse_pulse(first) == Pulse("spark-1", 1, BOOT)
    now[0] = 2
    assert parse_pulse(own.encoded()) == Pulse("spark-1", 2, BOOT)
    now[1] = None
    assert parse_pulse(own.encoded()) == Pulse("spark-1", 2, None)


def test_the_source_addresses_remembered_are_bounded_and_a_peer_is_still_known() -> None:
    from spark_watchdog.agent.peers import MAX_REMEMBERED_SOURCES

    watch = _watch("http://127.0.0.1:9", time.monotonic)
    carried = pulse_bytes("spark-2", 3, BOOT)
    for i in range(3 * MAX_REMEMBERED_SOURCES):
        watch.heard(carried + b" " * 4096, (f"10.0.{i // 250}.{i % 250}", 4000))  # too long
        watch.heard(carried, (f"10.1.{i // 250}.{i % 250}", 4000))
        watch.to_json()
        assert len(watch._sources) <= MAX_REMEMBERED_SOURCES
    for i in range(3 * MAX_REMEMBERED_SOURCES):  # kept, not taken yet: bounded too, and short
        watch.heard(carried + b" " * 4096, (f"10.2.{i // 250}.{i % 250}", 4000))
    assert len(watch._carried) == MAX_REMEMBERED_SOURCES
    assert all(len(kept[0]) <= 1024 for kept in watch._carried.values())
    assert watch.to_json()["spark-2"]["heard_ago_s"] is None  # none of them its address
    watch.heard(carried, ("127.0.0.1", 4000))
    assert watch.to_json()["spark-2"]["heard_ago_s"] is not None


def test_a_carried_pulse_is_taken_later_as_of_when_it_came() -> None:
    """The server keeps a carried pulse (the latest per connection) for the
    next round or /v1/state read, which take it with the time it came."""
    clock = FakeClock()
    watch = PeerWatch(
        (PeerConfig("spark-2", "http://127.0.0.1:9"), PeerConfig("spark-3", "http://127.0.0.1:10")),
        PeeringConfig(1.0, 0.5),
        clock=clock,
    )
    # Two peers on one address (a lab's loopback), each on its own connection.
    watch.heard(pulse_bytes("spark-3", 8, BOOT), ("127.0.0.1", 4001))
    watch.heard(pulse_bytes("spark-2", 3, BOOT), ("127.0.0.1", 4000))
    clock.now += 0.4
    watch.heard(pulse_bytes("spark-2", 5, BOOT), ("127.0.0.1", 4000))
    clock.now += 0.3
    seen = watch.to_json()["spark-2"]
    assert (seen["seq"], seen["heard_ago_s"], seen["answer_ago_s"]) == (5, 0.3, 0.3)
    assert watch.to_json()["spark-3"]["heard_ago_s"] == 0.7
    assert seen["progress_ago_s"] is None  # the first pulse taken is a baseline
    watch.heard(pulse_bytes("spark-2", 6, BOOT), ("127.0.0.1", 4000))
    clock.now += 0.2
    watch.heard(pulse_bytes("spark-3", 9, BOOT), ("127.0.0.1", 4001))
    watch.pulse_all()  # takes them, and does not ask: heard within the share
    clock.now += 0.1
    seen = watch.to_json()["spark-2"]
    assert (seen["seq"], seen["progress_ago_s"], seen["state"]) == (6, 0.3, "ok")


def _paced_watch(url: str, clock: FakeClock, interval: float = 1.0) -> PeerWatch:
    return PeerWatch(
        (PeerConfig("spark-2", url),), PeeringConfig(interval, 0.5), clock=clock, beat=1.0
    )


def test_rounds_on_the_heartbeat_wake_the_pulse_thread_only_for_a_peer_to_ask(
    stub: StubPeer,
) -> None:
    """With the interval a whole number of loops, the heartbeat decides each
    round: a peer heard within the round's share is not asked and the pulse
    thread is not even woken; a peer not heard is asked on the thread."""
    clock = FakeClock()
    watch = _paced_watch(stub.url, clock)
    assert watch.paced
    rounds: list[float] = []
    real_round = watch.pulse_all

    def counted() -> None:
        rounds.append(clock.now)
        real_round()

    watch.pulse_all = counted  # type: ignore[method-assign]
    carried = pulse_bytes("spark-2", 5, BOOT)
    try:
        watch.start()  # the first round at once
        _wait(lambda: watch.to_json()["spark-2"]["state"] == "ok", "the first round")
        assert rounds == [1000.0]
        # Heard within the share before each beat: no round, however many beats.
        for _ in range(3):
            clock.now += 1.0
            watch.heard(carried, ("127.0.0.1", 50000))
            clock.now += 0.2
            watch.beat()
        time.sleep(0.5)  # a wrongly woken thread runs its round within milliseconds
        assert rounds == [1000.0]
        # Not heard for a whole interval: the beat wakes the thread, which asks.
        clock.now += 1.0
        assert watch.to_json()["spark-2"]["answer_ago_s"] == 1.2  # the last pulse heard
        watch.beat()
        _wait(lambda: watch.to_json()["spark-2"]["answer_ago_s"] == 0.0, "the peer asked")
        assert rounds[1:] == [clock.now]
        # A beat before the next round is due (a second one in the same loop) does nothing.
        watch.beat()
        time.sleep(0.5)
        assert len(rounds) == 2
    finally:
        watch.stop()


def test_an_interval_that_is_not_a_whole_number_of_loops_keeps_its_own_clock() -> None:
    clock = FakeClock()
    assert _paced_watch("http://127.0.0.1:1", clock, 2.0).paced
    odd = _paced_watch("http://127.0.0.1:1", clock, 1.5)
    assert not odd.paced
    odd.beat()  # not paced: a no-op, and nothing started
    assert not PeerWatch((), PeeringConfig(1.0, 0.5)).paced


def test_a_failure_taking_carried_pulses_leaves_the_heartbeat_going(
    stub: StubPeer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """beat() runs on the agent's heartbeat: whatever goes wrong in it is
    logged and handed to the pulse thread, never raised into the loop."""
    clock = FakeClock()
    watch = _paced_watch(stub.url, clock)
    try:
        watch.start()
        _wait(lambda: watch.to_json()["spark-2"]["state"] == "ok", "the first round")

        def broken() -> None:
            raise RuntimeError("a carried pulse nobody expected")

        monkeypatch.setattr(watch, "_take_carried", broken)
        clock.now += 1.0
        watch.beat()  # must not raise
        assert "carried failed" in caplog.text
    finally:
        monkeypatch.undo()
        watch.stop()
