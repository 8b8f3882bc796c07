"""The controller's main loop: pull, check, decide, act, record.

Every ``poll_interval``: pull each agent's ``/v1/state`` (short timeout),
check SSH banners where an agent is late (and now and then otherwise),
check the witness, classify each node (pure), decide (pure), and start what
the decision says: a recovery ladder, a serving restart, an agent restart,
or a hold. Long actions run as their own tasks, so detection never waits on
them. On start, the newest unfinished incident of each node is resumed.

All I/O goes through the ``ControllerIO`` it is given, and all time through
its clock (docs/design.md, "Proof"), so the simulation runs this very code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.controller import unlatch, wedged
from spark_watchdog.controller.detector import DetectionPolicy, Verdict, classify
from spark_watchdog.controller.flight_recorder import FlightRecorder
from spark_watchdog.controller.http_client import ANSWERED, HttpError
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.node_states import InvalidTransition, NodeEvent, NodeState
from spark_watchdog.controller.node_watch import (
    BLIND_BANNER_OUTCOMES,
    GUARD_KILL_FRESH_S,
    LIVE_BANNER_OUTCOMES,
    NodeWatch,
)
from spark_watchdog.controller.notify import Event, Notifier
from spark_watchdog.controller.planner import Decision, Guards, Step, breaker_trips, decide
from spark_watchdog.controller.recovery import (
    Phase,
    ResumeInfo,
    RungOutcome,
    recover_frozen_host,
    resume_plan,
    rungs_of,
)
from spark_watchdog.controller.serving_restart import ServingNode
from spark_watchdog.errors import ConfigError, IncidentAlreadyOpen, WatchdogError
from spark_watchdog.history.instance_lock import InstanceLock
from spark_watchdog.history.records import CLUSTER, Incident
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState, PowerStep, VerifiedPower
from spark_watchdog.power.paths import PowerPath
from spark_watchdog.sdnotify import SystemdNotifier
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.controller")

AGENT_RESTART_COOLDOWN_S = 300.0
LATE_BANNER_INTERVAL_S = 2.0
# Budgets count cycles by the wall clock (they are recorded); the window is
# widened by this much so a clock stepped forward cannot forget a cycle.
CLOCK_STEP_MARGIN_S = 900.0
# How often the repeat-offender counts are read again from the history (seconds).
OFFENDERS_REFRESH_S = 300.0
# Incident kinds whose serving restart counts against serving.restart_budget.
SERVING_FAULT_KINDS = (
    Verdict.SERVING_STALLED.value,
    Verdict.SERVING_DEAD.value,
    Verdict.MEMORY_EXHAUSTED.value,
    Verdict.GPU_WEDGED.value,
)
BY = "controller"
# The only steps whose failed record must stop what follows: they precede a cut.
_BEFORE_A_CUT = frozenset(
    {StepName.TIMED_ON_UNAVAILABLE, StepName.OFF_SPACING, StepName.OFF_REQUESTED}
)


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: HistoryStore,
        *,
        io: ControllerIO | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.io = io or ControllerIO.production(config)
        self.clock = self.io.clock
        self.notifier = notifier or Notifier(config.notify)
        self.ledger = Ledger(store, self.notifier, self.io.blocking)
        # What /metrics counts: incidents, actions, verdict changes (in memory).
        self.tallies = self.ledger.tallies
        self.tallies.seed_nodes(n.name for n in config.nodes)
        self._counted_verdicts: dict[str, str] = {}
        self.cluster_hold: str | None = None
        now = self.clock.monotonic()
        # A late agent: banner checks every LATE_BANNER_INTERVAL_S, and an SSH
        # refusal from then on means the host is going down.
        late_after = min(2.0, config.detection.freeze_after / 4)
        self.watches = {n.name: NodeWatch(n, now, late_after=late_after) for n in config.nodes}
        self.policy = DetectionPolicy(
            freeze_after=config.detection.freeze_after,
            banner_misses=config.detection.banner_misses,
            boot_timeout=config.guards.boot_timeout,
            gpu_wedged_after=config.detection.gpu_wedged_after,
        )
        self._slot = asyncio.Semaphore(config.guards.max_concurrent_power_actions)
        # Held from a rung's guard check to its record (see recovery._preflight).
        self._budget_lock = asyncio.Lock()
        # Rungs this process recorded, by monotonic time: the budgets count them
        # exactly whatever the wall clock does; the history counts the earlier ones.
        self._cycles: list[tuple[str, float, int]] = []
        self._fencing: dict[str, asyncio.Task[RungOutcome]] = {}
        self._serving_task: asyncio.Task[bool] | None = None
        self.recorder = FlightRecorder(config.detection.flight_recorder_seconds)
        # When the repeat-offender counts were last read from the history (monotonic).
        self._offenders_read_at = float("-inf")
        # The wedged-but-alive ladder per node, and its incident.
        self._wedged: dict[str, tuple[asyncio.Task[str], int]] = {}
        self._unlatching: dict[str, asyncio.Task[str]] = {}
        self._agent_restarts: dict[str, asyncio.Task[None]] = {}
        self._last_serving_restart = float("-inf")
        # After a serving restart refused by the budget: no new try (nor alert) before this.
        self._serving_blocked_until = float("-inf")
        # (monotonic time, record id) of the serving restarts this process made
        # for a serving fault: the restart budget counts them exactly.
        self.serving_fault_restarts: list[tuple[float, int]] = []
        self._banner_checks: dict[str, asyncio.Task[None]] = {}
        self.witness_ok = True
        self.witness_detail = "not checked yet"
        # Since when more nodes than the breaker allows look frozen (monotonic).
        self._breaker_since: float | None = None
        self.ticks = 0
        self._tick_started = 0.0
        self.last_sweep_s = 0.0
        self.started_at = self.clock.time()
        self.profile: str | None = None
        # What the HTTP threads read: rebuilt after every tick, never mutated.
        self.published: dict[str, Any] = {}
        # READY/WATCHDOG/STATUS to systemd (Type=notify); None: from the environment.
        self.systemd: SystemdNotifier | None = None

    # -- RecoveryHost -------------------------------------------------------

    def power_slot(self) -> asyncio.Semaphore:
        return self._slot

    def budget_lock(self) -> asyncio.Lock:
        return self._budget_lock

    def note_cycle(self, node: str, action_id: int) -> None:
        """A rung was recorded: it counts against the budgets from now (monotonic)."""
        self._cycles.append((node, self.clock.monotonic(), action_id))

    def power_for(self, path: PowerPath, watch: NodeWatch, incident_id: int) -> VerifiedPower:
        """A verified power path whose every step is written ahead, with the send gate."""
        ledger, node = self.ledger, watch.name
        rung = rungs_of(self.config, watch).index(path)

        async def write_ahead(step: PowerStep) -> None:
            # Awaited by VerifiedPower *before* each command leaves.
            if step.name == StepName.OFF_REQUESTED:
                self.notifier.send(
                    Event(
                        "power_action",
                        f"{node}: power cycle via {path.key_path}",
                        node,
                        incident_id,
                        {"rung": rung + 1},
                    )
                )
            detail: dict[str, Any] = {"rung": rung, "device": path.key_path, "detail": step.detail}
            if step.on_after_s is not None:
                detail["on_after_s"] = step.on_after_s  # a resume reads it: a self-timed off
            try:
                await ledger.write(
                    ledger.store.add_step, incident_id, step.name, node=node, detail=detail
                )
            except HistoryUnwritable as exc:
                if step.name in _BEFORE_A_CUT:
                    raise  # nothing unrecorded cuts power
                # The outlet may be off: the on goes out all the same.
                log.error("%s: %s not recorded (%s); carrying on to power on", node, step.name, exc)
                self.notifier.send(
                    Event(
                        "history_unwritable",
                        f"{node}: {step.name} not recorded ({exc}); the controller restores power",
                        node,
                        incident_id,
                    )
                )

        def gate(target: PowerState) -> str | None:
            return self._may_cut(watch) if target is PowerState.OFF else None

        return self.io.power_factory(path, write_ahead, gate)

    def _may_cut(self, watch: NodeWatch) -> str | None:
        """Right before an off leaves: any reason not to send it (None: send).

        Synchronous on purpose: nothing else of the event loop runs between
        this answer and the command. The holds are read from the history
        itself, so a hold placed a moment ago by the CLI counts.
        """
        now = self.clock.monotonic()
        life = watch.last_life_at
        if life is not None and now - life < self.config.detection.freeze_after:
            return f"the host showed life {now - life:.1f}s ago: off withdrawn"
        try:
            hold = self.ledger.store.active_hold(watch.name) or self.ledger.store.active_hold(
                CLUSTER
            )
        except WatchdogError as exc:
            return f"the history cannot be read ({exc}): off withdrawn"
        if hold is not None:
            return f"held ({hold.reason}): off withdrawn"
        return None

    async def rung_blocked(self, watch: NodeWatch) -> str | None:
        """Before every rung: a hold, a spent budget or the breaker stops it."""
        holds = await self.ledger.read(self.ledger.store.active_holds)
        for hold in holds:
            if hold.node in (watch.name, CLUSTER):
                return f"held: {hold.reason}"
        guards = await self._guards(watch)
        if guards.breaker_tripped:
            return "the circuit breaker is tripped"
        if guards.node_cycles_in_window >= guards.node_budget:
            return f"node budget spent ({guards.node_cycles_in_window}/{guards.node_budget} cycles)"
        if guards.cluster_cycles_in_window >= guards.cluster_budget:
            return (
                f"cluster budget spent "
                f"({guards.cluster_cycles_in_window}/{guards.cluster_budget} cycles)"
            )
        if guards.dry_run:
            return "dry run: nothing is sent"
        return None

    async def still_frozen(self, watch: NodeWatch) -> tuple[bool, str]:
        """Right before cutting power: the witness, the agent and the banner, all at once.

        Any HTTP answer from the agent and any SSH answer (banner, refusal,
        close) mean a live host; a witness that does not answer or a host the
        controller cannot look at means no fencing now.
        """
        node = watch.config
        timeout = self.config.detection

        async def agent() -> str | None:
            try:
                answer = await self.io.agents.get(node, "/v1/state", timeout.agent_timeout)
            except HttpError as exc:
                watch.note_answer_error(exc.kind, str(exc), self.clock.monotonic())
                return "the agent answered" if exc.kind == ANSWERED else None
            self._note_agent_answer(watch, answer.status, answer.body)
            return f"the agent answered (HTTP {answer.status})"

        async def banner() -> str | None:
            result = await self.io.banner(node.banner_host, node.ssh_port, timeout.banner_timeout)
            watch.note_banner(
                result.outcome, result.banner or result.outcome, self.clock.monotonic()
            )
            if result.outcome in LIVE_BANNER_OUTCOMES:
                return f"ssh {result.outcome}" + (f" ({result.banner})" if result.banner else "")
            if result.outcome in BLIND_BANNER_OUTCOMES:
                return f"cannot look: ssh {result.outcome}"
            return None

        witness, alive_agent, alive_ssh = await asyncio.gather(
            self.io.witness(self.config.witness, 1.0), agent(), banner()
        )
        if not witness.ok:
            return False, f"witness unreachable ({', '.join(witness.missed)}): no fencing"
        for why in (alive_agent, alive_ssh):
            if why is not None:
                return False, why
        if watch.agent_blind is not None:
            return False, f"cannot look: {watch.agent_blind}"
        return True, f"agent silent, ssh {watch.banner_detail}"

    async def record_boots(self, watch: NodeWatch, incident_id: int) -> None:
        """Store the agent's journal analysis: how did the previous boot end?"""
        try:
            answer = await self.io.agents.get(watch.config, "/v1/boots", 5.0)
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

    async def hold_node(
        self,
        watch: NodeWatch,
        reason: str,
        event: NodeEvent,
        *,
        by_controller: bool = False,
        record: bool = True,
    ) -> None:
        """Hold a node: in memory always, in the history when ``record``.

        ``by_controller``: a hold the controller decided on (ambiguity, an
        error, a guard) is never released automatically: it is in the history
        (an operator releases it), or, while the history cannot be written,
        kept in memory and written as soon as it can be. ``record=False``: a
        pause while the history cannot be written, released by the next hold
        sync once it can (the incident, if any, is then resumed).
        """
        watch.held_reason = reason
        try:
            watch.apply(event)
        except InvalidTransition:
            watch.apply(NodeEvent.RECOVERY_FAILED)
        watch.held_by_controller = False
        if record:
            try:
                await self.ledger.write(self.ledger.store.hold, watch.name, reason, by=BY)
            except HistoryUnwritable:
                watch.held_by_controller = by_controller  # written when it can be
        self.notifier.send(Event("held", f"{watch.name} held: {reason}", watch.name))

    # -- serving ----------------------------------------------------------

    async def restart_serving_after(
        self, incident_id: int | None, reason: str, *, kind: str = "host_frozen"
    ) -> bool:
        """Switch to the safe profile and restart serving everywhere.

        Every rank restarts together, so while another node is still being
        recovered the restart waits for that recovery, which ends with one.
        In dry run nothing is restarted.
        """
        if self.config.guards.dry_run:
            return False
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
        self.profile = profile
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(
                self.ledger.store.set_setting, "serving_profile", profile, by=BY
            )
        if busy and incident_id is not None:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                StepName.SERVING_RESTART_DEFERRED,
                detail={"waiting_for": busy},
            )
            return True
        return await self._restart_serving(profile, incident_id, reason, kind)

    def _serving_nodes(self) -> tuple[ServingNode, list[ServingNode]] | None:
        head = self.config.serving.head
        if head is None or self.config.serving.token_file is None:
            return None
        nodes = [ServingNode(n.name, n.agent) for n in self.config.nodes]
        head_node = next(n for n in nodes if n.name == head)
        return head_node, [n for n in nodes if n.name != head]

    async def _restart_serving(
        self, profile: str, incident_id: int | None, reason: str, kind: str
    ) -> bool:
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
        self._answer_guard_kills_before(record.started_at)
        if kind in SERVING_FAULT_KINDS:
            self.serving_fault_restarts.append((self.clock.monotonic(), record.id))
        if incident_id is not None:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                StepName.SERVING_RESTART_STARTED,
                detail={"profile": profile, "reason": reason},
            )
        report = await self.io.serving(
            head, workers, token, self.config.serving.start_timeout, profile
        )
        self._last_serving_restart = self.clock.monotonic()
        if incident_id is not None and report.stacks:
            await self.ledger.write(
                self.ledger.store.add_step,
                incident_id,
                StepName.STACKS_RECORDED,
                detail={"nodes": report.stacks},
            )
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
                StepName.SERVING_RESTART_DONE,
                detail={"result": report.result, "error": report.error}
                | ({"note": report.note} if report.note else {}),
            )
        total = sum(report.step_durations.values())
        if report.result == "succeeded":
            self.notifier.send(
                Event(
                    "serving_restarted",
                    f"serving restarted with profile {profile} in {total:.1f}s"
                    + (f"; {report.note}" if report.note else ""),
                )
            )
            return True
        self.notifier.send(
            Event("serving_restart_failed", f"serving restart ({profile}): {report.error}")
        )
        return False

    async def _serving_restarts_in_window(self) -> int:
        """Automatic serving restarts for serving faults within restart_budget_window:
        this process's by the monotonic clock, earlier ones from the history over a
        window widened by CLOCK_STEP_MARGIN_S (as the power budgets count)."""
        window = self.config.serving.restart_budget_window
        now = self.clock.monotonic()
        mine = [at for at, _ in self.serving_fault_restarts if now - at < window]
        ours = {restart_id for _, restart_id in self.serving_fault_restarts}
        since = self.clock.time() - window - CLOCK_STEP_MARGIN_S
        recorded = await self.ledger.read(
            self.ledger.store.serving_restarts_for, SERVING_FAULT_KINDS, since
        )
        return len(mine) + sum(1 for restart_id in recorded if restart_id not in ours)

    async def serving_budget_spent(self, watch: NodeWatch) -> bool:
        """Too many automatic serving restarts in the window: alert once, a person decides."""
        cfg = self.config.serving
        try:
            done = await self._serving_restarts_in_window()
        except HistoryUnwritable:
            return True  # nothing can be recorded now: no restart; the next tick asks again
        if done < cfg.restart_budget:
            return False
        self._serving_blocked_until = self.clock.monotonic() + cfg.restart_budget_window / 4
        watch.answer_guard_kill()  # seen, alerted: no restart for it
        self.notifier.send(
            Event(
                "serving_budget_spent",
                f"{watch.name} {watch.finding.summary}: {done} automatic serving restarts in "
                f"{cfg.restart_budget_window:g} s (budget {cfg.restart_budget}); "
                "not restarting: a person decides",
                watch.name,
            )
        )
        return True

    async def _serving_incident(self, watch: NodeWatch) -> bool:
        finding = watch.finding
        if await self.serving_budget_spent(watch):
            return False
        # The fault began when vLLM last progressed, not when the agent last answered.
        onset = watch.serving_fault_onset(self.clock.time())
        kind = finding.verdict.value
        evidence: dict[str, Any] = {
            "reasons": list(finding.reasons),
            "agent_state": watch.snapshot,
            "flight_recorder": self.recorder.evidence(watch.name),
        }
        kill = watch.guard_kill
        if finding.verdict is Verdict.MEMORY_EXHAUSTED and kill is not None:
            evidence["memory_guard"] = kill
            # The rank died when the guard killed it.
            at = kill.get("at_unix")
            onset = float(at) if isinstance(at, (int, float)) else onset
        try:
            incident = await self.ledger.write(
                self.ledger.store.open_incident,
                kind,
                [watch.name],
                detected_at=self.clock.time(),
                evidence=evidence,
                fault_onset=onset,
                dry_run=self.config.guards.dry_run,
            )
        except IncidentAlreadyOpen as exc:
            log.info("%s: serving incident not opened: %s", watch.name, exc)
            return False
        if finding.verdict is Verdict.MEMORY_EXHAUSTED:
            watch.answer_guard_kill()
        self.notifier.send(
            Event("incident_opened", f"{watch.name} {finding.summary}", watch.name, incident.id)
        )
        if self.config.guards.dry_run:
            await self._close_dry_run(incident.id, "restart serving")
            return False
        ok = await self.restart_serving_after(incident.id, finding.summary, kind=kind)
        await self.ledger.write(
            self.ledger.store.resolve_incident,
            incident.id,
            "recovered" if ok else "gave_up",
            detail={"profile": self.profile},
        )
        return ok

    # -- the loop ---------------------------------------------------------

    def _note_agent_answer(self, watch: NodeWatch, status: int, body: bytes) -> None:
        """An HTTP answer: life in any case; a snapshot when it is a 200 with a JSON object."""
        before = watch.snapshot
        wall = self.clock.time()
        watch.note_http_answer(status, body, self.clock.monotonic(), wall)
        if watch.snapshot is not None and watch.snapshot is not before:
            self.recorder.note(watch.name, watch.snapshot, wall)

    async def _poll_agent(self, watch: NodeWatch) -> None:
        try:
            answer = await self.io.agents.get(
                watch.config, "/v1/state", self.config.detection.agent_timeout
            )
        except HttpError as exc:
            watch.note_answer_error(exc.kind, str(exc), self.clock.monotonic())
            return
        self._note_agent_answer(watch, answer.status, answer.body)

    async def _check_banner(self, watch: NodeWatch, now: float) -> None:
        node = watch.config
        late = watch.agent_silent_s(now) >= watch.late_after
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
                result = await self.io.banner(
                    node.banner_host, node.ssh_port, self.config.detection.banner_timeout
                )
                watch.note_banner(
                    result.outcome, result.banner or result.outcome, self.clock.monotonic()
                )
            finally:
                self._banner_checks.pop(watch.name, None)

        self._banner_checks[watch.name] = asyncio.get_running_loop().create_task(check())

    async def tick(self) -> None:
        now = self.clock.monotonic()
        self._tick_started = now
        witness, _ = await asyncio.gather(
            self.io.witness(self.config.witness, 1.0),
            asyncio.gather(*(self._poll_agent(w) for w in self.watches.values())),
        )
        self.witness_ok = witness.ok
        self.witness_detail = "ok" if witness.ok else f"unreachable: {', '.join(witness.missed)}"
        now = self.clock.monotonic()
        for watch in self.watches.values():
            await self._check_banner(watch, now)
        head = self.config.serving.head
        for watch in self.watches.values():
            judges = head is None or watch.name == head
            before = watch.finding.verdict
            watch.finding = classify(watch.observation(now, witness.ok, judges), self.policy)
            if watch.finding.verdict is not before:
                self._verdict_changed(watch, before)
        await self._sync_holds()
        await self._check_breaker()
        for watch in self.watches.values():
            await self._act(watch)
        await self._refresh_offenders()
        for watch in self.watches.values():
            if self._counted_verdicts.get(watch.name) != watch.verdict:
                self._counted_verdicts[watch.name] = watch.verdict
                self.tallies.note_verdict(watch.name, watch.verdict)
        self.ticks += 1
        self.last_sweep_s = self.clock.monotonic() - self._tick_started
        self.published = self.status_json()

    async def _refresh_offenders(self) -> None:
        """Freezes per node within suspect_window and cycles ever, from the history:
        every OFFENDERS_REFRESH_S, and after each freeze incident opens. A node that
        becomes hardware_suspect gets one alert."""
        now = self.clock.monotonic()
        if now - self._offenders_read_at < OFFENDERS_REFRESH_S:
            return
        guards = self.config.guards
        try:
            freezes, cycles = await self.ledger.read(
                self.ledger.store.repeat_offenders, self.clock.time() - guards.suspect_window
            )
        except HistoryUnwritable:
            return
        self._offenders_read_at = now
        for name, watch in self.watches.items():
            watch.freezes_in_window = freezes.get(name, 0)
            watch.power_cycles_total = cycles.get(name, 0)
            suspect = watch.freezes_in_window >= guards.suspect_freezes
            if suspect and not watch.hardware_suspect:
                self.notifier.send(
                    Event(
                        "hardware_suspect",
                        f"{name} froze {watch.freezes_in_window} times within "
                        f"{guards.suspect_window:g}s: the hardware may be at fault (GPU, PSU, "
                        "cable, the outlet); power cycles only treat the symptom",
                        name,
                    )
                )
            watch.hardware_suspect = suspect

    async def _answer_clock_latch(self, watch: NodeWatch) -> None:
        """A boot whose GPU the agent found clock-latched: one critical alert, and
        with policy.clock_latch_off_seconds the unlatch ladder (a clean halt, then
        the power path's long cut: controller/unlatch.py), started once per boot
        when the node is free: watching, no incident, no other node unlatching."""
        boot = watch.clock_latched_boot
        if boot is None:
            return
        acting = self.config.policy.clock_latch_off_seconds > 0
        if watch.clock_latch_alerted != boot:
            watch.clock_latch_alerted = boot
            check = (watch.snapshot or {}).get("gpu_clock_check")
            evidence = dict(check) if isinstance(check, dict) else {}
            then = (
                "the controller halts it and holds its AC off "
                f"{unlatch.off_seconds(self.config):g}s"
                if acting and not self.config.guards.dry_run
                else "cut its AC for a few minutes (a reboot does not clear it)"
            )
            self.notifier.send(
                Event(
                    "clock_latched",
                    f"{watch.name}: GPU clock latched on boot {boot} (busy, never above "
                    f"{evidence.get('max_busy_sm_clock_mhz')} MHz of a "
                    f"{evidence.get('floor_mhz')} MHz floor): the illegal memory access is "
                    f"likely to return; {then}",
                    watch.name,
                    None,
                    {"boot_id": boot, "check": evidence},
                )
            )
        if not acting or watch.clock_latch_answered == boot or not self._free_to_unlatch(watch):
            return
        with contextlib.suppress(HistoryUnwritable):
            await self._start_unlatch(watch)
            watch.clock_latch_answered = boot

    def _free_to_unlatch(self, watch: NodeWatch) -> bool:
        """One unlatch at a time, on a healthy node, while nothing else in the
        cluster is being recovered."""
        if watch.finding.verdict is not Verdict.HEALTHY or watch.incident_id is not None:
            return False
        if self._unlatch_in_progress():
            return False
        if watch.state is not NodeState.WATCHING:
            return False
        busy = (NodeState.FENCING, NodeState.BOOTING)  # a held node elsewhere does not count
        if any(w.state in busy for w in self.watches.values()):
            return False
        if any(not task.done() for task in self._fencing.values()):
            return False
        return not any(not task.done() for task, _ in self._wedged.values())

    def _unlatch_in_progress(self) -> bool:
        """An unlatch ladder runs, or a node halted for its latch (here or by an
        earlier controller) is silent, waiting for its long cut."""
        if any(not task.done() for task in self._unlatching.values()):
            return True
        return any(
            w.halted_boot is not None and not self.shows_life(w) for w in self.watches.values()
        )

    async def _close_dry_run(self, incident_id: int, would: str) -> None:
        """In dry run an incident records what would have been done and closes
        as a false alarm: nothing is sent."""
        await self.ledger.write(
            self.ledger.store.add_step, incident_id, StepName.DRY_RUN, detail={"would": would}
        )
        await self.ledger.write(
            self.ledger.store.resolve_incident,
            incident_id,
            "false_alarm",
            detail={"dry_run": True},
        )

    async def _start_unlatch(self, watch: NodeWatch) -> None:
        dry_run = self.config.guards.dry_run
        check = (watch.snapshot or {}).get("gpu_clock_check")
        try:
            incident = await self.ledger.write(
                self.ledger.store.open_incident,
                unlatch.KIND,
                [watch.name],
                detected_at=self.clock.time(),
                evidence={
                    "gpu_clock_check": dict(check) if isinstance(check, dict) else {},
                    "boot_id": watch.clock_latched_boot,
                    "flight_recorder": self.recorder.evidence(watch.name),
                },
                dry_run=dry_run,
            )
        except IncidentAlreadyOpen as exc:
            log.info("%s: clock_latched incident not opened: %s", watch.name, exc)
            return
        if dry_run:
            await self._close_dry_run(
                incident.id,
                f"halt it over ssh, then hold its AC off {unlatch.off_seconds(self.config):g}s",
            )
            return
        self._unlatching[watch.name] = asyncio.get_running_loop().create_task(
            self._run_unlatch(watch, incident.id), name=f"unlatch-{watch.name}"
        )

    async def _run_unlatch(self, watch: NodeWatch, incident_id: int) -> str:
        try:
            return await unlatch.unlatch(self, watch, incident_id)
        except HistoryUnwritable as exc:
            # A halt that may have left keeps the node's silence expected and the
            # long cut armed (the freeze path takes a silent host with it).
            log.warning("%s: clock latch ladder stopped: %s", watch.name, exc)
            return "unrecorded"
        except Exception as exc:
            # Never guess after an unexpected error: record, alert, a person decides.
            log.exception("%s: clock latch ladder failed", watch.name)
            self.notifier.send(
                Event(
                    "clock_latch_not_cleared",
                    f"{watch.name}: the clock latch ladder failed: {exc!r}",
                    watch.name,
                    incident_id,
                )
            )
            with contextlib.suppress(HistoryUnwritable):
                await self.ledger.write(
                    self.ledger.store.resolve_incident,
                    incident_id,
                    "gave_up",
                    detail={"why": f"failed: {exc!r}"},
                )
            return "gave_up"

    async def halt(self, device: SshDevice) -> wedged.RebootAttempt:
        return await self.io.halt(device)

    async def cycles_in_window(self, node: str) -> tuple[int, int]:
        return await self._cycles_in_window(node)

    def _verdict_changed(self, watch: NodeWatch, before: Verdict) -> None:
        finding = watch.finding
        log.info(
            "%s: %s",
            watch.name,
            finding.summary,
            extra={"node": watch.name, "verdict": finding.verdict.value},
        )
        if finding.verdict is Verdict.UNOBSERVABLE:
            self.notifier.send(Event("unobservable", f"{watch.name} {finding.summary}", watch.name))
        handed_over = watch.off_seconds_override is not None  # halted for a clock latch
        if (
            before is Verdict.REBOOTING
            and finding.verdict is not Verdict.HEALTHY
            and not handed_over
        ):
            # Gone down in order, not back within boot_timeout: a person should look
            # (silent, it becomes host_frozen; still refusing, it is never fenced).
            self.notifier.send(
                Event("reboot_overdue", f"{watch.name} {finding.summary}", watch.name)
            )

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
            if watch.held_by_controller:
                # Our own hold, not yet in the history: write it now, release never.
                with contextlib.suppress(HistoryUnwritable):
                    assert watch.held_reason is not None
                    await self.ledger.write(
                        self.ledger.store.hold, watch.name, watch.held_reason, by=BY
                    )
                    watch.held_by_controller = False
                continue
            if reason and watch.state is NodeState.WATCHING:
                watch.held_reason = reason
                watch.apply(NodeEvent.HOLD)
            elif not reason and watch.state is NodeState.HELD:
                watch.held_reason = None
                watch.apply(NodeEvent.RELEASE)

    def _breaker_count(self) -> list[str]:
        """Nodes whose confirmed freeze the network could explain.

        Counted: ``host_frozen`` nodes the controller is not already handling,
        whose last miss was not a completed handshake (a frozen GB10 still
        completes TCP; a partition does not). Not counted: nodes it powered
        off or waits on (fencing, booting), and mere silence, which a blip of
        a few seconds produces on every node at once.
        """
        return [
            w.name
            for w in self.watches.values()
            if w.state is NodeState.WATCHING
            and w.finding.verdict is Verdict.HOST_FROZEN
            and not w.banner_reachable
            and w.off_seconds_override is None  # halted by the controller for its latch
        ]

    def breaker_open(self) -> bool:
        return self._breaker_since is not None

    async def _check_breaker(self) -> None:
        trouble = self._breaker_count()
        nodes = len(self.watches)
        if not breaker_trips(len(trouble), nodes, self.config.guards.max_unhealthy_fraction):
            self._breaker_since = None
            return
        now = self.clock.monotonic()
        if self._breaker_since is None:
            self._breaker_since = now
            log.warning("circuit breaker open: %d/%d nodes look frozen", len(trouble), nodes)
        # Open: nothing is fenced. Latched into a cluster hold only if it lasts.
        if now - self._breaker_since < self.config.guards.breaker_latch_after:
            return
        if self.cluster_hold is not None:
            return
        reason = (
            f"circuit breaker: {len(trouble)}/{nodes} nodes look frozen without a TCP handshake "
            f"({', '.join(trouble)}) for {now - self._breaker_since:.0f}s; "
            "release with: spark-watchdog release '*'"
        )
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(self.ledger.store.hold, CLUSTER, reason, by=BY)
            self.cluster_hold = reason
        self.notifier.send(Event("circuit_breaker", reason))
        for watch in self.watches.values():
            if watch.state is NodeState.WATCHING:
                watch.held_reason = reason
                watch.apply(NodeEvent.HOLD)

    async def _guards(self, watch: NodeWatch) -> Guards:
        g = self.config.guards
        node_cycles, cluster_cycles = await self._cycles_in_window(watch.name)
        # Nodes in the power phase of a rung; the power slot serialises the
        # commands themselves, this keeps new incidents from queueing blind.
        in_flight = sum(1 for w in self.watches.values() if w.state is NodeState.FENCING)
        return Guards(
            node_held=watch.state is NodeState.HELD,
            cluster_held=self.cluster_hold is not None,
            breaker_tripped=self.breaker_open(),
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

    async def _cycles_in_window(self, node: str) -> tuple[int, int]:
        """Cycles of the node and of the cluster within budget_window.

        This process's own by the monotonic clock (exact under any clock
        step); those of earlier processes from the history by wall time, over
        a window widened by CLOCK_STEP_MARGIN_S (a clock stepped by less than
        that between the record and now cannot hide one).
        """
        window = self.config.guards.budget_window
        since = self.clock.time() - window - CLOCK_STEP_MARGIN_S
        ours = {action_id for _, _, action_id in self._cycles}
        earlier = [
            cut_node
            for action_id, cut_node, _ in await self.ledger.read(
                self.ledger.store.power_cuts_since, since
            )
            if action_id not in ours
        ]
        now = self.clock.monotonic()
        mine = [n for n, at, _ in self._cycles if now - at < window]
        return earlier.count(node) + mine.count(node), len(earlier) + len(mine)

    async def _act(self, watch: NodeWatch) -> None:
        await self._answer_clock_latch(watch)
        self._settle_guard_kill(watch)
        self._expire_expected_reboot(watch)
        if watch.finding.verdict is Verdict.MEMORY_EXHAUSTED and watch.guard_kill is None:
            return  # answered just now: the next tick judges the node afresh
        if watch.name in self._fencing and not self._fencing[watch.name].done():
            return
        if await self._unwedging(watch):
            return
        if watch.state is not NodeState.WATCHING:
            return
        if watch.incident_id is not None:
            # Ours, open, and nothing runs it (paused while the history could
            # not be written): resume it from its record, as after a restart.
            with contextlib.suppress(HistoryUnwritable):
                await self._resume_incident(watch, watch.incident_id)
            return
        verdict = watch.finding.verdict
        if verdict is Verdict.HOST_FROZEN and self.ledger.problem:
            # Holds rather than acts blind: nothing unrecorded touches power.
            await self.hold_node(
                watch, f"history unwritable: {self.ledger.problem}", NodeEvent.HOLD, record=False
            )
            return
        if verdict not in (
            Verdict.HOST_FROZEN,
            Verdict.AGENT_DOWN,
            Verdict.SERVING_STALLED,
            Verdict.SERVING_DEAD,
            Verdict.MEMORY_EXHAUSTED,
            Verdict.GPU_WEDGED,
        ):
            watch.dry_run_incident = None  # the next freeze is a new dry-run incident
            return  # nothing to decide: skip the history reads
        if verdict is Verdict.MEMORY_EXHAUSTED and await self._guard_kill_recorded(watch):
            return
        try:
            guards = await self._guards(watch)
        except HistoryUnwritable:
            return
        decision = decide(watch.state, watch.finding, guards)
        try:
            await self._carry_out(watch, decision)
        except HistoryUnwritable as exc:
            # Nothing that needed a record happened; the next tick decides again.
            log.warning("%s: %s not carried out: %s", watch.name, decision.step.value, exc)

    async def _carry_out(self, watch: NodeWatch, decision: Decision) -> None:
        verdict = watch.finding.verdict
        if decision.step is Step.FENCE:
            await self._start_fencing(watch)
        elif decision.step is Step.RECORD_DRY_RUN:
            await self._record_dry_run(watch, decision.reason)
        elif decision.step is Step.HOLD:
            assert decision.event is not None
            await self.hold_node(watch, decision.reason, decision.event, by_controller=True)
        elif decision.step is Step.RESTART_AGENT:
            self._restart_agent(watch)
        elif decision.step is Step.RESTART_SERVING:
            self._maybe_restart_serving(watch)
        elif decision.step is Step.UNWEDGE:
            await self._start_unwedge(watch)
        elif verdict is not Verdict.HOST_FROZEN:
            watch.dry_run_incident = None

    async def _start_fencing(self, watch: NodeWatch) -> None:
        try:
            incident = await self._open_frozen_incident(watch)
        except HistoryUnwritable as exc:
            await self.hold_node(watch, f"history unwritable: {exc}", NodeEvent.HOLD, record=False)
            return
        if incident is None:
            return
        watch.incident_id = incident.id
        watch.rungs_done.clear()
        watch.apply(NodeEvent.FROZEN_CONFIRMED)
        self._offenders_read_at = float("-inf")  # this freeze counts at the next tick
        self.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        self._spawn_recovery(watch, incident.id, None)

    async def _open_frozen_incident(self, watch: NodeWatch) -> Incident | None:
        try:
            incident: Incident = await self.ledger.write(
                self.ledger.store.open_incident,
                "host_frozen",
                [watch.name],
                detected_at=self.clock.time(),
                evidence={
                    "reasons": list(watch.finding.reasons),
                    "last_agent_state": watch.snapshot,
                    "boot_id": watch.boot_id,
                    "banner": watch.banner_detail,
                    "flight_recorder": self.recorder.evidence(watch.name),
                },
                fault_onset=watch.agent_progress_wall,
            )
        except IncidentAlreadyOpen as exc:
            # Ours would be running (and _act would not get here): a leftover.
            log.error("%s: %s; not opening another", watch.name, exc)
            await self.hold_node(
                watch,
                f"incident #{exc.incident_id} is still open: a person decides",
                NodeEvent.HOLD,
                by_controller=True,
            )
            return None
        return incident

    def _spawn_recovery(
        self, watch: NodeWatch, incident_id: int, resume: ResumeInfo | None
    ) -> None:
        task = asyncio.get_running_loop().create_task(
            recover_frozen_host(self, watch, incident_id, resume), name=f"recover-{watch.name}"
        )
        self._fencing[watch.name] = task
        task.add_done_callback(lambda t: self._recovery_done(watch, t))

    def _recovery_done(self, watch: NodeWatch, task: asyncio.Task[RungOutcome]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            # recover_frozen_host holds on every error it sees; this is the last net.
            log.error("%s: recovery failed: %r", watch.name, error, exc_info=error)
            watch.held_reason = f"recovery failed: {error}"
            watch.held_by_controller = True
            if watch.state is not NodeState.HELD:
                watch.apply(NodeEvent.RECOVERY_FAILED)
            self.notifier.send(Event("held", f"{watch.name}: recovery failed: {error}", watch.name))

    async def _record_dry_run(self, watch: NodeWatch, reason: str) -> None:
        if watch.dry_run_incident is not None:
            return
        rungs = rungs_of(self.config, watch)
        incident = await self.ledger.write(
            self.ledger.store.open_incident,
            "host_frozen",
            [watch.name],
            detected_at=self.clock.time(),
            evidence={
                "reasons": list(watch.finding.reasons),
                "last_agent_state": watch.snapshot,
                "flight_recorder": self.recorder.evidence(watch.name),
            },
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
            step=StepName.DRY_RUN,
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

    def _restart_agent(self, watch: NodeWatch) -> None:
        """agent_down: alert, and restart the agent over SSH in the background (cooldown)."""
        now = self.clock.monotonic()
        if now - watch.last_agent_restart < AGENT_RESTART_COOLDOWN_S:
            return
        running = self._agent_restarts.get(watch.name)
        if running is not None and not running.done():
            return
        watch.last_agent_restart = now
        self.notifier.send(
            Event("agent_down", f"{watch.name}: {watch.finding.summary}", watch.name)
        )
        ssh = next((d for d in watch.config.power if isinstance(d, SshDevice)), None)
        if ssh is None or self.config.guards.dry_run:
            return
        self._agent_restarts[watch.name] = asyncio.get_running_loop().create_task(
            self._run_agent_restart(watch, ssh)
        )

    async def _run_agent_restart(self, watch: NodeWatch, ssh: SshDevice) -> None:
        try:
            # Recorded first: the cooldown survives a restart of the controller.
            await self.ledger.write(
                self.ledger.store.record_action,
                watch.name,
                "agent_restart",
                device=f"ssh {ssh.host}:{ssh.port}",
            )
            outcome = await self.io.agent_restart(ssh)
            log.info("%s: agent restart over ssh: %s", watch.name, outcome)
        except (HistoryUnwritable, WatchdogError, OSError) as exc:
            log.warning("%s: agent restart over ssh failed: %s", watch.name, exc)

    # -- wedged but alive ----------------------------------------------------

    async def _unwedging(self, watch: NodeWatch) -> bool:
        """A wedged-but-alive ladder runs for the node: leave it be, unless the
        host went silent, which the freeze path takes over."""
        running = self._wedged.get(watch.name)
        if running is None or running[0].done():
            return False
        task, incident_id = running
        if watch.finding.verdict is not Verdict.HOST_FROZEN:
            return True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, HistoryUnwritable):
            await task
        with contextlib.suppress(HistoryUnwritable):
            await wedged.hand_over(self, watch, incident_id, None)
        return False

    async def _start_unwedge(self, watch: NodeWatch) -> None:
        if watch.dry_run_incident is not None:
            return
        try:
            incident = await self.ledger.write(
                self.ledger.store.open_incident,
                wedged.KIND,
                [watch.name],
                detected_at=self.clock.time(),
                evidence={
                    "reasons": list(watch.finding.reasons),
                    "agent_state": watch.snapshot,
                    "flight_recorder": self.recorder.evidence(watch.name),
                },
                fault_onset=watch.gpu_timeout_wall,
                dry_run=self.config.guards.dry_run,
            )
        except IncidentAlreadyOpen as exc:
            log.info("%s: gpu_wedged incident not opened: %s", watch.name, exc)
            return
        self.notifier.send(
            Event(
                "incident_opened", f"{watch.name} {watch.finding.summary}", watch.name, incident.id
            )
        )
        if self.config.guards.dry_run:
            watch.dry_run_incident = incident.id
            await self._close_dry_run(incident.id, "restart serving, then a forced reboot over ssh")
            return
        task = asyncio.get_running_loop().create_task(
            self._run_unwedge(watch, incident.id), name=f"unwedge-{watch.name}"
        )
        self._wedged[watch.name] = (task, incident.id)

    async def _run_unwedge(self, watch: NodeWatch, incident_id: int) -> str:
        try:
            return await wedged.unwedge(self, watch, incident_id)
        except HistoryUnwritable as exc:
            log.warning("%s: gpu_wedged ladder stopped: %s", watch.name, exc)
            return "unrecorded"
        except Exception as exc:
            # Never guess after an unexpected error: hold, record, a person decides.
            log.exception("%s: gpu_wedged ladder failed", watch.name)
            with contextlib.suppress(HistoryUnwritable):
                await self.hold_node(
                    watch, f"gpu_wedged ladder failed: {exc}", NodeEvent.HOLD, by_controller=True
                )
                await self.ledger.write(
                    self.ledger.store.resolve_incident,
                    incident_id,
                    "gave_up",
                    detail={"why": f"the ladder failed: {exc}"},
                )
            return "gave_up"

    async def reboots_in_window(self, node: str) -> int:
        """Forced reboots of the node within budget_window, from the history
        (widened by CLOCK_STEP_MARGIN_S, as the power budgets)."""
        since = self.clock.time() - self.config.guards.budget_window - CLOCK_STEP_MARGIN_S
        actions = await self.ledger.read(self.ledger.store.actions, node=node, limit=None)
        return sum(
            1
            for a in actions
            if a.operation == "ssh_reboot" and not a.dry_run and a.requested_at >= since
        )

    async def forced_reboot(self, device: SshDevice) -> wedged.RebootAttempt:
        return await self.io.forced_reboot(device)

    def gpu_answers(self, watch: NodeWatch) -> bool:
        """The node's latest snapshot has a GPU reading that did not time out."""
        probes = (watch.snapshot or {}).get("probes")
        gpu = probes.get("gpu") if isinstance(probes, dict) else None
        state = gpu.get("state") if isinstance(gpu, dict) else None
        return isinstance(state, str) and state not in ("timeout", "pending")

    def expect_reboot(self, watch: NodeWatch, why: str | None) -> None:
        """From now the node's silence is a reboot for boot_timeout (None: no longer)."""
        watch.going_down_at = None if why is None else self.clock.monotonic()
        watch.going_down_why = why
        watch.reboot_expected = why is not None

    def shows_life(self, watch: NodeWatch) -> bool:
        last = watch.last_life_at
        return last is not None and self.clock.monotonic() - last < self.policy.freeze_after

    def node_held(self, watch: NodeWatch) -> bool:
        return watch.state is NodeState.HELD or self.cluster_hold is not None

    def _expire_expected_reboot(self, watch: NodeWatch) -> None:
        """A reboot the controller asked for that did not come within boot_timeout
        while the agent kept answering is not expected any more: a later planned
        reboot is then judged on its own signs, from its own start."""
        since = watch.going_down_at
        if not watch.reboot_expected or since is None:
            return
        now = self.clock.monotonic()
        answering = watch.agent_progress_at is not None and watch.agent_progress_at > since
        if answering and now - since >= self.policy.boot_timeout:
            self.expect_reboot(watch, None)

    def _settle_guard_kill(self, watch: NodeWatch) -> None:
        """A guard trip that killed nothing is an alert, not a cluster restart; a
        pending kill that grew old (a hold, a failed restart) is no longer news."""
        kill = watch.guard_kill
        if kill is None:
            return
        at = kill.get("at_unix")
        stale = isinstance(at, (int, float)) and self.clock.time() - at > GUARD_KILL_FRESH_S
        if kill.get("result") == "killed" and not stale:
            return
        watch.answer_guard_kill()
        if not stale:
            self.notifier.send(
                Event(
                    "memory_guard_failed",
                    f"{watch.name}: the memory guard tripped and {kill.get('result')}: "
                    f"{'; '.join(map(str, kill.get('reasons') or []))}; look at the node now",
                    watch.name,
                )
            )

    def _answer_guard_kills_before(self, started_wall: float) -> None:
        """A serving restart that began after a kill answers it, whatever began it."""
        for watch in self.watches.values():
            at = None if watch.guard_kill is None else watch.guard_kill.get("at_unix")
            if isinstance(at, (int, float)) and at <= started_wall:
                watch.answer_guard_kill()

    async def _guard_kill_recorded(self, watch: NodeWatch) -> bool:
        """A memory guard kill an earlier controller already opened an incident for:
        the same kill (agent start, id, time) in a memory_exhausted incident's
        evidence. Looked up over a wide window: the node's clock and ours may differ."""
        kill = watch.guard_kill
        at = None if kill is None else kill.get("at_unix")
        if kill is None or not isinstance(at, (int, float)):
            return False
        try:
            found = await self.ledger.read(
                self.ledger.store.list_incidents,
                node=watch.name,
                kind=Verdict.MEMORY_EXHAUSTED.value,
                since=float(at) - 4 * GUARD_KILL_FRESH_S,
                limit=20,
            )
        except HistoryUnwritable:
            return True  # not now: the next tick asks again
        same = ("agent_started_at", "id", "at_unix")
        for incident in found:
            recorded = incident.evidence.get("memory_guard")
            if isinstance(recorded, dict) and all(recorded.get(k) == kill.get(k) for k in same):
                watch.answer_guard_kill()
                return True
        return False

    def _maybe_restart_serving(self, watch: NodeWatch) -> None:
        if self._unlatch_in_progress():
            return  # a node is halting for its long cut: serving restarts after it
        if not self.config.serving.auto_restart:
            if watch.guard_kill is not None:
                # Told once, then not news any more: a person restarts serving.
                watch.answer_guard_kill()
                self.notifier.send(
                    Event(
                        "memory_exhausted",
                        f"{watch.name} {watch.finding.summary}; serving.auto_restart is off: "
                        "restart serving by hand (spark-watchdog serving restart)",
                        watch.name,
                    )
                )
            return
        if self.clock.monotonic() < self._serving_blocked_until:
            return
        if self._serving_task is not None and not self._serving_task.done():
            return
        if any(not t.done() for t in self._fencing.values()):
            return  # a host recovery ends with a serving restart anyway
        if any(not task.done() for task, _ in self._wedged.values()):
            return  # so does the wedged-but-alive ladder, whose restart this may be
        cooldown = self.config.serving.restart_cooldown
        if self.clock.monotonic() - self._last_serving_restart < cooldown:
            return
        self._serving_task = asyncio.get_running_loop().create_task(self._serving_incident(watch))

    # -- start, resume, run -----------------------------------------------

    async def resume(self) -> None:
        """Continue what a previous controller left open (the write-ahead log).

        One incident per node: the newest open one is resumed, older ones are
        closed as superseded. A resumed rung goes through the same preflight
        (holds, budgets, breaker, last look) as a fresh one.
        """
        incidents = await self.ledger.read(self.ledger.store.open_incidents)
        self.tallies.seed_open(incidents)
        newest: dict[str, Incident] = {}
        for incident in sorted(incidents, key=lambda i: i.id):
            if incident.kind == wedged.KIND and not incident.dry_run:
                await self._resume_wedged(incident)
            if incident.kind == unlatch.KIND and not incident.dry_run:
                await self._resume_unlatch(incident)
            if incident.kind != "host_frozen" or incident.dry_run:
                await self.ledger.write(
                    self.ledger.store.resolve_incident,
                    incident.id,
                    "false_alarm" if incident.dry_run else "gave_up",
                    detail={"why": "controller restarted mid-incident"},
                )
                continue
            for name in incident.nodes:
                older = newest.get(name)
                if older is not None:
                    await self._supersede(older, incident)
                newest[name] = incident
        for name, incident in newest.items():
            watch = self.watches.get(name)
            if watch is not None:
                await self._resume_incident(watch, incident.id)

    async def _resume_wedged(self, incident: Incident) -> None:
        """A ladder cut short after its forced reboot may have left: the node's
        silence is still a reboot for boot_timeout, never a freeze to fence."""
        steps = {s.step for s in await self.ledger.read(self.ledger.store.steps, incident.id)}
        sent = {StepName.REBOOT_REQUESTED, StepName.REBOOT_SENT} & steps
        for name in incident.nodes:
            watch = self.watches.get(name)
            if watch is not None and sent and StepName.NEW_BOOT_SEEN not in steps:
                self.expect_reboot(watch, "a forced reboot may have been sent before a restart")

    async def _resume_unlatch(self, incident: Incident) -> None:
        """A halt for a clock latch may have left before a restart: the node's
        silence stays expected for boot_timeout and its next cut stays long;
        after the handover, only the long cut. The incident is closed here."""
        steps = await self.ledger.read(self.ledger.store.steps, incident.id)
        names = {s.step for s in steps}
        asked = [s for s in steps if s.step == StepName.HALT_REQUESTED]
        detail = asked[-1].detail if asked and isinstance(asked[-1].detail, dict) else {}
        off = detail.get("off_seconds")
        if not isinstance(off, (int, float)) or StepName.HALT_NOT_SENT in names:
            return
        for name in incident.nodes:
            watch = self.watches.get(name)
            if watch is None:
                continue
            boot = detail.get("boot_id")
            watch.arm_long_cut(float(off), boot if isinstance(boot, str) else None)
            watch.clock_latch_answered = boot  # this boot: not again
            if StepName.HANDED_TO_POWER_PATH not in names:
                self.expect_reboot(watch, "a halt for the clock latch may have left")

    async def _resume_incident(self, watch: NodeWatch, incident_id: int) -> None:
        """Continue one open incident from its record: the same code as a fresh one."""
        name = watch.name
        steps = await self.ledger.read(self.ledger.store.steps, incident_id)
        info = resume_plan(steps, name)
        watch.incident_id = incident_id
        watch.rungs_done = set(info.rungs_done)
        log.info("%s: resuming incident #%d (%s)", name, incident_id, info.phase.value)
        if self.config.guards.dry_run:
            # Dry run sends nothing, not even an on: a person finishes this one.
            await self.hold_node(
                watch,
                f"incident #{incident_id} is open and the controller runs in dry run "
                f"({info.phase.value}); check the outlet",
                NodeEvent.HOLD,
                by_controller=True,
            )
            watch.incident_id = None
            await self.ledger.write(
                self.ledger.store.resolve_incident,
                incident_id,
                "gave_up",
                detail={"why": "the controller runs in dry run: held for a person"},
            )
            return
        if info.phase is Phase.BOOT_WAIT:
            watch.apply(NodeEvent.RESUMED_BOOT_WAIT)
        elif info.phase is Phase.LADDER:
            watch.apply(NodeEvent.RESUMED_LADDER)
        self._spawn_recovery(watch, incident_id, info)

    async def _supersede(self, older: Incident, newer: Incident) -> None:
        detail = {"why": f"superseded by incident #{newer.id}"}
        await self.ledger.write(
            self.ledger.store.add_step, older.id, StepName.SUPERSEDED, detail=detail
        )
        await self.ledger.write(
            self.ledger.store.resolve_incident, older.id, "gave_up", detail=detail
        )

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
            started = self.clock.monotonic()
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
            elapsed = self.clock.monotonic() - started
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, interval - elapsed))
        pending = [
            t
            for t in [
                *self._fencing.values(),
                *self._banner_checks.values(),
                *self._agent_restarts.values(),
                self._serving_task,
            ]
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
        now = self.clock.monotonic()
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
    """Run until SIGTERM or SIGINT, as the only controller on this history."""
    lock = InstanceLock(config.history)
    lock.acquire()  # HistoryLocked names the other controller
    try:
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
    finally:
        lock.release()
