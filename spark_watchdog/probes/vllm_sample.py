"""What one look at a vLLM head found: a scrape (:class:`VllmSample`) and a
canary (:class:`CanaryResult`). Plain data, read by the scraper that makes it
(:mod:`spark_watchdog.probes.vllm`) and the tracker that judges it
(:mod:`spark_watchdog.probes.vllm_progress`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from spark_watchdog.probes.vllm_metrics import EngineSample


@dataclass(frozen=True)
class VllmSample:
    """One scrape of vLLM's head: ``/health`` then ``/metrics``.

    ``reachable`` is True when ``/metrics`` gave a usable vLLM body; otherwise
    ``error`` says why. ``health_status`` is set whenever ``/health`` answered.
    ``refused`` is True when the port refused the connection (nothing listens:
    the API server is gone), as opposed to a timeout or a garbled answer.
    """

    url: str
    observed_at: float  # time.monotonic() when the scrape began
    wall_time: float  # time.time() at the same moment
    health_status: int | None
    engines: Mapping[str, EngineSample]
    reachable: bool
    error: str | None
    models: tuple[str, ...] = ()
    elapsed: float = 0.0
    refused: bool = False


@dataclass(frozen=True)
class CanaryResult:
    """One ``POST /v1/completions`` with ``max_tokens=1``."""

    outcome: Literal["ok", "timeout", "error"]
    latency: float  # seconds from the start of the canary to its end
    finished_at: float  # time.monotonic() at the end
    model: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def describe(self) -> str:
        if self.ok:
            return f"answered in {self.latency:.2f} s"
        if self.outcome == "timeout":
            return f"no answer within {self.latency:.1f} s"
        return f"failed after {self.latency:.2f} s: {self.error}"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "latency": round(self.latency, 3),
            "model": self.model,
            "error": self.error,
        }
