"""Shared by the deploy tests: the real ``/metrics`` of the agent and the controller.

The dashboard, the alert rules and the naming tests all check against these
expositions, so a renamed metric fails them. Both come from the real
collectors fed with state the real code produced:

- the agent's snapshot is built from real probe reports: the vLLM probe's
  scraper and progress tracker reading a vLLM stand-in over HTTP (one engine
  progressing, one wedged), the recorded H200 NVML answer, the host probe on
  the committed fake ``/proc`` tree, and a journal report whose previous
  boot ended uncleanly after an Xid;
- the controller is the real ``Controller`` with a real history: it polls
  four nodes whose agents are gone, while the test writes incidents and
  power actions through its ledger the way the escalation ladder does, and
  holds one node.

``metric_names_in`` pulls metric names (and the label names of their
matchers) out of PromQL, for the dashboard and rule tests. ``binary`` finds
promtool, amtool and Alertmanager: without them a test skips, except in CI
(``CI`` set), where a missing tool fails it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from spark_watchdog.agent.clock_check import ClockCheck, ClockPolicy
from spark_watchdog.agent.exposition import render as render_agent
from spark_watchdog.agent.memory_watch import MemoryWatch
from spark_watchdog.agent.probe_runner import Observation, iso_time
from spark_watchdog.config.agent import MemoryGuardConfig
from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.page.status_api import render as render_controller
from spark_watchdog.controller.page.status_api import render_standby
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port as _closed_port
from spark_watchdog.probes.gpu import GpuReading, low_power_while_running
from spark_watchdog.probes.host import HostProbe
from spark_watchdog.probes.journal import BootRecord, Evidence, JournalReport
from spark_watchdog.probes.vllm import VllmScraper
from spark_watchdog.probes.vllm_progress import ProgressTracker
from spark_watchdog.probes.vllm_status import VllmStatus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REPO = Path(__file__).resolve().parents[2]

# Series Prometheus makes itself for every target, and the labels it adds.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped"})
TARGET_LABELS = frozenset({"job", "instance"})


@dataclass(frozen=True)
class Exposition:
    """One ``/metrics`` body, parsed: families, and the label names of each sample name."""

    text: str
    families: tuple[Any, ...]  # prometheus_client.Metric

    @property
    def labels_by_sample(self) -> dict[str, frozenset[str]]:
        names: dict[str, set[str]] = {}
        for family in self.families:
            for sample in family.samples:
                names.setdefault(sample.name, set()).update(sample.labels)
        return {name: frozenset(labels) for name, labels in names.items()}


def parse_exposition(body: bytes) -> Exposition:
    text = body.decode()
    return Exposition(text, tuple(text_string_to_metric_families(text)))


# -- the agent ----------------------------------------------------------------


def _vllm_report() -> Observation:
    """Two scrapes of a 2-engine vLLM stand-in, engine 1 wedged, through the real probe."""
    tracker = ProgressTracker(stall_after=15.0)
    with VllmStandin(engines=2, seed=11, step_rate=40.0) as vllm:
        vllm.set_mode("wedged", engine=1)
        scraper = VllmScraper(vllm.url, timeout=2.0, max_body_bytes=4 << 20)
        tracker.update(scraper.scrape(), time.monotonic())
        vllm.advance(5)
        time.sleep(0.2)
        started = time.monotonic()
        status = tracker.update(scraper.scrape(), time.monotonic())
    assert isinstance(status, VllmStatus) and status.engine_steps, status
    return Observation(status, time.time(), time.monotonic() - started)


def _journal_report() -> JournalReport:
    now = datetime.now(timezone.utc)
    xid = Evidence(
        now - timedelta(hours=1, minutes=1),
        "xid",
        "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, name=python3, Ch 00000008",
    )
    previous = BootRecord(
        boot_id="5e2ffed9" * 4,
        first_entry=now - timedelta(hours=9),
        last_entry=now - timedelta(hours=1),
        current=False,
        clean_shutdown=False,  # no "Journal stopped": the host froze
        evidence=(xid,),
        evidence_counts={"xid": 1, "nv_err_no_memory": 5},
        kernel_lines=1200,
        uncleanly_shut_down_logged=False,
    )
    current = BootRecord(
        boot_id="e3d068f0" * 4,
        first_entry=now - timedelta(minutes=50),
        last_entry=now,
        current=True,
        clean_shutdown=None,
        evidence=(),
        evidence_counts={"xid": 0},
        kernel_lines=800,
        uncleanly_shut_down_logged=True,
    )
    return JournalReport("ok", boots=(previous, current), scanned_entries=2000)


def agent_snapshot(proc_root: Path) -> dict[str, Any]:
    """What the agent's ``build_snapshot`` publishes, from real probe reports."""
    vllm = _vllm_report()
    gpu = GpuReading.from_json(json.loads((FIXTURES / "gpu/h200_probe_gpu.json").read_text()))
    assert gpu.state == "ok", gpu.error
    gpu_json = Observation(gpu, time.time(), gpu.duration_s).to_json()
    running = vllm.report.running if isinstance(vllm.report, VllmStatus) else None
    gpu_json["low_power_while_running"] = low_power_while_running(gpu, running, 30.0)

    journal = _journal_report()
    journal_json = journal.summary_json()
    journal_json.update(observed_at=iso_time(time.time()), duration_s=0.42)

    # MemAvailable falls 1 GiB/s over two readings: the trend is real arithmetic,
    # and the real memory guard judges both readings (plenty left: no kill).
    probe = HostProbe(proc_root)
    memory = MemoryWatch(MemoryGuardConfig(), launcher=None, process_match=None)
    memory.observe(probe.read(now=100.0), 100.0)
    meminfo = proc_root / "meminfo"
    meminfo.write_text(
        re.sub(
            r"MemAvailable:\s+(\d+) kB",
            lambda m: f"MemAvailable:   {int(m.group(1)) - 2 * 1024 * 1024} kB",
            meminfo.read_text(),
        )
    )
    host = probe.read(loop_lag_s=0.003, now=102.0)
    assert host.state == "ok" and host.mem_available_trend_bytes_per_s, host
    assert memory.observe(host, 102.0).state == "clear"
    host_json = host.to_json()
    host_json["observed_at"] = iso_time(time.time())

    # The real clock check, judging the real GPU's clock as if it were busy.
    busy = replace(gpu.devices[0], utilization_gpu_pct=95)
    clock = ClockCheck(ClockPolicy(busy_samples=1), started=0.0)
    clock.observe(replace(gpu, devices=(busy,)), 1.0)
    assert clock.state in ("ok", "latched"), clock.to_json()

    return {
        "node": "spark-2",
        "boot_id": host.boot_id,
        "seq": 812,
        "started_at": iso_time(time.time() - 3000),
        "observed_at": iso_time(time.time()),
        "version": "0.1.0",
        "loop_lag_s": 0.003,
        "healthy": True,
        "probes": {
            "vllm": vllm.to_json(),
            "gpu": gpu_json,
            "journal": journal_json,
            "host": host_json,
        },
        "memory_guard": memory.to_json(),
        "gpu_clock_check": clock.to_json(),
    }


@pytest.fixture(scope="session")
def agent_exposition(tmp_path_factory: pytest.TempPathFactory) -> Exposition:
    proc = tmp_path_factory.mktemp("agent") / "proc"
    shutil.copytree(FIXTURES / "proc", proc)
    snapshot = agent_snapshot(proc)
    return parse_exposition(render_agent(lambda: snapshot))


# -- the controller -----------------------------------------------------------


def controller_config(directory: Path) -> dict[str, Any]:
    community = directory / "pdu-community"
    community.write_text("private\n")
    return {
        "nodes": [
            {
                "name": f"spark-{i}",
                # Nothing listens there: the agents are gone, the banners refused.
                "agent": f"http://127.0.0.1:{_closed_port()}",
                "ssh_host": "127.0.0.1",
                "ssh_port": _closed_port(),
                "power": [
                    {
                        "type": "snmp",
                        "host": "127.0.0.1",
                        "port": _closed_port(),
                        "outlet": i,
                        "vendor": "auto",
                        "community_file": str(community),
                    }
                ],
            }
            for i in range(1, 5)
        ],
        "detection": {"poll_interval": 0.2},
        "listen": {"address": "127.0.0.1", "port": _closed_port()},
        "history": str(directory / "history.db"),
    }


async def _drive(controller: Controller) -> None:
    """Run the real loop while writing what a few incidents would have written."""
    stop = asyncio.Event()
    loop = asyncio.create_task(controller.run(stop))
    ledger, store = controller.ledger, controller.ledger.store

    async def ticks(count: int) -> None:
        target = controller.ticks + count
        for _ in range(200):
            if controller.ticks >= target:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"the controller did not reach {target} poll sweeps")

    await ticks(1)
    # A freeze recovered by one verified cycle (what the freeze ladder writes).
    frozen = await ledger.write(
        store.open_incident, "host_frozen", ["spark-3"], detected_at=time.time(), evidence={}
    )
    action = await ledger.write(
        store.record_action,
        "spark-3",
        "cycle",
        device="snmp 127.0.0.1 outlet 3",
        incident_id=frozen.id,
        rung=0,
        step="rung_started",
    )
    await ledger.write(store.finish_action, action.id, "verified")
    await ledger.write(store.resolve_incident, frozen.id, "recovered")
    # A freeze where the PDU failed: the controller gave up.
    lost = await ledger.write(
        store.open_incident, "host_frozen", ["spark-4"], detected_at=time.time(), evidence={}
    )
    failed = await ledger.write(
        store.record_action, "spark-4", "cycle", device="snmp", incident_id=lost.id, rung=0
    )
    await ledger.write(store.finish_action, failed.id, "failed", error="PDU did not answer")
    await ledger.write(store.resolve_incident, lost.id, "gave_up")
    await ledger.write(store.hold, "spark-4", "gave up: every power path was tried", by="test")
    # A serving stall still being handled.
    await ledger.write(
        store.open_incident, "serving_stalled", ["spark-1"], detected_at=time.time(), evidence={}
    )
    await ticks(2)
    stop.set()
    await loop


@pytest.fixture(scope="session")
def controller_exposition(tmp_path_factory: pytest.TempPathFactory) -> Exposition:
    config = parse_controller_config(controller_config(tmp_path_factory.mktemp("controller")))
    store = HistoryStore(config.history)
    try:
        # As one controller of a pair leads (controller/pair/pair.py): its families too.
        leads = Fence(leadership=lambda: {"holder": "mgmt-1:4242:ab12cd34", "epoch": 3})
        controller = Controller(config, store, io=ControllerIO.production(config, fence=leads))
        asyncio.run(_drive(controller))
        assert controller.published["nodes"], "the controller published no node"
        return parse_exposition(render_controller(controller))
    finally:
        store.close()


@pytest.fixture(scope="session")
def standby_exposition() -> Exposition:
    """A standby of a pair, seeing another controller lead at epoch 3."""
    leader = {"holder": "mgmt-1:4242:ab12cd34", "epoch": 3, "expired": False}
    view = {"holder": "mgmt-2:77:0f0f0f0f", "leader": leader, "history": "ok"}
    return parse_exposition(render_standby(lambda: view))


@pytest.fixture(scope="session")
def exposed(
    agent_exposition: Exposition, controller_exposition: Exposition, standby_exposition: Exposition
) -> dict[str, Any]:
    """Every sample name the agent, controller and standby expose, with its label names."""
    names: dict[str, frozenset[str]] = {}
    for exposition in (agent_exposition, controller_exposition, standby_exposition):
        for name, labels in exposition.labels_by_sample.items():
            names[name] = names.get(name, frozenset()) | labels
    return names


# -- PromQL -------------------------------------------------------------------

_FUNCTIONS_AND_KEYWORDS = frozenset(
    [
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "rate",
        "irate",
        "increase",
        "delta",
        "idelta",
        "deriv",
        "changes",
        "resets",
        "predict_linear",
        "absent",
        "absent_over_time",
        "present_over_time",
        "avg_over_time",
        "min_over_time",
        "max_over_time",
        "sum_over_time",
        "count_over_time",
        "last_over_time",
        "quantile_over_time",
        "stddev_over_time",
        "abs",
        "ceil",
        "floor",
        "round",
        "clamp",
        "clamp_min",
        "clamp_max",
        "sgn",
        "exp",
        "ln",
        "log2",
        "log10",
        "sqrt",
        "time",
        "timestamp",
        "vector",
        "scalar",
        "sort",
        "sort_desc",
        "label_replace",
        "label_join",
        "histogram_quantile",
        "days_in_month",
        "day_of_month",
        "day_of_week",
        "hour",
        "minute",
        "month",
        "year",
        "inf",
        "nan",
    ]
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", re.IGNORECASE
)
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.$])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:])")


@dataclass(frozen=True)
class PromqlNames:
    metrics: frozenset[str]
    # (metric, label) for each label matcher written on a named selector.
    matcher_labels: frozenset[tuple[str, str]]


def metric_names_in(expr: str) -> PromqlNames:
    """Metric names an expression selects, and the labels its matchers name.

    A small reader, not a parser: strings, Grafana variables, ranges and
    grouping label lists are cut first; what is left that is not a function,
    keyword or number is a metric name. Good enough for our own rules and
    panels; ``test_promql_reader`` pins what it must see.
    """
    text = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", "1", expr)
    text = _STRING.sub('""', text)
    matchers: set[tuple[str, str]] = set()
    for match in _SELECTOR.finditer(text):
        if match.group(1):
            for label in _MATCHER.findall(match.group(2)):
                matchers.add((match.group(1), label[0]))
    text = _SELECTOR.sub(lambda m: m.group(1) or "", text)
    text = _GROUPING.sub(" ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    names = {
        m.group(1)
        for m in _IDENT.finditer(text)
        if m.group(1).lower() not in _FUNCTIONS_AND_KEYWORDS
        and not re.match(r"\s*\(", text[m.end() :])
    }
    return PromqlNames(frozenset(names), frozenset(matchers))


@pytest.fixture(scope="session")
def promql_names() -> Callable[[str], PromqlNames]:
    return metric_names_in


@pytest.fixture(scope="session")
def check_promql(exposed: dict[str, frozenset[str]]) -> Callable[[str, str], list[str]]:
    """Problems with one expression: unknown metrics, unknown matcher labels, no metric."""

    def check(where: str, expr: str) -> list[str]:
        found = metric_names_in(expr)
        problems: list[str] = []
        if not found.metrics:
            problems.append(f"{where}: no metric name found in {expr!r}")
        for name in sorted(found.metrics):
            if name not in exposed and name not in PROMETHEUS_SERIES:
                problems.append(f"{where}: {name} is not exposed by the agent or the controller")
        for name, label in sorted(found.matcher_labels):
            known = exposed.get(name)
            if known is not None and label not in known | TARGET_LABELS:
                problems.append(f"{where}: {name} has no label {label!r} (it has {sorted(known)})")
        return problems

    return check


# -- tools ---------------------------------------------------------------------


def find_binary(*names: str) -> str:
    """The first of ``names`` on PATH; a skip without one, a failure in CI."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    why = f"{' or '.join(names)} is not installed (scripts/setup.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run this test, so it fails instead of skipping")
    pytest.skip(why)


@pytest.fixture
def binary() -> Callable[..., str]:
    return find_binary


@pytest.fixture(name="grafana_to_promql")
def grafana_to_promql_fixture() -> Callable[[str], str]:
    return grafana_to_promql


def grafana_to_promql(expr: str) -> str:
    """A panel's expression with Grafana's variables replaced, for promtool to parse."""
    for variable in ("$__rate_interval", "$__interval", "$__range"):
        expr = expr.replace(variable, "1m")
    return re.sub(r"\$\{?[A-Za-z_]\w*\}?", ".+", expr)


@pytest.fixture
def promql_syntax(binary: Callable[..., str], tmp_path: Path) -> Callable[[list[str]], None]:
    """Parses expressions with promtool (as recording rules), failing on the first bad one."""
    promtool = binary("promtool")

    def check(exprs: list[str]) -> None:
        rules = [{"record": f"check:expr_{i}", "expr": e} for i, e in enumerate(exprs)]
        path = tmp_path / "exprs.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, f"promtool cannot parse an expression:\n{done.stderr}"

    return check
