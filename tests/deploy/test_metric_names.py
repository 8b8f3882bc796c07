"""Every metric the agent and the controller expose follows Prometheus naming.

The conventions (https://prometheus.io/docs/practices/naming/): one prefix,
``spark_watchdog_``; the base unit as the suffix (``_seconds``, ``_bytes``,
``_watts``, ``_celsius``, ``_hertz``, ``_ratio``), never a scaled one;
``_total`` on counters and only on counters; HELP text on every family. The
expositions are the real collectors' (conftest.py), so a metric renamed
without its unit, or a counter turned gauge, fails here.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

PREFIX = "spark_watchdog_"
UNIT_SUFFIXES = ("_seconds", "_bytes", "_watts", "_celsius", "_hertz", "_ratio")
# A rate of a base unit is still base units: MemAvailable's trend.
RATE_SUFFIXES = ("_bytes_per_second",)
UNIT_WORDS = re.compile(r"_(seconds|bytes|watts|celsius|hertz|ratio)(?=_)")
SCALED_UNITS = re.compile(
    r"_(ms|us|ns|msec|millis|milliseconds|microseconds|minutes|hours|days|kb|mb|gb|kib|mib|gib"
    r"|khz|mhz|ghz|mw|kw|percent|pct|celcius|fahrenheit)(_|$)"
)

# Families with no unit, and what they hold instead: counts, state sets,
# booleans, an identity. A family missing from here must carry a unit.
UNITLESS = {
    "spark_watchdog_agent_info": "identity, value 1",
    "spark_watchdog_agent_loops": "main loop iterations",
    "spark_watchdog_probe_state": "state set",
    "spark_watchdog_vllm_requests_running": "requests",
    "spark_watchdog_vllm_requests_waiting": "requests",
    "spark_watchdog_vllm_engine_steps": "engine steps",
    "spark_watchdog_gpu_low_power_while_running": "boolean",
    "spark_watchdog_gpu_clock_latched": "boolean",
    "spark_watchdog_node_gpu_clock_latched": "boolean",
    "spark_watchdog_host_load1": "load average",
    "spark_watchdog_journal_previous_boot_clean": "boolean",
    "spark_watchdog_journal_current_boot_evidence_lines": "journal lines",
    "spark_watchdog_memory_guard_kills": "kills",
    "spark_watchdog_node_verdict": "state set",
    "spark_watchdog_node_hardware_suspect": "boolean",
    "spark_watchdog_node_power_cycles": "power cycles",
    "spark_watchdog_node_ssh_banner_misses": "banner checks",
    "spark_watchdog_node_held": "boolean",
    "spark_watchdog_node_verdict_changes": "verdict changes",
    "spark_watchdog_controller_polls": "poll sweeps",
    "spark_watchdog_controller_witness_ok": "boolean",
    "spark_watchdog_controller_history_writable": "boolean",
    "spark_watchdog_controller_leader_epoch": "leadership epoch",
    "spark_watchdog_controller_seen_leader_epoch": "leadership epoch",
    "spark_watchdog_cluster_held": "boolean",
    "spark_watchdog_notifications": "notifications",
    "spark_watchdog_incidents": "incidents",
    "spark_watchdog_incidents_resolved": "incidents",
    "spark_watchdog_incidents_open": "incidents",
    "spark_watchdog_power_actions": "actions",
}

SOURCES = ("agent", "controller", "standby")


@pytest.fixture(params=SOURCES)
def exposition(request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue(f"{request.param}_exposition")


# A standby of a pair says only who leads (status_api.StandbyEndpoint).
MIN_FAMILIES = {"agent": 10, "controller": 10, "standby": 2}


def test_every_family_has_samples_so_the_checks_below_see_it(
    exposition: Any, request: pytest.FixtureRequest
) -> None:
    empty = [f.name for f in exposition.families if not f.samples]
    assert not empty, f"families without a sample in the realistic exposition: {empty}"
    source = request.node.callspec.params["exposition"]
    assert len(exposition.families) >= MIN_FAMILIES[source]


def test_every_family_has_the_prefix_and_help(exposition: Any) -> None:
    problems = []
    for family in exposition.families:
        if not family.name.startswith(PREFIX):
            problems.append(f"{family.name}: no {PREFIX} prefix")
        help_text = family.documentation.strip()
        if len(help_text) < 10 or help_text.replace(" ", "_") == family.name:
            problems.append(f"{family.name}: HELP text missing or empty ({help_text!r})")
        if f"# HELP {family.samples[0].name} " not in exposition.text and (
            f"# HELP {family.name} " not in exposition.text
        ):
            problems.append(f"{family.name}: no # HELP line in the exposition")
    assert not problems, "\n".join(problems)


def test_no_series_appears_twice(exposition: Any) -> None:
    # Prometheus rejects a scrape's duplicate series (same name and labels).
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    twice = []
    for family in exposition.families:
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if key in seen:
                twice.append(f"{sample.name}{dict(key[1])}")
            seen.add(key)
    assert not twice, f"series exposed twice: {twice}"


def test_counters_end_in_total_and_only_counters_do(exposition: Any) -> None:
    problems = []
    for family in exposition.families:
        names = {s.name for s in family.samples}
        if family.type == "counter":
            wrong = sorted(n for n in names if n != f"{family.name}_total")
            if wrong:
                problems.append(f"counter {family.name}: samples {wrong} do not end in _total")
        else:
            wrong = sorted(n for n in names if re.search(r"_(total|count|sum|bucket)$", n))
            if wrong:
                problems.append(f"{family.type} {family.name}: {wrong} look like counter series")
    assert not problems, "\n".join(problems)


def test_units_are_base_units_in_the_suffix(exposition: Any) -> None:
    problems = []
    for family in exposition.families:
        name = family.name
        if SCALED_UNITS.search(name):
            problems.append(f"{name}: a scaled unit; use the base unit")
        if name.endswith(RATE_SUFFIXES):
            continue
        if UNIT_WORDS.search(name):
            problems.append(f"{name}: the unit must be the suffix, not inside the name")
        has_unit = name.endswith(UNIT_SUFFIXES)
        if not has_unit and name not in UNITLESS:
            problems.append(f"{name}: no unit suffix {UNIT_SUFFIXES} and not a known unitless one")
        if has_unit and name in UNITLESS:
            problems.append(f"{name}: carries a unit but is listed as unitless")
    assert not problems, "\n".join(problems)


def test_ratios_are_between_zero_and_one(exposition: Any) -> None:
    for family in exposition.families:
        if family.name.endswith("_ratio"):
            for sample in family.samples:
                assert 0.0 <= sample.value <= 1.0, f"{sample.name}{sample.labels}={sample.value}"


def test_the_unitless_list_names_only_exposed_families(
    agent_exposition: Any, controller_exposition: Any, standby_exposition: Any
) -> None:
    expositions = (agent_exposition, controller_exposition, standby_exposition)
    exposed = {f.name for e in expositions for f in e.families}
    stale = sorted(set(UNITLESS) - exposed)
    assert not stale, f"UNITLESS names families nobody exposes (renamed?): {stale}"


def test_the_controller_counts_what_the_ladder_wrote(controller_exposition: Any) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in controller_exposition.families
        for s in family.samples
    }
    cycle = (("node", "spark-3"), ("operation", "cycle"), ("result", "verified"))
    assert samples[("spark_watchdog_power_actions_total", cycle)] == 1
    failed = (("node", "spark-4"), ("operation", "cycle"), ("result", "failed"))
    assert samples[("spark_watchdog_power_actions_total", failed)] == 1
    frozen = (("kind", "host_frozen"), ("node", "spark-3"))
    assert samples[("spark_watchdog_incidents_total", frozen)] == 1
    gave_up = (("kind", "host_frozen"), ("node", "spark-4"), ("resolution", "gave_up"))
    assert samples[("spark_watchdog_incidents_resolved_total", gave_up)] == 1
    stalled = (("kind", "serving_stalled"), ("node", "spark-1"))
    assert samples[("spark_watchdog_incidents_open", stalled)] == 1
    assert ("spark_watchdog_incidents_open", frozen) not in samples, "a resolved one is not open"
    held = (("node", "spark-4"), ("verdict", "held"))
    assert samples[("spark_watchdog_node_verdict", held)] == 1
    assert samples[("spark_watchdog_node_verdict_changes_total", held)] == 1
    assert samples[("spark_watchdog_controller_poll_interval_seconds", ())] == 0.2
    assert samples[("spark_watchdog_controller_freeze_after_seconds", ())] == 8.0
