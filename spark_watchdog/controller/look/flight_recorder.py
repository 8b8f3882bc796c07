"""The flight recorder: the last minutes of each node, kept off the node.

Nothing survives a GB10 freeze on the box itself
(docs/facts.md, "Whole-host freezes"), so the controller keeps, per node, one
compact sample of every snapshot the agent sent in the last ``seconds``
(memory, pressure, GPU power and clock, vLLM counters, probe states), and
writes them into each incident it opens for that node
(``evidence.flight_recorder``). ``spark-watchdog show ID``
draws them; ``--json`` has every sample.

A sample is a tuple in the order of :data:`FIELDS`, so a thousand nodes cost
little (docs/benchmarks.md, "Flight recorder").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

# What one sample holds, in order; ``t`` is the controller's wall clock.
FIELDS = (
    "t",
    "mem_available_bytes",
    "mem_pressure_full_avg10",
    "gpu_state",
    "gpu_power_w",
    "gpu_sm_clock_mhz",
    "vllm_state",
    "vllm_running",
    "vllm_waiting",
    "vllm_engine_steps",
    "memory_guard",
)
Sample = tuple[Any, ...]


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _text(value: Any) -> str | None:
    return value[:32] if isinstance(value, str) else None


def _section(snapshot: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = snapshot
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def sample_of(snapshot: Mapping[str, Any], at: float) -> Sample:
    """One snapshot as a sample; anything missing or malformed is None."""
    host = _section(snapshot, "probes", "host")
    gpu = _section(snapshot, "probes", "gpu")
    vllm = _section(snapshot, "probes", "vllm")
    devices = gpu.get("devices")
    first = devices[0] if isinstance(devices, list) and devices else {}
    first = first if isinstance(first, Mapping) else {}
    return (
        round(at, 3),
        _number(host.get("mem_available_bytes")),
        _number(host.get("mem_pressure_full_avg10")),
        _text(gpu.get("state")),
        _number(first.get("power_w")),
        _number(first.get("sm_clock_mhz")),
        _text(vllm.get("state")),
        _number(vllm.get("running")),
        _number(vllm.get("waiting")),
        _number(vllm.get("engine_steps")),
        _text(_section(snapshot, "memory_guard").get("state")),
    )


class FlightRecorder:
    """Per node, the samples of the last ``seconds`` (0: record nothing)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._samples: dict[str, deque[Sample]] = {}

    def note(self, node: str, snapshot: Mapping[str, Any], at: float) -> None:
        if self.seconds <= 0:
            return
        # A hard bound whatever the clock does (a step back would keep old samples).
        samples = self._samples.setdefault(node, deque(maxlen=int(self.seconds * 4) + 8))
        samples.append(sample_of(snapshot, at))
        while samples and at - samples[0][0] > self.seconds:
            samples.popleft()

    def samples(self, node: str) -> list[Sample]:
        return list(self._samples.get(node, ()))

    def evidence(self, node: str) -> dict[str, Any]:
        """What goes into an incident: the fields and every sample, oldest first."""
        return {
            "node": node,
            "seconds": self.seconds,
            "fields": list(FIELDS),
            "samples": [list(s) for s in self.samples(node)],
        }
