"""The production settings the lab benchmarks run with: the agent's default
intervals and the controller's default detection, power and guard settings,
read from the config classes so that a changed default moves the benchmarks
with it."""

from __future__ import annotations

from typing import Any

from spark_watchdog.config.agent import CanaryConfig, PeeringConfig
from spark_watchdog.config.controller import (
    DetectionConfig,
    GuardsConfig,
    PolicyConfig,
    ServingConfig,
)
from spark_watchdog.lab.cluster import LabTimings

# The agent's production defaults (config/agent.py), and the lab's simulated boot.
PRODUCTION_TIMINGS = LabTimings(
    loop_interval=1.0,
    vllm_interval=2.0,
    stall_after=15.0,
    boot_seconds=1.0,
    gpu_interval=2.0,
    gpu_deadline=3.0,
    canary_timeout=CanaryConfig().timeout,
    canary_idle_after=CanaryConfig().idle_after,
    peering_interval=PeeringConfig().interval,
    peering_timeout=PeeringConfig().timeout,
)

_KEYS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "detection": (
        DetectionConfig(),
        (
            "poll_interval",
            "agent_timeout",
            "freeze_after",
            "banner_misses",
            "banner_timeout",
            "banner_interval",
        ),
    ),
    "policy": (
        PolicyConfig(),
        ("power_off_seconds", "power_timeout", "power_poll_interval", "min_command_interval"),
    ),
    "guards": (
        GuardsConfig(),
        ("node_budget", "cluster_budget", "budget_window", "boot_timeout"),
    ),
    "serving": (ServingConfig(), ("restart_cooldown",)),
}


def production_settings() -> dict[str, dict[str, Any]]:
    """Controller config sections with every production default, to merge
    over the lab's short ones (LabSession's controller_overrides)."""
    return {
        section: {key: getattr(defaults, key) for key in keys}
        for section, (defaults, keys) in _KEYS.items()
    }
