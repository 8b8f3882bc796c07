"""Controller processes of a pair on the lab's cluster and one PostgreSQL history.

What the pair's tests and the failover benchmark share: each controller is
a real ``spark-watchdog controller`` process with the lab's config, short
leadership timings (``LEADERSHIP``) and the PostgreSQL history, reached
directly or through a ``TcpProxy`` of its own (the chaos tier cuts one
controller's link, not the other's). Its output goes to ``<name>.log``.

A controller that stops leading exits, and its unit starts it again as a
standby (``Restart=always``, ``RestartSec=5s`` in
systemd/spark-watchdog-controller.service). ``start(..., restart=True)`` does
the same here: a controller that exits is started again ``RESTART_S`` later,
its output appended to the same log after a ``RESTARTED`` line. Without it a
pair whose both controllers lose their leases in turn (a loaded machine, then
a fault) has nobody left to finish a recovery, which production would have.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests
import yaml

from spark_watchdog.history.leadership import Leader, current
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.hardware.postgres_server import PostgresServer
from spark_watchdog.lab.hardware.tcp_proxy import TcpProxy

# Short, and holding together: give_up_after + 2 x send_deadline + 1 <= lease. The
# lab's SNMP timeout (1 s, one retry) and SSH connect timeout (2 s) are within
# the send deadline. give_up_after leaves a loaded 2-core machine room: when a
# leader's renewals were relayed by a proxy in the test's own process, sharing
# two cores with the whole suite, a leader on a healthy link gave up at 1.5 s,
# and once at 3 s; the proxy is a process of its own now (tcp_proxy.py).
LEADERSHIP: dict[str, float] = {
    "lease": 12.0,
    "renew_every": 0.5,
    "give_up_after": 4.5,
    "send_deadline": 2.0,
    "settle": 0.5,
}


# The controller unit's RestartSec (systemd/spark-watchdog-controller.service).
RESTART_S = 5.0
RESTARTED = "--- the lab started this controller again (its unit's Restart=always) ---"


def wait_for(check: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``check`` until it is true; the seconds it took (RuntimeError past ``timeout``)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


class ControllerPair:
    """The controller processes of one run, on one database (``url``)."""

    def __init__(self, lab: LabCluster, server: PostgresServer, url: str, tmp: Path) -> None:
        self.lab = lab
        self.server = server
        self.url = url
        self.tmp = tmp
        self.processes: dict[str, subprocess.Popen[bytes]] = {}  # each name's latest
        self.store = PostgresHistoryStore(url, password_file=str(server.password_file))
        self._earlier: list[subprocess.Popen[bytes]] = []  # replaced by a restart
        self._restarts: dict[str, tuple[list[str], dict[str, str] | None]] = {}
        self._closing = threading.Event()
        self._keeper: threading.Thread | None = None

    def config_path(self, name: str) -> Path:
        return self.tmp / f"{name}.yaml"

    def start(
        self,
        name: str,
        *,
        via: TcpProxy | None = None,
        env: Mapping[str, str] | None = None,
        restart: bool = False,
        **overrides: Any,
    ) -> subprocess.Popen[bytes]:
        """Start controller ``name``; ``via``: its history link goes through that
        proxy; ``env``: added to its environment; ``restart``: started again
        ``RESTART_S`` after it exits, as its unit would; ``overrides``: of its
        config."""
        config: dict[str, Any] = self.lab.controller_config(
            Path("unused"), leadership=LEADERSHIP, **overrides
        )
        url = self.url
        if via is not None:
            url = url.replace(f"127.0.0.1:{self.server.port}/", f"127.0.0.1:{via.port}/")
        config["history"] = url
        config["history_password_file"] = str(self.server.password_file)
        self.config_path(name).write_text(yaml.safe_dump(config))
        argv = [sys.executable, "-m", "spark_watchdog", "controller"]
        argv += ["--config", str(self.config_path(name))]
        environment = None if env is None else {**os.environ, **env}
        (self.tmp / f"{name}.log").write_bytes(b"")
        process = self._spawn(name, argv, environment)
        if restart:
            self._restarts[name] = (argv, environment)
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keep_running, daemon=True)
                self._keeper.start()
        return process

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None
    ) -> subprocess.Popen[bytes]:
        with (self.tmp / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.processes[name] = process
        return process

    def _keep_running(self) -> None:
        """Start each restarted controller again ``RESTART_S`` after it exits."""
        exited: dict[str, float] = {}
        while not self._closing.wait(0.2):
            for name, (argv, env) in list(self._restarts.items()):
                process = self.processes[name]
                if process.poll() is None:
                    continue
                since = exited.setdefault(name, time.monotonic())
                if time.monotonic() - since < RESTART_S:
                    continue
                del exited[name]
                with (self.tmp / f"{name}.log").open("a") as log:
                    log.write(f"{RESTARTED} (it exited with {process.returncode})\n")
                self._earlier.append(process)
                self._spawn(name, argv, env)

    def log(self, name: str) -> str:
        """What ``name`` wrote, every start of it in turn."""
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def leader(self) -> Leader | None:
        return current(self.store)

    def leads(self, name: str, epoch: int | None = None) -> bool:
        """Whether ``name`` holds an unexpired lease (at ``epoch``, if given)."""
        leader = self.leader()
        pid = self.processes[name].pid
        return (
            leader is not None
            and not leader.expired
            and leader.holder.split(":")[1] == str(pid)
            and (epoch is None or leader.epoch == epoch)
        )

    def sees_every_node_healthy(self, name: str) -> bool:
        """Whether controller ``name`` leads and has seen every node healthy
        (so it knows each node's boot id before a fault)."""
        port = yaml.safe_load(self.config_path(name).read_text())["listen"]["port"]
        try:
            status = requests.get(f"http://127.0.0.1:{port}/v1/status", timeout=2).json()
        except (requests.RequestException, ValueError):
            return False
        nodes = status.get("nodes") or []
        return len(nodes) == len(self.lab.nodes) and all(
            n.get("verdict") == "healthy" for n in nodes
        )

    def standing_by(self, name: str) -> bool:
        return "standby:" in self.log(name)

    def said_while_deposed(self, name: str, since: int = 0) -> list[str]:
        """The lines of ``name``'s log from offset ``since`` that a deposed
        leader must not write (docs/design.md, "Controller pair"): an alert about
        a node, an incident resumed, a second ``leadership_lost``."""
        said = self.log(name)[since:]
        lines = said.split(RESTARTED)[0].splitlines()  # this start's, not the next's
        wrong = [
            line
            for line in lines
            if ("notify " in line and "notify leadership_" not in line)
            or "resuming incident" in line
        ]
        lost = [line for line in lines if "notify leadership_lost" in line]
        return wrong + lost[1:]

    def close(self) -> None:
        """Every process still running is woken and killed; the store closed."""
        self._closing.set()
        if self._keeper is not None:
            self._keeper.join(30)
        for process in [*self._earlier, *self.processes.values()]:
            if process.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    os.kill(process.pid, sig)
                process.wait(30)
        self.store.close()
