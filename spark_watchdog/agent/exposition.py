"""The agent's view in Prometheus exposition format.

Names follow Prometheus conventions: a ``spark_watchdog_`` prefix, base units
in the name (``_seconds``, ``_bytes``, ``_watts``, ``_celsius``, ``_hertz``),
ratios 0 to 1, and ``_total`` only on counters. States are exposed the
"state set" way: one series per state, value 1 for the current one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PROBE_STATES: dict[str, tuple[str, ...]] = {
    "vllm": ("progressing", "idle", "stalled", "dead", "unreachable", "headless"),
    "gpu": ("ok", "unavailable", "timeout", "error"),
    "journal": ("ok", "degraded", "unavailable", "error"),
    "host": ("ok", "error"),
}
_RUNNER_STATES = ("pending", "disabled", "timeout", "error")

Snapshot = Mapping[str, Any]


class AgentCollector:
    """Builds metric families from the latest snapshot on every scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        probes: Mapping[str, Any] = snap.get("probes", {})
        node = str(snap.get("node", ""))

        yield from _agent_metrics(node, snap)
        yield from _probe_state_metrics(node, probes)
        yield from _vllm_metrics(node, probes.get("vllm", {}))
        yield from _gpu_metrics(node, probes.get("gpu", {}))
        yield from _host_metrics(node, probes.get("host", {}))
        yield from _journal_metrics(node, probes.get("journal", {}))
        guard = snap.get("memory_guard")
        if isinstance(guard, Mapping) and guard.get("enabled"):
            yield from _memory_guard_metrics(node, guard)
        clock = snap.get("gpu_clock_check")
        if isinstance(clock, Mapping) and clock.get("state") in ("ok", "latched"):
            yield from _gauge(
                "spark_watchdog_gpu_clock_latched",
                "1 when the post-boot check found the GPU clock-latched on this boot, 0 when "
                "a busy GPU reached gpu_clock_check.floor_mhz (absent until judged).",
                node,
                1 if clock.get("state") == "latched" else 0,
            )


def _agent_metrics(node: str, snap: Snapshot) -> Iterator[Metric]:
    """The agent itself: identity, loop count, loop lag."""
    info = GaugeMetricFamily(
        "spark_watchdog_agent_info",
        "Agent identity; the value is always 1.",
        labels=["node", "version", "boot_id"],
    )
    info.add_metric([node, str(snap.get("version")), str(snap.get("boot_id") or "")], 1)
    yield info

    loops = CounterMetricFamily(
        "spark_watchdog_agent_loops",
        "Main loop iterations since the agent started (the seq field of /v1/state).",
        labels=["node"],
    )
    loops.add_metric([node], float(snap.get("seq", 0)))
    yield loops

    lag = GaugeMetricFamily(
        "spark_watchdog_agent_loop_lag_seconds",
        "How late the last main loop iteration woke up.",
        labels=["node"],
    )
    lag.add_metric([node], float(snap.get("loop_lag_s", 0.0)))
    yield lag


def _probe_state_metrics(node: str, probes: Mapping[str, Any]) -> Iterator[Metric]:
    """Each probe's state (one series per state it can be in) and its latest duration."""
    state = GaugeMetricFamily(
        "spark_watchdog_probe_state",
        "Current state of each probe (1 for the current state, 0 otherwise).",
        labels=["node", "probe", "state"],
    )
    duration = GaugeMetricFamily(
        "spark_watchdog_probe_duration_seconds",
        "How long the latest run of each probe took.",
        labels=["node", "probe"],
    )
    for probe, states in PROBE_STATES.items():
        body = probes.get(probe, {})
        current = body.get("state")
        # dict.fromkeys: a state both lists name (timeout, error) is one series, not two.
        for name in dict.fromkeys(states + _RUNNER_STATES):
            state.add_metric([node, probe, name], 1.0 if name == current else 0.0)
        if isinstance(body.get("duration_s"), (int, float)):
            duration.add_metric([node, probe], float(body["duration_s"]))
    yield state
    yield duration


def _memory_guard_metrics(node: str, guard: Mapping[str, Any]) -> Iterator[Metric]:
    kills = guard.get("kills")
    if isinstance(kills, int) and not isinstance(kills, bool):
        family = CounterMetricFamily(
            "spark_watchdog_memory_guard_kills",
            "Times the memory guard killed the rank since the agent started.",
            labels=["node"],
        )
        family.add_metric([node], float(kills))
        yield family
    assessment = guard.get("assessment")
    if isinstance(assessment, Mapping):
        yield from _gauge(
            "spark_watchdog_memory_guard_time_to_floor_seconds",
            "Seconds until MemAvailable reaches memory_guard.floor_gib at its current fall.",
            node,
            assessment.get("seconds_to_floor"),
        )


def _gauge(name: str, doc: str, node: str, value: Any) -> Iterator[Metric]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        family = GaugeMetricFamily(name, doc, labels=["node"])
        family.add_metric([node], float(value))
        yield family


def _vllm_metrics(node: str, body: Mapping[str, Any]) -> Iterator[Metric]:
    yield from _gauge(
        "spark_watchdog_vllm_requests_running",
        "Requests vLLM reports running (sum over engines).",
        node,
        body.get("running"),
    )
    yield from _gauge(
        "spark_watchdog_vllm_requests_waiting",
        "Requests vLLM reports waiting (sum over engines).",
        node,
        body.get("waiting"),
    )
    steps = body.get("engine_steps")
    if isinstance(steps, int) and not isinstance(steps, bool):
        # A counter: it only grows, and falls back to 0 when vLLM restarts,
        # which rate() takes as a counter reset.
        family = CounterMetricFamily(
            "spark_watchdog_vllm_engine_steps",
            "Engine steps vLLM reports (vllm:iteration_tokens_total_count), summed over engines.",
            labels=["node"],
        )
        family.add_metric([node], float(steps))
        yield family
    yield from _gauge(
        "spark_watchdog_vllm_without_progress_seconds",
        "Seconds since vLLM last advanced while requests were running (the worst engine).",
        node,
        body.get("seconds_without_progress"),
    )


def _gpu_metrics(node: str, body: Mapping[str, Any]) -> Iterator[Metric]:
    fields = (
        ("power_w", "spark_watchdog_gpu_power_watts", "GPU power draw.", 1.0),
        ("utilization_gpu_pct", "spark_watchdog_gpu_utilization_ratio", "GPU utilization.", 0.01),
        ("temperature_c", "spark_watchdog_gpu_temperature_celsius", "GPU temperature.", 1.0),
        ("sm_clock_mhz", "spark_watchdog_gpu_sm_clock_hertz", "GPU SM clock.", 1e6),
    )
    for key, name, doc, scale in fields:
        family = GaugeMetricFamily(name, doc, labels=["node", "gpu", "uuid"])
        for device in body.get("devices", []) or []:
            value = device.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                family.add_metric(
                    [node, str(device.get("index")), str(device.get("uuid"))], value * scale
                )
        yield family
    flag = body.get("low_power_while_running")
    if isinstance(flag, bool):
        yield from _gauge(
            "spark_watchdog_gpu_low_power_while_running",
            "1 when GPU power is below low_power_watts while vLLM has requests running.",
            node,
            int(flag),
        )


def _host_metrics(node: str, body: Mapping[str, Any]) -> Iterator[Metric]:
    yield from _gauge(
        "spark_watchdog_host_mem_available_bytes",
        "MemAvailable from /proc/meminfo.",
        node,
        body.get("mem_available_bytes"),
    )
    yield from _gauge(
        "spark_watchdog_host_mem_available_trend_bytes_per_second",
        "Change of MemAvailable over the last ~10 s (negative when falling).",
        node,
        body.get("mem_available_trend_bytes_per_s"),
    )
    for kind in ("some", "full"):
        yield from _gauge(
            f"spark_watchdog_host_memory_pressure_{kind}_ratio",
            f"PSI memory '{kind}' avg10: share of the last 10 s that "
            + ("some tasks" if kind == "some" else "all non-idle tasks")
            + " waited for memory.",
            node,
            _ratio(body.get(f"mem_pressure_{kind}_avg10")),
        )
    yield from _gauge(
        "spark_watchdog_host_uptime_seconds", "Host uptime.", node, body.get("uptime_s")
    )
    yield from _gauge(
        "spark_watchdog_host_load1", "1-minute load average.", node, body.get("load1")
    )


def _ratio(percent: Any) -> float | None:
    if isinstance(percent, (int, float)) and not isinstance(percent, bool):
        return float(percent) / 100.0
    return None


def _journal_metrics(node: str, body: Mapping[str, Any]) -> Iterator[Metric]:
    clean = body.get("previous_boot_clean_shutdown")
    if isinstance(clean, bool):
        yield from _gauge(
            "spark_watchdog_journal_previous_boot_clean",
            "1 when the previous boot ended with journald's 'Journal stopped', 0 when not.",
            node,
            int(clean),
        )
    counts = body.get("current_boot_evidence_counts")
    if isinstance(counts, Mapping):
        family = GaugeMetricFamily(
            "spark_watchdog_journal_current_boot_evidence_lines",
            "Kernel lines of each evidence kind (Xid, NV_ERR_NO_MEMORY, ...) in this boot.",
            labels=["node", "kind"],
        )
        for kind, count in sorted(counts.items()):
            if isinstance(count, int):
                family.add_metric([node, str(kind)], float(count))
        yield family


def render(snapshot: Callable[[], Snapshot]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(snapshot))
    return bytes(generate_latest(registry))
