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
- dry run: read, decide and log, send no command.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from spark_watchdog.errors import (
    Ambiguous,
    FoundOff,
    PowerError,
    StateTimeout,
    Unreachable,
    Withdrawn,
)

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

    async def read_state(self) -> PowerState: ...

    async def command(self, target: PowerState) -> None: ...


@dataclass(frozen=True)
class PowerTiming:
    """Timing of verified actions (fence-agents' power_wait / power_timeout)."""

    poll_interval: float = 1.0
    power_timeout: float = 30.0
    min_command_interval: float = 2.0
    read_timeout: float = 10.0
    command_timeout: float = 15.0


@dataclass(frozen=True)
class PowerStep:
    """One recorded step of an action, in order: what and when (monotonic s from start)."""

    name: str
    at_s: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.name, "at_s": round(self.at_s, 3), "detail": self.detail}


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
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        spacing: CommandSpacing = COMMAND_SPACING,
    ) -> None:
        self.backend = backend
        self.timing = timing or PowerTiming()
        self.dry_run = dry_run
        self._on_step = on_step
        self._gate = gate
        self._clock = clock
        self._sleep = sleep
        self._spacing = spacing

    @property
    def name(self) -> str:
        return self.backend.name

    # -- public -------------------------------------------------------------

    async def state(self) -> PowerState:
        run = self._start(self.timing.read_timeout)
        return await self._read(run)

    async def on(self) -> PowerResult:
        return await self._switch(PowerState.ON, "on")

    async def off(self) -> PowerResult:
        return await self._switch(PowerState.OFF, "off")

    async def cycle(self, off_seconds: float, *, from_off: bool = False) -> PowerResult:
        """Off, verify off, hold ``off_seconds``, on, verify on.

        A device read as anything but on before the off raises ``FoundOff``
        and sends nothing, unless ``from_off`` (a person at the CLI asking to
        cycle an outlet they know is off): a cycle is for a powered machine.
        """
        if off_seconds < 0:
            raise ValueError(f"off_seconds: expected ≥ 0, got {off_seconds}")
        budget = off_seconds + 2 * self._switch_budget()
        run = self._start(budget)
        before = await self._read(run)
        if before is not PowerState.ON and not from_off:
            await self._step(run, "found_off", f"read {before.value} before the off; sent nothing")
            error = FoundOff(
                self.name, f"read {before.value} before the off: switched off by hand? Not touched"
            )
            error.steps = tuple(run.steps)
            raise error
        if self.dry_run:
            await self._step(run, "dry_run", f"would cycle (off {off_seconds:g}s); sent nothing")
            return self._result(run, "cycle", before, before, verified=False)
        try:
            await self._drive(run, PowerState.OFF, before)
            off_at = self._clock()
            # GB10 "clock latch" clears only after 30-60 s without AC (tsw2k
            # docs/GOTCHAS.md): the hold is counted from the verified off.
            await self._step(run, "hold_started", f"{off_seconds:g}s")
            await self._sleep(max(0.0, off_seconds - (self._clock() - off_at)))
            held = self._clock() - off_at
            await self._step(run, "hold_done", f"{held:.1f}s")
            await self._drive(run, PowerState.ON, PowerState.OFF)
        except PowerError as exc:
            exc.steps = tuple(run.steps)
            raise
        after = PowerState.ON
        return self._result(run, "cycle", before, after, verified=True, off_held_s=held)

    # -- internals ----------------------------------------------------------

    def _switch_budget(self) -> float:
        t = self.timing
        return t.read_timeout + t.min_command_interval + t.command_timeout + t.power_timeout + 5.0

    async def _switch(self, target: PowerState, action: str) -> PowerResult:
        run = self._start(self._switch_budget())
        before = await self._read(run)
        if self.dry_run:
            note = "already there" if before is target else f"would switch {action}"
            await self._step(run, "dry_run", f"{note}; sent nothing")
            return self._result(run, action, before, before, verified=before is target)
        try:
            await self._drive(run, target, before)
        except PowerError as exc:
            exc.steps = tuple(run.steps)
            raise
        return self._result(run, action, before, target, verified=True)

    async def _drive(self, run: _Run, target: PowerState, before: PowerState) -> None:
        """Bring the device to ``target`` and read it back, or raise."""
        word = target.value
        if before is target:
            await self._step(run, f"already_{word}", "read back; no command sent")
            return
        await self._wait_spacing(run, word)
        # Write-ahead: the step is recorded before the command leaves.
        await self._step(run, f"{word}_requested")
        try:
            await self._bounded(run, self._send(target), self.timing.command_timeout)
        except Withdrawn as exc:
            await self._step(run, f"{word}_withdrawn", exc.message)
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
        await self._poll_until(run, target)

    async def _send(self, target: PowerState) -> None:
        # The gate runs here, inside the bounded task, so nothing else of the
        # event loop runs between its answer and the backend's first byte.
        if self._gate is not None:
            why = self._gate(target)
            if why is not None:
                raise Withdrawn(self.name, why)
        await self.backend.command(target)

    async def _after_ambiguous(self, run: _Run, target: PowerState, why: str) -> None:
        """The command may or may not have landed: read, never resend."""
        await self._step(run, f"{target.value}_ambiguous", why)
        try:
            await self._poll_until(run, target)
        except (StateTimeout, Unreachable) as exc:
            raise Ambiguous(
                self.name,
                f"{target.value} command outcome unknown ({why}); read-back: {exc.message}. "
                "Not retried: read the state before deciding anything",
            ) from exc

    async def _poll_until(self, run: _Run, target: PowerState) -> None:
        window_end = min(run.deadline, self._clock() + self.timing.power_timeout)
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
                await self._step(run, f"{target.value}_verified", f"after {reads} read(s)")
                return
            if self._clock() + self.timing.poll_interval >= window_end:
                break
            await self._sleep(self.timing.poll_interval)
        seen = f"last read {last.value}" if last is not None else "no successful read"
        if last_error is not None:
            seen += f"; last error: {last_error.message}"
        raise StateTimeout(
            self.name,
            f"{target.value} not read back within {self.timing.power_timeout:g}s ({seen})",
        )

    async def _read(self, run: _Run, until: float | None = None) -> PowerState:
        end = run.deadline if until is None else min(until, run.deadline)
        limit = min(self.timing.read_timeout, max(0.0, end - self._clock()))
        try:
            return await asyncio.wait_for(self.backend.read_state(), limit)
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
            await self._step(run, f"{word}_spacing", f"waiting {wait:.1f}s since the last command")
            await self._sleep(wait)

    def _start(self, budget: float) -> _Run:
        now = self._clock()
        return _Run(started=now, deadline=now + budget)

    async def _step(self, run: _Run, name: str, detail: str = "") -> None:
        step = PowerStep(name, self._clock() - run.started, detail)
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
        # Sequential on purpose: each member's errors stay attributable, and a
        # refused first outlet stops the rest instead of half-switching.
        switched: list[str] = []
        for index, member in enumerate(self.members):
            try:
                if await member.read_state() is not target:
                    await member.command(target)
                    switched.append(member.name)
            except PowerError as exc:
                if not switched:
                    # Nothing sent by this call yet: the member's error is the truth.
                    raise
                # Something was sent: the group is half-switched, whatever this
                # member's error says. Unreachable or Refused would tell
                # VerifiedPower "certainly not sent"; that is not true of the group.
                raise self._half_switched(target, switched, index, exc) from exc

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
