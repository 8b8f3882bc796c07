"""Real components on loopback for the doctor's checks: an agent daemon, a PDU that
speaks SNMP, an SSH banner, and an agent look-alike whose clock is off."""

from __future__ import annotations

import json
import socketserver
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

from spark_watchdog.lab.hardware.journal_writer import boot_entries, write_boot
from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.ports import free_port
from spark_watchdog.lab.stories.agent_demo import AgentProcess
from spark_watchdog.power.snmp_profiles import APC_RPDU2

PDU_NAMES = {1: "spark-1", 2: "spark-2", 3: "spark-3", 4: "db-1"}
WRITE_COMMUNITY = "doctor-write-community"


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The real agent daemon (``spark-watchdog agent``) as node spark-3."""
    root = tmp_path_factory.mktemp("agent")
    journal = root / "journal"
    write_boot(
        journal,
        boot_entries(uuid.uuid4().hex, datetime.now(timezone.utc) - timedelta(hours=2)),
    )
    port = free_port()
    config = {
        "node": "spark-3",
        "listen": {"address": "127.0.0.1", "port": port},
        "loop_interval": 0.2,
        "probes": {
            "vllm": {"url": f"http://127.0.0.1:{free_port()}", "interval": 1.0},
            "gpu": {"deadline": 1.0},
            "journal": {"directory": str(journal)},
        },
    }
    path = root / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    agent = AgentProcess(path, root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/v1/state", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if agent.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not start: {agent.log_path.read_text()}")
            time.sleep(0.1)
        yield base
    finally:
        agent.close()


class _Banner(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def banner_port() -> Iterator[int]:
    """A TCP server that greets like sshd."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Banner)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def pdu() -> Iterator[PduStandinThread]:
    """An APC rPDU2 over real SNMP on loopback, outlets named after the nodes."""
    standin = PduStandin(
        StandinConfig(APC_RPDU2, outlets=8, names=PDU_NAMES, write_community=WRITE_COMMUNITY)
    )
    runner = PduStandinThread(standin).start()
    try:
        yield runner
    finally:
        runner.stop()


@pytest.fixture
def community_file(tmp_path: Path) -> Path:
    path = tmp_path / "pdu-community"
    path.write_text(WRITE_COMMUNITY + "\n")
    path.chmod(0o600)
    return path


def _skewed_handler(node: str, shift_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def date_time_string(self, timestamp: float | None = None) -> str:
            return formatdate(time.time() + shift_s, usegmt=True)

        def do_GET(self) -> None:
            now = datetime.fromtimestamp(time.time() + shift_s, timezone.utc)
            body = json.dumps(
                {
                    "node": node,
                    "seq": 7,
                    "boot_id": uuid.uuid4().hex,
                    "observed_at": now.isoformat(timespec="milliseconds"),
                    "healthy": True,
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@pytest.fixture
def skewed_agent() -> Iterator[Callable[[str, float], str]]:
    """``skewed_agent(node, shift_s)``: the URL of an agent look-alike whose clock is
    ``shift_s`` seconds off, in its body's observed_at and its Date header alike."""
    servers: list[ThreadingHTTPServer] = []

    def start(node: str, shift_s: float) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _skewed_handler(node, shift_s))
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
