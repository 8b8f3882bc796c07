"""``show ID``'s drawing of an incident's flight recorder: one sparkline per
measure, the state changes with their time before detection
(:mod:`spark_watchdog.controller.look.flight_recorder` keeps the samples)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 60
GIB = 1024**3

# (field, label, scale) of the measures drawn as sparklines.
MEASURES: tuple[tuple[str, str, Callable[[float], float]], ...] = (
    ("mem_available_bytes", "MemAvailable GiB", lambda v: v / GIB),
    ("mem_pressure_full_avg10", "PSI full %", lambda v: v),
    ("gpu_power_w", "GPU power W", lambda v: v),
    ("gpu_sm_clock_mhz", "SM clock MHz", lambda v: v),
    ("vllm_running", "vLLM running", lambda v: v),
    ("vllm_waiting", "vLLM waiting", lambda v: v),
)
STATES = (("gpu_state", "gpu"), ("vllm_state", "vllm"), ("memory_guard", "memory guard"))


def sparkline(values: Sequence[float | None], width: int = WIDTH) -> str:
    """Values (None: no reading) as at most ``width`` bars, each the mean of its span."""
    if not values:
        return ""
    per = max(1, -(-len(values) // width))
    spans = [values[i : i + per] for i in range(0, len(values), per)]
    means = [
        sum(known) / len(known) if (known := [v for v in span if v is not None]) else None
        for span in spans
    ]
    present = [m for m in means if m is not None]
    if not present:
        return " " * len(means)
    low, high = min(present), max(present)
    scale = (len(BARS) - 1) / (high - low) if high > low else 0.0
    return "".join(" " if m is None else BARS[round((m - low) * scale)] for m in means)


def render(recorder: Mapping[str, Any], detected_at: float) -> list[str]:
    fields = recorder.get("fields")
    samples = recorder.get("samples")
    if not isinstance(fields, list) or not isinstance(samples, list) or not samples:
        return []
    if not all(isinstance(f, str) for f in fields):
        return []
    rows = [dict(zip(fields, s, strict=False)) for s in samples if isinstance(s, list)]
    if not rows:
        return []
    times = [t for t in (_scaled(r.get("t"), float) for r in rows) if t is not None]
    if len(times) != len(rows):
        return []
    first, last = times[0] - detected_at, times[-1] - detected_at
    lines = [
        f"flight recorder ({recorder.get('node')}: {len(rows)} samples from "
        f"{first:+.0f}s to {last:+.0f}s of detection)"
    ]
    for key, label, scale in MEASURES:
        values = [_scaled(r.get(key), scale) for r in rows]
        known = [v for v in values if v is not None]
        if not known:
            continue
        lines.append(
            f"  {label:<17} {sparkline(values)}  {known[0]:.4g} → {known[-1]:.4g} "
            f"(min {min(known):.4g}, max {max(known):.4g})"
        )
    steps = [_scaled(r.get("vllm_engine_steps"), float) for r in rows]
    rates: list[float | None] = []
    for a, b, ta, tb in zip(steps, steps[1:], times, times[1:], strict=False):
        rates.append((b - a) / (tb - ta) if a is not None and b is not None and tb > ta else None)
    if any(r is not None for r in rates):
        lines.append(f"  {'engine steps/s':<17} {sparkline(rates)}")
    for key, label in STATES:
        changes = _changes(rows, key, detected_at)
        if changes:
            lines.append(f"  {label:<17} {' → '.join(changes)}")
    return lines


def _scaled(value: Any, scale: Callable[[float], float]) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return round(scale(float(value)), 3)


def _changes(rows: list[dict[str, Any]], key: str, detected_at: float) -> list[str]:
    changes: list[str] = []
    previous: object = object()
    for row in rows:
        value = row.get(key)
        if value != previous and value is not None:
            changes.append(f"{value} ({row['t'] - detected_at:+.0f}s)")
        previous = value
    return changes
