"""What the controller remembers about one node between polls."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.detector import Finding, NodeObservation, Verdict
from spark_watchdog.controller.node_states import NodeEvent, NodeState, transition

SILENT_BANNER_OUTCOMES = frozenset({"no_banner", "connect_timeout", "unreachable"})


@dataclass
class NodeWatch:
    config: NodeConfig
    watch_started_at: float  # monotonic
    state: NodeState = NodeState.WATCHING
    finding: Finding = field(default_factory=lambda: Finding(Verdict.PENDING, ("starting",)))
    # Agent
    snapshot: dict[str, Any] | None = None
    seq: int | None = None
    boot_id: str | None = None
    agent_started_at: str | None = None
    agent_progress_at: float | None = None  # monotonic; last answer with seq advancing
    agent_progress_wall: float | None = None  # same instant, wall clock (for the history)
    agent_error: str | None = None
    # SSH banner
    banner_misses: int = 0
    banner_checked_at: float | None = None
    banner_detail: str | None = None
    banner_ok_at: float | None = None
    # Incident
    incident_id: int | None = None
    rungs_done: set[int] = field(default_factory=set)
    dry_run_incident: int | None = None
    last_agent_restart: float = float("-inf")
    held_reason: str | None = None

    @property
    def name(self) -> str:
        return self.config.name

    def note_answer(self, snapshot: dict[str, Any], now: float) -> bool:
        """Take an agent answer; True when it shows progress (seq advanced or new boot)."""
        seq = snapshot.get("seq")
        boot_id = snapshot.get("boot_id")
        started = snapshot.get("started_at")
        progressed = (
            self.seq is None
            or not isinstance(seq, int)
            or boot_id != self.boot_id
            or started != self.agent_started_at
            or seq > self.seq
        )
        self.snapshot = snapshot
        self.agent_error = None
        if isinstance(seq, int):
            self.seq = seq
        self.agent_started_at = started if isinstance(started, str) else None
        if isinstance(boot_id, str):
            self.boot_id = boot_id
        if progressed:
            self.agent_progress_at = now
            self.agent_progress_wall = time.time()
        return progressed

    def note_banner(self, outcome: str, detail: str, now: float) -> None:
        """Count a banner check. Only silence counts as a miss.

        A frozen host's kernel still completes the handshake while userland
        sends nothing (``no_banner``), or, powered off, answers nothing at all
        (``connect_timeout``, ``unreachable``). A refused or closed connection
        or a garbled line comes from a live host (sshd gone, or OpenSSH's
        PerSourcePenalties turning a frequent poller away): never evidence of
        a freeze, so it neither adds a miss nor clears one.
        """
        # banner_checked_at stays the check's start (set by the controller): a
        # late agent gets one check every LATE_BANNER_INTERVAL_S, start to start.
        self.banner_detail = detail
        if outcome == "banner":
            self.banner_misses = 0
            self.banner_ok_at = now
        elif outcome in SILENT_BANNER_OUTCOMES:
            self.banner_misses += 1

    def observation(self, now: float, witness_ok: bool, judges_serving: bool) -> NodeObservation:
        return NodeObservation(
            now=now,
            watch_started_at=self.watch_started_at,
            agent_progress_at=self.agent_progress_at,
            snapshot=self.snapshot,
            banner_misses=self.banner_misses,
            witness_ok=witness_ok,
            judges_serving=judges_serving,
            banner_ok_at=self.banner_ok_at,
        )

    def apply(self, event: NodeEvent) -> NodeState:
        self.state = transition(self.state, event)
        return self.state

    @property
    def verdict(self) -> str:
        """The verdict as DESIGN §4 names it, state first."""
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

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "state": self.state.value,
            "reasons": list(self.finding.reasons),
            "boot_id": self.boot_id,
            "seq": self.seq,
            "agent_silent_s": round(self.agent_silent_s(now), 2),
            "agent_error": self.agent_error,
            "banner_misses": self.banner_misses,
            "banner": self.banner_detail,
            "incident_id": self.incident_id,
            "held_reason": self.held_reason,
        }
