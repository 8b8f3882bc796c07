"""deploy/grafana/spark-watchdog.json: importable anywhere, and every query asks for a real metric.

Every metric a panel, an annotation or a variable queries must be one the
agent or the controller exposes (their real expositions, conftest.py): a
renamed metric fails here instead of leaving an empty panel.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/spark-watchdog.json"
DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# What the dashboard is for: each of these panels, with the metrics it must show.
REQUIRED_PANELS = {
    "Node verdicts": ("state-timeline", {"spark_watchdog_node_verdict"}),
    "Detection timeline": (
        "timeseries",
        {"spark_watchdog_incidents_total", "spark_watchdog_node_verdict_changes_total"},
    ),
    "Power actions": ("timeseries", {"spark_watchdog_power_actions_total"}),
    "Engine steps per second": ("timeseries", {"spark_watchdog_vllm_engine_steps_total"}),
    "Requests running / waiting": (
        "timeseries",
        {"spark_watchdog_vllm_requests_running", "spark_watchdog_vllm_requests_waiting"},
    ),
    "Seconds without progress": ("timeseries", {"spark_watchdog_vllm_without_progress_seconds"}),
    "GPU power": ("timeseries", {"spark_watchdog_gpu_power_watts"}),
    "MemAvailable": ("timeseries", {"spark_watchdog_host_mem_available_bytes"}),
    "MemAvailable trend": (
        "timeseries",
        {"spark_watchdog_host_mem_available_trend_bytes_per_second"},
    ),
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), f"{DASHBOARD}: expected a JSON object"
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, expr) for every PromQL query: panel targets, annotations, variables."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} target {target.get('refId')}", target["expr"]
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation:
            yield f"annotation {annotation['name']!r}", annotation["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable.get("type") == "query":
            query = variable["query"]
            text = query["query"] if isinstance(query, dict) else query
            # label_values(metric, label) is Grafana's, not PromQL: check its metric.
            if text.startswith("label_values("):
                text = text[len("label_values(") :].split(",")[0]
            yield f"variable {variable['name']!r}", text


def test_it_imports_into_any_grafana(dashboard: dict[str, Any]) -> None:
    assert 36 <= dashboard["schemaVersion"] <= 41, dashboard["schemaVersion"]
    inputs = {i["name"]: i for i in dashboard["__inputs"]}
    assert inputs["DS_PROMETHEUS"]["type"] == "datasource"
    assert inputs["DS_PROMETHEUS"]["pluginId"] == "prometheus"
    assert dashboard["id"] is None, "an exported dashboard has no instance id"
    assert dashboard["uid"] == "spark-watchdog"
    problems = []
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        if panel.get("datasource") != DATASOURCE:
            problems.append(f"panel {panel['title']!r}: datasource {panel.get('datasource')}")
        for target in panel.get("targets", []):
            if target.get("datasource", DATASOURCE) != DATASOURCE:
                problems.append(f"panel {panel['title']!r}: target datasource {target}")
        if not panel.get("description"):
            problems.append(f"panel {panel['title']!r}: no description")
    for annotation in dashboard["annotations"]["list"]:
        if "expr" in annotation and annotation["datasource"] != DATASOURCE:
            problems.append(f"annotation {annotation['name']!r}: {annotation['datasource']}")
    assert not problems, "\n".join(problems)


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), f"repeated panel ids: {ids}"
    taken: dict[tuple[int, int], str] = {}
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, f"{panel['title']!r} is wider than the dashboard"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = taken.setdefault((x, y), panel["title"])
                assert other == panel["title"], f"{panel['title']!r} overlaps {other!r}"


def test_the_panels_the_operators_need_are_there(
    dashboard: dict[str, Any], promql_names: Callable[[str], Any]
) -> None:
    by_title = {p["title"]: p for p in panels(dashboard)}
    for title, (kind, metrics) in REQUIRED_PANELS.items():
        assert title in by_title, f"no panel {title!r}; panels: {sorted(by_title)}"
        panel = by_title[title]
        assert panel["type"] == kind, f"{title!r} is a {panel['type']}, expected {kind}"
        shown = set().union(*(promql_names(t["expr"]).metrics for t in panel["targets"]))
        assert metrics <= shown, f"{title!r} does not query {sorted(metrics - shown)}"


def test_every_query_selects_metrics_that_exist(
    dashboard: dict[str, Any], check_promql: Callable[[str, str], list[str]]
) -> None:
    found = list(queries(dashboard))
    assert len(found) >= 20, f"expected the dashboard's queries, found {len(found)}"
    problems = [problem for where, expr in found for problem in check_promql(where, expr)]
    assert not problems, "\n".join(problems)


@pytest.mark.integration
def test_every_query_parses(
    dashboard: dict[str, Any],
    promql_syntax: Callable[[list[str]], None],
    grafana_to_promql: Callable[[str], str],
) -> None:
    promql_syntax([grafana_to_promql(expr) for _, expr in queries(dashboard)])
