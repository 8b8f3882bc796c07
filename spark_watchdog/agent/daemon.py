"""The agent's main loop: probes on their own schedules, a snapshot, systemd.

Layout of one running agent:

- one asyncio task per probe (``ProbeRunner``), each with its own interval and
  deadline, so a wedged GPU driver or a slow vLLM never delays the heartbeat;
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
``stopping`` in ``/v1/state``. When the system is going down it keeps the
heartbeat and the endpoint up for ``shutdown_linger`` seconds, so the
controller (polling every second) sees the planned reboot before the port
goes away and never takes it for a frozen host; when only the agent is
stopped or restarted it exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from spark_watchdog import __version__
from spark_watchdog.agent.auth import BearerAuth
from spark_watchdog.agent.clock_check import ClockCheck, ClockPolicy
from spark_watchdog.agent.clock_check import disabled_json as clock_disabled_json
from spark_watchdog.agent.exposition import render
from spark_watchdog.agent.memory_watch import MemoryWatch, disabled_json
from spark_watchdog.agent.probe_runner import Observation, ProbeRunner, iso_time
from spark_watchdog.agent.serving import (
    LaunchFailed,
    ServingConflict,
    ServingLauncher,
    StopFailed,
    UnknownProfile,
    disabled_status,
)
from spark_watchdog.agent.shutdown import SystemStopping, system_shutting_down
from spark_watchdog.config.agent import AgentConfig, CanaryConfig
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.errors import ProbeError
from spark_watchdog.http_server import (
    JSON,
    PROMETHEUS_TEXT,
    HttpEndpoint,
    PostRoute,
    Response,
    Route,
    json_response,
)
from spark_watchdog.probes.base import ProbeReport
from spark_watchdog.probes.gpu import GpuProbe, GpuReading, low_power_while_running
from spark_watchdog.probes.host import HostProbe, read_boot_id
from spark_watchdog.probes.journal import JournalProbe, JournalReport
from spark_watchdog.probes.vllm import (
    Canary,
    ProgressTracker,
    VllmScraper,
    VllmStatus,
    rank_process_alive,
)
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.agent")

# A probe with no report for this many of its own (interval + deadline) is
# stuck; the agent then stops petting the systemd watchdog so it restarts us.
_STALE_FACTOR = 10.0


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


def _clock_check(config: AgentConfig) -> ClockCheck | None:
    if not (config.gpu_clock_check.enabled and config.probes.gpu.enabled):
        return None
    ccfg = config.gpu_clock_check
    policy = ClockPolicy(ccfg.floor_mhz, ccfg.busy_util_pct, ccfg.busy_samples, ccfg.window)
    return ClockCheck(policy, time.monotonic())


def _memory_watch(config: AgentConfig, launcher: ServingLauncher | None) -> MemoryWatch | None:
    if not config.memory_guard.enabled:
        return None
    return MemoryWatch(
        config.memory_guard,
        launcher=launcher,
        process_match=config.probes.vllm.process_match,
    )


def _serving_disabled(body: dict[str, Any]) -> Response:
    return json_response(
        {"error": "serving control is disabled on this node (serving.enabled: false)"}, 404
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
        # Asked once, at SIGTERM, off the event loop: is the whole system
        # going down? Tests pass their own answer.
        self._system_stopping = system_stopping or system_shutting_down
        self.started_at = time.time()
        self.seq = 0
        # None while running; {"since", "system"} once asked to stop.
        self._stopping: dict[str, Any] | None = None
        self._linger_cut = asyncio.Event()
        self.loop_lag_s = 0.0
        self.host = HostProbe(config.probes.host.proc_root)
        self._host_reading: ProbeReport | None = None
        self._host_observed_at = 0.0
        self._lock = threading.Lock()
        self._state_json = b"{}"
        self._snapshot: dict[str, Any] = {}
        self._boots_json: dict[str, Any] = {"boots": [], "state": "pending"}
        self._runners: dict[str, ProbeRunner] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._last_pet = 0.0
        self._last_status = ""
        # The JSON body of each probe's latest report, kept until the next report.
        self._probe_bodies: dict[str, tuple[Observation, dict[str, Any]]] = {}
        self.ready = asyncio.Event()
        self.http: HttpEndpoint | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

        self._auth, self.serving = _serving_control(config)
        self.clock_check = _clock_check(config)
        self.memory = _memory_watch(config, self.serving)

        self._tracker: ProgressTracker | None = None
        self._scraper: VllmScraper | None = None
        self._canary: Canary | None = None
        self._canary_task: asyncio.Task[None] | None = None
        self._asked_canary: Canary | None = None
        self._last_canary = float("-inf")
        self._gpu: GpuProbe | None = None
        self._journal: JournalProbe | None = None
        if config.probes.vllm.enabled:
            self._add_vllm_probe()
        if config.probes.gpu.enabled:
            self._add_gpu_probe(gpu_worker_argv)
        if config.probes.journal.enabled:
            self._add_journal_probe(journal_boot_id)
        for runner in self._runners.values():
            runner.on_report = self._on_report

    def _add_vllm_probe(self) -> None:
        vcfg = self.config.probes.vllm
        self._tracker = ProgressTracker(vcfg.stall_after, dead_after=vcfg.dead_after)
        if vcfg.url is not None:
            self._scraper = VllmScraper(vcfg.url, vcfg.timeout, vcfg.max_body_bytes)
            api_key = canary_api_key(vcfg.canary)
            if vcfg.canary.enabled:
                self._canary = Canary(
                    vcfg.url, vcfg.canary.model, vcfg.canary.timeout, api_key=api_key
                )
            # The one the controller asks for (POST /v1/serving/canary), sent
            # whether or not automatic canaries are on.
            self._asked_canary = Canary(
                vcfg.url, vcfg.canary.model, vcfg.canary.timeout, api_key=api_key
            )
        self._runners["vllm"] = ProbeRunner(
            "vllm", vcfg.interval, vcfg.timeout + 1.0, blocking_probe=self._read_vllm
        )

    def _add_gpu_probe(self, worker_argv: Sequence[str] | None) -> None:
        gcfg = self.config.probes.gpu
        self._gpu = GpuProbe(gcfg.deadline, worker_argv=worker_argv)
        # The GpuProbe enforces the deadline itself (and kills the child);
        # the runner's deadline is only a backstop, past a fresh child's start.
        backstop = gcfg.deadline + GpuProbe.start_allowance_s + 2.0
        self._runners["gpu"] = ProbeRunner("gpu", gcfg.interval, backstop, probe=self._gpu.read)

    def _add_journal_probe(self, boot_id: str | None) -> None:
        probes = self.config.probes
        jcfg = probes.journal
        if boot_id is None:
            # The boot the journal calls "current" is the one this host
            # runs now; proc_root lets the lab give each node its own.
            try:
                boot_id = read_boot_id(probes.host.proc_root)
            except ProbeError as exc:
                log.warning("%s; no journal boot will count as current", exc)
        self._journal = JournalProbe(
            jcfg.directory,
            tail_entries=jcfg.tail_entries,
            evidence_per_kind=jcfg.evidence_per_kind,
            max_boots=jcfg.max_boots,
            current_boot_id=boot_id,
        )
        self._runners["journal"] = ProbeRunner(
            "journal", jcfg.interval, 60.0, blocking_probe=self._journal.read
        )

    @property
    def runners(self) -> dict[str, ProbeRunner]:
        """The probe runners by name (vllm, gpu, journal), for inspection."""
        return self._runners

    # -- probes -----------------------------------------------------------

    def _read_vllm(self) -> VllmStatus:
        assert self._tracker is not None
        vcfg = self.config.probes.vllm
        process_alive = rank_process_alive(vcfg.process_match) if vcfg.process_match else None
        sample = self._scraper.scrape() if self._scraper is not None else None
        return self._tracker.update(sample, time.monotonic(), process_alive=process_alive)

    def _on_report(self, name: str, observation: Observation) -> None:
        if name == "journal" and isinstance(observation.report, JournalReport):
            full = observation.report.to_json()
            with self._lock:
                self._boots_json = full
            if self.memory is not None:
                self.memory.note_journal(observation.report, time.monotonic())
        if name == "vllm":
            self._maybe_run_canary()
        if name == "gpu" and isinstance(observation.report, GpuReading):
            self._check_clock(observation.report)

    def _check_clock(self, reading: GpuReading) -> None:
        check = self.clock_check
        if check is None or check.state != "pending":
            return
        if check.observe(reading, time.monotonic()) == "latched":
            log.error(
                "GPU clock latched on this boot: %d busy readings, none at %d MHz "
                "(highest %s MHz); minutes without AC clear it",
                check.busy,
                check.policy.floor_mhz,
                check.max_busy_mhz,
            )

    def _maybe_run_canary(self) -> None:
        """Send a 1-token canary when a stall is suspected
        (docs/design.md, "Signals on the node"), or when the head has been quiet
        for ``canary.idle_after`` (an idle hang answers no new request, and
        nothing else would show it)."""
        if self._canary is None or self._tracker is None:
            return
        if self._canary_task is not None and not self._canary_task.done():
            return
        now = time.monotonic()
        ccfg = self.config.probes.vllm.canary
        if self._tracker.stall_suspected:
            if now - self._last_canary < ccfg.min_interval:
                return
        else:
            quiet = self._tracker.quiet_for(now)
            if (
                ccfg.idle_after <= 0
                or quiet is None
                or quiet < ccfg.idle_after
                # One timeout is confirmed by a second canary at once.
                or (
                    now - self._last_canary < ccfg.idle_after
                    and not self._tracker.canary_unconfirmed
                )
            ):
                return
        self._last_canary = now
        self._canary_task = asyncio.get_running_loop().create_task(self._run_canary())

    async def _run_canary(self) -> None:
        assert self._canary is not None and self._tracker is not None
        latest = self._runners["vllm"].latest
        models: tuple[str, ...] = ()
        if latest is not None and isinstance(latest.report, VllmStatus):
            models = latest.report.models  # saves a GET /v1/models
        result = await asyncio.to_thread(self._canary.run, models)
        self._tracker.note_canary(result, time.monotonic())
        log.info("canary: %s", result.outcome, extra={"probe": "vllm", "canary": result.outcome})

    def _tracker_stop_not_taken(self) -> None:
        """A stop that failed leaves the rank serving: a later refusal is a death."""
        if self._tracker is not None:
            self._tracker.note_planned_start()

    def _known_models(self) -> tuple[str, ...]:
        runner = self._runners.get("vllm")
        latest = None if runner is None else runner.latest
        if latest is not None and isinstance(latest.report, VllmStatus):
            return latest.report.models
        return ()

    # -- snapshot ---------------------------------------------------------

    def _probe_json(self, name: str) -> dict[str, Any]:
        runner = self._runners.get(name)
        if runner is None:
            return {"state": "disabled", "observed_at": None}
        latest = runner.latest
        if latest is None:
            return {"state": "pending", "observed_at": None}
        # A probe reports every few seconds, the snapshot is built every loop:
        # encode each report once (the journal's is the largest by far).
        cached = self._probe_bodies.get(name)
        if cached is not None and cached[0] is latest:
            body = cached[1]
        else:
            if name == "journal" and isinstance(latest.report, JournalReport):
                body = latest.report.summary_json()
                body.update(
                    observed_at=iso_time(latest.observed_at),
                    duration_s=round(latest.duration_s, 4),
                )
            else:
                body = latest.to_json()
            self._probe_bodies[name] = (latest, body)
        if name == "gpu" and isinstance(latest.report, GpuReading):
            body = {
                **body,
                "low_power_while_running": low_power_while_running(
                    latest.report,
                    self._requests_running(),
                    self.config.probes.gpu.low_power_watts,
                ),
            }
        return body

    def _requests_running(self) -> float | None:
        runner = self._runners.get("vllm")
        if runner is None or runner.latest is None:
            return None
        report = runner.latest.report
        return report.running if isinstance(report, VllmStatus) else None

    def build_snapshot(self) -> dict[str, Any]:
        host = self._host_reading
        host_json: dict[str, Any] = {"state": "pending", "observed_at": None}
        if host is not None:
            host_json = host.to_json()
            host_json["observed_at"] = iso_time(self._host_observed_at)
        boot_id = host_json.get("boot_id")
        return {
            "node": self.config.node,
            "boot_id": boot_id,
            "seq": self.seq,
            "started_at": iso_time(self.started_at),
            "observed_at": iso_time(time.time()),
            "version": __version__,
            "loop_lag_s": round(self.loop_lag_s, 4),
            "healthy": self.loop_healthy(),
            "probes": {
                "vllm": self._probe_json("vllm"),
                "gpu": self._probe_json("gpu"),
                "journal": self._probe_json("journal"),
                "host": host_json,
            },
            "serving": self.serving_status(),
            "memory_guard": disabled_json() if self.memory is None else self.memory.to_json(),
            "gpu_clock_check": (
                clock_disabled_json() if self.clock_check is None else self.clock_check.to_json()
            ),
            "stopping": None if self._stopping is None else dict(self._stopping),
        }

    def serving_status(self) -> dict[str, Any]:
        return self.serving.status() if self.serving is not None else disabled_status()

    def loop_healthy(self) -> bool:
        """Every probe task alive and none stuck: the condition for WATCHDOG=1."""
        now = time.time()
        for task in self._tasks:
            if task.done():
                return False
        for runner in self._runners.values():
            if runner.latest is None:
                continue
            limit = _STALE_FACTOR * (runner.interval + runner.deadline)
            if now - runner.latest.observed_at > limit:
                return False
        return True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self._snapshot

    def _publish(self) -> None:
        snap = self.build_snapshot()
        encoded = json.dumps(snap, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            self._snapshot = snap
            self._state_json = encoded

    # -- HTTP -------------------------------------------------------------

    def routes(self) -> dict[str, Route]:
        def state() -> Response:
            with self._lock:
                return 200, JSON, self._state_json

        def boots() -> Response:
            with self._lock:
                return json_response(self._boots_json)

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
        }

    def post_routes(self) -> dict[str, PostRoute]:
        """``POST /v1/serving/{start,stop,canary}``; the bearer token is checked
        by the HTTP layer before any of these runs."""
        if self.serving is None:
            return dict.fromkeys(_SERVING_POSTS, _serving_disabled)
        return {
            "/v1/serving/start": self._post_start,
            "/v1/serving/stop": self._post_stop,
            "/v1/serving/canary": self._post_canary,
        }

    def _post_start(self, body: dict[str, Any]) -> Response:
        launcher = self.serving
        assert launcher is not None  # routed only when serving is enabled
        problem = _unexpected_keys(body, ("profile",))
        profile = body.get("profile")
        if (
            problem is None
            and profile is not None
            and (not isinstance(profile, str) or not profile)
        ):
            problem = f"profile: expected a profile name (a string), got {profile!r}"
        if problem is not None:
            return json_response({"error": problem}, 400)
        log.info("serving: start requested (profile %s)", profile or "default")
        if self._tracker is not None:
            self._tracker.note_planned_start()
        try:
            return json_response(launcher.start(profile))
        except UnknownProfile as exc:
            return json_response({"error": str(exc), "known_profiles": exc.known}, 400)
        except ServingConflict as exc:
            return json_response({"error": str(exc), "serving": launcher.status()}, 409)
        except LaunchFailed as exc:
            log.error("serving: %s", exc)
            return json_response({"error": str(exc), "serving": launcher.status()}, 500)

    def _post_stop(self, body: dict[str, Any]) -> Response:
        launcher = self.serving
        assert launcher is not None  # routed only when serving is enabled
        problem = _unexpected_keys(body, ())
        if problem is not None:
            return json_response({"error": problem}, 400)
        log.info("serving: stop requested")
        if self._tracker is not None:
            # The port refusing from now on is our doing, not a death.
            self._tracker.note_planned_stop()
        try:
            return json_response(launcher.stop())
        except ServingConflict as exc:
            self._tracker_stop_not_taken()
            return json_response({"error": str(exc), "serving": launcher.status()}, 409)
        except StopFailed as exc:
            self._tracker_stop_not_taken()
            log.error("serving: %s", exc)
            return json_response({"error": str(exc), "serving": launcher.status()}, 500)

    def _post_canary(self, body: dict[str, Any]) -> Response:
        problem = _unexpected_keys(body, ())
        if problem is not None:
            return json_response({"error": problem}, 400)
        if self._asked_canary is None:
            return json_response(
                {
                    "error": "no vLLM API on this node (probes.vllm.url is null or the "
                    "vllm probe is off): canaries go to the head"
                },
                409,
            )
        result = self._asked_canary.run(self._known_models())
        loop, tracker = self._loop, self._tracker
        if loop is not None and tracker is not None:
            # An answered canary is proof of life for the stall clock too.
            loop.call_soon_threadsafe(tracker.note_canary, result, time.monotonic())
        log.info("serving: canary asked: %s", result.describe())
        return json_response(result.to_json())

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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), interval)

    def _talk_to_systemd(self) -> None:
        if not self.ready.is_set():
            return
        status = self.status_line()
        # Once stopping, STATUS stays "stopping" (sent with STOPPING=1).
        if self._stopping is None and status != self._last_status:
            self.notifier.status(status)
            self._last_status = status
        pet_every = self.notifier.watchdog_interval
        if pet_every is None:
            return
        now = time.monotonic()
        if now - self._last_pet >= pet_every and self.loop_healthy():
            self.notifier.watchdog()
            self._last_pet = now

    async def _first_round(self) -> None:
        await asyncio.gather(*(r.run_once() for r in self._runners.values()))

    async def _run_probe(self, runner: ProbeRunner) -> None:
        await asyncio.sleep(runner.interval)
        await runner.run_forever()

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set. Raises WatchdogError if it cannot listen."""
        listen = self.config.listen
        self._loop = asyncio.get_running_loop()
        self.http = HttpEndpoint(
            listen.address,
            listen.port,
            self.routes(),
            self.post_routes(),
            None if self._auth is None else self._auth.check,
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
        heartbeat_done = asyncio.Event()
        heartbeat = asyncio.create_task(self._heartbeat(heartbeat_done))
        told_systemd = False
        try:
            # READY=1 only after the first probe round: a unit that is
            # "active" then has a meaningful snapshot behind /v1/state.
            await self._first_round()
            self._publish()
            self.ready.set()
            self.notifier.ready(self.status_line())
            self._tasks = [
                asyncio.create_task(self._run_probe(r), name=f"probe-{r.name}")
                for r in self._runners.values()
            ]
            await stop.wait()
            self.notifier.stopping()
            told_systemd = True
            await self._wind_down()
        finally:
            if not told_systemd:
                self.notifier.stopping()
            heartbeat_done.set()
            for task in [*self._tasks, heartbeat]:
                task.cancel()
            await asyncio.gather(*self._tasks, heartbeat, return_exceptions=True)
            if self._canary_task is not None:
                self._canary_task.cancel()
            if self._gpu is not None:
                await self._gpu.close()
            if self.serving is not None:
                self.serving.close()  # the rank runs on: only its watchers stop
            self.http.stop()
            log.info("agent %s stopped", self.config.node)

    async def _wind_down(self) -> None:
        """Asked to stop: say why in /v1/state, and linger while the system goes down.

        The heartbeat, the probes and the endpoint all keep running meanwhile,
        so ``seq`` keeps advancing: a stopping agent is not a frozen one.
        """
        since = time.time()
        system = await asyncio.to_thread(self._ask_system_stopping)
        self._stopping = {"since": round(since, 3), "system": system}
        self._publish()
        linger = self.config.shutdown_linger
        if not system or linger <= 0:
            log.info("agent %s stopping", self.config.node)
            return
        log.info(
            "agent %s stopping: the system is going down; /v1/state says so for %.1f s",
            self.config.node,
            linger,
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._linger_cut.wait(), linger)

    def _ask_system_stopping(self) -> bool:
        try:
            return bool(self._system_stopping())
        except Exception:
            # Not knowing is "no": exit promptly, as before this existed.
            log.exception("cannot tell whether the system is shutting down")
            return False

    def cut_linger(self) -> None:
        """End the shutdown linger now (a second SIGTERM or SIGINT)."""
        self._linger_cut.set()


_SERVING_POSTS = ("/v1/serving/start", "/v1/serving/stop", "/v1/serving/canary")


def canary_api_key(config: CanaryConfig) -> str | None:
    """The vLLM server's API key for the canary, read from its file now.

    :raises ConfigError: the file is missing, unreadable, open to others or blank.
    """
    if config.api_key_file is None:
        return None
    return read_secret("probes.vllm.canary.api_key_file", config.api_key_file).reveal()


def _unexpected_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> str | None:
    extra = sorted(set(body) - set(allowed))
    if not extra:
        return None
    wanted = ", ".join(allowed) if allowed else "none (send {} or no body)"
    return f"unknown key(s) in body: {', '.join(extra)}; expected: {wanted}"


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
