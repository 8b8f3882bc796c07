"""The stand-in's tensor-parallel group: what lets the head's engine step.

Every step of a real tensor-parallel engine runs an all-reduce over every
rank of its group, through the fabric the ranks talk over (the Sparks'
ConnectX-7 ports). So the head cannot step while a rank is gone, frozen, or
out of reach over the fabric, and a dark fabric link stalls serving on
every node (docs/design.md, "Peers").

The lab's stand-in plays that with two small pieces: each worker rank
answers on its fabric address (:class:`RankEndpoint`: every byte it reads it
writes back, from the rank's own process, so a frozen or dead rank answers
nothing), and the head asks every rank in turn (:class:`GroupReach`, a
thread per rank) and takes a step only while each answered within
:data:`GRACE_S`. Without ranks to ask (a stand-in alone, the lab on
loopback) the head steps as before.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Sequence

# Seconds between two asks of one rank, how long one ask may take, and how
# recent every rank's last answer must be for a step. A real engine stops at
# once (its all-reduce blocks); the grace is what a loaded machine's
# scheduling needs, far below the lab's stall_after. Steps it lets through
# after a cut are life the controller reads for the node cut off (it may call
# a node whose links both went dark `unreachable` for a moment).
ASK_EVERY_S = 0.1
ASK_TIMEOUT_S = 0.3
GRACE_S = 0.5


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv4 address or a name) as a socket address."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        server = self.server
        assert isinstance(server, _EndpointServer)
        with server.lock:
            server.connections.add(sock)
        with contextlib.suppress(OSError):
            while data := sock.recv(64):
                sock.sendall(data)
        with server.lock:
            server.connections.discard(sock)


class _EndpointServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int]) -> None:
        self.lock = threading.Lock()
        self.connections: set[socket.socket] = set()
        super().__init__(address, _Echo)

    def close_connections(self) -> None:
        """What a rank's exit does to the head's connections: they end."""
        with self.lock:
            for sock in self.connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self.connections.clear()


class RankEndpoint:
    """A worker rank's end of the group's all-reduce, on its fabric address."""

    def __init__(self, host: str, port: int) -> None:
        self._server = _EndpointServer((host, port))
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="rank-endpoint",
            daemon=True,
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> RankEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()
        self._server.close_connections()


class GroupReach:
    """The head's view of its group: whether every rank answered lately."""

    def __init__(self, ranks: Sequence[tuple[str, int]]) -> None:
        self.ranks = list(ranks)
        self._answered: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._ask_forever, args=(rank,), name="group-ask", daemon=True)
            for rank in self.ranks
        ]

    def start(self) -> GroupReach:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(ASK_TIMEOUT_S + 1.0)

    def answers(self) -> bool:
        """Every rank answered within GRACE_S: the engine may step."""
        return not self.silent()

    def silent(self) -> list[tuple[str, int]]:
        """The ranks that have not answered within GRACE_S."""
        now = time.monotonic()
        with self._lock:
            answered = dict(self._answered)
        return [r for r in self.ranks if r not in answered or now - answered[r] > GRACE_S]

    def _ask_forever(self, rank: tuple[str, int]) -> None:
        sock: socket.socket | None = None
        while not self._stopping.is_set():
            try:
                if sock is None:
                    sock = socket.create_connection(rank, timeout=ASK_TIMEOUT_S)
                sock.sendall(b"s")
                if sock.recv(1) != b"s":
                    raise OSError("the rank closed its end")
                with self._lock:
                    self._answered[rank] = time.monotonic()
            except OSError:
                # Unanswered: a new connection next time (a half-dead one
                # would keep the stale bytes of a late answer).
                if sock is not None:
                    sock.close()
                sock = None
            self._stopping.wait(ASK_EVERY_S)
        if sock is not None:
            sock.close()
