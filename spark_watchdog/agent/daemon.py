"""The agent's main loop: probes on their own schedules, a snapshot, systemd.

Layout of one running agent:

- one asyncio task per probe (``ProbeRunner``), each with its own interval and
  deadline, so a wedged GPU driver or a slow vLLM never delays the heartbeat
  (the probes and what their reports set off: :mod:`spark_watchdog.agent.probe_set`);
- the heartbeat loop, every ``loop_interval``: reads the host, advances
  ``seq``, rebuilds the snapshot, and pets the systemd watchdog only while
  every probe task is alive and reporting;
- the HTTP endpoint on its own threads, serving the latest snapshot;
- the memory guard (``memory_guard.enabled``), judged on every heartbeat
  from the host reading; it kills the rank itself when the host is about to
  run out (:mod:`spark_watchdog.agent.memory_watch`);
- the serving launcher (``serving.enabled``), driven by the controller's
  authenticated ``POST /v1/serving/{start,stop,canary}``; those run in the
  HTTP request threads, so a stop waiting out ``stop_timeout`` never blocks
  the loop. Its status is ``serving`` in ``/v1/state`` and ``GET /v1/serving``.

On SIGTERM the agent says STOPPING=1 to systemd, asks once whether the whole
system is going down (:mod:`spark_watchdog.agent.shutdown`), and publishes
``stopping`` in ``/v1/state`` (:mod:`spark_watchdog.agent.wind_down`). When the
system is going down it keeps the heartbeat and the endpoint up for
``shutdown_linger`` seconds, so the controller (polling every second) sees the
planned reboot before the port goes away and never takes it for a frozen host;
when only the agent is stopped or restarted it exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from spark_watchdog import __version__
from spark_watchdog.agent.auth import BearerAuth
from spark_watchdog.agent.clock_check import ClockCheck
from spark_watchdog.agent.clock_check import disabled_json as clock_disabled_json
from spark_watchdog.agent.exposition import render
from spark_watchdog.agent.gpu_faults import GpuFaultLog
from spark_watchdog.agent.memory_watch import MemoryWatch, disabled_json
from spark_watchdog.agent.peers import PeerWatch
from spark_watchdog.agent.probe_runner import ProbeRunner, iso_time
from spark_watchdog.agent.probe_set import AgentProbes
from spark_watchdog.agent.serving import ServingLauncher, disabled_status
from spark_watchdog.agent.serving_routes import serving_post_routes
from spark_watchdog.agent.shutdown import SystemStopping, system_shutting_down
from spark_watchdog.agent.snapshot import LiveValue, StateBody, ago
from spark_watchdog.agent.vllm_watch import VllmWatch
from spark_watchdog.agent.wind_down import WindDown
from spark_watchdog.config.agent import AgentConfig, peers_on_management
from spark_watchdog.http.server import (
    JSON,
    PROMETHEUS_TEXT,
    HttpEndpoint,
    PostRoute,
    Response,
    Route,
    json_response,
)
from spark_watchdog.probes.base import ProbeReport
from spark_watchdog.probes.host import HostProbe
from spark_watchdog.probes.pulse import OwnPulse, new_run
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.agent")


def _serving_control(config: AgentConfig) -> tuple[BearerAuth | None, ServingLauncher | None]:
    """The controller's token and the serving launcher, when serving is enabled.

    The token is read now, so a missing or unreadable token_file stops the
    agent at start (ConfigError), not at the first restart the controller
    asks for in the middle of an incident.
    """
    if not config.serving.enabled:
        return None, None
    assert config.serving.token_file is not None  # checked by the config
    auth = BearerAuth.from_file(config.serving.token_file)
    launcher = ServingLauncher(
        config.serving, process_match=config.probes.vllm.process_match, node=config.node
    )
    return auth, launcher


def _memory_watch(config: AgentConfig, launcher: ServingLauncher | None) -> MemoryWatch | None:
    if not config.memory_guard.enabled:
        return None
    return MemoryWatch(
        config.memory_guard,
        launcher=launcher,
        process_match=config.probes.vllm.process_match,
    )


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        notifier: SystemdNotifier | None = None,
        gpu_worker_argv: Sequence[str] | None = None,
        journal_boot_id: str | None = None,
        system_stopping: SystemStopping | None = None,
    ) -> None:
        self.config = config
        self.notifier = notifier or SystemdNotifier()
        self.started_at = time.time()
        self.seq = 0
        self._wind_down = WindDown(
            config.node, config.shutdown_linger, system_stopping or system_shutting_down
        )
        self.loop_lag_s = 0.0
        self.host = HostProbe(config.probes.host.proc_root)
        self._host_reading: ProbeReport | None = None
        self._host_observed_at = 0.0
        self._lock = threading.Lock()
        self._state_body = StateBody()
        self._snapshot: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._last_pet = 0.0
        self._last_status = ""
        self.ready = asyncio.Event()
        self.http: HttpEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._auth, self.serving = _serving_control(config)
        self.memory = _memory_watch(config, self.serving)
        self.own_pulse = OwnPulse(config.node, lambda: (self.seq, self._boot_id), new_run())
        self.peers = PeerWatch(
            config.peers, config.peering, carry=self.own_pulse.encoded, beat=config.loop_interval
        )
        self.probes = AgentProbes(
            config,
            serving=self.serving,
            memory=self.memory,
            gpu_worker_argv=gpu_worker_argv,
            journal_boot_id=journal_boot_id,
        )

    @property
    def _boot_id(self) -> str | None:
        boot_id = getattr(self._host_reading, "boot_id", None)
        return boot_id if isinstance(boot_id, str) else None

    @property
    def runners(self) -> dict[str, ProbeRunner]:
        """The probe runners by name (vllm, gpu, journal), for inspection."""
        return self.probes.runners

    @property
    def vllm(self) -> VllmWatch | None:
        return self.probes.vllm

    @property
    def clock_check(self) -> ClockCheck | None:
        return self.probes.clock_check

    @property
    def gpu_faults(self) -> GpuFaultLog:
        """Live GPU faults of this boot; one that ends the rank's context stops it."""
        return self.probes.gpu_faults

    # -- snapshot ---------------------------------------------------------

    def build_snapshot(self) -> dict[str, Any]:
        host = self._host_reading
        host_json: dict[str, Any] = {"state": "pending", "observed_at": None}
        if host is not None:
            host_json = host.to_json()
            host_json["observed_at"] = iso_time(self._host_observed_at)
        boot_id = host_json.get("boot_id")
        now = time.monotonic()
        stopping = self._wind_down.stopping
        snapshot = {
            "node": self.config.node,
            "boot_id": boot_id,
            "seq": self.seq,
            "started_at": iso_time(self.started_at),
            "observed_at": iso_time(time.time()),
            "version": __version__,
            "loop_lag_s": round(self.loop_lag_s, 4),
            "healthy": self.loop_healthy(),
            "probes": {
                "vllm": self.probes.bodies.json("vllm", now),
                "gpu": self.probes.bodies.json("gpu", now),
                "journal": self.probes.bodies.json("journal", now),
                "host": host_json,
            },
            "serving": self.serving_status(),
            "memory_guard": disabled_json() if self.memory is None else self.memory.to_json(),
            "gpu_clock_check": (
                clock_disabled_json() if self.clock_check is None else self.clock_check.to_json()
            ),
            "stopping": None if stopping is None else dict(stopping),
        }
        if self.config.peers:
            snapshot["peers"] = self.peers.to_json(now)
        if self.config.probes.gpu.enabled:
            snapshot["gpu_faults"] = self.gpu_faults.to_json()
        return snapshot

    def _live_values(self) -> list[LiveValue]:
        """The ages in the snapshot, filled in as each /v1/state answer leaves."""
        live: list[LiveValue] = []
        vllm = self.vllm
        if vllm is not None:
            live.append(
                (("probes", "vllm", "progress_ago_s"), lambda now: ago(vllm.advanced_at(), now))
            )
        if self.config.peers:
            live.append((("peers",), self.peers.to_json))
        return live

    def serving_status(self) -> dict[str, Any]:
        return self.serving.status() if self.serving is not None else disabled_status()

    def loop_healthy(self) -> bool:
        """Every probe task alive and none stuck: the condition for WATCHDOG=1."""
        return not any(task.done() for task in self._tasks) and not self.probes.stuck(time.time())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot

    def _publish(self) -> None:
        snap = self.build_snapshot()
        self._state_body.set(snap, self._live_values())
        with self._lock:
            self._snapshot = snap

    # -- HTTP -------------------------------------------------------------

    def routes(self) -> dict[str, Route]:
        def state() -> Response:
            return 200, JSON, self._state_body.render()

        def pulse() -> Response:
            # Cheap and history-free: what a peer asks every second over the fabric.
            return 200, JSON, self.own_pulse.line()

        def boots() -> Response:
            return json_response(self.probes.boots_json())

        def metrics() -> Response:
            return 200, PROMETHEUS_TEXT, render(self.snapshot)

        def serving() -> Response:
            # Unauthenticated, like /v1/state, which carries the same object: it
            # holds no secret (the argv's secret values read ***, spark_watchdog.redact).
            return json_response(self.serving_status())

        return {
            "/v1/state": state,
            "/v1/boots": boots,
            "/metrics": metrics,
            "/v1/serving": serving,
            "/v1/pulse": pulse,
        }

    def post_routes(self) -> dict[str, PostRoute]:
        """``POST /v1/serving/{start,stop,canary}`` (agent/serving_routes.py)."""
        return serving_post_routes(self.serving, self.vllm, lambda: self._loop)

    # -- main loop --------------------------------------------------------

    def status_line(self) -> str:
        """One line for ``systemctl status``; it changes only when a state does."""
        probes = self._snapshot.get("probes", {})
        line = ", ".join(f"{name} {body.get('state')}" for name, body in probes.items())
        serving = self._snapshot.get("serving", {})
        if serving.get("enabled"):
            profile = serving.get("profile")
            line += f", serving {serving.get('state')}" + (f" ({profile})" if profile else "")
        return line

    async def _heartbeat(self, done: asyncio.Event) -> None:
        interval = self.config.loop_interval
        expected = time.monotonic()
        while not done.is_set():
            now = time.monotonic()
            self.loop_lag_s = max(0.0, now - expected)
            reading = self.host.read(self.loop_lag_s, now)
            self._host_reading = reading
            self._host_observed_at = time.time()
            if self.memory is not None:
                try:
                    self.memory.observe(reading, now)
                except Exception:
                    # The heartbeat must go on: a guard that failed once judges the next reading.
                    log.exception("memory guard failed on this reading")
            self.seq += 1
            self._publish()
            self._talk_to_systemd()
            expected = time.monotonic() + interval
            # Last, as the loop goes to sleep: a pulse thread woken for a round
            # finds the interpreter free.
            self.peers.beat()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), interval)

    def _talk_to_systemd(self) -> None:
        if not self.ready.is_set():
            return
        status = self.status_line()
        # Once stopping, STATUS stays "stopping" (sent with STOPPING=1).
        if self._wind_down.stopping is None and status != self._last_status:
            self.notifier.status(status)
            self._last_status = status
        pet_every = self.notifier.watchdog_interval
        if pet_every is None:
            return
        now = time.monotonic()
        if now - self._last_pet >= pet_every and self.loop_healthy():
            self.notifier.watchdog()
            self._last_pet = now

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set. Raises WatchdogError if it cannot listen."""
        self._loop = asyncio.get_running_loop()
        http = self._listen()
        self._start_peers()
        heartbeat_done = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(heartbeat_done))
        told_systemd = False
        try:
            await self._start_probes()
            await stop.wait()
            self.notifier.stopping()
            told_systemd = True
            await self._wind_down.run(self._publish)
        finally:
            if not told_systemd:
                self.notifier.stopping()
            heartbeat_done.set()
            await self._shut(heartbeat, http)

    def _listen(self) -> HttpEndpoint:
        """The HTTP endpoint, started with the first snapshot behind it."""
        listen = self.config.listen
        self.http = HttpEndpoint(
            listen.address,
            listen.port,
            self.routes(),
            self.post_routes(),
            None if self._auth is None else self._auth.check,
            pulse_in=self.peers.heard if self.config.peers else None,
        )
        self._publish()
        self.http.start()
        log.info(
            "agent %s listening on %s:%d",
            self.config.node,
            listen.address,
            self.http.port,
            extra={"node": self.config.node},
        )
        return self.http

    async def _start_probes(self) -> None:
        # READY=1 only after the first probe round: a unit that is
        # "active" then has a meaningful snapshot behind /v1/state.
        await asyncio.gather(*(r.run_once() for r in self.runners.values()))
        self._publish()
        self.ready.set()
        self.notifier.ready(self.status_line())
        self._tasks = [
            asyncio.create_task(r.run_forever(first_wait=True), name=f"probe-{r.name}")
            for r in self.runners.values()
        ]

    async def _shut(self, heartbeat: asyncio.Task[None], http: HttpEndpoint) -> None:
        """Every task, watcher and thread of the agent stopped; the rank runs on."""
        for runner in self.runners.values():
            runner.stop()  # where a cancellation below is lost (ProbeRunner.stop)
        for task in [*self._tasks, heartbeat]:
            task.cancel()
        await asyncio.gather(*self._tasks, heartbeat, return_exceptions=True)
        self.peers.stop()
        await self.probes.close()
        if self.serving is not None:
            self.serving.close()  # the rank runs on: only its watchers stop
        http.stop()
        log.info("agent %s stopped", self.config.node)

    def _start_peers(self) -> None:
        for name in peers_on_management(self.config):
            log.warning(
                "peer %s is asked on this agent's own management address (%s): "
                "not a second path; give its fabric (ConnectX-7) address",
                name,
                self.config.listen.address,
            )
        self.peers.start()

    def cut_linger(self) -> None:
        """End the shutdown linger now (a second SIGTERM or SIGINT)."""
        self._wind_down.cut()


async def serve(config: AgentConfig, *, system_stopping: SystemStopping | None = None) -> None:
    """Run the agent until SIGTERM or SIGINT; a second one cuts the linger short.

    ``system_stopping`` replaces the systemd query made at the first signal.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    agent = Agent(config, system_stopping=system_stopping)

    def on_signal() -> None:
        if stop.is_set():
            agent.cut_linger()
        else:
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await agent.run(stop)
