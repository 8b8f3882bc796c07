"""Run planned checks one after another, each with a deadline of its own.

A check that hangs (NVML stuck in the driver, a PDU that never answers, a
journal on a dying disk) must not hang doctor: each check gets ``timeout``
seconds and then counts as failed. Blocking work runs in a daemon thread
(:func:`in_daemon_thread`), so a call stuck in the kernel cannot keep the
process from exiting either.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from spark_watchdog.doctor.result import Check, Finding, fail

T = TypeVar("T")

# A check still running after this long gets a progress line (on a terminal).
PROGRESS_AFTER_S = 0.3


@dataclass(frozen=True)
class PlannedCheck:
    """A check to run: its report name, what the progress line calls it, its deadline."""

    name: str
    label: str  # "power device of spark-3": shown as "checking power device of spark-3 ..."
    timeout: float
    run: Callable[[], Awaitable[Finding]]


class Progress(Protocol):
    def begin(self, label: str) -> None: ...

    def end(self) -> None: ...


def in_daemon_thread(work: Callable[[], T]) -> asyncio.Future[T]:
    """Run blocking ``work`` in a daemon thread; the future gives its result.

    Not the loop's default executor: ``asyncio.run`` joins those threads at
    exit, so one stuck in the kernel would hang doctor after it timed out.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def main() -> None:
        try:
            value = work()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, lambda: future.set_result(value))

    threading.Thread(target=main, name="doctor-check", daemon=True).start()
    return future


async def run_one(planned: PlannedCheck, progress: Progress | None = None) -> Check:
    """One check within its deadline; a hang or a crash of the check is a failure."""
    task = asyncio.ensure_future(planned.run())
    shown = False
    try:
        done, _ = await asyncio.wait({task}, timeout=min(PROGRESS_AFTER_S, planned.timeout))
        if not done and progress is not None:
            progress.begin(planned.label)
            shown = True
        try:
            found = await asyncio.wait_for(task, max(0.0, planned.timeout - PROGRESS_AFTER_S))
        except asyncio.TimeoutError:
            return Check.named(
                planned.name,
                fail(
                    f"the check of {planned.label} did not finish within {planned.timeout:g} s "
                    "and was abandoned",
                    f"whatever {planned.label} waits on is hanging; run the matching "
                    "`spark-watchdog probe` or `power ... status` by hand to see where",
                ),
            )
        except Exception as exc:  # a bug or an unexpected error in the check itself
            return Check.named(
                planned.name,
                fail(
                    f"the check of {planned.label} failed: {type(exc).__name__}: {exc}",
                    "report this with the output of `spark-watchdog doctor --json`",
                ),
            )
    finally:
        if shown and progress is not None:
            progress.end()
    return Check.named(planned.name, found)


async def run_plan(plan: Sequence[PlannedCheck], progress: Progress | None = None) -> list[Check]:
    """Every check in order. Sequential on purpose: the report reads in plan order,
    and a PDU or BMC is asked one thing at a time."""
    return [await run_one(planned, progress) for planned in plan]
