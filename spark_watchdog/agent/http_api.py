"""The agent's HTTP endpoints: ``/v1/state``, ``/v1/boots``, ``/metrics``.

The server runs on its own threads and only reads snapshots the main loop has
already built, so a scrape never waits on a probe. Whether the loop is alive
shows in ``seq``: it advances once per loop, and a frozen ``seq`` behind a
live HTTP port is itself a finding for the controller.
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

JSON = "application/json"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def json_response(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, indent=None, separators=(",", ":"), sort_keys=False).encode()
    return status, JSON, body + b"\n"


class AgentHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    # A restarted agent must be able to bind again while old sockets linger.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], routes: dict[str, Route]) -> None:
        self.routes = routes
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
            known = ", ".join(sorted(self.server.routes))
            self._send(*json_response({"error": f"no such path {path}; try {known}"}, 404))
            return
        try:
            self._send(*route())
        except Exception as exc:
            log.exception("GET %s failed", path)
            self._send(*json_response({"error": f"{type(exc).__name__}: {exc}"}, 500))

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Access logs would flood the journal at 1 request/s per controller.
        return


class HttpEndpoint:
    """Owns the server thread; ``start`` raises WatchdogError if it cannot bind."""

    def __init__(self, address: str, port: int, routes: dict[str, Route]) -> None:
        self._address = address
        self._port = port
        self._routes = routes
        self._server: AgentHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> None:
        try:
            self._server = AgentHTTPServer((self._address, self._port), self._routes)
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
