"""Xid critical errors, live: the NVML worker's watcher (probes/gpu_worker.py), the
events as the probe hands them on (probes/xid_events.py), and the lab's NVML
stand-in delivering them through the real worker process."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.probes.gpu import GpuProbe
from spark_watchdog.probes.gpu_worker import XID_EVENTS_KEPT, XidWatcher
from spark_watchdog.probes.xid_events import XidEvent, parse_xid_report


class EventNvml:
    """pynvml's event calls, with pynvml's own errors: events queued, then timeouts."""

    NVMLError = pynvml.NVMLError
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError

    def __init__(self, events: list[int], refuse: bool = False, fail: bool = False) -> None:
        self.events = list(events)
        self.refuse, self.fail = refuse, fail
        self.registered: list[int] = []

    def nvmlEventSetCreate(self) -> object:
        return object()

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: object) -> None:
        if self.refuse:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self.registered.append(types)

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> Any:
        if self.events:
            return SimpleNamespace(device=0, eventData=self.events.pop(0))
        if self.fail:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        time.sleep(timeout_ms / 1000.0)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def drained(watcher: XidWatcher, wanted: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    deadline = time.monotonic() + 30.0
    seen: list[dict[str, Any]] = []
    while True:
        state, events, _ = watcher.drain()
        seen += events
        if len(seen) >= wanted or time.monotonic() > deadline or state["state"] == "failed":
            return state, seen
        time.sleep(0.05)


def test_the_watcher_registers_xid_critical_errors_only_and_keeps_each_event() -> None:
    nvml = EventNvml([31, 13])
    watcher = XidWatcher(nvml, clock=lambda: 1234.5)
    watcher.start(1)
    state, events = drained(watcher, 2)
    assert nvml.registered == [pynvml.nvmlEventTypeXidCriticalError]
    assert state == {"state": "on", "detail": None}
    assert events == [
        {"xid": 31, "gpu": 0, "at_unix": 1234.5},
        {"xid": 13, "gpu": 0, "at_unix": 1234.5},
    ]


def test_a_refused_registration_and_a_failed_wait_are_said() -> None:
    refused = XidWatcher(EventNvml([], refuse=True))
    refused.start(1)
    state, events, _ = refused.drain()
    assert state["state"] == "refused" and "GPU 0" in str(state["detail"]) and events == []
    failing = XidWatcher(EventNvml([43], fail=True))
    failing.start(1)
    state, events = drained(failing, 2)
    assert state["state"] == "failed" and "nvmlEventSetWait_v2 failed" in str(state["detail"])
    assert [e["xid"] for e in events] == [43]  # what came before the failure is kept


def test_a_flood_is_bounded_and_counted() -> None:
    watcher = XidWatcher(EventNvml([]))
    for _ in range(XID_EVENTS_KEPT + 10):
        watcher._note(SimpleNamespace(device=0, eventData=31))
    _, events, dropped = watcher.drain()
    assert len(events) == XID_EVENTS_KEPT and dropped == 10
    assert watcher.drain()[1:] == ([], 0)


def test_malformed_events_are_counted_and_the_rest_stands() -> None:
    answer = {
        "xid_watcher": {"state": "on", "detail": None},
        "xid_events": [
            {"xid": 31, "gpu": 0, "at_unix": 5.0},
            {"xid": True, "at_unix": 5.0},
            {"xid": 31, "at_unix": float("inf")},
            {"xid": -1, "at_unix": 5.0},
            "Xid 31",
            {"xid": 79, "gpu": "0", "at_unix": 6},
        ],
        "xid_dropped": 2,
    }
    report = parse_xid_report(answer)
    assert report is not None
    assert report.events == (XidEvent(31, 0, 5.0), XidEvent(79, None, 6.0))
    assert report.malformed == 4 and report.dropped == 2 and report.watcher == "on"
    odd = parse_xid_report({"xid_watcher": {"state": "sideways"}, "xid_events": "x"})
    assert odd is not None and odd.watcher == "unknown" and odd.malformed == 1
    assert parse_xid_report({"state": "ok"}) is None


@pytest.mark.integration
def test_an_xid_reaches_the_probe_through_the_real_worker_and_the_lab_s_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = tmp_path / "nvml"
    modules.mkdir()
    shutil.copyfile(gpu_standin.__file__, modules / "pynvml.py")
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(modules))
    monkeypatch.setenv("SPARK_WATCHDOG_NODE_DIR", str(node))

    async def scenario() -> list[XidEvent]:
        async with GpuProbe(deadline=10) as probe:
            first = await probe.read()
            assert first.state == "ok", first.error
            assert first.xids is not None and first.xids.watcher == "on"
            gpu_standin.inject_xid(node, 31)
            seen: list[XidEvent] = []
            deadline = time.monotonic() + 60.0
            while not seen and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                reading = await probe.read()
                assert reading.xids is not None
                seen += reading.xids.events
            later = await probe.read()
            assert later.xids is not None and later.xids.events == ()  # delivered once
            return seen

    (event,) = asyncio.run(scenario())
    assert event.xid == 31 and event.gpu == 0 and abs(event.at_unix - time.time()) < 120
