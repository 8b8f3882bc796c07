"""One verified, bounded, honest power interface over every kind of device.

A backend (SNMP outlet, IPMI BMC, Redfish system, smart plug) only knows two
raw things: read the state, and send a command. Everything that keeps a
power action safe lives here, once, for all of them (fencing's hard lessons,
ClusterLabs fence-agents and openstack/ironic):

- verify by reading back: an action is done when the state is read back,
  never because the command returned;
- never blindly retry: a command whose fate is unknown (``Ambiguous``) is
  followed by reads only; the caller decides what happens next;
- record before acting: ``on_step`` is awaited (the controller commits it to
  its history) *before* each command is sent;
- a minimum interval between commands to one device, and an overall
  deadline on every call, so a hung BMC cannot freeze the caller;
- dry run: read, decide and log, send no command;
- power that comes back by itself: where a device can time a cycle (a
  plug's flip-back timer, a PDU's outlet reboot), ``cycle(timed=True)``
  arms it with the off, so a caller that dies during the hold does not
  leave the machine dark; the on is still verified by reading back, and
  sent by the caller only when the device's own on did not come.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar, runtime_checkable

from spark_watchdog.clock import Clock, SystemClock
from spark_watchdog.errors import (
    Ambiguous,
    FoundOff,
    PowerError,
    SendRefused,
    StateTimeout,
    Unreachable,
    Withdrawn,
)
from spark_watchdog.power import send_window
from spark_watchdog.power.foreign_errors import command_error, guarded, read_error
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.power")

T = TypeVar("T")


class PowerState(enum.Enum):
    ON = "on"
    OFF = "off"
    # Only a group of outlets is ever mixed: some on, some off.
    MIXED = "mixed"


class PowerBackend(Protocol):
    """The raw, unverified operations of one device. Backends raise PowerError types.

    ``command`` raises ``Unreachable`` only when the command certainly did not
    reach the device (nothing was sent, or the connection was refused), and
    ``Ambiguous`` when it may have landed (a timeout after sending).
    """

    @property
    def name(self) -> str:
        """Human description: ``snmp apc_rpdu2 10.0.0.5:161 outlet 3``."""
        ...

    @property
    def limiter_key(self) -> str:
        """Commands to backends sharing this key are spaced by min_command_interval."""
        ...

    async def read_state(self) -> PowerState:
        """The device's state now.

        :raises Unreachable: no answer; nothing is known about the state.
        :raises PowerError: an answer it cannot read as on or off (a subclass names it).
        """
        ...

    async def command(self, target: PowerState) -> None:
        """Send ``target`` once; the caller reads it back.

        :raises Unreachable: the command certainly did not reach the device.
        :raises Refused: the device answered and did not do it.
        :raises Ambiguous: it may have landed: never resent, read instead.
        :raises SendRefused: the lease's send window closed before it left
            (power/send_window.py): nothing was sent.
        """
        ...

    async def aclose(self) -> None:
        """Release the device's sockets (on the loop that used them); a backend
        used again afterwards opens what it needs anew. Callers close through
        ``close_quietly``, so a failure to close never hides a power outcome."""
        ...


async def close_quietly(backend: PowerBackend) -> None:
    """``backend.aclose()``, logged instead of raised: it runs in ``finally``
    blocks, where an exception would replace the verified (or failed) outcome."""
    try:
        await backend.aclose()
    except Exception as exc:
        log.warning("%s: closing its connections failed: %r", backend.name, exc)


@dataclass(frozen=True)
class TimedOn:
    """Whether (and how) a device would switch itself back on after an off.

    ``on_after_s``: seconds from the off command to the device's own on, or
    None when it cannot for this cycle; ``how`` says which mechanism, or why
    not, in words for the history and doctor.
    """

    on_after_s: float | None
    how: str


@runtime_checkable
class SelfTimingBackend(Protocol):
    """A backend whose off can arm the device to switch on again by itself."""

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        """Reads only: can an off now come back on by itself after at least ``off_seconds``?"""
        ...

    async def command_timed_off(self, on_after_s: float) -> None:
        """Switch off, arming the device's own on ``on_after_s`` later. Errors as ``command``."""
        ...


# Seconds a plug's flip-back timer is armed beyond the hold: the hold counts
# from the verified off, the device's timer from the command's arrival.
TIMED_ON_MARGIN_S = 2.0
_HOLD_SLACK_S = 0.001
# An on this much before the hold's end is still the hold (read latency).
HOLD_TOLERANCE_S = 0.5


@dataclass(frozen=True)
class PowerTiming:
    """Timing of verified actions (fence-agents' power_wait / power_timeout)."""

    poll_interval: float = 1.0
    power_timeout: float = 30.0
    min_command_interval: float = 2.0
    read_timeout: float = 10.0
    command_timeout: float = 15.0

    @property
    def switch_budget(self) -> float:
        """The longest one verified switch may take: a read, the spacing, the
        command and its read-back, and a few seconds' slack."""
        waits = self.read_timeout + self.min_command_interval + self.command_timeout
        return waits + self.power_timeout + 5.0


@dataclass(frozen=True)
class PowerStep:
    """One recorded step of an action, in order: what and when (monotonic s from start)."""

    name: StepName  # the incident's vocabulary (steps.py): a name outside it fails here
    at_s: float
    detail: str = ""
    # An off that armed the device's own on: seconds from the command to that on.
    on_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.name, "at_s": round(self.at_s, 3)}
        data["detail"] = self.detail
        if self.on_after_s is not None:
            data["on_after_s"] = self.on_after_s
        return data


@dataclass(frozen=True)
class PowerResult:
    device: str
    action: str
    state_before: PowerState | None
    state_after: PowerState | None
    verified: bool
    elapsed_s: float
    dry_run: bool
    steps: tuple[PowerStep, ...] = ()
    error: str | None = None
    off_held_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "action": self.action,
            "state_before": None if self.state_before is None else self.state_before.value,
            "state_after": None if self.state_after is None else self.state_after.value,
            "verified": self.verified,
            "elapsed_s": round(self.elapsed_s, 3),
            "dry_run": self.dry_run,
            "off_held_s": None if self.off_held_s is None else round(self.off_held_s, 3),
            "error": self.error,
            "steps": [step.to_json() for step in self.steps],
        }


# Step hook: awaited before each command (write-ahead) and after each verification.
StepHook = Callable[[PowerStep], Awaitable[None]]
# Send gate: called synchronously right before a command leaves, after its
# write-ahead step; a reason withdraws the command (nothing is sent).
SendGate = Callable[[PowerState], "str | None"]


class CommandSpacing:
    """Minimum interval between commands to one device, across every caller in the process."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    def wait_needed(self, key: str, interval: float, now: float) -> float:
        last = self._last.get(key)
        return 0.0 if last is None else max(0.0, last + interval - now)

    def mark(self, key: str, now: float) -> None:
        self._last[key] = now


COMMAND_SPACING = CommandSpacing()


@dataclass
class _Run:
    """Book-keeping of one public call: its start, deadline and steps."""

    started: float
    deadline: float
    steps: list[PowerStep] = field(default_factory=list)
    sent_at: float | None = None  # when the last command left

    @classmethod
    def begin(cls, now: float, budget: float) -> _Run:
        """A call starting ``now``, to end within ``budget`` seconds."""
        return cls(started=now, deadline=now + budget)


class VerifiedPower:
    """``state``, ``on``, ``off`` and ``cycle`` of one device, each verified by reading back."""

    def __init__(
        self,
        backend: PowerBackend,
        timing: PowerTiming | None = None,
        *,
        dry_run: bool = False,
        on_step: StepHook | None = None,
        gate: SendGate | None = None,
        send_window: SendWindow | None = None,
        clock: Clock | None = None,
        spacing: CommandSpacing = COMMAND_SPACING,
    ) -> None:
        self.backend = backend
        self.timing = timing or PowerTiming()
        self.dry_run = dry_run
        self._on_step = on_step
        self._gate = gate
        self._send_window = send_window
        # Holds, deadlines and polls on the caller's one clock (spark_watchdog/clock.py).
        clock = clock or SystemClock()
        self._clock = clock.monotonic
        self._sleep = clock.sleep
        self._spacing = spacing

    @property
    def name(self) -> str:
        return self.backend.name

    # -- public -------------------------------------------------------------

    async def state(self) -> PowerState:
        """The device's state, read now.

        :raises PowerError: the device did not answer, or its answer says nothing.
        """
        run = _Run.begin(self._clock(), self.timing.read_timeout)
        return await self._read(run)

    async def on(self) -> PowerResult:
        """Switch on, then read it back.

        :raises Withdrawn: the last look before sending said no; certainly not sent.
        :raises SendRefused: a controller of a pair may not send now; certainly not sent.
        :raises Ambiguous: whether the command landed is unknown; never retried blindly.
        :raises PowerError: the command failed, or its read-back did not show it.
        """
        return await self._switch(PowerState.ON, "on")

    async def off(self) -> PowerResult:
        """Switch off, then read it back.

        :raises Withdrawn: the last look before sending said no; certainly not sent.
        :raises SendRefused: a controller of a pair may not send now; certainly not sent.
        :raises Ambiguous: whether the command landed is unknown; never retried blindly.
        :raises PowerError: the command failed, or its read-back did not show it.
        """
        return await self._switch(PowerState.OFF, "off")

    async def cycle(
        self, off_seconds: float, *, from_off: bool = False, timed: bool = False
    ) -> PowerResult:
        """Off, verify off, hold ``off_seconds``, on, verify on.

        A device read as anything but on before the off raises ``FoundOff``
        and sends nothing, unless ``from_off`` (a person at the CLI asking to
        cycle an outlet they know is off): a cycle is for a powered machine.

        ``timed``: where the backend can (``SelfTimingBackend``), the off arms
        the device to switch on by itself after the hold; the hold is watched
        by reading, and the on is sent here only if the device's did not come.

        :raises FoundOff: read anything but on before the off; nothing was sent.
        :raises Withdrawn: the last look before sending said no; certainly not sent.
        :raises SendRefused: a controller of a pair may not send now; certainly not sent.
        :raises Ambiguous: whether the command landed is unknown; never retried blindly.
        :raises PowerError: the command failed, or its read-back did not show it.
        """
        if off_seconds < 0:
            raise ValueError(f"off_seconds: expected ≥ 0, got {off_seconds}")
        run = _Run.begin(self._clock(), off_seconds + 2 * self.timing.switch_budget)
        before = await self._read(run)
        if before is not PowerState.ON and not from_off:
            await self._refuse_found_off(run, before)
        plan = (
            await self._timed_plan(run, off_seconds) if timed and before is PowerState.ON else None
        )
        if plan is not None:
            run.deadline += _timed_on_wait(plan, off_seconds, self.timing.power_timeout)
        if self.dry_run:
            how = "" if plan is None else f"; the device would switch on by itself ({plan.how})"
            await self._step(
                run, StepName.DRY_RUN, f"would cycle (off {off_seconds:g}s{how}); sent nothing"
            )
            return self._result(run, "cycle", before, before, verified=False)
        try:
            held = await self._off_hold_on(run, before, off_seconds, plan)
        except PowerError as exc:
            exc.steps = tuple(run.steps)
            raise
        after = PowerState.ON
        return self._result(run, "cycle", before, after, verified=True, off_held_s=held)

    # -- internals ----------------------------------------------------------

    async def _refuse_found_off(self, run: _Run, before: PowerState) -> NoReturn:
        """A cycle is for a powered machine: record the refusal and raise ``FoundOff``."""
        await self._step(
            run, StepName.FOUND_OFF, f"read {before.value} before the off; sent nothing"
        )
        error = FoundOff(
            self.name, f"read {before.value} before the off: switched off by hand? Not touched"
        )
        error.steps = tuple(run.steps)
        raise error

    async def _off_hold_on(
        self, run: _Run, before: PowerState, off_seconds: float, plan: TimedOn | None
    ) -> float:
        """The cycle itself: off (verified), the hold, on (verified); the seconds held."""
        await self._drive(run, PowerState.OFF, before, plan)
        off_at = self._clock()
        # GB10 "clock latch" clears only after 30-60 s without AC
        # (docs/facts.md): the hold is counted from the verified off.
        await self._step(run, StepName.HOLD_STARTED, f"{off_seconds:g}s")
        if plan is None:
            await self._sleep(max(0.0, off_seconds - (self._clock() - off_at)))
            held = self._clock() - off_at
            await self._step(run, StepName.HOLD_DONE, f"{held:.1f}s")
            await self._drive(run, PowerState.ON, PowerState.OFF)
        else:
            held = await self._timed_hold(run, off_at, off_seconds, plan)
        return held

    async def _timed_plan(self, run: _Run, off_seconds: float) -> TimedOn | None:
        """The device's plan for coming back on by itself, or None (a plain cycle)."""
        backend = self.backend
        if not isinstance(backend, SelfTimingBackend):
            return None
        try:
            plan = await self._bounded(
                run, backend.plan_timed_on(off_seconds), self.timing.read_timeout
            )
        except asyncio.TimeoutError:
            plan = TimedOn(None, "no answer in time to the read of its timer setting")
        except PowerError as exc:
            plan = TimedOn(None, f"its timer setting could not be read: {exc.message}")
        if plan.on_after_s is None or plan.on_after_s < off_seconds:
            await self._step(
                run, StepName.TIMED_ON_UNAVAILABLE, f"{plan.how}; the on is sent from here"
            )
            return None
        return plan

    async def _timed_hold(
        self, run: _Run, off_at: float, off_seconds: float, plan: TimedOn
    ) -> float:
        """Hold, watching for the device's own on; then await it, or send it.

        Returns the hold as the device counts it: from the off command (its
        timer starts there, and so does its off) to the on read back.
        """
        assert plan.on_after_s is not None
        sent_at = off_at if run.sent_at is None else run.sent_at
        early = await self._watch_hold(run, off_at, off_seconds)
        if early is not None:
            since = self._clock() - sent_at
            if since < off_seconds - HOLD_TOLERANCE_S:
                await self._step(
                    run,
                    StepName.HOLD_CUT_SHORT,
                    f"read {early.value} {since:.1f}s after the off command, before the "
                    f"{off_seconds:g}s hold ended (armed for {plan.on_after_s:g}s)",
                )
        else:
            await self._step(run, StepName.HOLD_DONE, f"{self._clock() - off_at:.1f}s")
        due = max(0.0, plan.on_after_s - (self._clock() - sent_at))
        await self._step(run, StepName.ON_AWAITED, f"the device's own on is due in {due:.1f}s")
        try:
            await self._poll_until(
                run, PowerState.ON, window=due + self.timing.power_timeout, by_device=True
            )
            return self._clock() - sent_at
        except PowerError as exc:
            # The device did not switch on by itself (or its reads fail): the
            # on goes from here. An on cannot hurt a machine that has no power,
            # and is harmless to an outlet already on.
            await self._step(run, StepName.ON_NOT_BY_DEVICE, exc.message)
        held = self._clock() - off_at
        await self._drive(run, PowerState.ON, PowerState.OFF)
        return held

    async def _watch_hold(self, run: _Run, off_at: float, off_seconds: float) -> PowerState | None:
        """Sleep the hold in poll steps, reading; the state if it is not off any more."""
        end = off_at + off_seconds
        while True:
            left = end - self._clock()
            # A millisecond's slack: a clock that cannot advance by a sliver
            # (float precision) must not spin here.
            if left <= _HOLD_SLACK_S:
                return None
            await self._sleep(min(left, self.timing.poll_interval))
            if end - self._clock() <= _HOLD_SLACK_S:
                return None
            try:
                state = await self._read(run)
            except PowerError:
                continue  # a failed read during the hold decides nothing
            if state is not PowerState.OFF:
                return state

    async def _switch(self, target: PowerState, action: str) -> PowerResult:
        run = _Run.begin(self._clock(), self.timing.switch_budget)
        before = await self._read(run)
        if self.dry_run:
            note = "already there" if before is target else f"would switch {action}"
            await self._step(run, StepName.DRY_RUN, f"{note}; sent nothing")
            return self._result(run, action, before, before, verified=before is target)
        try:
            await self._drive(run, target, before)
        except PowerError as exc:
            exc.steps = tuple(run.steps)
            raise
        return self._result(run, action, before, target, verified=True)

    async def _drive(
        self, run: _Run, target: PowerState, before: PowerState, plan: TimedOn | None = None
    ) -> None:
        """Bring the device to ``target`` and read it back, or raise.

        ``plan`` (an off only): the off arms the device's own on.
        """
        word = target.value
        if before is target:
            await self._step(run, StepName(f"already_{word}"), "read back; no command sent")
            return
        await self._wait_spacing(run, word)
        # Write-ahead: the step is recorded before the command leaves.
        if plan is None:
            await self._step(run, StepName(f"{word}_requested"))
        else:
            await self._step(
                run,
                StepName(f"{word}_requested"),
                f"timed: the device switches on by itself {plan.on_after_s:g}s later ({plan.how})",
                on_after_s=plan.on_after_s,
            )
        run.sent_at = self._clock()
        try:
            await self._bounded(run, self._send(target, plan), self.timing.command_timeout)
        except (Withdrawn, SendRefused) as exc:
            await self._step(run, StepName(f"{word}_withdrawn"), exc.message)
            raise
        except asyncio.TimeoutError:
            self._spacing.mark(self.backend.limiter_key, self._clock())
            await self._after_ambiguous(run, target, "no answer to the command in time")
            return
        except Ambiguous as exc:
            self._spacing.mark(self.backend.limiter_key, self._clock())
            await self._after_ambiguous(run, target, exc.message)
            return
        self._spacing.mark(self.backend.limiter_key, self._clock())
        try:
            await self._poll_until(run, target)
        except (StateTimeout, Unreachable) as exc:
            if plan is None:
                raise
            # The device may have switched off and back on by itself between
            # two reads: a landed off, not a failed one. Never a next cut.
            raise Ambiguous(
                self.name,
                f"the timed off was not read back ({exc.message}); the device may already "
                "have switched off and on by itself. Not retried",
            ) from exc

    async def _send(self, target: PowerState, plan: TimedOn | None = None) -> None:
        # The gate runs here, inside the bounded task, after the write-ahead
        # step. The backend still awaits before its first byte (a lookup, a
        # socket opening), so it asks the send window once more right before
        # its bytes leave (power/send_window.py).
        if self._gate is not None:
            why = self._gate(target)
            if why is not None:
                raise Withdrawn(self.name, why)
        with send_window.checking(self._send_window):
            if plan is not None and plan.on_after_s is not None:
                backend = self.backend
                assert isinstance(backend, SelfTimingBackend)
                sending = backend.command_timed_off(plan.on_after_s)
            else:
                sending = self.backend.command(target)
            await guarded(self.name, sending, command_error)

    async def _after_ambiguous(self, run: _Run, target: PowerState, why: str) -> None:
        """The command may or may not have landed: read, never resend."""
        await self._step(run, StepName(f"{target.value}_ambiguous"), why)
        try:
            await self._poll_until(run, target)
        except (StateTimeout, Unreachable) as exc:
            raise Ambiguous(
                self.name,
                f"{target.value} command outcome unknown ({why}); read-back: {exc.message}. "
                "Not retried: read the state before deciding anything",
            ) from exc

    async def _poll_until(
        self,
        run: _Run,
        target: PowerState,
        *,
        window: float | None = None,
        by_device: bool = False,
    ) -> None:
        span = self.timing.power_timeout if window is None else window
        window_end = min(run.deadline, self._clock() + span)
        last: PowerState | None = None
        last_error: PowerError | None = None
        reads = 0
        while True:
            try:
                last = await self._read(run, window_end)
                last_error = None
                reads += 1
            except Unreachable as exc:
                # A device busy switching may miss a read; the window decides.
                last_error = exc
            if last is target and last_error is None:
                who = "; switched by the device's own timer" if by_device else ""
                await self._step(
                    run, StepName(f"{target.value}_verified"), f"after {reads} read(s){who}"
                )
                return
            if self._clock() + self.timing.poll_interval >= window_end:
                break
            await self._sleep(self.timing.poll_interval)
        seen = _reads_seen(last, last_error)
        raise StateTimeout(self.name, f"{target.value} not read back within {span:g}s ({seen})")

    async def _read(self, run: _Run, until: float | None = None) -> PowerState:
        end = run.deadline if until is None else min(until, run.deadline)
        limit = min(self.timing.read_timeout, max(0.0, end - self._clock()))
        try:
            reading = guarded(self.name, self.backend.read_state(), read_error)
            return await asyncio.wait_for(reading, limit)
        except asyncio.TimeoutError:
            raise Unreachable(self.name, f"no answer to a state read within {limit:.1f}s") from None

    async def _bounded(self, run: _Run, call: Awaitable[T], limit: float) -> T:
        remaining = max(0.0, run.deadline - self._clock())
        return await asyncio.wait_for(call, min(limit, remaining))

    async def _wait_spacing(self, run: _Run, word: str) -> None:
        key = self.backend.limiter_key
        wait = self._spacing.wait_needed(key, self.timing.min_command_interval, self._clock())
        if wait > 0:
            # Named after the command it precedes: a resume must know whether
            # the off was still to come (nothing cut) or already done.
            await self._step(
                run, StepName(f"{word}_spacing"), f"waiting {wait:.1f}s since the last command"
            )
            await self._sleep(wait)

    async def _step(
        self, run: _Run, name: StepName, detail: str = "", *, on_after_s: float | None = None
    ) -> None:
        step = PowerStep(name, self._clock() - run.started, detail, on_after_s)
        run.steps.append(step)
        log.info(
            "%s: %s%s",
            self.name,
            name,
            f" ({detail})" if detail else "",
            extra={"device": self.name, "step": name},
        )
        if self._on_step is not None:
            await self._on_step(step)

    def _result(
        self,
        run: _Run,
        action: str,
        before: PowerState,
        after: PowerState,
        *,
        verified: bool,
        off_held_s: float | None = None,
    ) -> PowerResult:
        return PowerResult(
            device=self.name,
            action=action,
            state_before=before,
            state_after=after,
            verified=verified,
            elapsed_s=self._clock() - run.started,
            dry_run=self.dry_run,
            steps=tuple(run.steps),
            off_held_s=off_held_s,
        )


def _timed_on_wait(plan: TimedOn, off_seconds: float, power_timeout: float) -> float:
    """How much longer a timed cycle may take than a plain one: the device's
    own on may come up to ``on_after_s`` after the off (beyond the hold), and
    is then read back within a power_timeout."""
    assert plan.on_after_s is not None
    return max(0.0, plan.on_after_s - off_seconds) + power_timeout


def _reads_seen(last: PowerState | None, last_error: PowerError | None) -> str:
    """What a read-back that timed out saw: its last state, its last error."""
    seen = f"last read {last.value}" if last is not None else "no successful read"
    if last_error is not None:
        seen += f"; last error: {last_error.message}"
    return seen


class _NotSwitched(Exception):
    """An outlet of a group was already at the target: nothing sent to it."""


class OutletGroup:
    """Several outlets feeding one node (redundant supplies) as one backend.

    Off means every outlet off, read back; on means every outlet on. A group
    whose outlets disagree reads ``MIXED``, which verifies neither.
    """

    def __init__(self, members: Sequence[PowerBackend]) -> None:
        if not members:
            raise ValueError("an outlet group needs at least one outlet")
        self.members = tuple(members)

    @property
    def name(self) -> str:
        if len(self.members) == 1:
            return self.members[0].name
        return " + ".join(m.name for m in self.members)

    @property
    def limiter_key(self) -> str:
        return self.members[0].limiter_key

    async def read_state(self) -> PowerState:
        states = {await member.read_state() for member in self.members}
        return states.pop() if len(states) == 1 else PowerState.MIXED

    async def command(self, target: PowerState) -> None:
        await self._each(target, lambda member: member.command(target))

    async def aclose(self) -> None:
        for member in self.members:
            await close_quietly(member)

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        """Timed only when every outlet can time its own on (the latest one decides the wait)."""
        plans: list[TimedOn] = []
        for member in self.members:
            if not isinstance(member, SelfTimingBackend):
                return TimedOn(None, f"{member.name} cannot switch itself back on")
            plan = await member.plan_timed_on(off_seconds)
            if plan.on_after_s is None:
                return TimedOn(None, f"{member.name}: {plan.how}")
            plans.append(plan)
        latest = max(p.on_after_s for p in plans if p.on_after_s is not None)
        return TimedOn(latest, "; ".join(sorted({p.how for p in plans})))

    async def command_timed_off(self, on_after_s: float) -> None:
        async def arm(member: PowerBackend) -> None:
            if not isinstance(member, SelfTimingBackend):
                raise TypeError(f"{member.name} cannot switch itself back on")
            await member.command_timed_off(on_after_s)

        await self._each(PowerState.OFF, arm)

    async def _each(
        self, target: PowerState, send: Callable[[PowerBackend], Awaitable[None]]
    ) -> None:
        # Sequential on purpose: each member's errors stay attributable, and a
        # refused first outlet stops the rest instead of half-switching.
        switched: list[str] = []
        for index, member in enumerate(self.members):
            try:
                await self._switch_member(member, target, send)
                switched.append(member.name)
            except _NotSwitched:
                continue
            except PowerError as exc:
                if not switched:
                    # Nothing sent by this call yet: the member's error is the truth.
                    raise
                # Something was sent: the group is half-switched, whatever this
                # member's error says. Unreachable or Refused would tell
                # VerifiedPower "certainly not sent"; that is not true of the group.
                raise self._half_switched(target, switched, index, exc) from exc

    @staticmethod
    async def _switch_member(
        member: PowerBackend, target: PowerState, send: Callable[[PowerBackend], Awaitable[None]]
    ) -> None:
        """Read ``member``, and send to it unless it is there (``_NotSwitched``); an
        exception not of ours is judged as :class:`VerifiedPower` judges it."""
        if await guarded(member.name, member.read_state(), read_error) is target:
            raise _NotSwitched
        await guarded(member.name, send(member), command_error)

    def _half_switched(
        self, target: PowerState, switched: list[str], failed: int, exc: PowerError
    ) -> Ambiguous:
        member = self.members[failed]
        rest = [m.name for m in self.members[failed + 1 :]]
        if isinstance(exc, Ambiguous):
            fate = f"outcome unknown: {member.name}"
            if rest:
                fate += f"; not switched: {', '.join(rest)}"
        else:
            fate = f"not switched: {', '.join([member.name, *rest])}"
        return Ambiguous(
            self.name,
            f"group half-switched {target.value}: switched {', '.join(switched)}; {fate} "
            f"({type(exc).__name__} from {exc.device}: {exc.message}). "
            "Read every outlet before deciding anything",
        )
