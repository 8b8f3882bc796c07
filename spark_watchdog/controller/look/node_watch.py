"""What the controller remembers about one node between polls.

Times are the controller's monotonic clock, except ``*_wall`` (for the
history). Evidence of life (any HTTP answer from the agent, any SSH answer,
refusal or close) is kept apart from evidence of progress (an advancing
``seq``): only the absence of both counts toward a freeze.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.decide.detector import (
    Finding,
    NodeObservation,
    Verdict,
    serving_died_at,
    vllm_status,
)
from spark_watchdog.controller.decide.node_states import (
    Doing,
    Held,
    HeldBy,
    NodeEvent,
    NodeState,
    Unlatching,
    Unwedging,
    Watching,
    enter,
)
from spark_watchdog.controller.look.http_client import ANSWERED, NO_NETWORK, UNRESOLVABLE
from spark_watchdog.controller.look.intake import take_state
from spark_watchdog.controller.look.node_conduct import NodeConduct
from spark_watchdog.controller.look.peer_evidence import Sighting
from spark_watchdog.controller.look.rank_kills import ReportedKills, note_kills

# Silence: what a frozen host (the kernel completes the handshake, userland is
# silent) or a powered-off one (nothing answers on the segment) looks like.
SILENT_BANNER_OUTCOMES = frozenset({"no_banner", "connect_timeout", "unreachable"})
# A live kernel answered: sshd refused, closed, or sent something.
LIVE_BANNER_OUTCOMES = frozenset({"banner", "refused", "closed", "garbage"})
# The controller could not look at all.
BLIND_BANNER_OUTCOMES = frozenset({"unresolvable", "no_network"})
_BLIND_AGENT_FAILURES = (UNRESOLVABLE, NO_NETWORK)


@dataclass
class NodeWatch:
    config: NodeConfig
    watch_started_at: float  # monotonic
    # Agent silence after which it is late (banner checks, refusals mean going down).
    late_after: float = 2.0
    # What the controller is doing about the node (controller/decide/node_states.py):
    # changed only through ``apply``; everything else here is what it sees.
    doing: Doing = field(default_factory=Watching)
    finding: Finding = field(default_factory=lambda: Finding(Verdict.PENDING, ("starting",)))
    # Agent
    snapshot: dict[str, Any] | None = None  # as taken (controller/look/intake.py)
    intake_dropped: tuple[str, ...] = ()  # what the intake left out of it, and why
    seq: int | None = None
    boot_id: str | None = None
    agent_started_at: str | None = None
    agent_progress_at: float | None = None  # last answer with seq advancing
    agent_progress_wall: float | None = None  # same instant, wall clock (for the history)
    agent_answer_at: float | None = None  # last HTTP answer of any kind
    snapshot_at: float | None = None  # when ``snapshot`` came
    agent_error: str | None = None
    agent_blind: str | None = None  # the agent's name does not resolve, or no network
    # SSH banner
    banner_misses: int = 0
    banner_checked_at: float | None = None
    banner_detail: str | None = None
    banner_ok_at: float | None = None
    ssh_alive_at: float | None = None  # last banner, refusal, close or garbage
    # The last answer from the node's agent to anything else the controller
    # asked it (a serving restart's requests): life, though not the agent's loop.
    heard_at: float | None = None
    # The freshest sighting by a peer over its own path (controller/look/peer_evidence.py).
    peer_seen: Sighting | None = None
    banner_blind: str | None = None
    # Handshake proven on the last miss (no_banner): the path to the host works.
    banner_reachable: bool = False
    # An orderly shutdown seen since the agent's last progress.
    going_down_at: float | None = None
    going_down_why: str | None = None
    # A reboot the controller itself asked for (a forced reboot): the node is going
    # down until a new boot id, whatever its agent says before it drops.
    reboot_expected: bool = False
    # What the controller has done about the node (controller/look/node_conduct.py).
    conduct: NodeConduct = field(default_factory=NodeConduct)
    # Kills of the rank the agent reported (controller/look/rank_kills.py): by its
    # memory guard, and by the agent after a GPU fault that ended its CUDA context.
    memory_kills: ReportedKills = field(default_factory=ReportedKills)
    gpu_kills: ReportedKills = field(default_factory=ReportedKills)
    # Since when (monotonic, and wall clock) the agent's GPU probe reports timeouts.
    gpu_timeout_since: float | None = None
    gpu_timeout_wall: float | None = None
    # The boot whose GPU the agent found clock-latched (its post-boot check).
    clock_latched_boot: str | None = None
    # The off hold of the node's next power cycle, when not power_off_seconds: a
    # clock latch's long cut (controller/act/unlatch.py), for the boot that was (or
    # may have been) halted. Dropped when the agent reports any other boot.
    off_seconds_override: float | None = None
    halted_boot: str | None = None
    # Plain reads: the config's name (never changes), the kind of ``doing`` (set in apply).
    name: str = field(init=False)
    state: NodeState = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.config.name
        self.state = self.doing.kind

    @property
    def last_life_at(self) -> float | None:
        """The last evidence of a live host: any agent answer, any SSH answer, or
        a peer that saw its agent advance."""
        peer = None if self.peer_seen is None else self.peer_seen.at
        answers = (self.agent_answer_at, self.ssh_alive_at, self.heard_at, peer)
        times = [t for t in answers if t is not None]
        return max(times) if times else None

    def note_sighting(self, sighting: Sighting | None) -> None:
        """A peer's sighting, kept while none fresher comes."""
        if sighting is not None and (self.peer_seen is None or sighting.at > self.peer_seen.at):
            self.peer_seen = sighting

    def note_heard(self, now: float) -> None:
        """The node's agent answered a request other than the state poll."""
        self.heard_at = now

    def note_http_answer(self, status: int, body: bytes, now: float, wall: float) -> bool:
        """Take the agent's HTTP answer to ``/v1/state``; True when it shows progress.

        Any answer is life. Only a 200 whose body is a JSON object is a
        snapshot; anything else the agent (or whatever listens on its port)
        sends is noted as an error, never raised.
        """
        snapshot: Any = None
        problem = f"/v1/state answered {status}"
        if status == 200:
            try:
                snapshot = json.loads(body)
            except (ValueError, UnicodeDecodeError) as exc:
                problem = f"/v1/state answered 200 with a body that is not JSON ({exc})"
            except RecursionError:
                problem = "/v1/state answered 200 with JSON nested too deeply"
            else:
                if not isinstance(snapshot, dict):
                    problem = (
                        f"/v1/state answered 200 with JSON {type(snapshot).__name__}; "
                        "expected an object"
                    )
        if isinstance(snapshot, dict):
            return self.note_answer(snapshot, now, wall)
        self.note_answer_error(ANSWERED, problem, now)
        return False

    def serving_fault_onset(self, wall: float) -> float | None:
        """When serving last progressed (wall clock), from the last snapshot.

        The rank's time of death when the agent reports one within bounds
        (detector.serving_died_at); else the agent's
        ``probes.vllm.seconds_without_progress`` when it is a finite number of
        seconds ≥ 0, else the agent's last progress.
        """
        died = serving_died_at(self.snapshot or {}, wall)
        if died is not None:
            return died
        quiet = vllm_status(self.snapshot or {}).get("seconds_without_progress")
        if isinstance(quiet, (int, float)) and not isinstance(quiet, bool):
            try:
                seconds = float(quiet)
            except OverflowError:  # an integer beyond any float
                return self.agent_progress_wall
            if math.isfinite(seconds) and seconds >= 0:
                return wall - seconds
        return self.agent_progress_wall

    def note_answer(self, snapshot: dict[str, Any], now: float, wall: float) -> bool:
        """Take a well-formed agent answer; True when it shows progress.

        Progress: ``seq`` advanced, or a new boot id or agent start (a new
        agent counts from its own ``seq``). An answer without progress is
        still proof of a live userland. Everything in it is read as the
        intake took it (controller/look/intake.py).
        """
        taken = take_state(snapshot, wall)
        snapshot, self.intake_dropped = taken.state, taken.dropped
        seq = snapshot.get("seq")
        boot_id = snapshot.get("boot_id")
        started = snapshot.get("started_at")
        self.agent_answer_at = self.snapshot_at = now
        self.agent_blind = None
        self.agent_error = None
        well_formed = isinstance(seq, int) and not isinstance(seq, bool)
        new_boot = isinstance(boot_id, str) and boot_id != self.boot_id
        new_agent = new_boot or started != self.agent_started_at
        progressed = well_formed and (
            self.seq is None
            or new_boot
            or started != self.agent_started_at
            or (isinstance(seq, int) and seq > self.seq)
        )
        self.snapshot = snapshot
        if well_formed:
            self.seq = seq
            self.agent_started_at = started if isinstance(started, str) else None
        if isinstance(boot_id, str):
            self.boot_id = boot_id
        if isinstance(boot_id, str) and self.halted_boot not in (None, boot_id):
            self.arm_long_cut(None, None)  # the halted boot is over
        note_kills(self.memory_kills, self.gpu_kills, snapshot, self.agent_started_at, wall)
        self._note_gpu(snapshot, now, wall, new_agent)
        self._note_clock(snapshot)
        if progressed:
            self.agent_progress_at = now
            self.agent_progress_wall = wall
        stopping = snapshot.get("stopping")
        if isinstance(stopping, dict) and stopping.get("system") is True:
            if self.going_down_at is None:
                self.going_down_at = now
                self.going_down_why = "the agent said the system is shutting down"
        elif new_boot or (progressed and not self.reboot_expected):
            self.going_down_at = None
            self.going_down_why = None
            self.reboot_expected = False
        return progressed

    @property
    def guard_kill(self) -> dict[str, Any] | None:
        """The memory guard kill reported and not answered yet."""
        return self.memory_kills.pending

    @property
    def gpu_fault(self) -> dict[str, Any] | None:
        """The GPU fault that ended the rank's context, reported and not answered yet."""
        return self.gpu_kills.pending

    def kills_of(self, verdict: Verdict) -> ReportedKills | None:
        """The kills a verdict answers: memory_exhausted the guard's, gpu_fault the GPU's."""
        if verdict is Verdict.MEMORY_EXHAUSTED:
            return self.memory_kills
        if verdict is Verdict.GPU_FAULT:
            return self.gpu_kills
        return None

    def arm_long_cut(self, seconds: float | None, boot: str | None) -> None:
        """The next cut of this node holds ``seconds`` off, while it runs ``boot``."""
        self.off_seconds_override = seconds
        self.halted_boot = boot if seconds is not None else None

    def _note_clock(self, snapshot: dict[str, Any]) -> None:
        check = snapshot.get("gpu_clock_check")
        latched = isinstance(check, dict) and check.get("state") == "latched"
        self.clock_latched_boot = self.boot_id if latched else None

    def _note_gpu(self, snapshot: dict[str, Any], now: float, wall: float, new_agent: bool) -> None:
        probes = snapshot.get("probes")
        gpu = probes.get("gpu") if isinstance(probes, dict) else None
        timing_out = isinstance(gpu, dict) and gpu.get("state") == "timeout"
        if not timing_out or new_agent:
            self.gpu_timeout_since = self.gpu_timeout_wall = None
        if timing_out and self.gpu_timeout_since is None:
            self.gpu_timeout_since, self.gpu_timeout_wall = now, wall

    def answer_guard_kill(self) -> None:
        """The pending memory guard kill is taken care of (an incident, or a person)."""
        self.memory_kills.answer()

    def note_answer_error(self, kind: str, detail: str, now: float) -> None:
        """An agent poll that failed; an HTTP answer that was not usable is life all the same."""
        self.agent_error = detail
        if kind in _BLIND_AGENT_FAILURES:
            self.agent_blind = detail
        else:
            self.agent_blind = None
        if kind == "answered":
            self.agent_answer_at = now

    def note_banner(self, outcome: str, detail: str, now: float) -> None:
        """Count a banner check. Only silence counts as a miss.

        A frozen host's kernel still completes the handshake while userland
        sends nothing (``no_banner``), or, powered off, answers nothing at all
        (``connect_timeout``, ``unreachable``). A refused or closed connection
        or a garbled line comes from a live kernel: it clears the misses, and
        after the agent's last progress it means the host is going down
        (sshd stops before the reboot). A name that does not resolve or the
        controller's own dead network says nothing about the host.
        """
        # banner_checked_at stays the check's start (set by the controller): a
        # late agent gets one check every LATE_BANNER_INTERVAL_S, start to start.
        self.banner_detail = detail
        if outcome in BLIND_BANNER_OUTCOMES:
            self.banner_blind = detail
            return
        self.banner_blind = None
        if outcome == "banner":
            self.banner_ok_at = now
        if outcome in LIVE_BANNER_OUTCOMES:
            self.banner_misses = 0
            self.banner_reachable = False
            self.ssh_alive_at = now
            if outcome != "banner" and self._agent_late(now) and self.going_down_at is None:
                self.going_down_at = now
                self.going_down_why = f"ssh {outcome} after the agent's last progress"
        elif outcome in SILENT_BANNER_OUTCOMES:
            self.banner_misses += 1
            self.banner_reachable = outcome == "no_banner"

    def expect_reboot(self, why: str | None, now: float) -> None:
        """From ``now`` the node's silence is a reboot for boot_timeout (None: no longer)."""
        self.going_down_at = None if why is None else now
        self.going_down_why = why
        self.reboot_expected = why is not None

    def expire_expected_reboot(self, now: float, boot_timeout: float) -> None:
        """A reboot the controller asked for that did not come within boot_timeout
        while the agent kept answering is not expected any more: a later planned
        reboot is then judged on its own signs, from its own start."""
        since = self.going_down_at
        if not self.reboot_expected or since is None:
            return
        answering = self.agent_progress_at is not None and self.agent_progress_at > since
        if answering and now - since >= boot_timeout:
            self.expect_reboot(None, now)

    def booted_since(self, before: str | None) -> bool:
        """The agent answered with a boot id, and not ``before``'s."""
        return self.boot_id is not None and self.boot_id != before

    def shows_life(self, now: float, freeze_after: float) -> bool:
        """An answer of any kind (agent, SSH) within ``freeze_after``."""
        last = self.last_life_at
        return last is not None and now - last < freeze_after

    def gpu_answers(self) -> bool:
        """The latest snapshot has a GPU reading that did not time out."""
        probes = (self.snapshot or {}).get("probes")
        gpu = probes.get("gpu") if isinstance(probes, dict) else None
        state = gpu.get("state") if isinstance(gpu, dict) else None
        return isinstance(state, str) and state not in ("timeout", "pending")

    def _agent_late(self, now: float) -> bool:
        # The agent has not progressed for a few polls: an sshd that refuses
        # while the agent still reports is a healthy host turning a poller away
        # (OpenSSH's PerSourcePenalties), not a reboot.
        return self.agent_silent_s(now) >= self.late_after

    def observation(self, now: float, witness_ok: bool, judges_serving: bool) -> NodeObservation:
        since = self.gpu_timeout_since
        return NodeObservation(
            now=now,
            watch_started_at=self.watch_started_at,
            agent_progress_at=self.agent_progress_at,
            snapshot=self.snapshot,
            banner_misses=self.banner_misses,
            witness_ok=witness_ok,
            judges_serving=judges_serving,
            banner_ok_at=self.banner_ok_at,
            agent_answer_at=self.agent_answer_at,
            ssh_alive_at=self.ssh_alive_at,
            heard_at=self.heard_at,
            peer_seen_at=None if self.peer_seen is None else self.peer_seen.at,
            peer_seen=None if self.peer_seen is None else self.peer_seen.describe(now),
            going_down_at=self.going_down_at,
            going_down_why=self.going_down_why,
            unobservable=self.agent_blind or self.banner_blind,
            guard_kill=self.guard_kill,
            gpu_fault=self.gpu_fault,
            gpu_timeout_for=None if since is None else now - since,
        )

    @property
    def held_reason(self) -> str | None:
        return self.doing.reason if isinstance(self.doing, Held) else None

    def apply(
        self,
        event: NodeEvent,
        *,
        rung: int | None = None,
        incident: int | None = None,
        reason: str | None = None,
        by: HeldBy = HeldBy.CONTROLLER,
    ) -> NodeState:
        """Every state change goes through the table in node_states.

        :raises InvalidTransition: the table has no such change, or the new
            state lacks what it carries.
        """
        self.doing = enter(self.doing, event, rung=rung, incident=incident, reason=reason, by=by)
        self.state = self.doing.kind
        return self.state

    def leave_ladder(self, incident: int, event: NodeEvent = NodeEvent.LADDER_ENDED) -> None:
        """The gentler ladder of ``incident`` ended (``LADDER_ENDED``) or gave
        a silent host to the freeze path (``HANDED_TO_POWER``): the node is
        watched again, if that ladder still has it (a hold took it already)."""
        doing = self.doing
        if isinstance(doing, (Unwedging, Unlatching)) and doing.incident == incident:
            self.apply(event)

    @property
    def verdict(self) -> str:
        """The verdict as docs/design.md names it, state first."""
        if self.state is NodeState.HELD:
            return "held"
        if self.state is NodeState.BOOTING:
            return "booting"
        if self.state is NodeState.FENCING:
            return "host_frozen"
        return self.finding.verdict.value

    def agent_silent_s(self, now: float) -> float:
        since = self.agent_progress_at
        return now - (self.watch_started_at if since is None else since)


def doing_json(doing: Doing) -> dict[str, Any]:
    """The state and what it carries, for ``/v1/status``."""
    out: dict[str, Any] = {"state": doing.kind.value}
    out.update({k: (v.value if isinstance(v, HeldBy) else v) for k, v in vars(doing).items()})
    return out


def watch_json(watch: NodeWatch, now: float) -> dict[str, Any]:
    """One node in ``/v1/status`` (docs/api/controller.openapi.yaml)."""
    seen = watch.peer_seen
    return {
        "name": watch.name,
        "verdict": watch.verdict,
        "state": watch.state.value,
        "doing": doing_json(watch.doing),
        "reasons": list(watch.finding.reasons),
        "boot_id": watch.boot_id,
        "seq": watch.seq,
        "agent_silent_s": round(watch.agent_silent_s(now), 2),
        "agent_error": watch.agent_error,
        "banner_misses": watch.banner_misses,
        "banner": watch.banner_detail,
        "incident_id": watch.conduct.incident_id,
        "held_reason": watch.held_reason,
        "peer_seen": None
        if seen is None
        else {
            "by": seen.reporter,
            "via": seen.via,
            "kind": seen.kind,
            "ago_s": round(max(0.0, now - seen.at), 2),
        },
        "freezes_in_window": watch.conduct.freezes_in_window,
        "hardware_suspect": watch.conduct.hardware_suspect,
        "power_cycles_total": watch.conduct.power_cycles_total,
        "gpu_clock_latched": watch.clock_latched_boot is not None,
    }
