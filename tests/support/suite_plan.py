"""How the suite runs side by side, and where its time goes.

scripts/test.sh runs pytest with pytest-xdist (``--dist loadgroup``): each
worker takes whole groups of tests, one test at a time. This plugin gives
every test its group and orders the groups:

- A test is in the group named after its module, unless it names a group of
  its own (``@pytest.mark.xdist_group("...")``). A module's tests then share
  its module-scoped labs and servers on one worker, built once.
- What must not overlap has one group: the real-vLLM tier (one vLLM at a time
  on a 2-core machine), the Docker tier (one dockerd of its own) and the labs
  on the fixed network-namespace addresses (``lab-netns``). Each live guest
  is one module, so one group.
- Groups are handed out longest first, from ``group_times.json`` (seconds per
  group from an earlier run; a group not listed counts as ``UNKNOWN_S``), so
  that the long ones do not start last.

At the end of every run it prints the 20 slowest tests (setup, call and
teardown together) and the time of each group. ``--group-times=PATH``
writes the run's group times as JSON, the form of ``group_times.json``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.lab import ports

TESTS = Path(__file__).resolve().parents[1]
GROUP_TIMES = Path(__file__).with_name("group_times.json")
GROUP_TIMES_VARIABLE = "SPARK_WATCHDOG_GROUP_TIMES"  # another file (the plugin's own test)
# A group the file does not know (a new module): after the long ones, before the short.
UNKNOWN_S = 5.0
SLOWEST = 20
# Directories whose tests form one group, wherever their modules are.
# One vLLM at a time; one dockerd and one image for the Docker tier.
DIRECTORY_GROUPS = {"real_vllm": "real-vllm", "docker": "docker"}
CPU_PROPERTY = "cpu_s"
_CPU_AT_START = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--group-times",
        metavar="PATH",
        default=None,
        help="write each xdist group's summed test time (s) to PATH as JSON",
    )


def group_of(item: pytest.Item) -> str:
    """The xdist group ``item`` runs in."""
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return str(marker.args[0] if marker.args else marker.kwargs["name"])
    path = Path(str(item.path)).resolve()
    relative = path.relative_to(TESTS) if TESTS in path.parents else Path(path.name)
    for part in relative.parts[:-1]:
        if part in DIRECTORY_GROUPS:
            return DIRECTORY_GROUPS[part]
    return relative.with_suffix("").as_posix()


def _expected() -> dict[str, float]:
    path = Path(os.environ.get(GROUP_TIMES_VARIABLE) or GROUP_TIMES)
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in loaded.items()} if isinstance(loaded, dict) else {}


# Before xdist's own hook, which appends the group to each test's id.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    groups: dict[str, str] = {}
    for item in items:
        group = groups[item.nodeid] = group_of(item)
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
    # In an xdist worker (where the order counts: the workers' collections are
    # the queue), xdist has set dist to "no" and loadgroup to True.
    if not getattr(config.option, "loadgroup", False):
        return
    expected = _expected()
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(groups[item.nodeid], index)

    def key(pair: tuple[int, pytest.Item]) -> tuple[float, int, int]:
        index, item = pair
        group = groups[item.nodeid]
        return (-expected.get(group, UNKNOWN_S), first_seen[group], index)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


def _cpu_now() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Each test's CPU time (setup to teardown, with the processes it started
    and waited for), carried to the reporting process in its teardown report."""
    item.stash[_CPU_AT_START] = _cpu_now()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report: pytest.TestReport = yield
    started = item.stash.get(_CPU_AT_START, None)
    if call.when == "teardown" and started is not None:
        report.user_properties.append((CPU_PROPERTY, round(_cpu_now() - started, 3)))
    return report


@dataclass
class _Timed:
    seconds: float = 0.0
    cpu_s: float = 0.0
    start: float | None = None
    stop: float | None = None
    worker: str = ""

    def add(self, report: pytest.TestReport) -> None:
        self.seconds += report.duration
        for name, value in report.user_properties:
            if name == CPU_PROPERTY and isinstance(value, (int, float)):
                self.cpu_s += value
        start, stop = getattr(report, "start", None), getattr(report, "stop", None)
        if start is not None:
            self.start = start if self.start is None else min(self.start, start)
        if stop is not None:
            self.stop = stop if self.stop is None else max(self.stop, stop)
        node = getattr(report, "node", None)
        gateway = getattr(node, "gateway", None)
        if gateway is not None:
            self.worker = str(gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """A worker's collection carries each test's group in its id (``id@group``);
    where none does, grouping is broken (pytest 9.2 with pytest-xdist 3.8: the
    id is no longer changed) and labs would be built on every worker at once."""
    grouping = node.config.getoption("dist", "no") == "loadgroup"
    if grouping and ids and not any("@" in i for i in ids):
        raise pytest.UsageError(
            "--dist loadgroup: no test id carries its group; this pytest and "
            "pytest-xdist do not group (pyproject.toml pins the pair that does)"
        )


class SuiteTimes:
    """Collects every test's phases in the process that reports them."""

    def __init__(self) -> None:
        self.tests: dict[str, _Timed] = {}
        self.groups: dict[str, _Timed] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid, _, group = report.nodeid.rpartition("@")
        if not nodeid or "]" in group:
            nodeid, group = report.nodeid, ""
        self.tests.setdefault(nodeid, _Timed()).add(report)
        self.groups.setdefault(group or "(no group)", _Timed()).add(report)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        write = terminalreporter.write_line
        if self.tests:
            terminalreporter.section(f"{SLOWEST} slowest tests (setup + call + teardown)")
            slowest = sorted(self.tests.items(), key=lambda kv: -kv[1].seconds)[:SLOWEST]
            for nodeid, timed in slowest:
                write(f"{timed.seconds:8.1f} s  (CPU {timed.cpu_s:6.1f} s)  {nodeid}")
        if self.groups:
            terminalreporter.section("time per xdist group (summed tests; first start to end; CPU)")
            for group, timed in sorted(self.groups.items(), key=lambda kv: -kv[1].seconds):
                span = (
                    f"{timed.stop - timed.start:8.1f} s"
                    if timed.start is not None and timed.stop is not None
                    else " " * 10
                )
                where = f"  {timed.worker}" if timed.worker else ""
                write(f"{timed.seconds:8.1f} s {span} {timed.cpu_s:7.1f} s{where}  {group}")
        out = config.getoption("group_times")
        if out:
            times = {g: round(t.seconds, 1) for g, t in sorted(self.groups.items())}
            Path(out).write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # Known also where pytest-xdist is not installed (a plain run elsewhere).
    config.addinivalue_line("markers", "xdist_group(name): the tests run on one worker, in turn")
    worker: dict[str, Any] | None = getattr(config, "workerinput", None)
    if worker is None:
        # Where reports end up: the controller of an xdist run, or a plain run.
        config.pluginmanager.register(SuiteTimes(), "suite-times")
        # The groups go out in this plugin's order (longest first), not xdist's
        # (most tests first).
        if config.getoption("dist", "no") == "loadgroup":
            config.option.loadscopereorder = False
        return
    # A worker's listeners, and those of everything it starts, take ports
    # from a slice of their own: no other worker can pick the same port, and
    # a rank matched by its host and port matches this worker's rank only.
    index, count = int(str(worker["workerid"]).removeprefix("gw")), int(worker["workercount"])
    low, high = ports.worker_range(index, count, ports.assigned_range())
    os.environ[ports.RANGE_VARIABLE] = f"{low}-{high}"
