"""What the vLLM probe reports: each engine's verdict and the rank's, as the
agent serves them (the judgement itself is :mod:`.vllm_progress`'s)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

from spark_watchdog.probes.vllm_sample import CanaryResult

VllmState = Literal["progressing", "idle", "stalled", "dead", "unreachable", "headless"]
EngineState = Literal["progressing", "idle", "stalled"]


@dataclass(frozen=True)
class EngineStatus:
    """One engine's verdict. ``judged`` is False when the series needed to call
    a stall are missing, in which case the state is never ``stalled``."""

    engine: str
    state: EngineState
    reason: str
    running: int | None
    waiting: int | None
    engine_steps: int | None
    generation_tokens: int | None
    prompt_tokens: int | None
    kv_cache_usage: float | None
    seconds_without_progress: float | None
    judged: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "state": self.state,
            "reason": self.reason,
            "running": self.running,
            "waiting": self.waiting,
            "engine_steps": self.engine_steps,
            "generation_tokens": self.generation_tokens,
            "prompt_tokens": self.prompt_tokens,
            "kv_cache_usage": self.kv_cache_usage,
            "seconds_without_progress": _rounded(self.seconds_without_progress),
            "judged": self.judged,
        }


@dataclass(frozen=True)
class VllmStatus:
    """The vLLM probe's report. Totals are summed over engines (``None`` when no
    engine had the series); ``seconds_without_progress`` is the worst engine's."""

    state: VllmState
    reason: str
    url: str | None
    health_status: int | None = None
    running: int | None = None
    waiting: int | None = None
    engine_steps: int | None = None
    generation_tokens: int | None = None
    seconds_without_progress: float | None = None
    engines: Mapping[str, EngineStatus] = field(default_factory=dict)
    error: str | None = None
    canary: CanaryResult | None = None
    models: tuple[str, ...] = ()
    stall_suspected: bool = False
    process_alive: bool | None = None
    # When (monotonic) the tracker last saw an engine's counters go up; None: not
    # since it started. Not in to_json: the agent turns it into an age as it answers.
    advanced_at: float | None = None
    # While ``dead``: the wall-clock time of the first sign of it (the first
    # refusal, the first 503, the first look that found the process gone).
    dead_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``probe vllm`` contract keys first, then extras (keys may be added,
        never removed)."""
        return {
            "url": self.url,
            "state": self.state,
            "health_status": self.health_status,
            "running": self.running,
            "waiting": self.waiting,
            "engine_steps": self.engine_steps,
            "generation_tokens": self.generation_tokens,
            "seconds_without_progress": _rounded(self.seconds_without_progress),
            "reason": self.reason,
            "error": self.error,
            "stall_suspected": self.stall_suspected,
            "process_alive": self.process_alive,
            "models": list(self.models),
            "engines": {name: engine.to_json() for name, engine in self.engines.items()},
            "canary": None if self.canary is None else self.canary.to_json(),
            "dead_since": None if self.dead_since is None else _iso(self.dead_since),
        }


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
