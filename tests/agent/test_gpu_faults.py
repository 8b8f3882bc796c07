"""The agent's log of live GPU faults (agent/gpu_faults.py): a fault that ends the
rank's CUDA context stops the rank once, any other is evidence only."""

from __future__ import annotations

import asyncio

from spark_watchdog.agent.gpu_faults import FAULTS_KEPT, GpuFaultLog
from spark_watchdog.probes.xid_events import XidEvent, XidReport


def report(*xids: int, watcher: str = "on", dropped: int = 0) -> XidReport:
    events = tuple(XidEvent(x, 0, 100.0 + i) for i, x in enumerate(xids))
    return XidReport(watcher, None, events, dropped)


def test_a_context_ending_fault_stops_the_rank_once_per_read_and_others_are_evidence() -> None:
    stops: list[str] = []

    async def stop_rank() -> str:
        stops.append("stop")
        return "stopped"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(79, 31, 43)))
    faults = log.to_json()["faults"]
    assert [(f["id"], f["xid"], f["result"]) for f in faults] == [
        (1, 79, "evidence"),
        (2, 31, "stopped"),
        (3, 43, "stopped"),
    ]
    assert stops == ["stop"]  # one rank, one stop
    assert faults[1]["what"] == "Xid 31 (GPU memory page fault (MMU fault))"
    asyncio.run(log.take(None))  # a reading without a watcher changes nothing
    assert log.to_json()["watcher"] == "on" and len(log.to_json()["faults"]) == 3


def test_a_stop_that_fails_is_said_and_a_refused_watcher_is_reported() -> None:
    async def stop_rank() -> str:
        return "stop_failed"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(31)))
    assert log.to_json()["faults"][0]["result"] == "stop_failed"
    asyncio.run(log.take(XidReport("refused", "GPU 0: Not Supported")))
    assert log.to_json()["watcher"] == "refused"
    assert log.to_json()["detail"] == "GPU 0: Not Supported"


def test_a_flood_is_bounded_and_counted() -> None:
    async def stop_rank() -> str:
        return "no_rank"

    log = GpuFaultLog(stop_rank)
    asyncio.run(log.take(report(*([79] * (FAULTS_KEPT + 5)), dropped=7)))
    body = log.to_json()
    assert len(body["faults"]) == FAULTS_KEPT and body["dropped"] == 12
    assert body["faults"][-1]["id"] == FAULTS_KEPT + 5
