"""The controller speaks sd_notify: READY once it has resumed, WATCHDOG only
after ticks that complete, STOPPING on SIGTERM (spark-watchdog-controller.service
is Type=notify with WatchdogSec)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.ports import free_port
from spark_watchdog.sdnotify import SystemdNotifier

pytestmark = pytest.mark.integration


def _config(tmp_path: Path) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": "spark-1",
                # Nothing listens there: the node is silent, which is fine here.
                "agent": f"http://127.0.0.1:{free_port()}",
                "ssh_host": "127.0.0.1",
                "ssh_port": free_port(),
                "power": [],
            }
        ],
        "detection": {"poll_interval": 0.1, "agent_timeout": 0.1},
        "listen": {"address": "127.0.0.1", "port": free_port()},
        "history": str(tmp_path / "history.db"),
    }


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    yield path, sock
    sock.close()


def _messages(sock: socket.socket, seconds: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            got.append(sock.recv(4096).decode())
    return got


def test_the_controller_process_notifies_ready_pets_and_stops(
    tmp_path: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    path, sock = notify_socket
    config = tmp_path / "controller.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path)))
    env = {**os.environ, "NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"}
    process = subprocess.Popen(
        [sys.executable, "-m", "spark_watchdog", "controller", "--config", str(config)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        running = _messages(sock, 4.0)
        ready = [m for m in running if m.startswith("READY=1")]
        assert ready, running
        assert "STATUS=1 nodes:" in ready[0]
        # WATCHDOG_USEC 0.4 s: a pet every 0.2 s at the latest, after a tick.
        assert sum(m == "WATCHDOG=1" for m in running) >= 5, running
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert any(m.startswith("STOPPING=1") for m in _messages(sock, 0.5))
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


def test_no_pet_while_every_tick_fails(
    tmp_path: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    path, sock = notify_socket
    config = parse_controller_config(_config(tmp_path), "test")
    store = HistoryStore(config.history)
    controller = Controller(
        config, store, systemd=SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
    )
    failing = {"on": False}
    real_tick = controller.tick

    async def tick() -> None:
        if failing["on"]:
            raise RuntimeError("a sweep that always fails")
        await real_tick()

    controller.tick = tick  # type: ignore[method-assign]

    async def scenario() -> tuple[list[str], list[str]]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = loop.create_task(controller.run(stop))
        healthy = await loop.run_in_executor(None, _messages, sock, 1.5)
        failing["on"] = True
        await asyncio.sleep(0.3)
        await loop.run_in_executor(None, _messages, sock, 0.2)  # sent before it took effect
        broken = await loop.run_in_executor(None, _messages, sock, 1.5)
        stop.set()
        await task
        return healthy, broken

    try:
        healthy, broken = asyncio.run(scenario())
    finally:
        store.close()
    assert sum(m == "WATCHDOG=1" for m in healthy) >= 3, healthy
    assert not any(m == "WATCHDOG=1" for m in broken), broken
