"""Is vLLM serving making progress? A pure judgement over scrapes and time.

``/health`` answers 200 while the engine is wedged and ``/v1/models`` is static
config (docs/facts.md, "Endpoints while the engine is wedged"), so the only
honest sign of life is a counter that moves while requests are running: the
engine-step heartbeat (``vllm:iteration_tokens_total_count``) or the
generated-token counter. This module holds no clock and does no I/O: the caller
passes each scrape and the time, so every rule below is testable with a fake
clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace

from spark_watchdog.probes.vllm_metrics import EngineSample
from spark_watchdog.probes.vllm_refusal import RefusalWatch
from spark_watchdog.probes.vllm_sample import CanaryResult, VllmSample
from spark_watchdog.probes.vllm_status import EngineState, EngineStatus, VllmState, VllmStatus

# /health turns 503 only on EngineDeadError
# (docs/facts.md, "Endpoints while the engine is wedged").
HEALTH_ENGINE_DEAD = 503


@dataclass
class _EngineTrack:
    """What the tracker remembers of one engine between scrapes."""

    steps: int | None
    tokens: int | None
    last_advance_at: float
    # Since when requests are running or waiting (None while there are none).
    busy_since: float | None


def _advance(
    previous: _EngineTrack | None, reading: EngineSample, now: float, blind: bool
) -> tuple[_EngineTrack, bool]:
    """The engine's track after this reading, and whether its counters moved."""
    steps, tokens, running = reading.engine_steps, reading.generation_tokens, reading.running
    waiting = reading.waiting
    moved = previous is not None and (
        _moved(previous.steps, steps) or _moved(previous.tokens, tokens)
    )
    # The first sight of an engine is its baseline: the clock starts there.
    last_advance_at = now if previous is None or moved else previous.last_advance_at
    busy = (running or 0) > 0 or (waiting or 0) > 0
    busy_since: float | None
    if running is None or not busy:
        busy_since = None
    elif previous is None or previous.busy_since is None or blind:
        busy_since = now
    else:
        busy_since = previous.busy_since
    return _EngineTrack(steps, tokens, last_advance_at, busy_since), moved


class ProgressTracker:
    """Turns a stream of scrapes into a :class:`VllmStatus`.

    Stall rule, per engine: requests running or waiting and neither the
    engine-step count nor the generated-token count advanced for
    ``stall_after`` seconds, counted from the last advance or from when requests
    were first seen, whichever is later. Waiting requests count even when
    ``num_requests_running`` reads 0: a wedged engine can leave them queued
    with nothing running. A counter that goes *down* means vLLM restarted: that
    is a new baseline and counts as progress. The cluster is stalled if any
    engine is.

    Idle hang rule: when the head has been quiet (no request running or
    waiting, no counter moving) and a canary sent since then got no answer
    within its timeout, with no counter moving since it was sent, the state is
    ``stalled``: the engine does not take new work.

    Death by refusal (``dead_after``, :class:`.vllm_refusal.RefusalWatch`):
    once vLLM answered, its port refusing connections for ``dead_after``
    seconds is ``dead``; :meth:`note_planned_stop` disarms the rule until vLLM
    answers again after a refusal.

    After a blind spell (no usable answer, or no call for longer than
    ``stall_after``) the stall clock restarts at the first good scrape: during
    the gap the engine may have gone idle and picked up new requests, so old
    timestamps would report a stall nobody saw. Counter baselines are kept, so
    an advance or a restart during the gap is still recognised. The price: a
    server that answers only every other scrape is reported ``unreachable`` half
    the time, never ``stalled``.
    """

    def __init__(self, stall_after: float, dead_after: float | None = None) -> None:
        if stall_after <= 0:
            raise ValueError(f"stall_after: expected seconds > 0, got {stall_after!r}")
        if dead_after is not None and dead_after < 0:
            raise ValueError(f"dead_after: expected seconds ≥ 0, got {dead_after!r}")
        self.stall_after = stall_after
        self.dead_after = dead_after
        self._engines: dict[str, _EngineTrack] = {}
        self._last_usable_at: float | None = None
        self._canary: CanaryResult | None = None
        self._stall_suspected = False
        # Since when no request ran or waited and no counter moved (None: not quiet).
        self._quiet_since: float | None = None
        self._refusal = RefusalWatch(dead_after)
        # Idle canaries that timed out in a row: one alone is not a hang (a busy
        # API front end can miss one), two are.
        self._canary_timeouts = 0
        # The last scrape in which an engine's step or token counter went up.
        self._advanced_at: float | None = None
        self._read_at: dict[str, float] = {}  # each engine's last usable scrape
        # update() runs in a worker thread, the planned-stop notes in HTTP threads.
        self._lock = threading.RLock()

    @property
    def stall_suspected(self) -> bool:
        """Requests ran without progress for ≥ half of ``stall_after`` at the last
        update: the moment to send a canary before the stall is called."""
        return self._stall_suspected

    def note_canary(self, result: CanaryResult, now: float) -> None:
        """Record a canary's result; a successful one is proof of life.

        With one engine, an answered canary restarts its stall clock. With
        several (data parallel) the tracker cannot know which engine answered,
        and that engine's own counters show the step anyway, so no clock moves.
        """
        with self._lock:
            self._note_canary(result, now)

    @property
    def canary_unconfirmed(self) -> bool:
        """The last canary timed out and no second one has confirmed it: the
        agent sends the confirming canary without waiting for ``idle_after``."""
        return self._canary_timeouts == 1

    def _note_canary(self, result: CanaryResult, now: float) -> None:
        self._canary = result
        self._canary_timeouts = self._canary_timeouts + 1 if result.outcome == "timeout" else 0
        if result.ok and self._quiet_since is not None:
            self._quiet_since = max(self._quiet_since, now)
        if result.ok and len(self._engines) == 1:
            for track in self._engines.values():
                track.last_advance_at = max(track.last_advance_at, now)

    def quiet_for(self, now: float) -> float | None:
        """Seconds the head has been quiet at ``now``: no request running or
        waiting and no counter moving (None when not quiet, or not known)."""
        with self._lock:
            return None if self._quiet_since is None else now - self._quiet_since

    def note_planned_stop(self, now: float | None = None) -> None:
        """The rank is being stopped on purpose (``POST /v1/serving/stop``): its
        port refusing connections from now on is not a death, and the next rank
        must answer before its own refusal can be one (a model loads for minutes
        with its port closed). A stop that did not take (vLLM keeps answering
        for ``PLANNED_STOP_GRACE_S``) lapses, and the rule is armed again."""
        with self._lock:
            self._refusal.note_planned_stop(time.monotonic() if now is None else now)

    def note_planned_start(self) -> None:
        """The rank is being started on purpose: its next answer arms death by
        refusal again."""
        with self._lock:
            self._refusal.note_planned_start()

    def update(
        self,
        sample: VllmSample | None,
        now: float,
        process_alive: bool | None = None,
        wall: float | None = None,
    ) -> VllmStatus:
        """Judge one scrape taken at ``now``.

        ``sample`` is ``None`` on a rank with no HTTP API (``--headless`` worker).
        ``process_alive`` is the local rank process check, ``None`` when not made.
        ``wall``: the wall-clock time of the look, for ``dead_since`` when there
        is no sample (else the sample's own).
        """
        with self._lock:
            self._refusal.note_answer(sample, now)
            status = self._judge(sample, now, process_alive)
            self._stall_suspected = status.stall_suspected
            look = wall if sample is None else sample.wall_time
            dead_since = self._refusal.dead_since(status.state, look)
            return replace(status, advanced_at=self._advanced_at, dead_since=dead_since)

    def _judge(self, sample: VllmSample | None, now: float, alive: bool | None) -> VllmStatus:
        url = None if sample is None else sample.url
        if alive is False:
            return self._blind(sample, "dead", "the vLLM rank process is not running", alive)
        if sample is None:
            if alive:
                return VllmStatus(
                    state="headless",
                    reason="worker rank without an HTTP API (--headless); its process is running",
                    url=None,
                    canary=self._canary,
                    process_alive=alive,
                )
            return self._blind(
                sample, "unreachable", "no URL to scrape and no rank process to check", alive
            )
        if sample.health_status == HEALTH_ENGINE_DEAD:
            return self._blind(
                sample, "dead", "/health answered 503: the engine is dead (EngineDeadError)", alive
            )
        if not sample.reachable:
            gone = self._refusal.refused_for_good(sample, now)
            if gone is not None:
                return self._blind(sample, "dead", gone, alive)
            return self._blind(sample, "unreachable", sample.error or "no usable answer", alive)
        if sample.health_status != 200:
            return self._blind(
                sample,
                "unreachable",
                f"/health answered {sample.health_status}; expected 200 (or 503 = dead)",
                alive,
            )
        if not sample.engines:
            return self._blind(sample, "unreachable", f"no vLLM engine series at {url}", alive)

        blind = self._last_usable_at is None or now - self._last_usable_at > self.stall_after
        self._last_usable_at = now
        engines = {
            name: self._judge_engine(name, reading, now, blind)
            for name, reading in sorted(sample.engines.items())
        }
        for gone in set(self._engines) - set(engines):
            del self._engines[gone]
        quiet = all(e.running == 0 and not e.waiting for e in engines.values())
        if quiet:
            last_move = max(track.last_advance_at for track in self._engines.values())
            since = now if self._quiet_since is None else self._quiet_since
            self._quiet_since = max(since, last_move)
        else:
            self._quiet_since = None
        return self._combine(sample, engines, alive)

    def _judge_engine(
        self, name: str, reading: EngineSample, now: float, blind: bool
    ) -> EngineStatus:
        previous = self._engines.get(name)
        track, moved = _advance(previous, reading, now, blind)
        self._engines[name] = track
        read_before = self._read_at.get(name)
        self._read_at[name] = now
        if (
            previous is not None
            and read_before is not None
            and (
                _went_up(previous.steps, reading.engine_steps)
                or _went_up(previous.tokens, reading.generation_tokens)
            )
        ):
            # Moved some time after the scrape before: the ranks stepped then
            # (a frozen host does not thaw), and nothing later is proved.
            self._advanced_at = max(self._advanced_at or read_before, read_before)
        state, reason, idle_for, judged = _verdict(
            reading,
            track,
            now,
            self.stall_after,
            moved=moved,
            restarted=blind and previous is not None,
        )
        return EngineStatus(
            engine=name,
            state=state,
            reason=reason,
            running=reading.running,
            waiting=reading.waiting,
            engine_steps=reading.engine_steps,
            generation_tokens=reading.generation_tokens,
            prompt_tokens=reading.prompt_tokens,
            kv_cache_usage=reading.kv_cache_usage,
            seconds_without_progress=idle_for,
            judged=judged,
        )

    def _combine(
        self, sample: VllmSample, engines: dict[str, EngineStatus], alive: bool | None
    ) -> VllmStatus:
        stalled = [e for e in engines.values() if e.state == "stalled"]
        state: VllmState
        if stalled:
            state = "stalled"
            reason = "; ".join(f"engine {e.engine}: {e.reason}" for e in stalled)
            if self._canary is not None and not self._canary.ok:
                reason += f"; last canary: {self._canary.describe()}"
        elif any(e.state == "progressing" for e in engines.values()):
            state = "progressing"
            reason = _engines_reason(engines.values(), "progressing")
        elif (hung := self._idle_canary_unanswered()) is not None:
            state = "stalled"
            reason = hung
        else:
            state = "idle"
            reason = _engines_reason(engines.values(), "idle")
        half = self.stall_after / 2
        waits = [e.seconds_without_progress for e in engines.values()]
        known_waits = [w for w in waits if w is not None]
        return VllmStatus(
            state=state,
            reason=reason,
            url=sample.url,
            health_status=sample.health_status,
            running=_total(e.running for e in engines.values()),
            waiting=_total(e.waiting for e in engines.values()),
            engine_steps=_total(e.engine_steps for e in engines.values()),
            generation_tokens=_total(e.generation_tokens for e in engines.values()),
            seconds_without_progress=max(known_waits) if known_waits else None,
            engines=engines,
            error=sample.error,
            canary=self._canary,
            models=sample.models,
            stall_suspected=any(w >= half for w in known_waits),
            process_alive=alive,
        )

    def _idle_canary_unanswered(self) -> str | None:
        """Idle engines and a canary that timed out with no counter moving since
        it was sent: an idle hang. The reason, or None."""
        canary = self._canary
        if canary is None or self._canary_timeouts < 2 or not self._engines:
            return None
        sent_at = canary.finished_at - canary.latency
        if any(track.last_advance_at > sent_at for track in self._engines.values()):
            return None
        return (
            f"no requests and no engine step, and {self._canary_timeouts} canaries in a row "
            f"(1-token completions) got {canary.describe()}: the engine takes no new work"
        )

    def _blind(
        self, sample: VllmSample | None, state: VllmState, reason: str, alive: bool | None
    ) -> VllmStatus:
        # No usable answer: the next good scrape restarts the stall clock.
        self._last_usable_at = None
        self._quiet_since = None
        if state == "dead":
            # A dead engine is restarted, and a restarted one starts from zero.
            self._engines.clear()
        return VllmStatus(
            state=state,
            reason=reason,
            url=None if sample is None else sample.url,
            health_status=None if sample is None else sample.health_status,
            error=None if sample is None else sample.error,
            canary=self._canary,
            models=() if sample is None else sample.models,
            process_alive=alive,
        )


def _verdict(
    reading: EngineSample,
    track: _EngineTrack,
    now: float,
    stall_after: float,
    *,
    moved: bool,
    restarted: bool,
) -> tuple[EngineState, str, float | None, bool]:
    """State, reason, seconds without progress and whether it was judged at all.

    ``restarted``: the stall clock started again after a blind spell.
    """
    steps, tokens, running = reading.engine_steps, reading.generation_tokens, reading.running
    if running is None:
        why = "vllm:num_requests_running is missing, so idle cannot be told from stalled"
        if moved:
            return "progressing", f"counters advancing; {why}", None, False
        return "idle", f"counters not advancing; {why}", None, False
    if track.busy_since is None:
        return "idle", "no requests running", None, True
    if running > 0:
        load = f"{running} request(s) running"
    else:
        load = f"{reading.waiting} request(s) waiting and none running"
    if steps is None and tokens is None:
        return (
            "progressing",
            f"{load}, but neither vllm:iteration_tokens_total_count "
            "nor vllm:generation_tokens_total is present: progress cannot be judged",
            None,
            False,
        )
    idle_for = now - max(track.last_advance_at, track.busy_since)
    if idle_for >= stall_after:
        return (
            "stalled",
            f"{load} and no engine step or generated token for "
            f"{idle_for:.1f} s (stall_after {stall_after:g} s)",
            idle_for,
            True,
        )
    if moved:
        reason = f"{load}; counters advancing"
    elif restarted:
        reason = f"{load}; stall clock restarted after a blind spell"
    else:
        reason = f"{load}; no advance for {idle_for:.1f} s"
    return "progressing", reason, idle_for, True


def _moved(before: int | None, after: int | None) -> bool:
    # Down counts as well as up: a counter only goes down when vLLM restarted,
    # which is a new baseline, not a stall.
    return before is not None and after is not None and after != before


def _went_up(before: int | None, after: int | None) -> bool:
    # Up only: a counter that went down is a restarted vLLM, no proof that its ranks step.
    return before is not None and after is not None and after > before


def _total(values: Iterable[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _engines_reason(engines: Iterable[EngineStatus], state: EngineState) -> str:
    matching = [e for e in engines if e.state == state]
    if len(matching) == 1:
        return matching[0].reason
    return "; ".join(f"engine {e.engine}: {e.reason}" for e in matching)
