"""One call of a verified power action (power/base.py's ``VerifiedPower``): its
deadline, every read of the device within it, the read-back that decides
whether a command took, and the steps it records, each handed to the
caller's hook as it happens (the controller writes it to its history before
the next command leaves)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from spark_watchdog.clock import Clock
from spark_watchdog.errors import PowerError, StateTimeout, Unreachable
from spark_watchdog.power.foreign_errors import guarded, read_error
from spark_watchdog.power.records import PowerResult, PowerState, PowerStep, PowerTiming, StepHook
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.power")

T = TypeVar("T")

# A millisecond's slack: a clock that cannot advance by a sliver (float
# precision) must not spin in a hold.
_HOLD_SLACK_S = 0.001


class StateSource(Protocol):
    """What a call reads: a device's name and its state (any power backend)."""

    @property
    def name(self) -> str: ...

    async def read_state(self) -> PowerState: ...


class PowerCall:
    """One public call (``state``, ``on``, ``off``, ``cycle``) on one device: its
    start and deadline, its reads and read-backs, and the steps it records."""

    def __init__(
        self,
        device: StateSource,
        timing: PowerTiming,
        clock: Clock,
        on_step: StepHook | None,
        budget: float,
    ) -> None:
        self.device = device
        self.timing = timing
        self._clock = clock
        self._on_step = on_step
        self.started = clock.monotonic()
        self.deadline = self.started + budget  # the call ends within its budget
        self.steps: list[PowerStep] = []
        self.sent_at: float | None = None  # when the last command left

    @property
    def name(self) -> str:
        return self.device.name

    async def read(self, until: float | None = None) -> PowerState:
        """The device's state, read within the call's deadline (and ``until``).

        :raises Unreachable: no answer in time, or none at all.
        :raises PowerError: an answer that says nothing.
        """
        end = self.deadline if until is None else min(until, self.deadline)
        limit = min(self.timing.read_timeout, max(0.0, end - self._clock.monotonic()))
        try:
            reading = guarded(self.name, self.device.read_state(), read_error)
            return await asyncio.wait_for(reading, limit)
        except asyncio.TimeoutError:
            raise Unreachable(self.name, f"no answer to a state read within {limit:.1f}s") from None

    async def read_back(
        self, target: PowerState, *, window: float | None = None, by_device: bool = False
    ) -> None:
        """Read until the device is at ``target`` (recorded as verified), within
        ``window`` (a power_timeout unless given) and the call's deadline.

        :raises StateTimeout: not read at ``target`` in time (the last read said so).
        """
        span = self.timing.power_timeout if window is None else window
        window_end = min(self.deadline, self._clock.monotonic() + span)
        last: PowerState | None = None
        last_error: PowerError | None = None
        reads = 0
        while True:
            try:
                last = await self.read(window_end)
                last_error = None
                reads += 1
            except Unreachable as exc:
                # A device busy switching may miss a read; the window decides.
                last_error = exc
            if last is target and last_error is None:
                who = "; switched by the device's own timer" if by_device else ""
                await self.step(StepName(f"{target.value}_verified"), f"after {reads} read(s){who}")
                return
            if self._clock.monotonic() + self.timing.poll_interval >= window_end:
                break
            await self._clock.sleep(self.timing.poll_interval)
        seen = _reads_seen(last, last_error)
        raise StateTimeout(self.name, f"{target.value} not read back within {span:g}s ({seen})")

    async def watch_hold(self, off_at: float, off_seconds: float) -> PowerState | None:
        """Sleep a hold in poll steps, reading; the state if it is not off any more."""
        end = off_at + off_seconds
        while True:
            left = end - self._clock.monotonic()
            if left <= _HOLD_SLACK_S:
                return None
            await self._clock.sleep(min(left, self.timing.poll_interval))
            if end - self._clock.monotonic() <= _HOLD_SLACK_S:
                return None
            try:
                state = await self.read()
            except PowerError:
                continue  # a failed read during the hold decides nothing
            if state is not PowerState.OFF:
                return state

    async def bounded(self, call: Awaitable[T], limit: float) -> T:
        """``await call`` within ``limit`` seconds and the call's deadline."""
        remaining = max(0.0, self.deadline - self._clock.monotonic())
        return await asyncio.wait_for(call, min(limit, remaining))

    async def step(
        self, name: StepName, detail: str = "", *, on_after_s: float | None = None
    ) -> None:
        """Record a step, log it, and await the caller's hook with it."""
        step = PowerStep(name, self._clock.monotonic() - self.started, detail, on_after_s)
        self.steps.append(step)
        log.info(
            "%s: %s%s",
            self.name,
            name,
            f" ({detail})" if detail else "",
            extra={"device": self.name, "step": name},
        )
        if self._on_step is not None:
            await self._on_step(step)

    def result(
        self,
        action: str,
        before: PowerState,
        after: PowerState,
        *,
        verified: bool,
        dry_run: bool,
        off_held_s: float | None = None,
    ) -> PowerResult:
        return PowerResult(
            device=self.name,
            action=action,
            state_before=before,
            state_after=after,
            verified=verified,
            elapsed_s=self._clock.monotonic() - self.started,
            dry_run=dry_run,
            steps=tuple(self.steps),
            off_held_s=off_held_s,
        )


def _reads_seen(last: PowerState | None, last_error: PowerError | None) -> str:
    """What a read-back that timed out saw: its last state, its last error."""
    seen = f"last read {last.value}" if last is not None else "no successful read"
    if last_error is not None:
        seen += f"; last error: {last_error.message}"
    return seen
