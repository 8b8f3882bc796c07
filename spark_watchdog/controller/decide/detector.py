"""The detector: observations of one node plus time in, a verdict with reasons out.

Pure: no I/O, no clock of its own (docs/design.md, "Signals" and
"Verdicts"). Ping is not evidence of health, ``/health`` 200 is not evidence
of progress, and evidence of life beats evidence of silence. A host is only
``host_frozen`` when *all* of these hold:

- its agent has made no progress (no answer with an advancing ``seq``) for
  at least ``freeze_after``, and gave no HTTP answer at all in that time (an
  answer with a stuck ``seq`` proves userland alive: ``agent_down``);
- its SSH port gave no answer in that time (a banner, a refusal or a close
  all come from a live kernel), and the banner was missing on at least
  ``banner_misses`` consecutive checks (a frozen GB10 completes the TCP
  handshake in the kernel but userland sends no banner);
- it is not going down in an orderly way: the agent said the system is
  stopping, or SSH refused after the agent's last progress (a reboot), in
  which case it is ``rebooting`` for up to ``boot_timeout``;
- no peer that the controller reads as alive saw its agent advance over
  its own path within ``freeze_after`` (else ``unreachable``: the path from
  the controller is broken, not the host);
- the controller can look: the names resolve and its own network is up
  (else ``unobservable``), and its witness targets answer (else ``isolated``).

A node whose agent answers and reports a kill by its memory guard that the
controller has not answered yet is ``memory_exhausted``, on any node, head
or not: the rank is gone and the cluster needs a serving restart with the
safe profile (docs/design.md, "Memory guard"). A node whose agent answers
while its GPU reads have timed out for ``gpu_wedged_after`` is
``gpu_wedged``: a wedged driver on a live host, for the wedged-but-alive
ladder, never the power path directly (docs/design.md, "Wedged but alive").
A node whose agent reports a GPU fault that ended its rank's CUDA context
(an Xid of spark_watchdog/xid.py), not answered yet, is ``gpu_fault``: a
serving restart with the safe profile, as after a memory guard kill
(docs/design.md, "Live GPU faults").
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from spark_watchdog.verdicts import VerdictRow
from spark_watchdog.verdicts import row as verdict_row
from spark_watchdog.xid import describe


class Verdict(enum.Enum):
    """The detector's verdicts; what each means and what follows is its row
    in spark_watchdog/verdicts.py (a test checks the two name the same)."""

    HEALTHY = "healthy"
    # Watching, not yet sure of anything (just started, or one missed banner).
    PENDING = "pending"
    SERVING_STALLED = "serving_stalled"
    SERVING_DEAD = "serving_dead"
    # The agent's memory guard killed the rank: serving restarts with the safe profile.
    MEMORY_EXHAUSTED = "memory_exhausted"
    # The agent answers, its GPU reads time out: a wedged driver on a live host.
    GPU_WEDGED = "gpu_wedged"
    # A GPU fault (an Xid of spark_watchdog/xid.py) ended the rank's CUDA context:
    # serving restarts with the safe profile, as after a memory guard kill.
    GPU_FAULT = "gpu_fault"
    AGENT_DOWN = "agent_down"
    HOST_FROZEN = "host_frozen"
    # The node looks frozen but the controller cannot reach its own witness.
    ISOLATED = "isolated"
    # A live kernel going down: the agent said so, or SSH refused after its last progress.
    REBOOTING = "rebooting"
    # The controller cannot look: the name does not resolve, or its own network is down.
    UNOBSERVABLE = "unobservable"
    # Silent to the controller, alive to its peers over their own path: the
    # management path to it is broken (docs/design.md, "Peers"). Never fenced.
    UNREACHABLE = "unreachable"


def verdicts_where(keep: Callable[[VerdictRow], bool]) -> frozenset[Verdict]:
    """The verdicts whose row of the verdict table (spark_watchdog/verdicts.py)
    ``keep`` takes; KeyError, at import, for a verdict the table lacks."""
    return frozenset(v for v in Verdict if keep(verdict_row(v.value)))


@dataclass(frozen=True)
class DetectionPolicy:
    freeze_after: float = 8.0
    banner_misses: int = 2
    # How long a node going down may take to come back with a new boot id
    # before silence counts toward a freeze again.
    boot_timeout: float = 300.0
    gpu_wedged_after: float = 30.0

    @property
    def late_after(self) -> float:
        """Agent silence after which it is late: from then on an SSH or HTTP
        answer is news about the silence, not an echo of the host before it."""
        return min(2.0, self.freeze_after / 4)


@dataclass(frozen=True)
class NodeObservation:
    """What the controller knows about one node at ``now`` (monotonic seconds)."""

    now: float
    watch_started_at: float
    # Last time the agent answered with a seq that advanced (or a new boot).
    agent_progress_at: float | None
    snapshot: Mapping[str, Any] | None
    # Consecutive SSH banner checks that found no banner; 0 after any SSH answer.
    banner_misses: int
    witness_ok: bool
    # Whether this node's vLLM state decides serving verdicts (the head rank).
    judges_serving: bool = True
    # When the SSH banner last answered (monotonic), if ever.
    banner_ok_at: float | None = None
    # Last HTTP answer of any kind from the agent, progress or not (monotonic).
    agent_answer_at: float | None = None
    # Last SSH answer of any kind: banner, refusal, close, garbage (monotonic).
    ssh_alive_at: float | None = None
    # Last answer of the agent to anything else asked of it (a serving restart's).
    heard_at: float | None = None
    # When a peer the controller reads as alive last saw the node's agent advance
    # over its own path (controller/look/peer_evidence.py), and what it said.
    peer_seen_at: float | None = None
    peer_seen: str | None = None
    # Since when the node is going down in an orderly way, and why.
    going_down_at: float | None = None
    going_down_why: str | None = None
    # Why the controller cannot look at the node now, if it cannot.
    unobservable: str | None = None
    # A memory guard kill the agent reported and the controller has not answered yet.
    guard_kill: Mapping[str, Any] | None = None
    # A GPU fault that ended the rank's CUDA context, reported and not answered yet.
    gpu_fault: Mapping[str, Any] | None = None
    # For how long the agent's GPU reads have been timing out, if they are.
    gpu_timeout_for: float | None = None

    @property
    def agent_silent_s(self) -> float:
        since = self.agent_progress_at
        return self.now - (self.watch_started_at if since is None else since)

    def life_within(self, seconds: float) -> str | None:
        """Evidence of life in the last ``seconds``: what it was, or None."""
        if self.agent_answer_at is not None and self.now - self.agent_answer_at < seconds:
            return f"the agent answered {self.now - self.agent_answer_at:.1f}s ago"
        if self.ssh_alive_at is not None and self.now - self.ssh_alive_at < seconds:
            return f"ssh answered {self.now - self.ssh_alive_at:.1f}s ago"
        if self.heard_at is not None and self.now - self.heard_at < seconds:
            return f"the agent answered a serving request {self.now - self.heard_at:.1f}s ago"
        return None

    def seen_by_peers_within(self, seconds: float) -> str | None:
        """A peer saw the agent advance in the last ``seconds``: what it said, or None."""
        if self.peer_seen_at is not None and self.now - self.peer_seen_at < seconds:
            return self.peer_seen or "a peer saw its agent advance"
        return None


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
    if obs.going_down_at is not None and obs.now - obs.going_down_at < policy.boot_timeout:
        why = obs.going_down_why or "going down"
        return Finding(
            Verdict.REBOOTING, (why, f"waiting up to {policy.boot_timeout:g}s for a new boot")
        )
    silent = obs.agent_silent_s
    if silent >= policy.freeze_after:
        return _silent(obs, policy, f"agent silent {silent:.1f}s")
    if obs.snapshot is None:
        return Finding(Verdict.PENDING, ("no answer from the agent yet",))
    if obs.guard_kill is not None and obs.guard_kill.get("result") == "killed":
        reasons = obs.guard_kill.get("reasons")
        why = "; ".join(str(r) for r in reasons) if isinstance(reasons, list) else ""
        result = obs.guard_kill.get("result")
        return Finding(
            Verdict.MEMORY_EXHAUSTED,
            (f"memory guard: {result}", why or "the host was running out of memory"),
        )
    if obs.gpu_fault is not None:
        return _gpu_fault(obs.gpu_fault)
    if obs.gpu_timeout_for is not None and obs.gpu_timeout_for >= policy.gpu_wedged_after:
        return Finding(
            Verdict.GPU_WEDGED,
            (f"GPU reads timing out for {obs.gpu_timeout_for:.0f}s", "the agent answers"),
        )
    if not obs.judges_serving:
        return Finding(Verdict.HEALTHY, ())
    ended = rank_ended(obs.snapshot)
    if ended is not None:
        return Finding(Verdict.SERVING_DEAD, (ended,))
    vllm = vllm_status(obs.snapshot)
    state = vllm.get("state")
    if state == "stalled":
        reason = str(vllm.get("reason") or "requests running, no progress")
        return Finding(Verdict.SERVING_STALLED, (reason,))
    if state == "dead":
        reason = str(vllm.get("reason") or "/health 503 or the rank's process gone")
        return Finding(Verdict.SERVING_DEAD, (reason,))
    return Finding(Verdict.HEALTHY, ())


def _silent(obs: NodeObservation, policy: DetectionPolicy, silence: str) -> Finding:
    """The agent made no progress for freeze_after: what does the rest say?"""
    since = obs.watch_started_at if obs.agent_progress_at is None else obs.agent_progress_at
    # Only an answer given once the agent was late speaks of the silence: one
    # from just after its last progress may come from before the host froze.
    late = since + policy.late_after
    answered = obs.agent_answer_at
    if answered is not None and answered >= late and obs.now - answered < policy.freeze_after:
        # Userland answers HTTP: the host is alive, the agent's loop is not.
        return Finding(Verdict.AGENT_DOWN, (silence, "the agent answers, its seq is stuck"))
    if obs.banner_misses == 0 and obs.banner_ok_at is not None and obs.banner_ok_at >= late:
        return Finding(Verdict.AGENT_DOWN, (silence, "ssh banner answers"))
    life = obs.life_within(policy.freeze_after)
    if life is not None:
        return Finding(Verdict.PENDING, (silence, f"{life}: a live kernel, no fencing"))
    seen = obs.seen_by_peers_within(policy.freeze_after)
    if seen is not None:
        # Alive on another path: the controller's own path to it is broken.
        return Finding(
            Verdict.UNREACHABLE,
            (silence, seen, "the controller cannot reach it, its peers can: no fencing"),
        )
    if obs.unobservable is not None:
        return Finding(Verdict.UNOBSERVABLE, (silence, obs.unobservable, "cannot look: no fencing"))
    if obs.banner_misses >= policy.banner_misses:
        banner = f"no ssh banner x{obs.banner_misses}"
        if not obs.witness_ok:
            return Finding(Verdict.ISOLATED, (silence, banner, "witness unreachable: no fencing"))
        return Finding(Verdict.HOST_FROZEN, (silence, banner))
    return Finding(Verdict.PENDING, (silence, f"no ssh banner x{obs.banner_misses}"))


def _gpu_fault(fault: Mapping[str, Any]) -> Finding:
    xid, gpu = fault.get("xid"), fault.get("gpu")
    what = describe(xid) if isinstance(xid, int) else "a GPU fault"
    where = f" on GPU {gpu}" if isinstance(gpu, int) and not isinstance(gpu, bool) else ""
    then = (
        "the agent stopped the rank"
        if fault.get("result") == "stopped"
        else "the agent could not stop the rank"
    )
    return Finding(Verdict.GPU_FAULT, (f"{what}{where}", "the rank's CUDA context is gone", then))


# vLLM probe states of an API that answered at its last scrape.
_ANSWERING = frozenset({"progressing", "idle", "stalled"})
# How far the agent's time of a rank's death may lie ahead of the controller's
# clock (the cluster's clocks disagree a little) or behind it, to be taken as
# the fault's onset; beyond either it is no time of this death.
DEATH_AHEAD_S = 5.0
DEATH_BEHIND_S = 3600.0
_SIGNAL = re.compile(r"(SIG[A-Z0-9+]{1,12}|signal [0-9]{1,3})")


def rank_ended(snapshot: Mapping[str, Any]) -> str | None:
    """The rank ended on its own, as its launcher reports (``serving.state``
    ``exited``: Docker's ``die`` event, or the forked process gone): why, or None.

    Seen at the agent's next heartbeat, without waiting for the vLLM probe's
    ``dead_after`` (docs/design.md, "Verdicts"). Not when vLLM still answers
    in a report read since the end (a wrapper that exited, its group serving;
    a launch command that detached): then the probe judges, as on a node
    without a launcher.
    """
    serving = snapshot.get("serving")
    if not isinstance(serving, Mapping) or serving.get("enabled") is not True:
        return None
    if serving.get("state") != "exited" or serving.get("stopping") is not False:
        return None
    vllm = vllm_status(snapshot)
    if vllm.get("state") in _ANSWERING and not (
        serving.get("group_alive") is False and _read_before_end(vllm, serving)
    ):
        return None  # vLLM answers since: a detached launch, or a wrapper's group
    code, sig = serving.get("exit_code"), serving.get("exit_signal")
    how = ""
    if isinstance(sig, str) and _SIGNAL.fullmatch(sig):
        how = f" on {sig}"
    elif isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
        how = f" with code {code}"
    return f"the rank exited{how} (its launcher saw it end; nothing restarted it)"


def _read_before_end(vllm: Mapping[str, Any], serving: Mapping[str, Any]) -> bool:
    """Whether the vLLM report was read before the rank ended (both by the
    agent's clock): an answering report from before the end says nothing."""
    observed, ended = _unix(vllm.get("observed_at")), _unix(serving.get("ended_at"))
    return observed is not None and ended is not None and observed <= ended


def serving_died_at(snapshot: Mapping[str, Any], wall: float) -> float | None:
    """When the rank died (wall clock), as its agent reports the first sign: its
    launcher's end of it (``serving.ended_at``) when :func:`rank_ended`, else the
    vLLM probe's ``dead_since`` while it reports ``dead``. None when neither is a
    time within ``DEATH_BEHIND_S`` before ``wall`` and ``DEATH_AHEAD_S`` after it;
    a time a little ahead of ``wall`` is taken as ``wall``."""
    serving = snapshot.get("serving")
    vllm = vllm_status(snapshot)
    if rank_ended(snapshot) is not None and isinstance(serving, Mapping):
        text = serving.get("ended_at")
    elif vllm.get("state") == "dead":
        text = vllm.get("dead_since")
    else:
        return None
    at = _unix(text)
    if at is None or not wall - DEATH_BEHIND_S <= at <= wall + DEATH_AHEAD_S:
        return None
    return min(at, wall)


def _unix(text: Any) -> float | None:
    """An ISO 8601 time with its zone as Unix seconds, else None."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None:
            return None
        unix = moment.timestamp()
    except (ValueError, OverflowError, OSError):
        return None
    return unix if math.isfinite(unix) else None


def vllm_status(snapshot: Mapping[str, Any]) -> Mapping[str, Any]:
    """The snapshot's ``probes.vllm`` object; ``{}`` when absent or not an object."""
    probes = snapshot.get("probes")
    if isinstance(probes, Mapping):
        vllm = probes.get("vllm")
        if isinstance(vllm, Mapping):
            return vllm
    return {}
