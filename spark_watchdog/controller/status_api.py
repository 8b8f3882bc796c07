"""The controller's HTTP surface: ``GET /v1/status`` (JSON) and ``GET /metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from spark_watchdog.agent.http_api import JSON, PROMETHEUS_TEXT, HttpEndpoint, Response
from spark_watchdog.controller.node_states import NodeState

VERDICTS = (
    "healthy",
    "pending",
    "serving_stalled",
    "serving_dead",
    "agent_down",
    "host_frozen",
    "isolated",
    "booting",
    "held",
)


class StatusSource(Protocol):
    published: dict[str, Any]


class _Collector:
    def __init__(self, source: StatusSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        status = self._source.published
        verdict = GaugeMetricFamily(
            "spark_watchdog_node_verdict",
            "Each node's verdict (1 for the current one, 0 otherwise).",
            labels=["node", "verdict"],
        )
        silent = GaugeMetricFamily(
            "spark_watchdog_node_agent_silent_seconds",
            "Seconds since the node's agent last answered with an advancing seq.",
            labels=["node"],
        )
        misses = GaugeMetricFamily(
            "spark_watchdog_node_ssh_banner_misses",
            "Consecutive SSH banner checks without a banner.",
            labels=["node"],
        )
        held = GaugeMetricFamily(
            "spark_watchdog_node_held", "1 when the node is held.", labels=["node"]
        )
        for node in status.get("nodes", []):
            name = str(node.get("name"))
            for v in VERDICTS:
                verdict.add_metric([name, v], 1.0 if node.get("verdict") == v else 0.0)
            silent.add_metric([name], float(node.get("agent_silent_s") or 0.0))
            misses.add_metric([name], float(node.get("banner_misses") or 0))
            held.add_metric([name], 1.0 if node.get("state") == NodeState.HELD.value else 0.0)
        yield verdict
        yield silent
        yield misses
        yield held
        ticks = CounterMetricFamily(
            "spark_watchdog_controller_polls", "Poll sweeps since the controller started."
        )
        ticks.add_metric([], float(status.get("ticks", 0)))
        yield ticks
        sweep = GaugeMetricFamily(
            "spark_watchdog_controller_poll_sweep_seconds",
            "How long the last poll sweep of every node took (should stay under poll_interval).",
        )
        sweep.add_metric([], float(status.get("last_sweep_s", 0.0)))
        yield sweep
        witness = GaugeMetricFamily(
            "spark_watchdog_controller_witness_ok", "1 when the witness targets answer."
        )
        witness.add_metric([], 1.0 if status.get("witness") == "ok" else 0.0)
        yield witness


class StatusEndpoint(HttpEndpoint):
    def __init__(self, address: str, port: int, source: StatusSource) -> None:
        import json

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(source))

        def status() -> Response:
            return 200, JSON, json.dumps(source.published).encode() + b"\n"

        def metrics() -> Response:
            return 200, PROMETHEUS_TEXT, bytes(generate_latest(registry))

        super().__init__(address, port, {"/v1/status": status, "/metrics": metrics})
