"""The controller's HTTP surface: ``GET /v1/status`` (JSON) and ``GET /metrics``.

Metric names follow the agent's conventions (``spark_watchdog/agent/exposition.py``).
A scrape reads only what the controller already holds in memory (the last
published status and the tallies): never the history database, which may be
years long. docs/observability.md lists every family.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.record.tallies import Tallies
from spark_watchdog.http.server import JSON, PROMETHEUS_TEXT, HttpEndpoint, PathRoutes, Response
from spark_watchdog.verdicts import METRIC_LABELS

# The verdict metric's labels: every verdict the table gives one (spark_watchdog/verdicts.py).
VERDICTS = METRIC_LABELS


class StatusSource(Protocol):
    published: dict[str, Any]
    tallies: Tallies


# One gauge per node: (name, help, the value from the node's /v1/status entry).
_NODE_GAUGES: tuple[tuple[str, str, Callable[[dict[str, Any]], float]], ...] = (
    (
        "spark_watchdog_node_agent_silent_seconds",
        "Seconds since the node's agent last answered with an advancing seq.",
        lambda node: float(node.get("agent_silent_s") or 0.0),
    ),
    (
        "spark_watchdog_node_ssh_banner_misses",
        "Consecutive SSH banner checks without a banner.",
        lambda node: float(node.get("banner_misses") or 0),
    ),
    (
        "spark_watchdog_node_held",
        "1 when the node is held.",
        lambda node: 1.0 if node.get("state") == NodeState.HELD.value else 0.0,
    ),
    (
        "spark_watchdog_node_hardware_suspect",
        "1 when the node froze guards.suspect_freezes times within guards.suspect_window.",
        lambda node: 1.0 if node.get("hardware_suspect") else 0.0,
    ),
    (
        "spark_watchdog_node_gpu_clock_latched",
        "1 when the node's agent found its GPU clock-latched on this boot.",
        lambda node: 1.0 if node.get("gpu_clock_latched") else 0.0,
    ),
    (
        "spark_watchdog_node_power_cycles",
        "The node's power cycles in the history, ever (relay wear).",
        lambda node: float(node.get("power_cycles_total") or 0),
    ),
)


class _Collector:
    def __init__(self, source: StatusSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        status = self._source.published
        yield from _node_metrics(status.get("nodes", []))
        yield from _loop_metrics(status)
        leadership = status.get("leadership")
        if isinstance(leadership, dict):  # one controller of a pair (controller/pair/pair.py)
            yield _leader_epoch(leadership.get("epoch"))
        yield _gauge(
            "spark_watchdog_cluster_held",
            "1 while a cluster-wide hold (circuit breaker or an operator) is active.",
            1.0 if status.get("cluster_hold") else 0.0,
        )
        notifications = CounterMetricFamily(
            "spark_watchdog_notifications",
            "Notifications delivered, or dropped after every attempt, since the start.",
            labels=["result"],
        )
        sent = status.get("notifications") or {}
        for result in ("delivered", "dropped"):
            notifications.add_metric([result], float(sent.get(result, 0)))
        yield notifications
        yield from _tally_metrics(self._source.tallies)


def _gauge(name: str, doc: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family


def _node_metrics(nodes: list[dict[str, Any]]) -> Iterator[Metric]:
    verdict = GaugeMetricFamily(
        "spark_watchdog_node_verdict",
        "Each node's verdict (1 for the current one, 0 otherwise).",
        labels=["node", "verdict"],
    )
    families = [
        (GaugeMetricFamily(name, doc, labels=["node"]), value) for name, doc, value in _NODE_GAUGES
    ]
    for node in nodes:
        name = str(node.get("name"))
        for v in VERDICTS:
            verdict.add_metric([name, v], 1.0 if node.get("verdict") == v else 0.0)
        for family, value in families:
            family.add_metric([name], value(node))
    yield verdict
    for family, _ in families:
        yield family


def _loop_metrics(status: dict[str, Any]) -> Iterator[Metric]:
    """The poll loop, its settings, and what it depends on (witness, history)."""
    ticks = CounterMetricFamily(
        "spark_watchdog_controller_polls", "Poll sweeps since the controller started."
    )
    ticks.add_metric([], float(status.get("ticks", 0)))
    yield ticks
    yield _gauge(
        "spark_watchdog_controller_poll_sweep_seconds",
        "How long the last poll sweep of every node took (should stay under poll_interval).",
        float(status.get("last_sweep_s", 0.0)),
    )
    yield from _setting(
        "spark_watchdog_controller_poll_interval_seconds",
        "detection.poll_interval: how often every node is polled.",
        status.get("poll_interval_s"),
    )
    yield from _setting(
        "spark_watchdog_controller_freeze_after_seconds",
        "detection.freeze_after: agent silence before a host can be called frozen.",
        status.get("freeze_after_s"),
    )
    yield _gauge(
        "spark_watchdog_controller_witness_ok",
        "1 when the witness targets answer.",
        1.0 if status.get("witness") == "ok" else 0.0,
    )
    yield _gauge(
        "spark_watchdog_controller_history_writable",
        "1 when the freeze history can be written; 0 means no power action can be taken.",
        1.0 if status.get("history", "ok") == "ok" else 0.0,
    )


def _leader_epoch(epoch: object) -> Metric:
    family = GaugeMetricFamily(
        "spark_watchdog_controller_leader_epoch",
        "The leadership epoch this controller of a pair leads at; 0 when it does not lead.",
    )
    family.add_metric([], float(epoch) if isinstance(epoch, int) else 0.0)
    return family


def _setting(name: str, doc: str, value: Any) -> Iterator[Metric]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        family = GaugeMetricFamily(name, doc)
        family.add_metric([], float(value))
        yield family


# (family, name, HELP, labels, the TallyView field it counts), in exposition order.
_TALLY_FAMILIES: tuple[
    tuple[type[CounterMetricFamily] | type[GaugeMetricFamily], str, str, list[str], str], ...
] = (
    (
        CounterMetricFamily,
        "spark_watchdog_incidents",
        "Incidents opened since the controller started, per node and kind.",
        ["node", "kind"],
        "incidents_opened",
    ),
    (
        CounterMetricFamily,
        "spark_watchdog_incidents_resolved",
        "Incidents resolved since the controller started (recovered, gave_up, false_alarm).",
        ["node", "kind", "resolution"],
        "incidents_resolved",
    ),
    (
        GaugeMetricFamily,
        "spark_watchdog_incidents_open",
        "Incidents open now, per node and kind.",
        ["node", "kind"],
        "incidents_open",
    ),
    (
        CounterMetricFamily,
        "spark_watchdog_power_actions",
        "Actions on a node (power off/on/cycle, SSH reboot, agent restart) with a recorded "
        "outcome since the controller started: verified, failed, ambiguous or dry_run.",
        ["node", "operation", "result"],
        "power_actions",
    ),
    (
        CounterMetricFamily,
        "spark_watchdog_node_verdict_changes",
        "Times a node's verdict changed, labelled with the verdict it changed to.",
        ["node", "verdict"],
        "verdict_changes",
    ),
)


def _tally_metrics(tallies: Tallies) -> Iterator[Metric]:
    view = tallies.view()
    for family_type, name, doc, labels, field in _TALLY_FAMILIES:
        family = family_type(name, doc, labels=labels)
        counts: dict[tuple[str, ...], int] = getattr(view, field)
        for key, count in sorted(counts.items()):
            family.add_metric(list(key), float(count))
        yield family


def render(source: StatusSource) -> bytes:
    """The controller's ``/metrics`` body."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(source))
    return bytes(generate_latest(registry))


class StatusEndpoint(HttpEndpoint):
    """``GET``/``HEAD`` ``/v1/status`` and ``/metrics`` on the agent's HTTP server,
    with its limits and JSON errors (docs/api/controller.openapi.yaml)."""

    def __init__(
        self,
        address: str,
        port: int,
        source: StatusSource,
        *,
        paths_of: PathRoutes | None = None,
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(source))

        def status() -> Response:
            return 200, JSON, json.dumps(source.published).encode() + b"\n"

        def metrics() -> Response:
            return 200, PROMETHEUS_TEXT, bytes(generate_latest(registry))

        routes = {"/v1/status": status, "/metrics": metrics}
        super().__init__(address, port, routes, paths_of=paths_of)


class _StandbyCollector:
    def __init__(self, view: Callable[[], dict[str, Any]]) -> None:
        self._view = view

    def collect(self) -> Iterator[Metric]:
        seen = self._view().get("leader")
        yield _leader_epoch(None)
        family = GaugeMetricFamily(
            "spark_watchdog_controller_seen_leader_epoch",
            "A standby of a pair: the epoch it sees leading; 0 when none does or the "
            "history cannot be read.",
        )
        leads = isinstance(seen, dict) and not seen.get("expired")
        family.add_metric([], float(seen["epoch"]) if leads and seen else 0.0)
        yield family


def render_standby(view: Callable[[], dict[str, Any]]) -> bytes:
    """A standby's ``/metrics`` body."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StandbyCollector(view))
    return bytes(generate_latest(registry))


class StandbyEndpoint(HttpEndpoint):
    """What a standby of a pair serves at the controller's address until it
    leads: ``/v1/status`` says that it stands by and who leads, ``/metrics``
    that it leads at no epoch. So both controllers of a pair answer their
    scrapes (a dead standby is seen), and "nobody leads" is an alert
    (deploy/prometheus/spark-watchdog-rules.yml). ``view`` is what the
    standby loop last saw (controller/pair/pair.py)."""

    def __init__(
        self,
        address: str,
        port: int,
        view: Callable[[], dict[str, Any]],
        *,
        paths_of: PathRoutes | None = None,
    ) -> None:
        def status() -> Response:
            return 200, JSON, json.dumps({"standby": view()}).encode() + b"\n"

        def metrics() -> Response:
            return 200, PROMETHEUS_TEXT, render_standby(view)

        routes = {"/v1/status": status, "/metrics": metrics}
        super().__init__(address, port, routes, paths_of=paths_of)
