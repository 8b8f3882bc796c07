"""The small PromQL reader the dashboard and rule tests rely on (conftest.metric_names_in)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("expr", "metrics", "labels"),
    [
        (
            'sum by (node, kind) (increase(spark_watchdog_incidents_total{node=~"$node"}'
            "[$__interval]))",
            {"spark_watchdog_incidents_total"},
            {("spark_watchdog_incidents_total", "node")},
        ),
        (
            "avg_over_time(spark_watchdog_controller_poll_sweep_seconds[1m])\n"
            "  > spark_watchdog_controller_poll_interval_seconds",
            {
                "spark_watchdog_controller_poll_sweep_seconds",
                "spark_watchdog_controller_poll_interval_seconds",
            },
            set(),
        ),
        (
            'up{job="spark-watchdog-controller"} == 0 or absent(up{job="x"})',
            {"up"},
            {("up", "job")},
        ),
        (
            'sum without (node, verdict) (a_metric{verdict=~"host_frozen|agent_down"})'
            " / count without (node) (b_metric) > 0.5",
            {"a_metric", "b_metric"},
            {("a_metric", "verdict")},
        ),
        (
            "x_bytes_per_second < -0.5 * 1024 and on (node) y_seconds offset 5m",
            {"x_bytes_per_second", "y_seconds"},
            set(),
        ),
        ('{__name__="hidden"}', set(), set()),
    ],
)
def test_promql_reader(
    promql_names: Callable[[str], Any],
    expr: str,
    metrics: set[str],
    labels: set[tuple[str, str]],
) -> None:
    found = promql_names(expr)
    assert found.metrics == metrics
    assert found.matcher_labels == labels


def test_an_unknown_metric_or_label_is_reported(
    check_promql: Callable[[str, str], list[str]],
) -> None:
    assert check_promql("here", "spark_watchdog_node_verdict == 1") == []
    problems = check_promql("here", 'rate(spark_watchdog_nope_total{node="a"}[1m])')
    assert problems == [
        "here: spark_watchdog_nope_total is not exposed by the agent or the controller"
    ]
    problems = check_promql("here", 'spark_watchdog_node_held{verdict="held"}')
    assert len(problems) == 1 and "has no label 'verdict'" in problems[0], problems
    assert check_promql("here", "vector(1)") == ["here: no metric name found in 'vector(1)'"]
