"""The real controller, run for the lab: in a thread, or as its own process.

``ControllerThread`` runs :class:`~spark_watchdog.controller.daemon.Controller`
on a private event loop in this process, with its ``/v1/status`` endpoint:
the cheap way on a small machine. ``ControllerProcess`` runs
``python -m spark_watchdog controller --config FILE``, exactly as deployed,
for what needs a separate process (SIGKILL mid-recovery, then a restart).

``AlertReceiver`` is the webhook the lab's controller notifies: a loopback
HTTP server that keeps every event, so a scenario can check that a person
would have been alerted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

import requests
import yaml

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.page.page_api import page_endpoint
from spark_watchdog.controller.pair.fence import LONE, Fence
from spark_watchdog.history.store import HistoryStore

log = logging.getLogger("spark_watchdog.lab")


class LabController(Protocol):
    """What a scenario needs from a running controller, however it runs."""

    config: ControllerConfig

    @property
    def url(self) -> str: ...

    def status(self) -> dict[str, Any] | None: ...

    def stop(self) -> None: ...


def _status(url: str) -> dict[str, Any] | None:
    try:
        body = requests.get(f"{url}/v1/status", timeout=1).json()
    except (requests.RequestException, ValueError):
        return None
    return body if isinstance(body, dict) else None


def write_config(config: dict[str, Any], path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class ControllerThread:
    """The controller on its own event loop in a daemon thread, with /v1/status."""

    def __init__(self, config: dict[str, Any], *, fence: Fence = LONE) -> None:
        """``fence``: how far it may act (controller/pair/fence.py); alone by default."""
        self.config = parse_controller_config(config, "lab controller config")
        self.store = HistoryStore(self.config.history)
        io = ControllerIO.production(self.config, fence=fence)
        self.controller = Controller(self.config, self.store, io=io)
        self._loop: asyncio.AbstractEventLoop | None = None
        try:
            self.endpoint = page_endpoint(
                self.config, self.controller, self.controller, lambda: self._loop
            )
        except BaseException:
            self.store.close()  # listen.token_file unreadable: nothing starts
            raise
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lab-controller", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.listen.address}:{self.config.listen.port}"

    def start(self) -> ControllerThread:
        self.endpoint.start()
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop_event = asyncio.Event()
            self._ready.set()
            await self.controller.run(self._stop_event)

        # asyncio.run, as `spark-watchdog controller` does: what the controller
        # leaves running at the end is cancelled, not destroyed pending.
        asyncio.run(main())

    def status(self) -> dict[str, Any] | None:
        return _status(self.url)

    def stop(self) -> None:
        loop, stop_event = self._loop, self._stop_event
        if self._thread.is_alive() and loop is not None and stop_event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop_event.set)
            self._thread.join(30)
        self.endpoint.stop()
        self.store.close()


class ControllerProcess:
    """``spark-watchdog controller --config FILE`` as a child process of the lab.

    It runs in a session of its own, so a Ctrl-C on the terminal reaches the
    lab, which stops it in order, not the controller first.
    """

    def __init__(
        self, config: dict[str, Any], config_path: Path, log_path: Path, env: dict[str, str]
    ) -> None:
        self.config = parse_controller_config(config, str(config_path))
        self.config_path = write_config(config, config_path)
        self.log_path = log_path
        self.env = env
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{self.config.listen.address}:{self.config.listen.port}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self, wait: float = 30.0) -> ControllerProcess:
        argv = [sys.executable, "-m", "spark_watchdog", "controller", "--config"]
        with self.log_path.open("ab") as sink:
            self.process = subprocess.Popen(
                [*argv, str(self.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the controller exited with {self.process.returncode}; see {self.log_path}"
                )
            if self.status() is not None:
                return self
            time.sleep(0.1)
        raise TimeoutError(f"the controller did not answer within {wait:g}s; see {self.log_path}")

    def status(self) -> dict[str, Any] | None:
        return _status(self.url)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind, as when the management host dies."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class AlertReceiver:
    """A webhook receiver (on loopback, or on ``host``) that keeps what the controllers send."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                with contextlib.suppress(ValueError):
                    event = json.loads(self.rfile.read(length))
                    if isinstance(event, dict):
                        with outer._lock:
                            outer.events.append(event)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="lab-alerts", daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/alerts"

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def kinds(self) -> list[str]:
        return [str(e.get("kind")) for e in self.snapshot()]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


def quiet_logging(log_file: Path) -> logging.Handler:
    """Send the in-process controller's log lines to a file, not the terminal."""
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    return handler
