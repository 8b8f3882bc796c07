"""VerifiedPower's safety rules, against a scripted backend and a fake clock.

The same paths run against real devices in the backend tests (SNMP, IPMI,
Redfish, plugs); here each rule is isolated so a regression names itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from spark_watchdog.errors import Ambiguous, Refused, SendRefused, StateTimeout, Unreachable
from spark_watchdog.power.base import (
    CommandSpacing,
    OutletGroup,
    PowerState,
    PowerStep,
    PowerTiming,
    VerifiedPower,
)

ON, OFF = PowerState.ON, PowerState.OFF


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@dataclass
class ScriptedOutlet:
    """A device whose state follows commands after ``delay_reads`` reads."""

    state: PowerState = ON
    delay_reads: int = 0
    command_error: Exception | None = None
    apply_despite_error: bool = False
    read_errors: list[Exception] = field(default_factory=list)
    errors_after_command: list[Exception] = field(default_factory=list)
    commands: list[PowerState] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    _pending: PowerState | None = None
    _reads_left: int = 0
    label: str = "fake outlet 1"

    @property
    def name(self) -> str:
        return self.label

    @property
    def limiter_key(self) -> str:
        return "fake:pdu"

    async def read_state(self) -> PowerState:
        self.log.append("read")
        if self.read_errors:
            raise self.read_errors.pop(0)
        if self._pending is not None:
            if self._reads_left <= 0:
                self.state, self._pending = self._pending, None
            else:
                self._reads_left -= 1
        return self.state

    async def aclose(self) -> None:
        return None

    async def command(self, target: PowerState) -> None:
        self.log.append(f"command {target.value}")
        self.commands.append(target)
        if self.command_error is not None and not self.apply_despite_error:
            raise self.command_error
        self._pending, self._reads_left = target, self.delay_reads
        self.read_errors.extend(self.errors_after_command)
        if self.command_error is not None:
            raise self.command_error


def make(
    outlet: ScriptedOutlet, clock: FakeClock, **kwargs: object
) -> tuple[VerifiedPower, list[PowerStep]]:
    steps: list[PowerStep] = []

    async def record(step: PowerStep) -> None:
        steps.append(step)
        outlet.log.append(f"step {step.name}")

    timing = PowerTiming(poll_interval=1.0, power_timeout=10.0, min_command_interval=5.0)
    power = VerifiedPower(
        outlet,
        timing,
        on_step=record,
        clock=clock,
        spacing=CommandSpacing(),
        **kwargs,  # type: ignore[arg-type]
    )
    return power, steps


def names(steps: list[PowerStep]) -> list[str]:
    return [s.name for s in steps]


def test_off_is_verified_by_reading_back() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet(delay_reads=3)
    power, steps = make(outlet, clock)
    result = asyncio.run(power.off())
    assert result.verified and result.state_before is ON and result.state_after is OFF
    assert names(steps) == ["off_requested", "off_verified"]
    assert outlet.commands == [OFF]
    assert steps[-1].detail == "after 4 read(s)"


def test_the_step_is_recorded_before_the_command_leaves() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet()
    power, _ = make(outlet, clock)
    asyncio.run(power.off())
    assert outlet.log.index("step off_requested") < outlet.log.index("command off")


def test_already_off_sends_nothing() -> None:
    outlet = ScriptedOutlet(state=OFF)
    power, steps = make(outlet, FakeClock())
    result = asyncio.run(power.off())
    assert result.verified and outlet.commands == []
    assert names(steps) == ["already_off"]


def test_state_never_coming_is_a_state_timeout() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet(delay_reads=1000)
    power, _ = make(outlet, clock)
    with pytest.raises(StateTimeout, match=r"off not read back within 10s \(last read on\)"):
        asyncio.run(power.off())
    assert outlet.commands == [OFF], "a state timeout must not resend"


def test_ambiguous_command_is_read_back_never_resent() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet(
        command_error=Ambiguous("fake outlet 1", "SET timed out"), apply_despite_error=True
    )
    power, steps = make(outlet, clock)
    result = asyncio.run(power.off())
    assert result.verified
    assert names(steps) == ["off_requested", "off_ambiguous", "off_verified"]
    assert outlet.commands == [OFF]


def test_ambiguous_command_that_did_not_land_stays_ambiguous() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet(command_error=Ambiguous("fake outlet 1", "SET timed out"))
    power, _ = make(outlet, clock)
    with pytest.raises(Ambiguous, match="Not retried: read the state before deciding"):
        asyncio.run(power.off())
    assert outlet.commands == [OFF], "never a second command"


def test_refused_and_unreachable_propagate_without_retry() -> None:
    for error in (Refused("fake outlet 1", "wrongValue"), Unreachable("fake outlet 1", "silence")):
        outlet = ScriptedOutlet(command_error=error)
        power, _ = make(outlet, FakeClock())
        with pytest.raises(type(error)):
            asyncio.run(power.off())
        assert outlet.commands == [OFF]


def test_unreadable_device_sends_nothing() -> None:
    outlet = ScriptedOutlet(read_errors=[Unreachable("fake outlet 1", "timeout")])
    power, _ = make(outlet, FakeClock())
    with pytest.raises(Unreachable):
        asyncio.run(power.off())
    assert outlet.commands == []


def test_a_missed_read_while_switching_is_tolerated() -> None:
    outlet = ScriptedOutlet(
        delay_reads=1, errors_after_command=[Unreachable("fake outlet 1", "busy switching")]
    )
    power, steps = make(outlet, FakeClock())
    result = asyncio.run(power.off())
    assert result.verified
    assert outlet.commands == [OFF]
    assert steps[-1].detail == "after 2 read(s)"  # the failed read is not counted


def test_dry_run_reads_but_sends_nothing() -> None:
    outlet = ScriptedOutlet()
    power, steps = make(outlet, FakeClock(), dry_run=True)
    result = asyncio.run(power.cycle(60))
    assert result.dry_run and not result.verified
    assert outlet.commands == []
    assert names(steps) == ["dry_run"]
    off = asyncio.run(power.off())
    assert off.dry_run and off.state_after is ON and outlet.commands == []


def test_cycle_holds_off_from_the_verified_off() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet(delay_reads=2)
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(60))
    assert result.verified and result.state_before is ON and result.state_after is ON
    assert outlet.commands == [OFF, ON]
    # The 60 s hold is longer than min_command_interval: no extra spacing wait.
    assert names(steps) == [
        "off_requested",
        "off_verified",
        "hold_started",
        "hold_done",
        "on_requested",
        "on_verified",
    ]
    assert result.off_held_s is not None and result.off_held_s >= 60


def test_commands_to_one_device_are_spaced() -> None:
    clock = FakeClock()
    outlet = ScriptedOutlet()
    power, steps = make(outlet, clock)

    async def go() -> None:
        await power.off()
        await power.on()

    asyncio.run(go())
    spacing = next(s for s in steps if s.name == "on_spacing")
    assert spacing.detail == "waiting 5.0s since the last command"
    assert names(steps).index("on_spacing") < names(steps).index("on_requested")
    assert outlet.commands == [OFF, ON]


def test_a_hung_backend_cannot_freeze_the_caller() -> None:
    class Hung(ScriptedOutlet):
        async def read_state(self) -> PowerState:
            await asyncio.sleep(3600)
            return ON

    outlet = Hung()
    power = VerifiedPower(outlet, PowerTiming(read_timeout=0.2), spacing=CommandSpacing())
    with pytest.raises(Unreachable, match=r"no answer to a state read within 0\.2s"):
        asyncio.run(power.state())


def test_a_command_that_never_returns_is_ambiguous_and_then_read() -> None:
    class HungCommand(ScriptedOutlet):
        async def aclose(self) -> None:
            return None

        async def command(self, target: PowerState) -> None:
            self.commands.append(target)
            await asyncio.sleep(3600)

    outlet = HungCommand()
    timing = PowerTiming(command_timeout=0.2, power_timeout=0.5, poll_interval=0.1)
    power = VerifiedPower(outlet, timing, spacing=CommandSpacing())
    with pytest.raises(Ambiguous, match="no answer to the command in time"):
        asyncio.run(power.off())
    assert outlet.commands == [OFF]


def test_outlet_group_off_means_all_off() -> None:
    a, b = ScriptedOutlet(label="outlet 3"), ScriptedOutlet(label="outlet 4", delay_reads=2)
    group = OutletGroup([a, b])
    clock = FakeClock()
    timing = PowerTiming(poll_interval=1.0, power_timeout=10.0, min_command_interval=5.0)
    power = VerifiedPower(group, timing, clock=clock, spacing=CommandSpacing())
    result = asyncio.run(power.off())
    assert result.verified
    assert a.state is OFF and b.state is OFF
    assert group.name == "outlet 3 + outlet 4"


def test_outlet_group_reads_mixed_and_verifies_neither() -> None:
    a, b = ScriptedOutlet(label="o1"), ScriptedOutlet(label="o2", state=OFF)
    assert asyncio.run(OutletGroup([a, b]).read_state()) is PowerState.MIXED


def group_power(group: OutletGroup, clock: FakeClock) -> VerifiedPower:
    timing = PowerTiming(poll_interval=1.0, power_timeout=10.0, min_command_interval=5.0)
    return VerifiedPower(group, timing, clock=clock, spacing=CommandSpacing())


@dataclass
class SwitchThenBreak(ScriptedOutlet):
    """An outlet whose command, once applied, makes ``other`` unreachable for its next read."""

    other: ScriptedOutlet | None = None

    async def aclose(self) -> None:
        return None

    async def command(self, target: PowerState) -> None:
        await super().command(target)
        assert self.other is not None
        self.other.read_errors.append(Unreachable(self.other.name, "no answer"))


def test_outlet_group_half_switched_is_ambiguous_not_unreachable() -> None:
    b = ScriptedOutlet(label="outlet 4")
    a = SwitchThenBreak(label="outlet 3", other=b)
    power = group_power(OutletGroup([a, b]), FakeClock())
    with pytest.raises(Ambiguous) as caught:
        asyncio.run(power.off())
    message = str(caught.value)
    assert "switched outlet 3; not switched: outlet 4" in message
    assert "Unreachable from outlet 4" in message
    # Ambiguous means reads only: nothing resent to the first, nothing ever sent to the second.
    assert a.commands == [OFF] and b.commands == []
    assert a.state is OFF and b.state is ON


def test_outlet_group_refused_after_a_switch_is_ambiguous() -> None:
    a = ScriptedOutlet(label="outlet 3")
    b = ScriptedOutlet(label="outlet 4", command_error=Refused("outlet 4", "not allowed"))
    c = ScriptedOutlet(label="outlet 5")
    power = group_power(OutletGroup([a, b, c]), FakeClock())
    with pytest.raises(Ambiguous, match="not switched: outlet 4, outlet 5"):
        asyncio.run(power.off())
    assert a.commands == [OFF] and b.commands == [OFF] and c.commands == []


def test_outlet_group_error_before_any_send_stays_as_it_is() -> None:
    a = ScriptedOutlet(label="outlet 3", command_error=Unreachable("outlet 3", "refused"))
    b = ScriptedOutlet(label="outlet 4")
    power = group_power(OutletGroup([a, b]), FakeClock())
    with pytest.raises(Unreachable):
        asyncio.run(power.off())
    # An outlet already off is not "sent": the second's refusal stays a refusal.
    a = ScriptedOutlet(label="outlet 3", state=OFF)
    b = ScriptedOutlet(label="outlet 4", command_error=Refused("outlet 4", "not allowed"))
    power = group_power(OutletGroup([a, b]), FakeClock())
    with pytest.raises(Refused):
        asyncio.run(power.off())
    assert a.commands == [] and b.commands == [OFF]


def test_negative_off_seconds_is_rejected() -> None:
    power, _ = make(ScriptedOutlet(), FakeClock())
    with pytest.raises(ValueError, match="off_seconds"):
        asyncio.run(power.cycle(-1))


def test_failed_action_carries_its_steps() -> None:
    outlet = ScriptedOutlet(delay_reads=1000)
    power, _ = make(outlet, FakeClock())
    with pytest.raises(StateTimeout) as caught:
        asyncio.run(power.off())
    assert [s.name for s in caught.value.steps] == ["off_requested"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("target", ["off", "on"])
def test_a_refused_send_is_recorded_as_withdrawn_and_nothing_leaves(target: str) -> None:
    """A controller of a pair past its send deadline: the gate refuses after
    the step was written; the step that says so follows it, no command goes."""
    outlet = ScriptedOutlet(state=ON if target == "off" else OFF)

    def gate(wanted: PowerState) -> str | None:
        raise SendRefused("fake outlet 1", "past the send deadline: not sent")

    power, steps = make(outlet, FakeClock(), gate=gate)
    with pytest.raises(SendRefused):
        asyncio.run(power.off() if target == "off" else power.on())
    assert outlet.commands == []
    assert names(steps)[-2:] == [f"{target}_requested", f"{target}_withdrawn"]
    assert steps[-1].detail == "past the send deadline: not sent"


# -- exceptions that are not the product's own (a library's, an encoding's) ----------

_ENCODING = UnicodeEncodeError("latin-1", "pa€ss", 2, 3, "ordinal not in range(256)")


def test_an_unexpected_error_in_a_read_fails_the_path_and_sends_nothing() -> None:
    outlet = ScriptedOutlet(read_errors=[RuntimeError("library internals")])
    power, _ = make(outlet, FakeClock())
    with pytest.raises(Unreachable, match="a state read failed: RuntimeError: library internals"):
        asyncio.run(power.off())
    assert outlet.commands == []


def test_an_error_raised_before_the_command_left_fails_the_path_not_ambiguous() -> None:
    for error in (_ENCODING, OverflowError("timeout value is too large")):
        outlet = ScriptedOutlet(command_error=error)
        power, steps = make(outlet, FakeClock())
        with pytest.raises(Unreachable, match="could not be prepared; nothing was sent"):
            asyncio.run(power.off())
        assert names(steps) == ["off_requested"]  # no ambiguity recorded: the next path may go


def test_a_decoding_error_is_about_an_answer_so_the_command_had_left() -> None:
    """A plug answering the off with a redirect whose Location is not UTF-8:
    requests decodes it after the off went out."""
    decoding = UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
    outlet = ScriptedOutlet(command_error=decoding)
    power, _ = make(outlet, FakeClock())
    with pytest.raises(Ambiguous, match="may have left"):
        asyncio.run(power.off())
    assert outlet.commands == [OFF], "never a second command"


def test_an_unexpected_error_after_the_command_may_have_left_is_ambiguous_never_resent() -> None:
    landed = ScriptedOutlet(command_error=RuntimeError("reset by peer"), apply_despite_error=True)
    power, steps = make(landed, FakeClock())
    assert asyncio.run(power.off()).verified  # read back: it had switched
    assert names(steps) == ["off_requested", "off_ambiguous", "off_verified"]
    lost = ScriptedOutlet(command_error=RuntimeError("reset by peer"))
    power, _ = make(lost, FakeClock())
    with pytest.raises(Ambiguous, match=r"may have left.*Not retried"):
        asyncio.run(power.off())
    assert lost.commands == [OFF], "never a second command"


def test_an_outlet_group_with_an_unexpected_error_after_a_switch_is_ambiguous() -> None:
    a = ScriptedOutlet(label="outlet 3")
    b = ScriptedOutlet(label="outlet 4", command_error=_ENCODING)
    power = group_power(OutletGroup([a, b]), FakeClock())
    with pytest.raises(Ambiguous, match="group half-switched off: switched outlet 3"):
        asyncio.run(power.off())
    assert a.commands == [OFF] and b.commands == [OFF]
    first = ScriptedOutlet(label="outlet 5", read_errors=[ValueError("bad answer")])
    power = group_power(OutletGroup([first, ScriptedOutlet(label="outlet 6")]), FakeClock())
    with pytest.raises(Unreachable, match="a state read failed: ValueError: bad answer"):
        asyncio.run(power.off())
    assert first.commands == []
