"""The controller's small I/O pieces against real loopback peers."""

from __future__ import annotations

import asyncio
import errno
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import requests

from spark_watchdog.config.controller import NotifyConfig, WebhookConfig
from spark_watchdog.controller.look.http_client import (
    NO_NETWORK,
    REFUSED,
    SILENCE,
    UNRESOLVABLE,
    HttpError,
    failure_kind,
    request,
)
from spark_watchdog.controller.look.witness import check_witness
from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.record.tallies import Tallies
from spark_watchdog.lab.ports import free_port

pytestmark = pytest.mark.integration


class Receiver:
    def __init__(self, fail_first: int = 0) -> None:
        self.bodies: list[tuple[str, Any]] = []
        self.fail_first = fail_first
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(503)
                else:
                    outer.bodies.append((self.path, body))
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=1)
    yield r
    r.close()


def test_webhook_and_alertmanager_get_the_event_with_a_bounded_retry(receiver: Receiver) -> None:
    config = NotifyConfig(
        webhooks=(WebhookConfig(url=f"{receiver.base}/hook"),),
        alertmanager=receiver.base,
        attempts=3,
        timeout=2.0,
    )

    async def go() -> Notifier:
        notifier = Notifier(config)
        notifier.send(Event("gave_up", "spark-3: gave up", "spark-3", 7))
        await notifier.drain(10)
        return notifier

    notifier = asyncio.run(go())
    paths = {path: body for path, body in receiver.bodies}
    assert paths["/hook"]["kind"] == "gave_up" and paths["/hook"]["incident_id"] == 7
    alert = paths["/api/v2/alerts"][0]
    assert alert["labels"] == {
        "alertname": "SparkWatchdog_gave_up",
        "severity": "critical",
        "source": "spark-watchdog",
        "node": "spark-3",
    }
    assert alert["annotations"]["summary"] == "spark-3: gave up"
    assert notifier.delivered == 2 and notifier.failed == 0  # one 503 was retried


def test_a_dead_receiver_never_blocks_the_sender(silent_listener: int) -> None:
    config = NotifyConfig(
        webhooks=(WebhookConfig(url=f"http://127.0.0.1:{silent_listener}/hook"),),
        attempts=2,
        timeout=0.3,
    )

    async def go() -> tuple[float, Notifier]:
        notifier = Notifier(config)
        started = time.monotonic()
        notifier.send(Event("recovered", "x"))
        returned = time.monotonic() - started
        await notifier.drain(10)
        return returned, notifier

    returned, notifier = asyncio.run(go())
    assert returned < 0.25  # a send that waited would take the 0.3 s timeout at least
    assert notifier.failed == 1 and notifier.delivered == 0


def test_http_client_bounds_a_silent_server(silent_listener: int) -> None:
    started = time.monotonic()
    with pytest.raises(HttpError, match=r"no answer within 0\.3s") as caught:
        asyncio.run(request(f"http://127.0.0.1:{silent_listener}/v1/state", timeout=0.3))
    assert time.monotonic() - started < 2.0
    assert caught.value.kind == SILENCE  # what a frozen host looks like


def test_http_client_says_how_a_request_failed() -> None:
    """The detector counts only silence toward a freeze: refusals are a live kernel,
    a name that does not resolve means the controller cannot look."""
    port = free_port()
    with pytest.raises(HttpError) as refused:
        asyncio.run(request(f"http://127.0.0.1:{port}/", timeout=2.0))
    assert refused.value.kind == REFUSED
    with pytest.raises(HttpError) as unresolvable:  # RFC 6761: .invalid never resolves
        asyncio.run(request("http://no-such-node.invalid:9720/", timeout=5.0))
    assert unresolvable.value.kind == UNRESOLVABLE
    assert failure_kind(OSError(errno.ENETUNREACH, "Network is unreachable")) == NO_NETWORK
    assert failure_kind(OSError(errno.EHOSTUNREACH, "No route to host")) == SILENCE


def test_http_client_refused_and_non_json(receiver: Receiver) -> None:
    port = free_port()
    with pytest.raises(HttpError):
        asyncio.run(request(f"http://127.0.0.1:{port}/", timeout=1.0))
    answer = asyncio.run(request(f"{receiver.base}/nothing", timeout=2.0))
    assert answer.status == 501  # GET is not served by the receiver
    with pytest.raises(HttpError, match="not JSON"):
        answer.json()


def test_witness(silent_listener: int) -> None:
    dead = free_port()
    up = f"tcp://127.0.0.1:{silent_listener}"
    down = f"tcp://127.0.0.1:{dead}"
    assert asyncio.run(check_witness([up, down])).ok
    report = asyncio.run(check_witness([down], timeout=0.5))
    assert not report.ok and report.missed == (down,)
    assert asyncio.run(check_witness([])).ok


def test_status_endpoint_serves_json_and_metrics() -> None:
    class Source:
        def __init__(self) -> None:
            self.published: dict[str, Any] = {
                "ticks": 3,
                "witness": "ok",
                "nodes": [
                    {"name": "spark-1", "verdict": "healthy", "state": "watching"},
                    {"name": "spark-2", "verdict": "held", "state": "held", "banner_misses": 2},
                ],
            }
            self.tallies = Tallies()

    endpoint = StatusEndpoint("127.0.0.1", 0, Source())
    endpoint.start()
    try:
        base = f"http://127.0.0.1:{endpoint.port}"
        assert requests.get(f"{base}/v1/status", timeout=2).json()["ticks"] == 3
        text = requests.get(f"{base}/metrics", timeout=2).text
        assert 'spark_watchdog_node_verdict{node="spark-2",verdict="held"} 1.0' in text
        assert 'spark_watchdog_node_held{node="spark-2"} 1.0' in text
        assert "spark_watchdog_controller_polls_total 3.0" in text
    finally:
        endpoint.stop()
