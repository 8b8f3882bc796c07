"""The agent's HTTP endpoints: ``/v1/state``, ``/v1/boots``, ``/metrics``, and
the serving controls under ``/v1/serving``.

The server runs on its own threads and only reads snapshots the main loop has
already built, so a scrape never waits on a probe. Whether the loop is alive
shows in ``seq``: it advances once per loop, and a frozen ``seq`` behind a
live HTTP port is itself a finding for the controller.

POST routes take a JSON object body (empty means ``{}``) of at most
``MAX_BODY_BYTES`` and run in the request's own thread, so a serving stop that
waits for a process group never holds up the agent's event loop or a scrape.
When an ``authorize`` check is given, every POST must pass it before its body
is even read.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from spark_watchdog.errors import WatchdogError

log = logging.getLogger("spark_watchdog.agent.http")

# A route answers (status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[], Response]
# A POST route gets the request's JSON object.
PostRoute = Callable[[dict[str, Any]], Response]
# Checks an Authorization header value: None to let the request in, else why not.
Authorize = Callable[[str | None], str | None]

# Serving requests are a few dozen bytes; anything near this is not one of them.
MAX_BODY_BYTES = 64 * 1024

JSON = "application/json"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def json_response(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, indent=None, separators=(",", ":"), sort_keys=False).encode()
    return status, JSON, body + b"\n"


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A restarted agent must be able to bind again while old sockets linger.
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[str, Route],
        post_routes: dict[str, PostRoute] | None = None,
        authorize: Authorize | None = None,
    ) -> None:
        self.routes = routes
        self.post_routes = post_routes or {}
        self.authorize = authorize
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: AgentHTTPServer
    protocol_version = "HTTP/1.1"
    # Slow or half-open clients must not pin a thread forever.
    timeout = 10

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            if path in self.server.post_routes:
                self._error(405, f"{path} takes POST", Allow="POST")
                return
            known = ", ".join(sorted(self.server.routes))
            self._send(*json_response({"error": f"no such path {path}; try {known}"}, 404))
            return
        try:
            self._send(*route())
        except Exception as exc:
            log.exception("GET %s failed", path)
            self._send(*json_response({"error": f"{type(exc).__name__}: {exc}"}, 500))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.post_routes.get(path)
        if route is None:
            if path in self.server.routes:
                self._error(405, f"{path} takes GET", Allow="GET")
            else:
                known = ", ".join(sorted(self.server.post_routes)) or "none here"
                self._error(404, f"no such path {path} for POST; POST paths: {known}")
            return
        authorize = self.server.authorize
        if authorize is not None:
            problem = authorize(self.headers.get("Authorization"))
            if problem is not None:
                # RFC 6750 §3: a 401 names the scheme it wants.
                self._error(401, problem, **{"WWW-Authenticate": 'Bearer realm="spark-watchdog"'})
                return
        body = self._read_json()
        if body is None:
            return
        try:
            self._send(*route(body))
        except Exception as exc:
            log.exception("POST %s failed", path)
            self._send(*json_response({"error": f"{type(exc).__name__}: {exc}"}, 500))

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
        try:
            value = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            self._error(400, f"body is not JSON: {exc}")
            return None
        if not isinstance(value, dict):
            self._error(400, f"body: expected a JSON object, got {type(value).__name__}")
            return None
        return value

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

    def log_message(self, format: str, *args: Any) -> None:
        # Access logs would flood the journal at 1 request/s per controller.
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
    ) -> None:
        self._address = address
        self._port = port
        self._routes = routes
        self._post_routes = post_routes
        self._authorize = authorize
        self._server: AgentHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> None:
        try:
            self._server = AgentHTTPServer(
                (self._address, self._port), self._routes, self._post_routes, self._authorize
            )
        except OSError as exc:
            raise WatchdogError(
                f"listen: cannot bind {self._address}:{self._port} ({exc.strerror or exc}); "
                "choose a free listen.port or a local listen.address"
            ) from None
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="agent-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
