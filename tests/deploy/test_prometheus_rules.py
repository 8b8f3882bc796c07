"""deploy/prometheus: the alert rules, their unit tests, and the example scrape config.

promtool checks the rules and runs their unit tests (deploy/prometheus/tests);
the checks below tie the rules to the product: each expression selects
metrics the agent or the controller really exposes, each alert has a
severity and the annotations an on-call person needs, and the `for:`
durations fit the controller's own timings (config defaults).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.config.controller import (
    DetectionConfig,
    GuardsConfig,
    PolicyConfig,
    ServingConfig,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy/prometheus"
RULES = DEPLOY / "spark-watchdog-rules.yml"
RULE_TESTS = DEPLOY / "tests/spark-watchdog-rules.test.yml"
SCRAPE_CONFIG = DEPLOY / "prometheus.example.yml"

# The alerts operators asked for; each must exist (more may).
REQUIRED = {
    "SparkWatchdogGaveUp",  # a node held, waiting for a person
    "SparkWatchdogNodeHeld",
    "SparkWatchdogHostFrozen",
    "SparkWatchdogServingStalled",
    "SparkWatchdogAgentDown",
    "SparkWatchdogAgentScrapeDown",
    "SparkWatchdogControllerDown",
    "SparkWatchdogCircuitBreaker",
    "SparkWatchdogManyNodesInTrouble",
    "SparkWatchdogWitnessFailing",
    "SparkWatchdogPollSweepSlow",
    "SparkWatchdogPreviousBootUnclean",
    "SparkWatchdogGpuProbeTimeout",
}
SEVERITIES = {"critical", "warning"}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(duration: str) -> float:
    parts = _DURATION.findall(duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"bad duration {duration!r}"
    return sum(int(n) * _SECONDS[u] for n, u in parts)


@pytest.fixture(scope="module")
def groups() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return list(loaded["groups"])


def alerts(groups: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for group in groups:
        for rule in group["rules"]:
            assert "alert" in rule, f"group {group['name']}: only alerting rules here: {rule}"
            yield group, rule


@pytest.fixture(scope="module")
def by_name(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for _, rule in alerts(groups):
        assert rule["alert"] not in found, f"alert {rule['alert']} is defined twice"
        found[rule["alert"]] = rule
    return found


def test_the_required_alerts_exist(by_name: dict[str, dict[str, Any]]) -> None:
    missing = REQUIRED - set(by_name)
    assert not missing, f"missing alerts: {sorted(missing)}"


def test_every_alert_has_severity_annotations_and_a_runbook(
    groups: list[dict[str, Any]],
) -> None:
    problems = []
    for group, rule in alerts(groups):
        name = rule["alert"]
        if not name.startswith("SparkWatchdog"):
            problems.append(f"{name}: alert names start with SparkWatchdog")
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity must be one of {sorted(SEVERITIES)}")
        for key in ("summary", "description", "runbook"):
            if len(str(rule.get("annotations", {}).get(key, "")).strip()) < 10:
                problems.append(f"{name}: annotation {key!r} missing or too short")
        interval = seconds(group["interval"])
        wait = seconds(rule.get("for", "0s"))
        if wait and wait < interval:
            problems.append(f"{name}: for {rule['for']} is shorter than its group's interval")
    assert not problems, "\n".join(problems)


def test_every_expression_selects_exposed_metrics(
    groups: list[dict[str, Any]], check_promql: Callable[[str, str], list[str]]
) -> None:
    problems = []
    for _, rule in alerts(groups):
        problems += check_promql(f"alert {rule['alert']}", rule["expr"])
    assert not problems, "\n".join(problems)


def test_for_durations_fit_the_controllers_timings(by_name: dict[str, dict[str, Any]]) -> None:
    detection, policy, guards = DetectionConfig(), PolicyConfig(), GuardsConfig()
    serving = ServingConfig()

    def wait(alert: str) -> float:
        return seconds(by_name[alert].get("for", "0s"))

    # The warning comes while the power is off, before the host is back on.
    assert (
        2 * detection.poll_interval <= wait("SparkWatchdogHostFrozen") <= policy.power_off_seconds
    )
    # One rung (off and on, each verified within power_timeout, then the boot
    # wait) must be able to finish before a person is paged.
    rung = policy.power_off_seconds + 2 * policy.power_timeout + guards.boot_timeout
    assert wait("SparkWatchdogHostNotRecovering") >= rung
    assert wait("SparkWatchdogServingNotRecovering") >= serving.start_timeout
    # A fraction past the breaker's means the breaker has tripped or is about to.
    fraction = by_name["SparkWatchdogManyNodesInTrouble"]["expr"]
    assert re.search(rf">\s*{guards.max_unhealthy_fraction}\s*$", fraction.strip()), fraction
    # The controller's own health: short, it cannot act on it itself.
    for alert in ("SparkWatchdogControllerDown", "SparkWatchdogWitnessFailing"):
        assert wait(alert) <= 60, f"{alert} waits too long for something nothing else fixes"


def test_every_alert_has_a_unit_test_that_fires_it(by_name: dict[str, dict[str, Any]]) -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text(encoding="utf-8"))["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    untested = sorted(set(by_name) - fired)
    assert not untested, f"alerts no promtool test fires: {untested}"


@pytest.mark.integration
def test_promtool_checks_the_rules_and_the_scrape_config(binary: Callable[..., str]) -> None:
    promtool = binary("promtool")
    for command in (["check", "rules", str(RULES)], ["check", "config", str(SCRAPE_CONFIG)]):
        done = subprocess.run(
            [promtool, *command], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"promtool {' '.join(command)}:\n{done.stdout}{done.stderr}"
    # The scrape config loads the rules file next to it.
    assert "SUCCESS: 1 rule files found" in done.stdout, done.stdout


@pytest.mark.integration
def test_promtool_rule_unit_tests_pass(binary: Callable[..., str]) -> None:
    promtool = binary("promtool")
    done = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"promtool test rules:\n{done.stdout}{done.stderr}"
    assert "SUCCESS" in done.stdout + done.stderr
