"""When the controller restarts serving, and what counts against its budget
(docs/design.md, "Serving restart"; "Memory guard").

Serving restarts on every node together (controller/serving/serving_restart.py does
the restarting): after a host recovery, after a serving fault (stalled, dead,
memory exhausted, GPU wedged), and as the wedged ladder's first rung. A
restart for a serving fault counts against ``serving.restart_budget`` within
its window; past it a person decides. A memory guard kill is answered by the
restart that follows it, whatever began that restart; one that killed
nothing is an alert, not a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.controller.act.ladder import open_incident
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.planner import Step, serving_after_recovery
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution, close_dry_run
from spark_watchdog.controller.record.ledger import BY, HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.serving.kill_records import KILL_EVIDENCE, answer_kills_before
from spark_watchdog.controller.serving.serving_budget import ServingBudget, answer_kill
from spark_watchdog.controller.serving.serving_restart import ServingNode, ServingRestartReport
from spark_watchdog.errors import ConfigError
from spark_watchdog.steps import StepName
from spark_watchdog.verdicts import SERVING_FAULT_KINDS

log = logging.getLogger("spark_watchdog.controller")

# The history's setting of the profile in force (cli/serving_cmd.py sets it too).
PROFILE_SETTING = "serving_profile"


class ServingRestarts:
    """The serving restarts of one controller process: when, how many, with what."""

    def __init__(
        self,
        config: ControllerConfig,
        io: ControllerIO,
        ledger: Ledger,
        notifier: Notifier,
        watches: Mapping[str, NodeWatch],
        recorder: FlightRecorder,
        not_mine: Callable[[], str | None] | None = None,
    ) -> None:
        self.config, self.io, self.ledger, self.notifier = config, io, ledger, notifier
        self.watches, self.recorder = watches, recorder
        # Why another controller on the Sparks restarts serving now (None: this one).
        self.not_mine = not_mine or (lambda: None)
        # The profile serving was last (re)started with by the controller.
        self.profile: str | None = None
        self.task: asyncio.Task[bool] | None = None
        self._last_restart = float("-inf")
        # What counts against serving.restart_budget (controller/serving/serving_budget.py).
        self.budget = ServingBudget(config, io.clock, ledger, notifier)

    @property
    def clock(self) -> Clock:
        return self.io.clock

    async def restart_after(
        self, incident_id: int | None, reason: str, *, kind: str = "host_frozen"
    ) -> bool:
        """Switch to the safe profile and restart serving everywhere, now or
        after another node's recovery (``planner.serving_after_recovery``).
        In dry run nothing is restarted.
        """
        if self.config.guards.dry_run:
            return False
        profile = self.config.serving.safe_profile
        busy = self.recovering(lambda w: w.conduct.incident_id != incident_id)
        # A freeze's recovery, not a wedged GPU's rung, whose restart is its cure.
        others = self.not_mine() if kind == "host_frozen" else None
        now = serving_after_recovery(busy, for_incident=incident_id is not None, not_mine=others)
        self.profile = profile
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(self.ledger.store.set_setting, PROFILE_SETTING, profile, by=BY)
        if now.step is not Step.RESTART_SERVING and incident_id is not None:
            await incident_log.step(
                self.ledger,
                incident_id,
                StepName.SERVING_RESTART_DEFERRED,
                detail={"waiting_for": busy} if others is None else {"not_mine": others},
            )
            return True
        return await self._restart(profile, incident_id, reason, kind)

    async def sync_profile(self) -> None:
        """The profile in force as the history has it: a person may pick one
        (``serving profile P``) or restart serving with one (``serving
        restart``) while the controller runs, and its status and page then
        show that one, not the one it read at its start."""
        try:
            setting = await self.ledger.read(self.ledger.store.setting, PROFILE_SETTING)
        except HistoryUnwritable:
            return  # as it was; the next tick reads again
        if setting is not None:
            self.profile = setting.value

    def recovering(self, among: Callable[[NodeWatch], bool]) -> list[str]:
        """The nodes (of those ``among`` takes) frozen or being fenced or booted:
        serving restarts once their recovery ends, with its own restart."""
        return [
            w.name
            for w in self.watches.values()
            if among(w)
            and (
                w.state in (NodeState.FENCING, NodeState.BOOTING)
                or w.finding.verdict is Verdict.HOST_FROZEN
            )
        ]

    def held_down(self, among: Callable[[NodeWatch], bool]) -> list[str]:
        """The nodes (of those ``among`` takes) held for a person and not
        healthy: every rank restarts together, so serving cannot come back
        without them; it restarts once a person releases them and they answer."""
        return [
            w.name
            for w in self.watches.values()
            if among(w) and w.state is NodeState.HELD and w.finding.verdict is not Verdict.HEALTHY
        ]

    def _heard(self, node: str) -> None:
        """A node's agent answered a serving request: a sign of life."""
        watch = self.watches.get(node)
        if watch is not None:
            watch.note_heard(self.clock.monotonic())

    def _layout(self) -> tuple[ServingNode, list[ServingNode]] | None:
        config = self.config
        head = config.serving.head
        if head is None or config.serving.token_file is None:
            return None
        nodes = [ServingNode(n.name, n.agent) for n in config.nodes]
        head_node = next(n for n in nodes if n.name == head)
        return head_node, [n for n in nodes if n.name != head]

    async def _restart(self, profile: str, incident_id: int | None, reason: str, kind: str) -> bool:
        ledger = self.ledger
        layout = self._layout()
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
        record = await ledger.write(
            ledger.store.start_serving_restart, profile, incident_id=incident_id
        )
        answer_kills_before(self.watches.values(), record.started_at)
        if kind in SERVING_FAULT_KINDS:
            self.budget.recorded(record.id)
        if incident_id is not None:
            await incident_log.step(
                ledger,
                incident_id,
                StepName.SERVING_RESTART_STARTED,
                detail={"profile": profile, "reason": reason},
            )
        self.io.fence.check_leading()
        report = await self.io.serving(
            head, workers, token, self.config.serving.start_timeout, profile, self._heard
        )
        self._last_restart = self.clock.monotonic()
        await self._record_report(record.id, incident_id, report)
        return self._announce(profile, report)

    async def _record_report(
        self, restart_id: int, incident_id: int | None, report: ServingRestartReport
    ) -> None:
        """The restart's outcome in the history: the restart's row, and the
        incident's steps (stacks taken, the result)."""
        ledger = self.ledger
        if incident_id is not None and report.stacks:
            await incident_log.step(
                ledger,
                incident_id,
                StepName.STACKS_RECORDED,
                detail={"nodes": report.stacks},
            )
        await ledger.write(
            ledger.store.finish_serving_restart,
            restart_id,
            report.result,
            step_durations=report.step_durations,
            error=report.error,
        )
        if incident_id is not None:
            await incident_log.step(
                ledger,
                incident_id,
                StepName.SERVING_RESTART_DONE,
                detail={"result": report.result, "error": report.error}
                | ({"note": report.note} if report.note else {})
                | ({"launcher": report.launcher} if report.launcher else {}),
            )

    def _announce(self, profile: str, report: ServingRestartReport) -> bool:
        """Tell how the restart went; True when serving came back."""
        notifier = self.notifier
        total = sum(report.step_durations.values())
        if report.result == "succeeded":
            notifier.send(
                Event(
                    "serving_restarted",
                    f"serving restarted with profile {profile} in {total:.1f}s"
                    + (f"; {report.note}" if report.note else ""),
                )
            )
            return True
        notifier.send(
            Event("serving_restart_failed", f"serving restart ({profile}): {report.error}")
        )
        return False

    def running(self) -> bool:
        """A serving restart for a fault is under way."""
        return self.task is not None and not self.task.done()

    def cooling(self, now: float) -> bool:
        """Within serving.restart_cooldown of the last restart."""
        return now - self._last_restart < self.config.serving.restart_cooldown

    def tell_no_auto_restart(self, watch: NodeWatch) -> None:
        """A kill with serving.auto_restart off: told once, then not news any
        more: a person restarts serving."""
        answer_kill(watch)
        self.notifier.send(
            Event(
                watch.finding.verdict.value,
                f"{watch.name} {watch.finding.summary}; serving.auto_restart is off: "
                "restart serving by hand (spark-watchdog serving restart)",
                watch.name,
            )
        )

    def start(self, watch: NodeWatch) -> None:
        """A serving fault on the node: open its incident and restart serving in
        the background (controller/decide/decisions.py decided that it may, now)."""
        self.task = asyncio.get_running_loop().create_task(self._fault_incident(watch))

    def _evidence(self, watch: NodeWatch) -> tuple[dict[str, Any], float | None]:
        """What a serving fault's incident records, and when the fault began."""
        finding = watch.finding
        # The fault began when vLLM last progressed, not when the agent last answered.
        onset = watch.serving_fault_onset(self.clock.time())
        evidence: dict[str, Any] = {
            "reasons": list(finding.reasons),
            "agent_state": watch.snapshot,
            "flight_recorder": self.recorder.evidence(watch.name),
        }
        kills = watch.kills_of(finding.verdict)
        kill = None if kills is None else kills.pending
        if kill is not None:
            evidence[KILL_EVIDENCE[finding.verdict]] = kill
            # The rank died when the guard killed it, or when the GPU fault ended it.
            at = kill.get("at_unix")
            onset = float(at) if isinstance(at, (int, float)) else onset
        return evidence, onset

    async def _fault_incident(self, watch: NodeWatch) -> bool:
        ledger, finding = self.ledger, watch.finding
        kind = finding.verdict.value
        kills = watch.kills_of(finding.verdict)
        evidence, onset = self._evidence(watch)
        try:
            incident = await open_incident(self, kind, watch, evidence, onset)
        except HistoryUnwritable as exc:
            # Nothing restarts unrecorded; the fault is still there at the next tick.
            log.warning(
                "%s: %s incident not opened, serving not restarted: %s", watch.name, kind, exc
            )
            return False
        if incident is None:
            return False
        if kills is not None:
            kills.answer()
        self.notifier.send(
            Event("incident_opened", f"{watch.name} {finding.summary}", watch.name, incident.id)
        )
        if self.config.guards.dry_run:
            watch.conduct.dry_run_recorded(incident.id, Step.RESTART_SERVING)  # once a spell
            await close_dry_run(ledger, incident.id, "restart serving")
            return False
        try:
            ok = await self.restart_after(incident.id, finding.summary, kind=kind)
            await incident_log.resolve(
                ledger,
                incident.id,
                Resolution.RECOVERED if ok else Resolution.GAVE_UP,
                detail={"profile": self.profile},
            )
        except HistoryUnwritable as exc:
            # What could not be recorded did not happen; the incident stays open
            # for the next controller start to close (resume).
            log.warning("%s: incident #%d stopped: %s", watch.name, incident.id, exc)
            return False
        return ok

    def tell_guard_failed(self, watch: NodeWatch) -> None:
        """A guard trip that killed nothing: an alert, not a cluster restart."""
        kill = watch.guard_kill or {}
        watch.answer_guard_kill()
        self.notifier.send(
            Event(
                "memory_guard_failed",
                f"{watch.name}: the memory guard tripped and {kill.get('result')}: "
                f"{'; '.join(map(str, kill.get('reasons') or []))}; look at the node now",
                watch.name,
            )
        )
