"""One running lab: the simulated cluster, the real controller, the alert
receiver and, when asked, the live timeline; started in order, stopped in
reverse, everything gone afterwards.

``LabSession`` is what ``lab demo``, ``lab run`` and ``lab up`` share::

    with LabSession(workdir, nodes=4, narrator=Narrator()) as lab:
        lab.cluster.freeze(lab.cluster.node("spark-3"))
        ...
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spark_watchdog.errors import StoreError
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import LabCluster, LabTimings
from spark_watchdog.lab.lab_controller import (
    AlertReceiver,
    ControllerProcess,
    ControllerThread,
    LabController,
    write_config,
)
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.rank_containers import SERVING
from spark_watchdog.lab.sweep import sweep
from spark_watchdog.lab.timeline import Narrator, TimelineWatcher

ControllerMode = Literal["thread", "process"]


class LabTimeout(Exception):
    """What a scenario waited for did not happen in time."""


@dataclass
class LabSession:
    workdir: Path
    nodes: int = 4
    narrator: Narrator | None = None
    controller_mode: ControllerMode = "thread"
    netns: bool = False  # each node in a network namespace (root; partition)
    host_memory: bool = False  # the nodes read this machine's /proc/meminfo
    # The head's rank: "standin" or "real" (the vLLM CPU server; see lab.hardware.real_vllm).
    vllm: str = "standin"
    # How each node's rank runs: "process", "docker" or "launcher" (lab.cluster.SERVING).
    serving: str = "process"
    # The agents' intervals and thresholds (short by default; bench uses production).
    timings: LabTimings = field(default_factory=LabTimings)
    # Called with the started cluster and the controller config before the
    # controller starts (a benchmark routes the controller through relays).
    adjust_config: Callable[[LabCluster, dict[str, Any]], None] | None = None
    # Merged into the lab's controller config (section by section).
    controller_overrides: dict[str, Any] = field(default_factory=dict)
    cluster: LabCluster | None = None
    controller: LabController | None = None
    receiver: AlertReceiver | None = None
    timeline: TimelineWatcher | None = None
    controller_config: dict[str, Any] = field(default_factory=dict)
    _store: HistoryStore | None = None

    @property
    def history_path(self) -> Path:
        return self.workdir / "history.db"

    @property
    def config_path(self) -> Path:
        return self.workdir / "controller.yaml"

    @property
    def lab(self) -> LabCluster:
        assert self.cluster is not None, "the lab is not started"
        return self.cluster

    def say(self, text: str) -> None:
        if self.narrator is not None:
            self.narrator.say(text)

    def lab_event(self, text: str) -> None:
        """What the simulated hardware did (not the controller): marked as such."""
        self.say(f"  [lab] {text}")

    # -- start ------------------------------------------------------------------

    def start(self) -> LabSession:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        cluster = self._start_cluster()
        self.receiver = AlertReceiver()
        config = cluster.controller_config(self.history_path)
        config["notify"] = {"webhooks": [{"url": self.receiver.url}], "attempts": 1}
        for key, value in self.controller_overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        if self.adjust_config is not None:
            self.adjust_config(cluster, config)
        self.controller_config = config
        write_config(config, self.config_path)
        self.controller = self._start_controller(config)
        self.say(f"controller up: {self.controller.url}/v1/status, history {self.history_path}")
        if self.narrator is not None:
            self.timeline = TimelineWatcher(
                self.controller.config, self.controller.url, self.narrator
            ).start()
        self.wait_healthy()
        if self.timeline is not None:
            self.timeline.poll()  # "every node healthy" before anything else happens

    def _start_cluster(self) -> LabCluster:
        """The lab's nodes and PDU started (``self.cluster`` from the first, for
        :meth:`stop`), every agent up, serving started."""
        cluster = self.cluster = LabCluster(
            self.workdir / "nodes",
            size=self.nodes,
            timings=self.timings,
            netns=self.netns,
            host_memory=self.host_memory,
            vllm=self.vllm,
            serving_mode=self.serving,
        )
        cluster.on_event = self.lab_event
        self.say(
            f"starting {self.nodes} simulated DGX Sparks (agent, SSH banner, vLLM rank, "
            "NVML and journal each) and an APC rPDU2 stand-in on loopback"
        )
        cluster.start()
        cluster.wait_agents()
        assert cluster.pdu is not None
        where = f" (network namespaces, {cluster.nodes[0].address} ...)" if self.netns else ""
        self.say(
            f"agents up on {', '.join(n.name for n in cluster.nodes)}{where}; "
            f"PDU on udp/127.0.0.1:{cluster.pdu.port}"
        )
        if self.serving != "process":
            self.say(f"ranks: {SERVING[self.serving]}")
        if self.vllm == "real":
            self.say(
                "the head's rank is the real vLLM server (CPU build, a small random model); "
                "it takes a minute or two to load, with the lab's own traffic"
            )
        cluster.start_serving("plain")
        self.say(
            "serving: TP=4 ranks started with profile plain (adaptive verification on, "
            "cudagraph_mode FULL_AND_PIECEWISE); the head's engine is stepping"
            if self.nodes == 4 and self.vllm != "real"
            else f"serving: {self.nodes} ranks started with profile plain; the head is stepping"
        )
        return cluster

    def _start_controller(self, config: dict[str, Any]) -> LabController:
        if self.controller_mode == "process":
            return ControllerProcess(
                config,
                self.config_path,
                self.workdir / "controller.log",
                self.lab.environment(),
            ).start()
        return ControllerThread(config).start()

    def wait_healthy(self, timeout: float = 30.0) -> float:
        return self.wait_for(
            lambda: (
                (s := self.status()) is not None
                and bool(s.get("nodes"))
                and all(n.get("verdict") == "healthy" for n in s["nodes"])
            ),
            timeout,
            "every node healthy",
        )

    # -- observation ------------------------------------------------------------

    def status(self) -> dict[str, Any] | None:
        return None if self.controller is None else self.controller.status()

    def verdict(self, node: LabNode) -> str | None:
        status = self.status() or {}
        for entry in status.get("nodes", []):
            if entry.get("name") == node.name:
                return str(entry.get("verdict"))
        return None

    def store(self) -> HistoryStore:
        """The history, read-only (the controller may be another process)."""
        if self._store is None:
            self._store = HistoryStore(self.history_path, read_only=True)
        return self._store

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
        """Reverse order; each step runs even when one before it failed, and a
        second Ctrl-C cannot cut the clean-up short."""
        with signals_ignored():
            self._stop()

    def _stop(self) -> None:
        # The readers close first, so that the controller's own close is the
        # last one and checkpoints the history into one self-contained file.
        steps: list[Callable[[], object]] = []
        if self.timeline is not None:
            steps.append(self.timeline.stop)
        if self._store is not None:
            steps.append(self._store.close)
        if self.controller is not None:
            steps.append(self.controller.stop)
        if self.cluster is not None:
            lab_id = self.cluster.lab_id
            steps += [self.cluster.stop, lambda: sweep(lab_id)]
        if self.receiver is not None:
            steps.append(self.receiver.stop)
        for step in steps:
            with contextlib.suppress(Exception):
                step()
        self.timeline = None
        self.controller = None
        self._store = None
        self.receiver = None

    def __enter__(self) -> LabSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored for a while (main thread only: elsewhere
    Python delivers no signal anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
