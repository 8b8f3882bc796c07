"""The HTTP server the agent and the controller share: routes given by the
caller (the agent's ``/v1/state``, ``/v1/boots``, ``/metrics`` and serving
controls, :mod:`spark_watchdog.agent.daemon`; the controller's ``/v1/status``,
:mod:`spark_watchdog.controller.status_api`; the lab's control endpoint).

The server runs on its own threads and only reads snapshots the caller's main
loop has already built, so a scrape never waits on a probe. Whether the loop is
alive shows in ``seq``: it advances once per loop, and a frozen ``seq`` behind
a live HTTP port is itself a finding for the controller.

POST routes take a JSON object body (empty means ``{}``) of at most
``MAX_BODY_BYTES``, nested at most ``MAX_BODY_DEPTH`` deep, and run in the
request's own thread, so a serving stop that waits for a process group never
holds up the agent's event loop or a scrape. When an ``authorize`` check is
given, every POST must pass it before its body is even read.

The port is reachable from the network, so whatever a client sends gets a JSON
answer, never a traceback: every error (a wrong method, a malformed request
line, an oversized header) is ``{"error": "..."}`` with its status. At most
``MAX_CONNECTIONS`` connections are served at once; past that a connection
gets a 503 from the accepting thread and is closed, with no thread of its own,
and a request that has not arrived within ``REQUEST_DEADLINE_S`` (a client
dripping a byte at a time) is closed, so slow clients cannot hold every slot.
A client that drops its connection costs one log line, and a flood of them at
most ``BROKEN_LOG_BURST`` lines a ``BROKEN_LOG_WINDOW_S``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spark_watchdog.errors import WatchdogError

log = logging.getLogger("spark_watchdog.http")

# A route answers (status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[], Response]
# A POST route gets the request's JSON object.
PostRoute = Callable[[dict[str, Any]], Response]
# Checks an Authorization header value: None to let the request in, else why not.
Authorize = Callable[[str | None], str | None]

# Serving requests are a few dozen bytes; anything near this is not one of them.
MAX_BODY_BYTES = 64 * 1024
# Serving requests are flat objects; the JSON parser recurses once per level.
MAX_BODY_DEPTH = 32
# Connections served at once (one thread each). The controller needs one, a
# Prometheus scrape another; past this a connection gets a 503.
MAX_CONNECTIONS = 32
# A request (its line, headers and body) must arrive within this, however it
# is paced: a client that sends a byte every few seconds would otherwise hold
# its connection slot forever, each read being within the socket timeout.
REQUEST_DEADLINE_S = 10.0
# Broken connections logged per window; the rest are counted, then reported in one line.
BROKEN_LOG_BURST = 10
BROKEN_LOG_WINDOW_S = 60.0
# A refused connection stays open this long after its 503, so the client's
# request can arrive and be discarded instead of turning into a TCP reset.
_REFUSED_LINGER_S = 1.0
_MAX_LINGERING = 64

JSON = "application/json"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

# What a client that went away leaves behind: not the server's fault, not a bug.
_BROKEN_ERRNOS = frozenset(
    {errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ENOTCONN, errno.ETIMEDOUT}
)
# A JSON string (escapes included) or a bracket: enough to measure nesting.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def json_response(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, indent=None, separators=(",", ":"), sort_keys=False).encode()
    return status, JSON, body + b"\n"


def json_nesting(raw: bytes) -> int:
    """How deep arrays and objects nest in ``raw`` (brackets in strings don't count)."""
    depth = deepest = 0
    for match in _JSON_NESTING.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def _is_broken_connection(exc: BaseException | None) -> bool:
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _BROKEN_ERRNOS


def _peer(client_address: Any) -> str:
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return str(client_address)


# A logging call: log.info, log.error and the like.
_LogCall = Callable[..., None]


class _LineBudget:
    """At most ``burst`` log lines per ``window`` seconds.

    Past the burst one line says that counting has begun; :meth:`flush`, called
    from the server loop, reports the count once the window is over.
    """

    def __init__(
        self,
        burst: int,
        window: float,
        what: str = "broken connections",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._burst = burst
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._logged = 0
        self._suppressed = 0

    def _roll(self, now: float) -> tuple[int, float]:
        """Start a new window if the old one is over: (suppressed, its length)."""
        elapsed = now - self._started
        if elapsed < self._window:
            return 0, 0.0
        suppressed = self._suppressed
        self._started, self._logged, self._suppressed = now, 0, 0
        return suppressed, elapsed

    def _report(self, emit: _LogCall, suppressed: int, elapsed: float) -> None:
        if suppressed:
            emit("%d more %s in the last %.0f s were not logged", suppressed, self._what, elapsed)

    def log(self, emit: _LogCall, message: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            suppressed, elapsed = self._roll(self._clock())
            self._report(emit, suppressed, elapsed)
            if self._logged >= self._burst:
                self._suppressed += 1
                return
            self._logged += 1
            last = self._logged == self._burst
        emit(message, *args, **kwargs)
        if last:
            emit(
                "%d %s logged in %.0f s; further ones in that time are counted, not logged",
                self._burst,
                self._what,
                self._window,
            )

    def flush(self, emit: _LogCall) -> None:
        with self._lock:
            suppressed, elapsed = self._roll(self._clock())
        self._report(emit, suppressed, elapsed)


class HardenedHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A restarted agent must be able to bind again while old sockets linger.
    allow_reuse_address = True
    # Connections past the cap are answered from the backlog, not left in SYN retries.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, Route],
        post_routes: dict[str, PostRoute] | None = None,
        authorize: Authorize | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections: expected ≥ 1, got {max_connections!r}")
        self.routes = routes
        self.post_routes = post_routes or {}
        self.authorize = authorize
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lingering: collections.deque[tuple[float, socket.socket]] = collections.deque()
        self._broken_log = _LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S)
        self._refused_log = _LineBudget(
            BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "refused connections"
        )
        self._error_log = _LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "unexpected errors")
        self._slow_log = _LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "slow requests")
        # Connections reading a request, with the monotonic time it must be in by.
        self._reading: dict[socket.socket, tuple[float, str]] = {}
        self._reading_lock = threading.Lock()
        # Connections a handler thread serves (closed when the server closes).
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(address, _Handler)

    def allowed_methods(self, path: str) -> tuple[str, ...]:
        """The methods ``path`` answers, in ``Allow`` order; () for no such path."""
        methods: tuple[str, ...] = ()
        if path in self.routes:
            methods += ("GET", "HEAD")
        if path in self.post_routes:
            methods += ("POST",)
        return methods

    def paths(self) -> list[str]:
        return sorted({*self.routes, *self.post_routes})

    # -- the connection cap --------------------------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self._refuse(request)
            self._refused_log.log(
                log.warning,
                "refused a connection from %s: %d connections already open",
                _peer(client_address),
                self.max_connections,
            )
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()  # no thread started: nothing else will
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)
            self._slots.release()

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 from the accepting thread without ever blocking it."""
        code, _, body = json_response(
            {"error": f"too many connections: {self.max_connections} already open; retry shortly"},
            503,
        )
        head = (
            f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
            f"Content-Type: {JSON}\r\nContent-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            # A fresh socket's send buffer holds far more than this: one send.
            sock.send(head.encode() + body)
            sock.shutdown(socket.SHUT_WR)
        _drain(sock)
        self._lingering.append((time.monotonic() + _REFUSED_LINGER_S, sock))
        while len(self._lingering) > _MAX_LINGERING:
            _close(self._lingering.popleft()[1])

    # -- the request deadline ------------------------------------------------

    def reading(self, sock: socket.socket, client_address: Any) -> None:
        """``sock`` starts reading a request: it has REQUEST_DEADLINE_S to arrive."""
        with self._reading_lock:
            self._reading[sock] = (time.monotonic() + REQUEST_DEADLINE_S, _peer(client_address))

    def read(self, sock: socket.socket) -> bool:
        """The request on ``sock`` is in (or was answered): no deadline while it runs.
        False when the deadline had already cut it: the route must not run."""
        with self._reading_lock:
            return self._reading.pop(sock, None) is not None

    def _cut_slow_requests(self, now: float) -> None:
        with self._reading_lock:
            late = [(s, peer) for s, (due, peer) in self._reading.items() if due <= now]
            for sock, _ in late:
                del self._reading[sock]
                # Under the lock: a handler that finishes reading now finds its
                # entry gone and runs no route on a socket that is being cut.
                # The handler's blocked read returns end-of-file, and its thread ends.
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for _, peer in late:
            self._slow_log.log(
                log.info,
                "closed the connection from %s: its request was not in within %g s",
                peer,
                REQUEST_DEADLINE_S,
            )

    def service_actions(self) -> None:
        # Called by serve_forever at least every poll interval (0.5 s).
        now = time.monotonic()
        self._cut_slow_requests(now)
        while self._lingering and self._lingering[0][0] <= now:
            _close(self._lingering.popleft()[1])
        self._broken_log.flush(log.info)
        self._refused_log.flush(log.warning)
        self._error_log.flush(log.error)
        self._slow_log.flush(log.info)

    def server_close(self) -> None:
        super().server_close()
        while self._lingering:
            _close(self._lingering.popleft()[1])
        # A kept-alive connection would otherwise go on being answered by this
        # server after it stopped (a scraper reusing it every few seconds).
        with self._open_lock:
            still_open = list(self._open)
        for sock in still_open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- errors ----------------------------------------------------------------

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line for a connection the client broke; socketserver's default
        prints a traceback to stderr (the journal) for each."""
        exc = sys.exc_info()[1]
        peer = _peer(client_address)
        if _is_broken_connection(exc):
            assert exc is not None
            reason = getattr(exc, "strerror", None) or str(exc) or "no detail"
            self._broken_log.log(
                log.info,
                "connection from %s broken by the client (%s: %s)",
                peer,
                type(exc).__name__,
                reason,
            )
        else:
            self._error_log.log(log.error, "unexpected error serving %s", peer, exc_info=exc)


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        for _ in range(16):
            if not sock.recv(65536, socket.MSG_DONTWAIT):
                return


def _close(sock: socket.socket) -> None:
    _drain(sock)
    with contextlib.suppress(OSError):
        sock.close()


class _Handler(BaseHTTPRequestHandler):
    server: HardenedHTTPServer
    protocol_version = "HTTP/1.1"
    # Slow or half-open clients must not pin a thread forever.
    timeout = 10

    # -- dispatch ----------------------------------------------------------------

    def handle_one_request(self) -> None:
        # Each request of a kept-alive connection gets its own deadline.
        self.server.reading(self.connection, self.client_address)
        try:
            super().handle_one_request()
        finally:
            self.server.read(self.connection)

    def do_GET(self) -> None:
        if self.server.read(self.connection):
            self._get()

    def do_HEAD(self) -> None:
        if self.server.read(self.connection):
            self._get()  # _send leaves the body out

    def do_POST(self) -> None:
        path = self._path()
        route = self.server.post_routes.get(path)
        if route is None:
            self._no_route(path)
            return
        authorize = self.server.authorize
        if authorize is not None:
            problem = authorize(self.headers.get("Authorization"))
            if problem is not None:
                # RFC 6750 §3: a 401 names the scheme it wants.
                self._error(401, problem, **{"WWW-Authenticate": 'Bearer realm="spark-watchdog"'})
                return
        body = self._read_json()
        # A serving stop may take longer than the deadline, which ends here.
        if not self.server.read(self.connection) or body is None:
            return
        try:
            response = route(body)
        except Exception as exc:
            log.exception("POST %s failed", path)
            response = json_response({"error": f"{type(exc).__name__}: {exc}"}, 500)
        self._send(*response)

    def _not_allowed(self) -> None:
        self._no_route(self._path())

    # Standard methods these paths do not take (QUERY: the IETF httpbis draft's
    # safe method with a body); a method the server does not know is a 501.
    do_OPTIONS = do_PUT = do_DELETE = do_PATCH = do_TRACE = do_CONNECT = do_QUERY = _not_allowed

    def _get(self) -> None:
        path = self._path()
        route = self.server.routes.get(path)
        if route is None:
            self._no_route(path)
            return
        try:
            response = route()
        except Exception as exc:
            log.exception("%s %s failed", self.command, path)
            response = json_response({"error": f"{type(exc).__name__}: {exc}"}, 500)
        self._send(*response)

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _no_route(self, path: str) -> None:
        """405 with Allow when the path takes other methods, else 404."""
        allowed = self.server.allowed_methods(path)
        if allowed:
            use = " or ".join(allowed)
            message = f"{self.command} is not allowed on {path}; use {use}"
            self._error(405, message, Allow=", ".join(allowed))
            return
        known = ", ".join(self.server.paths()) or "none"
        self._error(404, f"no such path {path}; paths: {known}")

    # -- the request body ---------------------------------------------------------

    def _read_json(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None after answering why it is not one."""
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "send the body with a Content-Length (no chunked bodies)")
            return None
        raw_length = self.headers.get("Content-Length")
        length = 0
        if raw_length is not None:
            try:
                length = int(raw_length)
                if length < 0:
                    raise ValueError(raw_length)
            except ValueError:
                self._error(400, f"Content-Length: expected a byte count, got {raw_length!r}")
                return None
        if length > MAX_BODY_BYTES:
            self._error(413, f"body of {length} bytes; at most {MAX_BODY_BYTES} accepted")
            return None
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:
            self._error(400, f"body ended after {len(raw)} of {length} bytes")
            return None
        if not raw.strip():
            return {}
        depth = json_nesting(raw)
        if depth > MAX_BODY_DEPTH:
            self._error(
                400,
                f"body nests {depth} levels of arrays and objects; at most {MAX_BODY_DEPTH} "
                "are accepted (a serving request is one flat object)",
            )
            return None
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self._error(400, f"body is not JSON: {exc}")
            return None
        if not isinstance(value, dict):
            self._error(400, f"body: expected a JSON object, got {type(value).__name__}")
            return None
        return value

    # -- answers -------------------------------------------------------------------

    def parse_request(self) -> bool:
        raw: bytes = getattr(self, "raw_requestline", b"")  # set by handle_one_request
        words = raw.split()
        if len(words) == 2:
            # No HTTP version: HTTP/0.9 ("GET /path"), which has no headers and
            # no status line; http.server would wait for headers that never come.
            self.command = ""
            self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
            self.request_version = "HTTP/1.0"
            self.close_connection = True
            if words[0] == b"GET":
                self.send_error(
                    505, "HTTP/0.9 is not supported; send HTTP/1.0 or HTTP/1.1 requests"
                )
            else:
                self.send_error(400, f"Bad request syntax ({self.requestline!r})")
            return False
        return bool(super().parse_request())

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error http.server raises itself (a malformed request line, an
        unknown method, oversized headers) answered in JSON, not HTML."""
        if self.request_version in ("HTTP/0.9", ""):
            # A request line that did not parse still gets a status line.
            self.request_version = "HTTP/1.0"
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            text = f"unsupported method {self.command!r}; use GET, HEAD or POST"
        elif code == HTTPStatus.REQUEST_URI_TOO_LONG:
            text = "request line longer than 65536 bytes; shorten the URL"
        elif code == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
            text = (
                "a header line longer than 65536 bytes; send shorter headers"
                if message == "Line too long"
                else "more than 100 headers; send fewer"
            )
        elif code == HTTPStatus.BAD_REQUEST and message and message.startswith("Bad request"):
            text = f"{message}; expected a request line METHOD /path HTTP/1.1"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED and message:
            text = message if "HTTP/1.1" in message else f"{message}; send HTTP/1.1 requests"
        else:
            text = message or HTTPStatus(code).phrase
            if explain:
                text = f"{text}: {explain}"
        self._error(code, text)

    def _error(self, status: int, message: str, **headers: str) -> None:
        """Answer an error; the connection closes, since a body may be left unread."""
        self.close_connection = True
        code, content_type, body = json_response({"error": message}, status)
        self._send(code, content_type, body, {"Connection": "close", **headers})

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Access logs would flood the journal at 1 request/s per controller.
        return

    def log_message(self, format: str, *args: Any) -> None:
        # http.server's own lines (timeouts, errors): each is answered, none logged.
        return


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
    ) -> None:
        self._address = address
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

    def operations(self) -> dict[str, tuple[str, ...]]:
        """Every path served and the methods it answers (what docs/api/ describes)."""
        paths = sorted({*self._routes, *self._post_routes})
        return {
            path: (("GET", "HEAD") if path in self._routes else ())
            + (("POST",) if path in self._post_routes else ())
            for path in paths
        }

    def start(self) -> None:
        try:
            self._server = HardenedHTTPServer(
                (self._address, self._port),
                self._routes,
                self._post_routes,
                self._authorize,
                max_connections=self._max_connections,
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
