"""The other controllers on the Sparks as ``history``, ``show``, ``status`` and the
page ask them (tests/cli, tests/web): a history served through the controller's
real page API (controller/page/page_api.py), or a server that answers whatever
a test gives it, or one that never says a word."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, cast

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.look.controller_peers import ALONE
from spark_watchdog.controller.page.page_api import PageRoutes
from spark_watchdog.controller.page.page_auth import PageAuth
from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.controller.record.tallies import Tallies
from spark_watchdog.history.store import HistoryStore


@contextmanager
def served_history(config: ControllerConfig, store: HistoryStore) -> Iterator[str]:
    """Another controller's page API over ``store``, on loopback; yields its URL."""
    source = SimpleNamespace(config=config, ledger=SimpleNamespace(store=store), peers=ALONE)
    routes = PageRoutes(cast(Any, source), PageAuth(None), lambda: None)
    status = SimpleNamespace(published={"ticks": 1}, tallies=Tallies())
    endpoint = StatusEndpoint("127.0.0.1", 0, cast(Any, status), paths_of=routes)
    endpoint.start()
    try:
        yield f"http://127.0.0.1:{endpoint.port}"
    finally:
        endpoint.stop()


class Canned:
    """Answers every GET with ``status`` and ``body`` (bytes as they are, anything
    else as JSON); keeps the paths it was asked."""

    def __init__(self, body: Any, status: int = 200) -> None:
        self.asked: list[str] = []
        payload = body if isinstance(body, bytes) else json.dumps(body).encode()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.asked.append(self.path)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def silent_controller() -> Iterator[str]:
    """A host whose kernel completes the handshake and whose controller never
    answers (frozen); yields its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def closed_url() -> str:
    """A URL where nothing listens: refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}"
