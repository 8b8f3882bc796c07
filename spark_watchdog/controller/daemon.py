"""The controller's main loop: pull, check, decide, act, record.

Every ``poll_interval``: pull each agent's ``/v1/state`` (short timeout),
check SSH banners where an agent is late (and now and then otherwise),
check the witness, classify each node (pure), decide (pure), and start what
the decision says: a recovery ladder, a serving restart, an agent restart,
or a hold. Long actions run as their own tasks, so detection never waits on
them. On start, unfinished incidents in the history are resumed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Any

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.controller.detector import HOST_TROUBLE, DetectionPolicy, Verdict, classify
from spark_watchdog.controller.http_client import HttpError, request
from spark_watchdog.controller.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.node_states import NodeEvent, NodeState
from spark_watchdog.controller.node_watch import NodeWatch
from spark_watchdog.controller.notify import Event, Notifier
from spark_watchdog.controller.planner import Guards, Step, breaker_trips, decide
from spark_watchdog.controller.recovery import (
    PowerFactory,
    RungPlan,
    await_new_boot,
    finish_recovery,
    recover_frozen_host,
    resume_plan,
    rungs_of,
)
from spark_watchdog.controller.serving_restart import ServingNode, ServingRestart
from spark_watchdog.controller.witness import check_witness
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import VerifiedPower
from spark_watchdog.power.paths import PowerPath, build_backend, read_device_secrets, timing_for
from spark_watchdog.power.ssh_banner import check_ssh_banner
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.controller")

AGENT_RESTART_COOLDOWN_S = 300.0
LATE_BANNER_INTERVAL_S = 2.0
BY = "controller"


def default_power_factory(config: ControllerConfig, dry_run: bool) -> PowerFactory:
    def make(path: PowerPath, on_step: Any) -> VerifiedPower:
        backend = build_backend(path, read_device_secrets(path))
        return VerifiedPower(backend, timing_for(config, path), dry_run=dry_run, on_step=on_step)

    return make


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: HistoryStore,
        *,
        notifier: Notifier | None = None,
        power_factory: PowerFactory | None = None,
    ) -> None:
        self.config = config
        self.notifier = notifier or Notifier(config.notify)
        self.ledger = Ledger(store, self.notifier)
        # What /metrics counts: incidents, actions, verdict changes (in memory).
        self.tallies = self.ledger.tallies
        self.tallies.seed_nodes(n.name for n in config.nodes)
        self._counted_verdicts: dict[str, str] = {}
        self.cluster_hold: str | None = None
        self.power_factory = power_factory or default_power_factory(config, config.guards.dry_run)
        now = time.monotonic()
        self.watches = {n.name: NodeWatch(n, now) for n in config.nodes}
        self.policy = DetectionPolicy(
            freeze_after=config.detection.freeze_after,
            banner_misses=config.detection.banner_misses,
        )
        self._slot = asyncio.Semaphore(config.guards.max_concurrent_power_actions)
        self._fencing: dict[str, asyncio.Task[str]] = {}
        self._serving_task: asyncio.Task[bool] | None = None
        self._last_serving_restart = float("-inf")
        self._banner_checks: dict[str, asyncio.Task[None]] = {}
        self.witness_ok = True
        self.witness_detail = "not checked yet"
        self.ticks = 0
        self._tick_started = 0.0
        self.last_sweep_s = 0.0
        self.started_at = time.time()
        self.profile: str | None = None
        # What the HTTP threads read: rebuilt after every tick, never mutated.
        self.published: dict[str, Any] = {}
        # READY/WATCHDOG/STATUS to systemd (Type=notify); None: from the environment.
        self.systemd: SystemdNotifier | None = None

    # -- RecoveryHost -------------------------------------------------------

    def power_slot(self) -> asyncio.Semaphore:
        return self._slot

    async def still_frozen(self, watch: NodeWatch) -> tuple[bool, str]:
        """Right before cutting power: ask the host once more, both ways at once
        (either answer means alive; asked one after the other, a frozen host
        would cost agent_timeout + banner_timeout instead of the longer one)."""
        node = watch.config

        async def agent_progressed() -> bool:
            try:
                answer = await request(
                    f"{node.agent.rstrip('/')}/v1/state",
                    timeout=self.config.detection.agent_timeout,
                )
                snapshot = answer.json()
            except HttpError:
                return False
            return (
                answer.status == 200
                and isinstance(snapshot, dict)
                and watch.note_answer(snapshot, time.monotonic())
            )

        progressed, banner = await asyncio.gather(
            agent_progressed(),
            check_ssh_banner(
                node.banner_host, node.ssh_port, timeout=self.config.detection.banner_timeout
            ),
        )
        if progressed:
            return False, "the agent answered with progress"
        if banner.ok:
            return False, f"the SSH banner answered ({banner.banner})"
        return True, f"agent silent, ssh {banner.outcome}"

    async def record_boots(self, watch: NodeWatch, incident_id: int) -> None:
        """Store the agent's journal analysis: how did the previous boot end?"""
        try:
            answer = await request(f"{watch.config.agent.rstrip('/')}/v1/boots", timeout=5.0)
            boots = answer.json().get("boots", [])
        except (HttpError, AttributeError) as exc:
            log.warning("%s: could not read /v1/boots: %s", watch.name, exc)
            return
        for boot in boots if isinstance(boots, list) else []:
            if not isinstance(boot, dict):
                continue
            try:
                await self.ledger.write(
                    self.ledger.store.record_agent_boot,
                    watch.name,
                    boot,
                    incident_id=incident_id if boot.get("current") is False else None,
                )
            except (HistoryUnwritable, WatchdogError) as exc:
                log.warning("%s: boot record skipped: %s", watch.name, exc)

    async def hold_node(self, watch: NodeWatch, reason: str, event: NodeEvent) -> None:
        watch.held_reason = reason
        try:
            watch.apply(event)
        except Exception:
            watch.state = NodeState.HELD
        with contextlib.suppress(HistoryUnwritable):  # held in memory all the same
            await self.ledger.write(self.ledger.store.hold, watch.name, reason, by=BY)
        self.notifier.send(Event("held", f"{watch.name} held: {reason}", watch.name))

    async def restart_serving_after(self, incident_id: int | None, reason: str) -> bool:
        """Switch to the safe profile and restart serving everywhere.

        Every rank restarts together, so while another node is still being
        recovered the restart waits for that recovery, which ends with one.
        """
        profile = self.config.serving.safe_profile
        busy = [
            w.name
            for w in self.watches.values()
            if w.incident_id != incident_id
            and (
                w.state in (NodeState.FENCING, NodeState.BOOTING)
                or w.finding.verdict is Verdict.HOST_FROZEN
            )
        ]
        if busy and incident_id is not None:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                "serving_restart_deferred",
                detail={"waiting_for": busy},
            )
            self.profile = profile
            with contextlib.suppress(HistoryUnwritable):
                await self.ledger.write(
                    self.ledger.store.set_setting, "serving_profile", profile, by=BY
                )
            return True
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(
                self.ledger.store.set_setting, "serving_profile", profile, by=BY
            )
        self.profile = profile
        return await self._restart_serving(profile, incident_id, reason)

    # -- serving ----------------------------------------------------------

    def _serving_nodes(self) -> tuple[ServingNode, list[ServingNode]] | None:
        head = self.config.serving.head
        if head is None or self.config.serving.token_file is None:
            return None
        nodes = [ServingNode(n.name, n.agent) for n in self.config.nodes]
        head_node = next(n for n in nodes if n.name == head)
        return head_node, [n for n in nodes if n.name != head]

    async def _restart_serving(self, profile: str, incident_id: int | None, reason: str) -> bool:
        layout = self._serving_nodes()
        if layout is None:
            log.info("serving restart skipped: serving.head and serving.token_file not set")
            return False
        token_file = self.config.serving.token_file
        assert token_file is not None
        try:
            token = read_secret("serving.token_file", token_file).reveal()
        except ConfigError as exc:
            self.notifier.send(Event("serving_restart_failed", str(exc)))
            return False
        head, workers = layout
        record = await self.ledger.write(
            self.ledger.store.start_serving_restart, profile, incident_id=incident_id
        )
        if incident_id is not None:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                "serving_restart_started",
                detail={"profile": profile, "reason": reason},
            )
        restart = ServingRestart(head, workers, token, timeout=self.config.serving.start_timeout)
        report = await restart.run(profile)
        self._last_serving_restart = time.monotonic()
        await self.ledger.write(
            self.ledger.store.finish_serving_restart,
            record.id,
            report.result,
            step_durations=report.step_durations,
            error=report.error,
        )
        if incident_id is not None:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                "serving_restart_done",
                detail={"result": report.result, "error": report.error},
            )
        total = sum(report.step_durations.values())
        if report.result == "succeeded":
            self.notifier.send(
                Event(
                    "serving_restarted", f"serving restarted with profile {profile} in {total:.1f}s"
                )
            )
            return True
        self.notifier.send(
            Event("serving_restart_failed", f"serving restart ({profile}): {report.error}")
        )
        return False

    async def _serving_incident(self, watch: NodeWatch) -> bool:
        finding = watch.finding
        # The fault began when vLLM last progressed, not when the agent last answered.
        onset = watch.agent_progress_wall
        vllm = ((watch.snapshot or {}).get("probes") or {}).get("vllm") or {}
        quiet = vllm.get("seconds_without_progress")
        if isinstance(quiet, (int, float)) and not isinstance(quiet, bool):
            onset = time.time() - float(quiet)
        kind = finding.verdict.value
        incident = await self.ledger.write(
            self.ledger.store.open_incident,
            kind,
            [watch.name],
            detected_at=time.time(),
            evidence={"reasons": list(finding.reasons), "agent_state": watch.snapshot},
            fault_onset=onset,
            dry_run=self.config.guards.dry_run,
        )
        self.notifier.send(
            Event("incident_opened", f"{watch.name} {finding.summary}", watch.name, incident.id)
        )
        if self.config.guards.dry_run:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident.id,
                "dry_run",
                detail={"would": "restart serving"},
            )
            await self.ledger.write(
                self.ledger.store.resolve_incident,
                incident.id,
                "false_alarm",
                detail={"dry_run": True},
            )
            return False
        ok = await self.restart_serving_after(incident.id, finding.summary)
        await self.ledger.write(
            self.ledger.store.resolve_incident,
            incident.id,
            "recovered" if ok else "gave_up",
            detail={"profile": self.profile},
        )
        return ok

    # -- the loop ---------------------------------------------------------

    async def _poll_agent(self, watch: NodeWatch, now: float) -> None:
        try:
            answer = await request(
                f"{watch.config.agent.rstrip('/')}/v1/state",
                timeout=self.config.detection.agent_timeout,
            )
            snapshot = answer.json()
            if answer.status != 200 or not isinstance(snapshot, dict):
                raise HttpError(f"/v1/state answered {answer.status}")
            watch.note_answer(snapshot, now)
        except HttpError as exc:
            watch.agent_error = str(exc)

    async def _check_banner(self, watch: NodeWatch, now: float) -> None:
        node = watch.config
        late = watch.agent_silent_s(now) >= min(2.0, self.config.detection.freeze_after / 4)
        since = None if watch.banner_checked_at is None else now - watch.banner_checked_at
        # A late agent gets a banner check every LATE_BANNER_INTERVAL_S, not
        # every poll: OpenSSH >= 9.8 penalises clients that connect without
        # authenticating (PerSourcePenalties), which a 1 s poller would become.
        due = since is None or since >= (
            LATE_BANNER_INTERVAL_S if late else self.config.detection.banner_interval
        )
        if not due or watch.name in self._banner_checks:
            return
        # In the background: a silent host holds a check for banner_timeout,
        # which must not stretch the poll of every other node.
        watch.banner_checked_at = now

        async def check() -> None:
            try:
                result = await check_ssh_banner(
                    node.banner_host, node.ssh_port, timeout=self.config.detection.banner_timeout
                )
                watch.note_banner(result.outcome, result.banner or result.outcome, time.monotonic())
            finally:
                self._banner_checks.pop(watch.name, None)

        self._banner_checks[watch.name] = asyncio.get_running_loop().create_task(check())

    async def tick(self) -> None:
        now = time.monotonic()
        self._tick_started = now
        witness, _ = await asyncio.gather(
            check_witness(self.config.witness, timeout=1.0),
            asyncio.gather(*(self._poll_agent(w, now) for w in self.watches.values())),
        )
        self.witness_ok = witness.ok
        self.witness_detail = "ok" if witness.ok else f"unreachable: {', '.join(witness.missed)}"
        await asyncio.gather(*(self._check_banner(w, now) for w in self.watches.values()))
        now = time.monotonic()
        head = self.config.serving.head
        for watch in self.watches.values():
            judges = head is None or watch.name == head
            before = watch.finding.verdict
            watch.finding = classify(watch.observation(now, witness.ok, judges), self.policy)
            if watch.finding.verdict is not before:
                log.info(
                    "%s: %s",
                    watch.name,
                    watch.finding.summary,
                    extra={"node": watch.name, "verdict": watch.finding.verdict.value},
                )
        await self._sync_holds()
        await self._check_breaker()
        for watch in self.watches.values():
            await self._act(watch)
        for watch in self.watches.values():
            if self._counted_verdicts.get(watch.name) != watch.verdict:
                self._counted_verdicts[watch.name] = watch.verdict
                self.tallies.note_verdict(watch.name, watch.verdict)
        self.ticks += 1
        self.last_sweep_s = time.monotonic() - self._tick_started
        self.published = self.status_json()

    async def _sync_holds(self) -> None:
        """Holds live in the history, so the CLI works with or without us running."""
        try:
            holds = await self.ledger.read(self.ledger.store.active_holds)
        except HistoryUnwritable:
            return
        held = {h.node: h.reason for h in holds}
        self.cluster_hold = held.get(CLUSTER)
        for watch in self.watches.values():
            reason = held.get(watch.name) or held.get(CLUSTER)
            if reason and watch.state is NodeState.WATCHING:
                watch.held_reason = reason
                watch.apply(NodeEvent.HOLD)
            elif not reason and watch.state is NodeState.HELD:
                watch.held_reason = None
                watch.apply(NodeEvent.RELEASE)

    async def _check_breaker(self) -> None:
        # Silence counts as soon as it passes freeze_after, before the banner
        # checks confirm anything: nodes that go quiet together trip the
        # breaker before the first of them can be fenced.
        now = time.monotonic()
        freeze_after = self.config.detection.freeze_after
        trouble = [
            w.name
            for w in self.watches.values()
            if w.finding.verdict in HOST_TROUBLE or w.agent_silent_s(now) >= freeze_after
        ]
        nodes = len(self.watches)
        if not breaker_trips(len(trouble), nodes, self.config.guards.max_unhealthy_fraction):
            return
        if any(h.node == CLUSTER for h in await self._holds()):
            return
        reason = (
            f"circuit breaker: {len(trouble)}/{nodes} nodes in host-level trouble "
            f"({', '.join(trouble)}); an operator must release"
        )
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(self.ledger.store.hold, CLUSTER, reason, by=BY)
        self.notifier.send(Event("circuit_breaker", reason))
        for watch in self.watches.values():
            if watch.state is NodeState.WATCHING:
                watch.held_reason = reason
                watch.apply(NodeEvent.HOLD)

    async def _holds(self) -> list[Any]:
        try:
            return list(await self.ledger.read(self.ledger.store.active_holds))
        except HistoryUnwritable:
            return []

    async def _guards(self, watch: NodeWatch) -> Guards:
        g = self.config.guards
        since = time.time() - g.budget_window
        node_cycles = await self.ledger.read(
            self.ledger.store.power_cycles_since, watch.name, since
        )
        cluster_cycles = await self.ledger.read(self.ledger.store.cluster_power_cycles_since, since)
        # Nodes in the power phase of a rung; the power slot serialises the
        # commands themselves, this keeps new incidents from queueing blind.
        in_flight = sum(1 for w in self.watches.values() if w.state is NodeState.FENCING)
        return Guards(
            node_held=watch.state is NodeState.HELD,
            dry_run=g.dry_run,
            node_cycles_in_window=node_cycles,
            node_budget=g.node_budget,
            cluster_cycles_in_window=cluster_cycles,
            cluster_budget=g.cluster_budget,
            power_actions_in_flight=in_flight,
            max_concurrent_power_actions=g.max_concurrent_power_actions,
            rungs=len(rungs_of(self.config, watch)),
            # Rungs tried for the node's open incident; none outside one.
            rungs_done=frozenset(watch.rungs_done if watch.incident_id is not None else ()),
        )

    async def _act(self, watch: NodeWatch) -> None:
        if watch.name in self._fencing and not self._fencing[watch.name].done():
            return
        if watch.state is not NodeState.WATCHING:
            return
        if watch.finding.verdict is Verdict.HOST_FROZEN and self.ledger.problem:
            # Holds rather than acts blind: nothing unrecorded touches power.
            await self.hold_node(
                watch, f"history unwritable: {self.ledger.problem}", NodeEvent.HOLD
            )
            return
        if watch.finding.verdict in (Verdict.HEALTHY, Verdict.PENDING, Verdict.ISOLATED):
            watch.dry_run_incident = None  # the next freeze is a new dry-run incident
            return  # nothing to decide: skip the history reads
        try:
            guards = await self._guards(watch)
        except HistoryUnwritable:
            return
        decision = decide(watch.state, watch.finding, guards)
        if decision.step is Step.FENCE:
            await self._start_fencing(watch, decision.reason)
        elif decision.step is Step.RECORD_DRY_RUN:
            await self._record_dry_run(watch, decision.reason)
        elif decision.step is Step.HOLD:
            assert decision.event is not None
            await self.hold_node(watch, decision.reason, decision.event)
        elif decision.step is Step.RESTART_AGENT:
            await self._restart_agent(watch)
        elif decision.step is Step.RESTART_SERVING:
            self._maybe_restart_serving(watch)
        else:
            if watch.finding.verdict is not Verdict.HOST_FROZEN:
                watch.dry_run_incident = None

    async def _start_fencing(self, watch: NodeWatch, reason: str) -> None:
        try:
            incident = await self.ledger.write(
                self.ledger.store.open_incident,
                "host_frozen",
                [watch.name],
                detected_at=time.time(),
                evidence={
                    "reasons": list(watch.finding.reasons),
                    "last_agent_state": watch.snapshot,
                    "boot_id": watch.boot_id,
                    "banner": watch.banner_detail,
                },
                fault_onset=watch.agent_progress_wall,
            )
        except HistoryUnwritable as exc:
            await self.hold_node(watch, f"history unwritable: {exc}", NodeEvent.HOLD)
            return
        watch.incident_id = incident.id
        watch.rungs_done.clear()
        watch.apply(NodeEvent.FROZEN_CONFIRMED)
        self.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        self._spawn_recovery(watch, incident.id, None)

    def _spawn_recovery(self, watch: NodeWatch, incident_id: int, plan: RungPlan | None) -> None:
        task = asyncio.get_running_loop().create_task(
            recover_frozen_host(self, watch, incident_id, plan), name=f"recover-{watch.name}"
        )
        self._fencing[watch.name] = task
        task.add_done_callback(lambda t: self._recovery_done(watch, t))

    def _recovery_done(self, watch: NodeWatch, task: asyncio.Task[str]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("%s: recovery failed: %r", watch.name, error, exc_info=error)
            watch.state = NodeState.HELD
            watch.held_reason = f"recovery failed: {error}"
            self.notifier.send(Event("held", f"{watch.name}: recovery failed: {error}", watch.name))

    async def _record_dry_run(self, watch: NodeWatch, reason: str) -> None:
        if watch.dry_run_incident is not None:
            return
        rungs = rungs_of(self.config, watch)
        incident = await self.ledger.write(
            self.ledger.store.open_incident,
            "host_frozen",
            [watch.name],
            detected_at=time.time(),
            evidence={"reasons": list(watch.finding.reasons), "last_agent_state": watch.snapshot},
            fault_onset=watch.agent_progress_wall,
            dry_run=True,
        )
        watch.dry_run_incident = incident.id
        await self.ledger.write(
            self.ledger.store.record_action,
            watch.name,
            "cycle",
            device=f"power path {rungs[0].key_path}" if rungs else "none",
            incident_id=incident.id,
            rung=0,
            dry_run=True,
            step="dry_run",
            step_detail={"decision": reason},
        )
        self.notifier.send(
            Event(
                "incident_opened",
                f"{watch.name} {watch.finding.summary} (dry run: {reason})",
                watch.name,
                incident.id,
            )
        )
        await self.ledger.write(
            self.ledger.store.resolve_incident, incident.id, "false_alarm", detail={"dry_run": True}
        )

    async def _restart_agent(self, watch: NodeWatch) -> None:
        now = time.monotonic()
        if now - watch.last_agent_restart < AGENT_RESTART_COOLDOWN_S:
            return
        watch.last_agent_restart = now
        ssh = next((d for d in watch.config.power if isinstance(d, SshDevice)), None)
        self.notifier.send(
            Event("agent_down", f"{watch.name}: {watch.finding.summary}", watch.name)
        )
        if ssh is None or self.config.guards.dry_run:
            return
        from spark_watchdog.power.ssh_reboot import ssh_command_for

        command = ssh_command_for(ssh)
        result = await command.run("sudo systemctl restart spark-watchdog-agent", timeout=30.0)
        await self.ledger.write(
            self.ledger.store.record_action, watch.name, "agent_restart", device=command.target
        )
        log.info("%s: agent restart over ssh: %s", watch.name, result.outcome)

    def _maybe_restart_serving(self, watch: NodeWatch) -> None:
        if not self.config.serving.auto_restart:
            return
        if self._serving_task is not None and not self._serving_task.done():
            return
        if any(not t.done() for t in self._fencing.values()):
            return  # a host recovery ends with a serving restart anyway
        if time.monotonic() - self._last_serving_restart < self.config.serving.restart_cooldown:
            return
        self._serving_task = asyncio.get_running_loop().create_task(self._serving_incident(watch))

    # -- start, resume, run -----------------------------------------------

    async def resume(self) -> None:
        """Continue incidents a previous controller left open (write-ahead log)."""
        incidents = await self.ledger.read(self.ledger.store.open_incidents)
        self.tallies.seed_open(incidents)
        for incident in incidents:
            steps = await self.ledger.read(self.ledger.store.steps, incident.id)
            for name in incident.nodes:
                watch = self.watches.get(name)
                if watch is None:
                    continue
                if incident.kind != "host_frozen" or incident.dry_run:
                    await self.ledger.write(
                        self.ledger.store.resolve_incident,
                        incident.id,
                        "false_alarm" if incident.dry_run else "gave_up",
                        detail={"why": "controller restarted mid-incident"},
                    )
                    break
                info = resume_plan(steps, name)
                watch.incident_id = incident.id
                watch.rungs_done = set(info.rungs_done)
                log.info("%s: resuming incident #%d (%s)", name, incident.id, info.phase)
                if info.phase == "ladder":
                    watch.state = NodeState.FENCING
                    self._spawn_recovery(watch, incident.id, info.plan)
                elif info.phase == "boot_wait":
                    watch.state = NodeState.BOOTING
                    restored = info.restored_at or time.time()
                    task = asyncio.get_running_loop().create_task(
                        await_new_boot(self, watch, incident.id, restored, info.boot_before)
                    )
                    self._fencing[name] = task
                else:
                    task = asyncio.get_running_loop().create_task(
                        finish_recovery(self, watch, incident.id)
                    )
                    self._fencing[name] = task

    async def run(self, stop: asyncio.Event) -> None:
        setting = await self.ledger.read(self.ledger.store.setting, "serving_profile")
        self.profile = None if setting is None else setting.value
        await self.resume()
        interval = self.config.detection.poll_interval
        systemd = self.systemd or SystemdNotifier()
        status = self.status_line()
        systemd.ready(status)
        last_pet = float("-inf")
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:
                log.exception("controller tick failed")
            else:
                # Petted only after a tick that completed: a loop that is stuck
                # or fails every sweep stops petting, and systemd restarts the
                # controller, which resumes any recovery from the history.
                pet_every = systemd.watchdog_interval
                if pet_every is not None and started - last_pet >= pet_every:
                    systemd.watchdog()
                    last_pet = started
                if (line := self.status_line()) != status:
                    status = line
                    systemd.status(status)
            elapsed = time.monotonic() - started
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - elapsed))
        pending = [
            t
            for t in [*self._fencing.values(), *self._banner_checks.values(), self._serving_task]
            if t is not None and not t.done()
        ]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.notifier.drain()
        systemd.stopping()

    def status_line(self) -> str:
        """One line for ``systemctl status``: the verdict counts and the history."""
        counts: dict[str, int] = {}
        for watch in self.watches.values():
            counts[watch.verdict] = counts.get(watch.verdict, 0) + 1
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        line = f"{len(self.watches)} nodes: {verdicts}"
        if self.ledger.problem:
            line += "; history unwritable"
        if self.cluster_hold:
            line += "; cluster held"
        return line

    def status_json(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "started_at": self.started_at,
            "ticks": self.ticks,
            "last_sweep_s": round(self.last_sweep_s, 4),
            "poll_interval_s": self.config.detection.poll_interval,
            "freeze_after_s": self.config.detection.freeze_after,
            "witness": self.witness_detail,
            "cluster_hold": self.cluster_hold,
            "notifications": {
                "delivered": self.notifier.delivered,
                "dropped": self.notifier.failed,
            },
            "dry_run": self.config.guards.dry_run,
            "serving_profile": self.profile,
            "history": self.ledger.problem or "ok",
            "nodes": [w.to_json(now) for w in self.watches.values()],
        }


async def serve(config: ControllerConfig) -> None:
    """Run until SIGTERM or SIGINT."""
    store = HistoryStore(config.history)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    controller = Controller(config, store)
    from spark_watchdog.controller.status_api import StatusEndpoint

    endpoint = StatusEndpoint(config.listen.address, config.listen.port, controller)
    endpoint.start()
    try:
        await controller.run(stop)
    finally:
        endpoint.stop()
        store.close()
