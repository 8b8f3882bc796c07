"""The detector: observations of one node plus time in, a verdict with reasons out.

Pure: no I/O, no clock of its own. DESIGN §3/§4: ping is not evidence of
health, ``/health`` 200 is not evidence of progress, and a host is only
``host_frozen`` when *all* of these hold:

- its agent has been silent (no answer with an advancing ``seq``) for at
  least ``freeze_after``;
- its SSH banner was missing on at least ``banner_misses`` consecutive checks
  (a frozen GB10 completes the TCP handshake in the kernel but userland sends
  no banner: NVIDIA/dgx-spark-playbooks #97);
- the controller's own witness targets answer (otherwise the fault is more
  likely on the controller's side: fencing would hit healthy nodes).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class Verdict(enum.Enum):
    HEALTHY = "healthy"
    # Watching, not yet sure of anything (just started, or one missed banner).
    PENDING = "pending"
    SERVING_STALLED = "serving_stalled"
    SERVING_DEAD = "serving_dead"
    AGENT_DOWN = "agent_down"
    HOST_FROZEN = "host_frozen"
    # The node looks frozen but the controller cannot reach its own witness.
    ISOLATED = "isolated"


# Host-level trouble (as opposed to serving trouble, which one frozen rank
# spreads to every node of a TP=4 cluster): what the circuit breaker counts.
HOST_TROUBLE = frozenset({Verdict.AGENT_DOWN, Verdict.HOST_FROZEN, Verdict.ISOLATED})


@dataclass(frozen=True)
class DetectionPolicy:
    freeze_after: float = 8.0
    banner_misses: int = 2


@dataclass(frozen=True)
class NodeObservation:
    """What the controller knows about one node at ``now`` (monotonic seconds)."""

    now: float
    watch_started_at: float
    # Last time the agent answered with a seq that advanced (or a new boot).
    agent_progress_at: float | None
    snapshot: Mapping[str, Any] | None
    # Consecutive SSH banner checks that found no banner; 0 after a good one.
    banner_misses: int
    witness_ok: bool
    # Whether this node's vLLM state decides serving verdicts (the head rank).
    judges_serving: bool = True
    # When the SSH banner last answered (monotonic), if ever.
    banner_ok_at: float | None = None

    @property
    def agent_silent_s(self) -> float:
        since = self.agent_progress_at
        return self.now - (self.watch_started_at if since is None else since)


@dataclass(frozen=True)
class Finding:
    verdict: Verdict
    reasons: tuple[str, ...]

    @property
    def summary(self) -> str:
        return (
            f"{self.verdict.value} ({', '.join(self.reasons)})"
            if self.reasons
            else (self.verdict.value)
        )


def classify(obs: NodeObservation, policy: DetectionPolicy) -> Finding:
    silent = obs.agent_silent_s
    if silent >= policy.freeze_after:
        silence = f"agent silent {silent:.1f}s"
        if obs.banner_misses >= policy.banner_misses:
            banner = f"no ssh banner x{obs.banner_misses}"
            if not obs.witness_ok:
                return Finding(
                    Verdict.ISOLATED, (silence, banner, "witness unreachable: no fencing")
                )
            return Finding(Verdict.HOST_FROZEN, (silence, banner))
        since = obs.watch_started_at if obs.agent_progress_at is None else obs.agent_progress_at
        if obs.banner_misses == 0 and obs.banner_ok_at is not None and obs.banner_ok_at > since:
            # A banner from before the silence proves nothing about now.
            return Finding(Verdict.AGENT_DOWN, (silence, "ssh banner answers"))
        return Finding(Verdict.PENDING, (silence, f"no ssh banner x{obs.banner_misses}"))
    if obs.snapshot is None:
        return Finding(Verdict.PENDING, ("no answer from the agent yet",))
    if not obs.judges_serving:
        return Finding(Verdict.HEALTHY, ())
    vllm = _vllm(obs.snapshot)
    state = vllm.get("state")
    if state == "stalled":
        reason = str(vllm.get("reason") or "requests running, no progress")
        return Finding(Verdict.SERVING_STALLED, (reason,))
    if state == "dead":
        reason = str(vllm.get("reason") or "/health 503 or the rank's process gone")
        return Finding(Verdict.SERVING_DEAD, (reason,))
    return Finding(Verdict.HEALTHY, ())


def _vllm(snapshot: Mapping[str, Any]) -> Mapping[str, Any]:
    probes = snapshot.get("probes")
    if isinstance(probes, Mapping):
        vllm = probes.get("vllm")
        if isinstance(vllm, Mapping):
            return vllm
    return {}
