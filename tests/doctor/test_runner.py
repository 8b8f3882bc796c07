"""The runner: per-check deadlines, a crash is a failure, progress only for slow checks."""

from __future__ import annotations

import asyncio
import threading
import time

from spark_watchdog.doctor.result import DoctorReport, Finding, ok
from spark_watchdog.doctor.runner import PlannedCheck, in_daemon_thread, run_plan


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []

    def begin(self, label: str) -> None:
        self.events.append(f"begin {label}")

    def end(self) -> None:
        self.events.append("end")


def test_a_check_stuck_in_a_blocking_call_is_abandoned_and_the_rest_still_run() -> None:
    release = threading.Event()

    def stuck() -> Finding:
        release.wait(60)  # a call that never returns, like NVML in the driver
        return ok("never")

    async def quick() -> Finding:
        return ok("fine")

    plan = [
        PlannedCheck("node.stuck", "something stuck", 0.5, lambda: in_daemon_thread(stuck)),
        PlannedCheck("node.quick", "something quick", 5.0, quick),
    ]
    started = time.monotonic()
    checks = asyncio.run(run_plan(plan))
    release.set()
    assert time.monotonic() - started < 3.0
    assert [c.status for c in checks] == ["fail", "ok"]
    assert "did not finish within 0.5 s" in checks[0].detail
    assert checks[0].fix is not None


def test_a_check_that_raises_is_a_failure_naming_the_error() -> None:
    async def broken() -> Finding:
        raise RuntimeError("boom")

    (check,) = asyncio.run(run_plan([PlannedCheck("x", "the thing", 5.0, broken)]))
    assert check.status == "fail" and "RuntimeError: boom" in check.detail


def test_progress_is_shown_only_for_checks_that_take_a_while() -> None:
    async def slow() -> Finding:
        await asyncio.sleep(0.6)
        return ok("slow")

    async def fast() -> Finding:
        return ok("fast")

    progress = Recorder()
    plan = [
        PlannedCheck("a", "the fast one", 5.0, fast),
        PlannedCheck("b", "power device of spark-3", 5.0, slow),
    ]
    asyncio.run(run_plan(plan, progress))
    assert progress.events == ["begin power device of spark-3", "end"]


def test_the_report_counts() -> None:
    from spark_watchdog.doctor.result import Check

    report = DoctorReport(
        (
            Check("a", "ok", "fine"),
            Check("b", "warn", "hm", "do x"),
            Check("c", "skip", "n/a"),
        )
    )
    assert report.ok and report.failures == 0 and report.warnings == 1
    failing = DoctorReport((*report.checks, Check("d", "fail", "bad", "fix it")))
    assert not failing.ok and failing.to_json()["failures"] == 1
