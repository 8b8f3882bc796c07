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
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn, Protocol, runtime_checkable

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
from spark_watchdog.power.power_call import PowerCall

# What an action reads and records lives in power/records.py; named here too,
# where every caller has always found it.
from spark_watchdog.power.records import PowerResult as PowerResult
from spark_watchdog.power.records import PowerState as PowerState
from spark_watchdog.power.records import PowerStep as PowerStep
from spark_watchdog.power.records import PowerTiming as PowerTiming
from spark_watchdog.power.records import StepHook as StepHook
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.steps import StepName

log = logging.getLogger("spark_watchdog.power")


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
# An on this much before the hold's end is still the hold (read latency).
HOLD_TOLERANCE_S = 0.5


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


class VerifiedPower:
    """``state``, ``on``, ``off`` and ``cycle`` of one device, each verified by reading back.

    It decides what is sent and when (the spacing, the last look before
    sending, the send window, never resending an ambiguous command, the hold);
    each call's reads, read-backs and recorded steps are a ``PowerCall``
    (power/power_call.py).
    """

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
        self._time = clock or SystemClock()
        self._clock = self._time.monotonic
        self._sleep = self._time.sleep
        self._spacing = spacing

    @property
    def name(self) -> str:
        return self.backend.name

    def _call(self, budget: float) -> PowerCall:
        """A public call starting now, to end within ``budget`` seconds."""
        return PowerCall(self.backend, self.timing, self._time, self._on_step, budget)

    # -- public -------------------------------------------------------------

    async def state(self) -> PowerState:
        """The device's state, read now.

        :raises PowerError: the device did not answer, or its answer says nothing.
        """
        return await self._call(self.timing.read_timeout).read()

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
        call = self._call(off_seconds + 2 * self.timing.switch_budget)
        before = await call.read()
        if before is not PowerState.ON and not from_off:
            await self._refuse_found_off(call, before)
        plan = (
            await self._timed_plan(call, off_seconds) if timed and before is PowerState.ON else None
        )
        if plan is not None:
            call.deadline += _timed_on_wait(plan, off_seconds, self.timing.power_timeout)
        if self.dry_run:
            how = "" if plan is None else f"; the device would switch on by itself ({plan.how})"
            await call.step(
                StepName.DRY_RUN, f"would cycle (off {off_seconds:g}s{how}); sent nothing"
            )
            return call.result("cycle", before, before, verified=False, dry_run=True)
        try:
            held = await self._off_hold_on(call, before, off_seconds, plan)
        except PowerError as exc:
            exc.steps = tuple(call.steps)
            raise
        after = PowerState.ON
        return call.result("cycle", before, after, verified=True, dry_run=False, off_held_s=held)

    # -- internals ----------------------------------------------------------

    async def _refuse_found_off(self, call: PowerCall, before: PowerState) -> NoReturn:
        """A cycle is for a powered machine: record the refusal and raise ``FoundOff``."""
        await call.step(StepName.FOUND_OFF, f"read {before.value} before the off; sent nothing")
        error = FoundOff(
            self.name, f"read {before.value} before the off: switched off by hand? Not touched"
        )
        error.steps = tuple(call.steps)
        raise error

    async def _off_hold_on(
        self, call: PowerCall, before: PowerState, off_seconds: float, plan: TimedOn | None
    ) -> float:
        """The cycle itself: off (verified), the hold, on (verified); the seconds held."""
        await self._drive(call, PowerState.OFF, before, plan)
        off_at = self._clock()
        # GB10 "clock latch" clears only after 30-60 s without AC
        # (docs/facts.md): the hold is counted from the verified off.
        await call.step(StepName.HOLD_STARTED, f"{off_seconds:g}s")
        if plan is None:
            await self._sleep(max(0.0, off_seconds - (self._clock() - off_at)))
            held = self._clock() - off_at
            await call.step(StepName.HOLD_DONE, f"{held:.1f}s")
            await self._drive(call, PowerState.ON, PowerState.OFF)
        else:
            held = await self._timed_hold(call, off_at, off_seconds, plan)
        return held

    async def _timed_plan(self, call: PowerCall, off_seconds: float) -> TimedOn | None:
        """The device's plan for coming back on by itself, or None (a plain cycle)."""
        backend = self.backend
        if not isinstance(backend, SelfTimingBackend):
            return None
        try:
            plan = await call.bounded(backend.plan_timed_on(off_seconds), self.timing.read_timeout)
        except asyncio.TimeoutError:
            plan = TimedOn(None, "no answer in time to the read of its timer setting")
        except PowerError as exc:
            plan = TimedOn(None, f"its timer setting could not be read: {exc.message}")
        if plan.on_after_s is None or plan.on_after_s < off_seconds:
            await call.step(StepName.TIMED_ON_UNAVAILABLE, f"{plan.how}; the on is sent from here")
            return None
        return plan

    async def _timed_hold(
        self, call: PowerCall, off_at: float, off_seconds: float, plan: TimedOn
    ) -> float:
        """Hold, watching for the device's own on; then await it, or send it.

        Returns the hold as the device counts it: from the off command (its
        timer starts there, and so does its off) to the on read back.
        """
        assert plan.on_after_s is not None
        sent_at = off_at if call.sent_at is None else call.sent_at
        early = await call.watch_hold(off_at, off_seconds)
        if early is not None:
            since = self._clock() - sent_at
            if since < off_seconds - HOLD_TOLERANCE_S:
                await call.step(
                    StepName.HOLD_CUT_SHORT,
                    f"read {early.value} {since:.1f}s after the off command, before the "
                    f"{off_seconds:g}s hold ended (armed for {plan.on_after_s:g}s)",
                )
        else:
            await call.step(StepName.HOLD_DONE, f"{self._clock() - off_at:.1f}s")
        due = max(0.0, plan.on_after_s - (self._clock() - sent_at))
        await call.step(StepName.ON_AWAITED, f"the device's own on is due in {due:.1f}s")
        try:
            await call.read_back(
                PowerState.ON, window=due + self.timing.power_timeout, by_device=True
            )
            return self._clock() - sent_at
        except PowerError as exc:
            # The device did not switch on by itself (or its reads fail): the
            # on goes from here. An on cannot hurt a machine that has no power,
            # and is harmless to an outlet already on.
            await call.step(StepName.ON_NOT_BY_DEVICE, exc.message)
        held = self._clock() - off_at
        await self._drive(call, PowerState.ON, PowerState.OFF)
        return held

    async def _switch(self, target: PowerState, action: str) -> PowerResult:
        call = self._call(self.timing.switch_budget)
        before = await call.read()
        if self.dry_run:
            note = "already there" if before is target else f"would switch {action}"
            await call.step(StepName.DRY_RUN, f"{note}; sent nothing")
            return call.result(action, before, before, verified=before is target, dry_run=True)
        try:
            await self._drive(call, target, before)
        except PowerError as exc:
            exc.steps = tuple(call.steps)
            raise
        return call.result(action, before, target, verified=True, dry_run=False)

    async def _drive(
        self, call: PowerCall, target: PowerState, before: PowerState, plan: TimedOn | None = None
    ) -> None:
        """Bring the device to ``target`` and read it back, or raise.

        ``plan`` (an off only): the off arms the device's own on.
        """
        word = target.value
        if before is target:
            await call.step(StepName(f"already_{word}"), "read back; no command sent")
            return
        await self._wait_spacing(call, word)
        # Write-ahead: the step is recorded before the command leaves.
        if plan is None:
            await call.step(StepName(f"{word}_requested"))
        else:
            await call.step(
                StepName(f"{word}_requested"),
                f"timed: the device switches on by itself {plan.on_after_s:g}s later ({plan.how})",
                on_after_s=plan.on_after_s,
            )
        call.sent_at = self._clock()
        try:
            await call.bounded(self._send(target, plan), self.timing.command_timeout)
        except (Withdrawn, SendRefused) as exc:
            await call.step(StepName(f"{word}_withdrawn"), exc.message)
            raise
        except asyncio.TimeoutError:
            self._spacing.mark(self.backend.limiter_key, self._clock())
            await self._after_ambiguous(call, target, "no answer to the command in time")
            return
        except Ambiguous as exc:
            self._spacing.mark(self.backend.limiter_key, self._clock())
            await self._after_ambiguous(call, target, exc.message)
            return
        self._spacing.mark(self.backend.limiter_key, self._clock())
        try:
            await call.read_back(target)
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

    async def _after_ambiguous(self, call: PowerCall, target: PowerState, why: str) -> None:
        """The command may or may not have landed: read, never resend."""
        await call.step(StepName(f"{target.value}_ambiguous"), why)
        try:
            await call.read_back(target)
        except (StateTimeout, Unreachable) as exc:
            raise Ambiguous(
                self.name,
                f"{target.value} command outcome unknown ({why}); read-back: {exc.message}. "
                "Not retried: read the state before deciding anything",
            ) from exc

    async def _wait_spacing(self, call: PowerCall, word: str) -> None:
        key = self.backend.limiter_key
        wait = self._spacing.wait_needed(key, self.timing.min_command_interval, self._clock())
        if wait > 0:
            # Named after the command it precedes: a resume must know whether
            # the off was still to come (nothing cut) or already done.
            await call.step(
                StepName(f"{word}_spacing"), f"waiting {wait:.1f}s since the last command"
            )
            await self._sleep(wait)


def _timed_on_wait(plan: TimedOn, off_seconds: float, power_timeout: float) -> float:
    """How much longer a timed cycle may take than a plain one: the device's
    own on may come up to ``on_after_s`` after the off (beyond the hold), and
    is then read back within a power_timeout."""
    assert plan.on_after_s is not None
    return max(0.0, plan.on_after_s - off_seconds) + power_timeout


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
