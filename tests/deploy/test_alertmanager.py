"""Alertmanager: the example config, and the controller's alerts through a real Alertmanager.

The end-to-end test starts Debian's Alertmanager binary on loopback with the
example routing (its receivers' URLs pointed at a webhook server of the
test's own), drives the controller's real Notifier, and checks what the
pager and the chat webhooks receive.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.config.controller import NotifyConfig
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.lab.ports import free_port

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy/alertmanager/alertmanager.example.yml"
ALERTMANAGER = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's

pytestmark = pytest.mark.integration


def test_the_example_config_passes_amtool(binary: Callable[..., str]) -> None:
    amtool = binary("amtool")
    done = subprocess.run(
        [amtool, "check-config", str(EXAMPLE)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"amtool check-config {EXAMPLE}:\n{done.stdout}{done.stderr}"
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (["severity=critical", "node=spark-3", "alertname=SparkWatchdog_gave_up"], "pager,chat"),
        (["severity=warning", "node=spark-3", "alertname=SparkWatchdogHostFrozen"], "chat"),
    ],
)
def test_the_example_routes_critical_to_the_pager_and_everything_to_chat(
    binary: Callable[..., str], labels: list[str], receivers: str
) -> None:
    amtool = binary("amtool")
    done = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={EXAMPLE}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == receivers, f"{labels} went to {done.stdout.strip()!r}"


class Webhooks:
    """Alertmanager's webhook receiver on loopback: keeps each payload by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.received.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def alerts(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [a for p, body in self.received if p == path for a in body["alerts"]]

    def payloads(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for p, body in self.received if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def routing_for_test(webhooks: Webhooks) -> dict[str, Any]:
    """The example's routing, with short waits and the receivers pointed at the test."""
    config = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for route in [config["route"], *config["route"]["routes"]]:
        for key in ("group_wait", "group_interval"):
            if key in route:
                route[key] = "1s"
    for receiver in config["receivers"]:
        assert set(receiver) == {"name", "webhook_configs"}, receiver
        for hook in receiver["webhook_configs"]:
            hook["url"] = f"{webhooks.base}/{receiver['name']}"
    return dict(config)


@pytest.fixture
def webhooks() -> Iterator[Webhooks]:
    hooks = Webhooks()
    yield hooks
    hooks.close()


@pytest.fixture
def alertmanager(binary: Callable[..., str], webhooks: Webhooks, tmp_path: Path) -> Iterator[str]:
    path = binary(*ALERTMANAGER)
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(routing_for_test(webhooks)))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "alertmanager.log").open("w")
    process = subprocess.Popen(
        [
            path,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: one instance
            "--log.level=info",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (
                f"alertmanager exited ({process.returncode}):\n"
                + (tmp_path / "alertmanager.log").read_text()
            )
            try:
                if requests.get(f"{base}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "alertmanager not ready within 30 s"
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.1)


def test_the_controllers_alerts_reach_the_pager_and_the_chat_through_alertmanager(
    alertmanager: str, webhooks: Webhooks
) -> None:
    notifier = Notifier(NotifyConfig(alertmanager=alertmanager, attempts=3, timeout=5.0))
    gave_up = Event(
        "gave_up", "spark-3: gave up (every power path was tried); held for a person", "spark-3", 7
    )
    power = Event("power_action", "spark-2: power cycle via snmp outlet 2", "spark-2", 8)

    async def send() -> None:
        notifier.send(gave_up)
        notifier.send(power)
        await notifier.drain(timeout=15.0)

    asyncio.run(send())
    assert (notifier.delivered, notifier.failed) == (2, 0), "Alertmanager refused an alert"

    wait_for(lambda: bool(webhooks.alerts("/pager")), "the critical alert at the pager webhook")
    wait_for(lambda: len(webhooks.alerts("/chat")) >= 2, "both alerts at the chat webhook")
    paged = webhooks.alerts("/pager")
    assert [a["labels"]["alertname"] for a in paged] == ["SparkWatchdog_gave_up"]
    alert = paged[0]
    assert alert["status"] == "firing"
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["node"] == "spark-3"
    assert alert["labels"]["source"] == "spark-watchdog"
    assert alert["annotations"]["summary"] == gave_up.summary
    assert alert["annotations"]["incident"] == "7"
    payload = webhooks.payloads("/pager")[0]
    assert payload["receiver"] == "pager"
    assert payload["groupLabels"] == {"alertname": "SparkWatchdog_gave_up", "node": "spark-3"}

    chat = {a["labels"]["alertname"]: a for a in webhooks.alerts("/chat")}
    assert set(chat) == {"SparkWatchdog_gave_up", "SparkWatchdog_power_action"}
    assert chat["SparkWatchdog_power_action"]["labels"]["severity"] == "warning"
    assert chat["SparkWatchdog_power_action"]["labels"]["node"] == "spark-2"
    # A warning never pages (the pager's group_wait has long passed by now).
    assert all(a["labels"]["severity"] == "critical" for a in webhooks.alerts("/pager"))
