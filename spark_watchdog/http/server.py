"""The HTTP server the agent and the controller share: routes given by the
caller (the agent's ``/v1/state``, ``/v1/boots``, ``/metrics`` and serving
controls, :mod:`spark_watchdog.agent.daemon`; the controller's ``/v1/status``,
:mod:`spark_watchdog.controller.page.status_api`; the lab's control endpoint).

One thread serves every connection, event-driven (epoll:
:mod:`spark_watchdog.http.poll`): a connection that is open and silent, or sends a byte a second, or
reads its answer a byte a second, costs a socket and a few hundred bytes,
never a thread, so a thousand of them do not keep the controller's poll
waiting (docs/design.md, "The HTTP servers"). The routes only read snapshots
the caller's main loop has already built, so a scrape never waits on a probe.
Whether the loop is alive shows in ``seq``: it advances once per loop, and a
frozen ``seq`` behind a live HTTP port is itself a finding for the controller.

What a connection may hold, and for how long:

- a request (its line, headers and body) must arrive within
  ``REQUEST_DEADLINE_S`` of the connection's opening or its last answer, and an
  answer must be taken within ``ANSWER_DEADLINE_S``; past that it is closed;
- at most ``max_connections`` connections are open (``MAX_CONNECTIONS``, fewer
  where the open-file limit is lower); a new one past that closes the oldest
  one that is not running a route, so the newest client, the controller's
  poll, always gets in;
- all connections together hold at most ``MAX_HELD_BYTES`` of requests not yet
  answered and answers not yet taken; past that the one holding the most is
  closed.

Parsing, routes and the JSON errors are :mod:`spark_watchdog.http.handler`;
where a head ends, :mod:`spark_watchdog.http.framing`; each connection's
phase, deadline and held bytes, and which to cut,
:mod:`spark_watchdog.http.connections`. A POST runs on a
thread of its own (at most ``MAX_ROUTE_THREADS`` at once), so a serving stop
that waits for a process group never holds up the agent's event loop or a
scrape; so does a GET that the caller's path routes say waits on something
(the controller page's reads of the history). A client that drops its
connection costs one log line, and a flood of them at most
``BROKEN_LOG_BURST`` lines a ``BROKEN_LOG_WINDOW_S``.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import io
import logging
import queue
import resource
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from spark_watchdog.errors import WatchdogError
from spark_watchdog.http.connection_log import BROKEN_LOG_BURST as BROKEN_LOG_BURST
from spark_watchdog.http.connection_log import BROKEN_LOG_WINDOW_S as BROKEN_LOG_WINDOW_S
from spark_watchdog.http.connection_log import ConnectionLog, peer
from spark_watchdog.http.connections import NOTHING, Connection, ConnectionTable, Phase
from spark_watchdog.http.framing import MAX_HEAD_BYTES, Scan, scan_head
from spark_watchdog.http.handler import (
    JSON,
    MAX_BODY_BYTES,
    MAX_BODY_DEPTH,
    PROMETHEUS_TEXT,
    Authorize,
    Exchange,
    PathRoutes,
    PostRoute,
    PulseIn,
    Reply,
    Request,
    Response,
    Route,
    Routes,
    error_answer,
    json_nesting,
    json_response,
)
from spark_watchdog.http.lean import lean_answer
from spark_watchdog.http.poll import READ, WRITE, Poller

__all__ = [
    "JSON",
    "MAX_BODY_BYTES",
    "MAX_BODY_DEPTH",
    "MAX_CONNECTIONS",
    "PROMETHEUS_TEXT",
    "REQUEST_DEADLINE_S",
    "Authorize",
    "HardenedHTTPServer",
    "HttpEndpoint",
    "PathRoutes",
    "PostRoute",
    "Reply",
    "Request",
    "Response",
    "Route",
    "json_nesting",
    "json_response",
]

log = logging.getLogger("spark_watchdog.http")

# Connections open at once. Each costs a socket and a few hundred bytes here
# (the kernel's buffers are not the process's memory); past this a new one
# closes the oldest idle one. Lowered to the open-file limit less
# RESERVED_FILES (the systemd units set LimitNOFILE=4096).
MAX_CONNECTIONS = 2048
# Open files kept for the process's own use (journal files, probes' sockets, logs).
RESERVED_FILES = 256
# A request (its line, headers and body) must arrive within this, however it
# is paced: a client that sends a byte every few seconds would otherwise hold
# its connection forever. A silent kept-alive connection is closed at this too.
REQUEST_DEADLINE_S = 10.0
# An answer must be taken within this: a client reading a byte a second holds
# the rest of it in this process's memory until then.
ANSWER_DEADLINE_S = 10.0
# Bytes held for all clients together: requests not yet whole, answers not yet
# taken. Real requests and answers are a few KB and gone within milliseconds.
MAX_HELD_BYTES = 4 * 1024 * 1024
# Routes running at once on threads of their own (POSTs, and GETs that wait on a
# database); past this such a request is a 503.
MAX_ROUTE_THREADS = 8
# At shutdown, how long a route still running (and its answer) may take.
SHUTDOWN_DRAIN_S = 2.0
# Broken connections logged per window; the rest are counted, then reported in one line.
# A connection answered for the last time stays open this long, its input
# discarded, so the client reads the answer instead of a TCP reset.
CLOSING_LINGER_S = 1.0

_RECV_BYTES = 65536
_ACCEPTS_PER_TURN = 64
# The loop wakes at least this often (deadlines, log counts).
_TICK_S = 0.5
# Accepting pauses this long when the process is out of file descriptors.
_ACCEPT_PAUSE_S = 0.1

_OUT_OF_FILES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_cap(wanted: int, open_files: int) -> int:
    """Connections to serve at once under an open-file limit of ``open_files``."""
    return max(1, min(wanted, open_files - RESERVED_FILES))


def open_files_limit() -> int:
    """The process's soft RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


# What the poller hands back for the listening socket and the wake-up socket.
_LISTENER = object()
_WAKE = object()


def _deadline_s(phase: str) -> float:
    """How long a connection may stay in ``phase``, read as it enters it."""
    if phase == Phase.READING:
        return REQUEST_DEADLINE_S
    if phase == Phase.WRITING:
        return ANSWER_DEADLINE_S
    return CLOSING_LINGER_S


class HardenedHTTPServer:
    """The event loop: accepts, reads, frames, answers and writes; cuts late
    and oldest connections. ``serve_forever`` on one thread, ``shutdown`` from
    another, then ``server_close``."""

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, Route],
        post_routes: dict[str, PostRoute] | None = None,
        authorize: Authorize | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        clock: Callable[[], float] = time.monotonic,
        paths_of: PathRoutes | None = None,
        pulse_in: PulseIn | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections: expected ≥ 1, got {max_connections!r}")
        self.routes = Routes(routes, post_routes or {}, authorize, paths_of, pulse_in)
        self.max_connections = max_connections
        self._clock = clock
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        # create_server sets SO_REUSEADDR: a restarted agent binds while old sockets linger.
        self._listener = socket.create_server(address, family=family, backlog=1024)
        self._listener.setblocking(False)
        self.server_address: tuple[Any, ...] = self._listener.getsockname()
        self._poller = Poller()
        self._poller.register(self._listener, READ, _LISTENER)
        self._accept_paused_until: float | None = None
        self._wake_in, self._wake_out = socket.socketpair()
        self._wake_in.setblocking(False)
        self._wake_out.setblocking(False)
        self._poller.register(self._wake_in, READ, _WAKE)
        self._running = 0
        self._drain_until = float("-inf")
        self._finished: queue.SimpleQueue[tuple[Connection, bytes, bool]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._log = ConnectionLog()
        self._log_due = float("-inf")
        self._conns = ConnectionTable(self._poller, clock, self._log, _deadline_s)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def held_bytes(self) -> int:
        return self._conns.held

    # -- the loop ----------------------------------------------------------------

    def serve_forever(self) -> None:
        try:
            while not self._stopping.is_set() or self._draining():
                for data, events in self._poller.poll(self._wait()):
                    self._on_event(data, events)
                self._tick(self._clock())
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop the loop; returns once it has stopped (or after 5 s). A route
        still running on its thread (a POST) gets up to ``SHUTDOWN_DRAIN_S``
        to finish and its answer to leave: the page's step-down ends the lease
        that this server goes down with, and its caller should hear so."""
        self._drain_until = self._clock() + SHUTDOWN_DRAIN_S
        self._stopping.set()
        self._wake()
        self._stopped.wait(5.0)

    def _draining(self) -> bool:
        """After shutdown: routes still running or answers still leaving, within the drain."""
        if self._clock() >= self._drain_until:
            return False
        return self._running > 0 or bool(self._conns.phases[Phase.WRITING])

    def server_close(self) -> None:
        """Close the port and every connection: a kept-alive one would otherwise
        go on being answered after the server stopped (a scraper reusing it)."""
        self._conns.close_all()
        with contextlib.suppress(KeyError, ValueError):
            self._poller.unregister(self._listener)
        self._listener.close()
        self._poller.close()
        self._wake_in.close()
        self._wake_out.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_out.send(b"\0")

    def _wait(self) -> float:
        now = self._clock()
        due = self._conns.next_due(now + _TICK_S)
        if self._accept_paused_until is not None:
            due = min(due, self._accept_paused_until)
        return max(0.0, due - now)

    def _on_event(self, data: Any, events: int) -> None:
        if data is _LISTENER:
            self._accept()
        elif data is _WAKE:
            with contextlib.suppress(OSError):
                self._wake_in.recv(4096)
            self._answer_finished_routes()
        else:
            conn: Connection = data
            if conn.phase == Phase.CLOSED:
                return  # closed earlier in this turn
            if events & READ:
                self._on_readable(conn)
            if events & WRITE and conn.phase == Phase.WRITING:
                self._flush(conn)

    def _tick(self, now: float) -> None:
        self._conns.expire(now)
        if self._accept_paused_until is not None and self._accept_paused_until <= now:
            self._accept_paused_until = None
            self._poller.register(self._listener, READ, _LISTENER)
        if now >= self._log_due:  # not on every turn: an answered pulse is a turn
            self._log_due = now + _TICK_S
            self._log.flush()

    # -- connections come and go --------------------------------------------------

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_FILES and self._conns.evict_oldest(
                    "no file descriptor left"
                ):
                    continue
                self._log.cannot_accept(_ACCEPT_PAUSE_S, exc)
                self._poller.unregister(self._listener)
                self._accept_paused_until = self._clock() + _ACCEPT_PAUSE_S
                return
            if len(self._conns) >= self.max_connections and not self._conns.evict_oldest(
                f"{len(self._conns)} connections open, the most served at once"
            ):
                _refuse(sock, self.max_connections)  # every open one is running a route
                self._log.refused(address, self.max_connections)
                continue
            self._conns.open(sock, address)

    # -- requests in ---------------------------------------------------------------

    def _on_readable(self, conn: Connection) -> None:
        sock = self._conns.sockets[conn]
        try:
            data = sock.recv(_RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._conns.broken(conn, exc)
            return
        if not data:
            self._conns.close(conn)  # the client closed its side
            return
        if conn.phase != Phase.READING:
            return  # closing: input is discarded
        conn.inbox += data
        self._conns.held += len(data)
        self._serve(conn)
        if self._conns.held > MAX_HELD_BYTES:
            self._conns.shed(MAX_HELD_BYTES)

    def _serve(self, conn: Connection) -> None:
        """Answer every whole request ``conn`` has sent (pipelined ones in turn)."""
        while conn.phase == Phase.READING and conn.inbox:
            scan = scan_head(conn.inbox)
            if scan.scan == Scan.PARTIAL:
                return
            if scan.scan == Scan.TOO_LARGE:
                self._take(conn, len(conn.inbox))
                message = f"request head longer than {MAX_HEAD_BYTES} bytes; send shorter headers"
                self._answer(conn, error_answer(431, message), keep_alive=False)
                return
            method, target, end = "", "", len(conn.inbox)
            if scan.scan == Scan.WHOLE:
                method, target, _ = bytes(conn.inbox[: scan.line_end]).decode("latin-1").split()
                if method == "POST":  # the only method whose body is read
                    head = io.BytesIO(bytes(conn.inbox[scan.line_end : scan.end]))
                    headers = http.client.parse_headers(head)
                    end = scan.end + self.routes.body_length(method, target, headers)
                    if len(conn.inbox) < end:
                        return  # the body is on its way
                else:
                    end = scan.end
                    answer = lean_answer(bytes(conn.inbox[:end]), self.routes, conn.address)
                    if answer is not None:
                        self._take(conn, end)
                        self._answer(conn, answer, keep_alive=True)
                        continue
            request = self._take(conn, end)
            if self.routes.on_thread(method, target if method else ""):
                self._run_route(conn, request)
            else:
                self._exchange(conn, request)

    def _take(self, conn: Connection, end: int) -> bytes:
        request = bytes(conn.inbox[:end])
        del conn.inbox[:end]
        self._conns.held -= len(request)
        return request

    def _exchange(self, conn: Connection, request: bytes) -> None:
        """Answer a request on this thread (GET, HEAD, errors: all quick)."""
        try:
            exchange = Exchange(request, conn.address, self.routes)
        except Exception as exc:
            self._log.error(conn.address, exc)
            self._answer(conn, error_answer(500, "internal error"), keep_alive=False)
            return
        self._answer(conn, exchange.answer, keep_alive=not exchange.close_connection)

    def _run_route(self, conn: Connection, request: bytes) -> None:
        """A POST (or a GET that waits on a database) runs on a thread of its
        own; its answer comes back to the loop."""
        if self._running >= MAX_ROUTE_THREADS:
            message = f"too many requests running: {MAX_ROUTE_THREADS} at once; retry shortly"
            self._answer(conn, error_answer(503, message, **{"Retry-After": "1"}), keep_alive=False)
            return
        self._running += 1
        self._conns.enter(conn, Phase.RUNNING)

        def run() -> None:
            answer, keep_alive = error_answer(500, "internal error"), False
            try:
                exchange = Exchange(request, conn.address, self.routes)
                answer, keep_alive = exchange.answer, not exchange.close_connection
            except Exception:
                log.exception("unexpected error serving %s", peer(conn.address))
            finally:
                self._finished.put((conn, answer, keep_alive))
                self._wake()

        threading.Thread(target=run, name="http-post", daemon=True).start()

    def _answer_finished_routes(self) -> None:
        while True:
            try:
                conn, answer, keep_alive = self._finished.get_nowait()
            except queue.Empty:
                return
            self._running -= 1
            if conn.phase == Phase.RUNNING:
                self._answer(conn, answer, keep_alive=keep_alive)
                self._serve(conn)

    # -- answers out ---------------------------------------------------------------

    def _answer(self, conn: Connection, answer: bytes, *, keep_alive: bool) -> None:
        conn.keep_alive = keep_alive
        conn.outbox = memoryview(answer)
        self._conns.held += len(answer)
        self._flush(conn)

    def _flush(self, conn: Connection) -> None:
        sock = self._conns.sockets[conn]
        while conn.outbox:
            try:
                sent = sock.send(conn.outbox)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._conns.broken(conn, exc)
                return
            # An empty slice would still keep the whole answer alive.
            conn.outbox = conn.outbox[sent:] if sent < len(conn.outbox) else NOTHING
            self._conns.held -= sent
        if conn.outbox:
            if conn.phase != Phase.WRITING:
                self._conns.enter(conn, Phase.WRITING)  # its deadline runs from now, once
            return
        if conn.keep_alive:
            self._conns.enter(conn, Phase.READING)
            return
        self._conns.held -= len(conn.inbox)
        conn.inbox = bytearray()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        self._conns.enter(conn, Phase.CLOSING)


def _refuse(sock: socket.socket, max_connections: int) -> None:
    """Answer a new connection 503 and close it: nothing to evict."""
    answer = error_answer(
        503,
        f"too many connections: {max_connections} already open; retry shortly",
        **{"Retry-After": "1"},
    )
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(answer)  # a fresh socket's send buffer takes it whole
    sock.close()


class HttpEndpoint:
    """Owns the server thread; ``start`` raises WatchdogError if it cannot bind."""

    def __init__(
        self,
        address: str,
        port: int,
        routes: dict[str, Route],
        post_routes: dict[str, PostRoute] | None = None,
        authorize: Authorize | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        paths_of: PathRoutes | None = None,
        pulse_in: PulseIn | None = None,
    ) -> None:
        self._address = address
        self._paths_of = paths_of
        self._pulse_in = pulse_in
        self._port = port
        self._routes = routes
        self._post_routes = post_routes or {}
        self._authorize = authorize
        self._max_connections = max_connections
        self._server: HardenedHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def server(self) -> HardenedHTTPServer:
        assert self._server is not None
        return self._server

    def operations(self) -> dict[str, tuple[str, ...]]:
        """Every path served and the methods it answers (what docs/api/ describes)."""
        paths = sorted({*self._routes, *self._post_routes})
        served = {
            path: (("GET", "HEAD") if path in self._routes else ())
            + (("POST",) if path in self._post_routes else ())
            for path in paths
        }
        if self._paths_of is not None:
            served.update(self._paths_of.operations())
        return dict(sorted(served.items()))

    def start(self) -> None:
        cap = connection_cap(self._max_connections, open_files_limit())
        if cap < self._max_connections:
            log.info(
                "serving at most %d connections at once on %s:%d: the open-file limit is %d "
                "(LimitNOFILE=; %d files kept for the rest of the process)",
                cap,
                self._address,
                self._port,
                open_files_limit(),
                RESERVED_FILES,
            )
        try:
            self._server = HardenedHTTPServer(
                (self._address, self._port),
                self._routes,
                self._post_routes,
                self._authorize,
                max_connections=cap,
                paths_of=self._paths_of,
                pulse_in=self._pulse_in,
            )
        except OSError as exc:
            raise WatchdogError(
                f"listen: cannot bind {self._address}:{self._port} ({exc.strerror or exc}); "
                "choose a free listen.port or a local listen.address"
            ) from None
        self._thread = threading.Thread(target=self._server.serve_forever, name="http", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
