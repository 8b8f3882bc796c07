"""One running lab whose controllers run on its nodes (lab/colocated.py):
the cluster in network namespaces, a controller inside each node of the
order, their alert receiver and, when asked, a timeline of each; started in
order, stopped in reverse, everything gone afterwards.

What ``lab up --colocated``, its scenarios (lab/stories/colocated_scenarios.py)
and their tests share::

    with ColocatedLab(workdir, nodes=2) as lab:
        lab.lab.freeze(lab.lab.node("spark-1"))
        lab.wait_for(lambda: ..., 120, "spark-2's controller to cycle spark-1")
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.errors import StoreError
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import LabCluster, LabTimings
from spark_watchdog.lab.colocated import DEFAULT_ORDER, HISTORY, LOG, Colocation
from spark_watchdog.lab.lab_controller import AlertReceiver
from spark_watchdog.lab.netns import IP
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import LabTimeout, signals_ignored
from spark_watchdog.lab.sweep import sweep
from spark_watchdog.lab.timeline import Narrator, TimelineWatcher

# A lab of two nodes starts its ranks in seconds; its controllers then listen
# takeover_after (15 s) before they act: a loaded 2-core machine takes longer.
READY_TIMEOUT_S = 120.0
CONTROLLER_MATCH = "spark_watchdog controller --config"
# Run inside a node's namespace: print what a URL answers.
_ASK = "import sys, urllib.request as u; print(u.urlopen(sys.argv[1], timeout=5).read().decode())"


@dataclass
class NodeController:
    """The controller a node runs, as the lab machine sees it: over the node's
    management link, and in the node's directory (its history and its log)."""

    node: LabNode
    port: int

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def url(self) -> str:
        return f"http://{self.node.address}:{self.port}"

    @property
    def history(self) -> Path:
        return self.node.directory / HISTORY

    @property
    def log(self) -> Path:
        return self.node.directory / LOG

    def status(self) -> dict[str, Any] | None:
        try:
            body = requests.get(f"{self.url}/v1/status", timeout=1).json()
        except (requests.RequestException, ValueError):
            return None
        return body if isinstance(body, dict) else None

    def status_from(self, inside: LabNode, url: str) -> dict[str, Any] | None:
        """Its /v1/status asked at ``url`` from inside node ``inside``'s namespace:
        over the fabric, which the lab machine is not on."""
        assert inside.netns is not None
        ask = [IP, "netns", "exec", inside.netns, sys.executable, "-c", _ASK, f"{url}/v1/status"]
        done = subprocess.run(ask, capture_output=True, text=True, timeout=30, check=False)
        with contextlib.suppress(ValueError):
            body = json.loads(done.stdout)
            return body if isinstance(body, dict) and done.returncode == 0 else None
        return None

    def process(self, tree: list[psutil.Process]) -> psutil.Process | None:
        """Its process among the node's (None: not running now)."""
        for process in tree:
            with contextlib.suppress(psutil.Error):
                if process.status() != psutil.STATUS_ZOMBIE and CONTROLLER_MATCH in " ".join(
                    process.cmdline()
                ):
                    return process
        return None


def _ticks(status: dict[str, Any] | None) -> int | None:
    ticks = None if status is None else status.get("ticks")
    return ticks if isinstance(ticks, int) else None


class _Prefixed(Narrator):
    """A timeline's lines, each saying whose controller it tells of."""

    def __init__(self, inner: Narrator, prefix: str) -> None:
        super().__init__(inner.clock, echo=None)
        self.inner, self.prefix = inner, prefix

    def say(self, text: str, wall: float | None = None) -> None:
        self.inner.say(f"{self.prefix}{text}", wall)


@dataclass
class ColocatedLab:
    workdir: Path
    nodes: int = 2
    # The nodes that run a controller, in the order of responsibility.
    controllers: tuple[str, ...] = DEFAULT_ORDER
    narrator: Narrator | None = None
    timings: LabTimings = field(default_factory=LabTimings)
    # Merged into the shared controller config (section by section).
    controller_overrides: dict[str, Any] = field(default_factory=dict)
    cluster: LabCluster | None = None
    placed: dict[str, NodeController] = field(default_factory=dict)
    timelines: list[TimelineWatcher] = field(default_factory=list)
    _stores: dict[str, HistoryStore] = field(default_factory=dict)

    @property
    def config_path(self) -> Path:
        return self.workdir / "controller.yaml"

    @property
    def lab(self) -> LabCluster:
        assert self.cluster is not None, "the lab is not started"
        return self.cluster

    @property
    def colocation(self) -> Colocation:
        assert self.lab.colocation is not None
        return self.lab.colocation

    @property
    def receiver(self) -> AlertReceiver | None:
        return None if self.cluster is None else self.colocation.receiver

    def say(self, text: str) -> None:
        if self.narrator is not None:
            self.narrator.say(text)

    def lab_event(self, text: str) -> None:
        self.say(f"  [lab] {text}")

    # -- start ------------------------------------------------------------------

    def start(self) -> ColocatedLab:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        placement = Colocation(self.controllers, self.config_path, dict(self.controller_overrides))
        cluster = self.cluster = LabCluster(
            self.workdir / "nodes",
            size=self.nodes,
            timings=self.timings,
            netns=True,
            colocation=placement,
        )
        cluster.on_event = self.lab_event
        order = ", ".join(self.controllers)
        self.say(
            f"starting {self.nodes} simulated DGX Sparks in network namespaces, a controller "
            f"on each of {order} (no controller on the lab machine), a management switch "
            "whose gateway is the PDU, the witness and the alert receiver"
        )
        cluster.start()
        cluster.wait_agents()
        cluster.start_serving("plain")
        self.placed = {
            name: NodeController(cluster.node(name), placement.port) for name in self.controllers
        }
        self.say(
            f"agents up, serving started; the controllers on {order} listen on port "
            f"{placement.port} of their nodes' management and fabric addresses "
            f"(config {self.config_path}); they listen to each other before they act"
        )
        if self.narrator is not None:
            self._start_timelines(self.narrator)
        self.wait_ready()

    def _start_timelines(self, narrator: Narrator) -> None:
        for placed in self.placed.values():
            config = {**self.colocation.config, "history": str(placed.history)}
            parsed = parse_controller_config(config, f"{placed.name}'s controller")
            prefix = _Prefixed(narrator, f"[{placed.name}'s controller] ")
            self.timelines.append(TimelineWatcher(parsed, placed.url, prefix).start())

    # -- observation ------------------------------------------------------------

    def status(self, name: str) -> dict[str, Any] | None:
        """The /v1/status of the controller on node ``name``."""
        return self.placed[name].status()

    def verdict(self, by: str, node: str) -> str | None:
        """``node``'s verdict in the status of the controller on ``by``."""
        for entry in (self.status(by) or {}).get("nodes", []):
            if entry.get("name") == node:
                return str(entry.get("verdict"))
        return None

    def ticks(self) -> dict[str, int | None]:
        """Each controller's sweeps so far, as its status says (None: no answer)."""
        return {name: _ticks(placed.status()) for name, placed in self.placed.items()}

    def ready(self, after: dict[str, int | None] | None = None) -> bool:
        """Every controller answers, listens no more, and finds every node healthy;
        with ``after``, in an answer of a sweep later than those (a controller
        woken from a freeze first answers what it published before it)."""
        for name, placed in self.placed.items():
            status = placed.status()
            if status is None or (status.get("colocated") or {}).get("observing") is not False:
                return False
            before, ticks = (after or {}).get(name), _ticks(status)
            if before is not None and (ticks is None or ticks <= before):
                return False
            nodes = status.get("nodes") or []
            if len(nodes) != self.nodes or any(n.get("verdict") != "healthy" for n in nodes):
                return False
        return True

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        before = self.ticks()
        took = self.wait_for(
            lambda: self.ready(before), timeout, "every controller acting, every node healthy"
        )
        self.say("every controller acts again and finds every node healthy")
        return took

    def store(self, name: str) -> HistoryStore:
        """The history of the controller on ``name``, read-only."""
        store = self._stores.get(name)
        if store is None:
            store = self._stores[name] = HistoryStore(self.placed[name].history, read_only=True)
        return store

    def wait_for(
        self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.2
    ) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            with contextlib.suppress(StoreError):
                if check():
                    return time.monotonic() - started
            time.sleep(interval)
        raise LabTimeout(f"timed out after {timeout:g}s waiting for {what}")

    # -- stop -------------------------------------------------------------------

    def stop(self) -> None:
        with signals_ignored():
            steps: list[Callable[[], object]] = [t.stop for t in self.timelines]
            steps += [s.close for s in self._stores.values()]
            if self.cluster is not None:
                lab_id = self.cluster.lab_id
                steps += [self.cluster.stop, lambda: sweep(lab_id)]
            for step in steps:
                with contextlib.suppress(Exception):
                    step()
            self.timelines, self._stores = [], {}

    def __enter__(self) -> ColocatedLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
