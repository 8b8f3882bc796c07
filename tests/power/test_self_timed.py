"""Power that comes back by itself: a cycle whose off arms the device's own on.

The rules against a device on a fake clock (the on is read back, sent from
here only when the device's did not come, an early on is recorded), then the
same cycle against the plug and PDU stand-ins over real HTTP and SNMP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from spark_watchdog.errors import Unreachable
from spark_watchdog.power.base import (
    CommandSpacing,
    OutletGroup,
    PowerState,
    PowerStep,
    PowerTiming,
    SelfTimingBackend,
    TimedOn,
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
class TimedOutlet:
    """An outlet whose timed off switches it on again ``on_after_s`` later (if it fires)."""

    clock: FakeClock
    state: PowerState = ON
    fires: bool = True
    early_by: float = 0.0  # the device's timer runs this much short
    plan: TimedOn | None = None
    commands: list[str] = field(default_factory=list)
    reads_down: set[int] = field(default_factory=set)  # read numbers that fail
    _on_at: float | None = None
    _reads: int = 0

    @property
    def name(self) -> str:
        return "timed outlet 1"

    @property
    def limiter_key(self) -> str:
        return "timed:pdu"

    async def read_state(self) -> PowerState:
        self._reads += 1
        if self._reads in self.reads_down:
            raise Unreachable(self.name, "missed read")
        if self._on_at is not None and self.clock.now >= self._on_at:
            self.state, self._on_at = ON, None
        return self.state

    async def aclose(self) -> None:
        return None

    async def command(self, target: PowerState) -> None:
        self.commands.append(target.value)
        self.state, self._on_at = target, None

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        return self.plan or TimedOn(off_seconds + 2.0, "test timer")

    async def command_timed_off(self, on_after_s: float) -> None:
        self.commands.append(f"timed off {on_after_s:g}")
        self.state = OFF
        if self.fires:
            self._on_at = self.clock.now + on_after_s - self.early_by


def make(
    backend: object, clock: FakeClock, **kwargs: object
) -> tuple[VerifiedPower, list[PowerStep]]:
    steps: list[PowerStep] = []

    async def record(step: PowerStep) -> None:
        steps.append(step)

    timing = PowerTiming(poll_interval=1.0, power_timeout=10.0, min_command_interval=0.0)
    power = VerifiedPower(
        backend,  # type: ignore[arg-type]
        timing,
        on_step=record,
        clock=clock,
        spacing=CommandSpacing(),
        **kwargs,  # type: ignore[arg-type]
    )
    return power, steps


def names(steps: list[PowerStep]) -> list[str]:
    return [s.name for s in steps]


def test_the_device_switches_itself_on_and_nothing_else_is_sent() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock)
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(60.0, timed=True))
    assert outlet.commands == ["timed off 62"]
    assert names(steps) == [
        "off_requested",
        "off_verified",
        "hold_started",
        "hold_done",
        "on_awaited",
        "on_verified",
    ]
    assert "by itself 62s later (test timer)" in steps[0].detail
    assert "device's own timer" in steps[-1].detail
    assert result.verified and result.state_after is ON
    assert result.off_held_s is not None and result.off_held_s >= 60.0


def test_a_timer_that_never_fires_is_covered_by_the_callers_own_on() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, fires=False)
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(30.0, timed=True))
    assert outlet.commands == ["timed off 32", "on"]
    assert "on_not_by_device" in names(steps)
    assert names(steps)[-2:] == ["on_requested", "on_verified"]
    assert result.verified and outlet.state is ON


def test_an_on_before_the_hold_ended_is_recorded_not_hidden() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, early_by=20.0)  # on 42 s after the off of a 60 s hold
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(60.0, timed=True))
    assert "hold_cut_short" in names(steps) and "hold_done" not in names(steps)
    assert result.off_held_s is not None and 40.0 <= result.off_held_s < 60.0
    assert outlet.commands == ["timed off 62"]  # nothing more was sent


def test_a_missed_read_during_the_hold_decides_nothing() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, reads_down={5, 6, 7})
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(10.0, timed=True))
    assert result.verified and "hold_cut_short" not in names(steps)
    assert outlet.commands == ["timed off 12"]


def test_a_device_that_cannot_time_this_off_gets_a_plain_cycle() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, plan=TimedOn(None, "reboot duration 5s, shorter than the hold"))
    power, steps = make(outlet, clock)
    result = asyncio.run(power.cycle(60.0, timed=True))
    assert outlet.commands == ["off", "on"]
    assert steps[0].name == "timed_on_unavailable" and "5s" in steps[0].detail
    assert result.verified


def test_a_plan_shorter_than_the_hold_is_not_used() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, plan=TimedOn(30.0, "a timer too short"))
    power, _ = make(outlet, clock)
    asyncio.run(power.cycle(60.0, timed=True))
    assert outlet.commands == ["off", "on"]


def test_untimed_cycles_and_dry_run_send_no_timed_off() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock)
    power, _ = make(outlet, clock)
    asyncio.run(power.cycle(5.0))
    assert outlet.commands == ["off", "on"]
    dry, steps = make(outlet, clock, dry_run=True)
    asyncio.run(dry.cycle(5.0, timed=True))
    assert outlet.commands == ["off", "on"]
    assert "switch on by itself" in steps[-1].detail


def test_a_group_is_timed_only_when_every_outlet_can_be() -> None:
    clock = FakeClock()
    a, b = TimedOutlet(clock), TimedOutlet(clock)
    power, _ = make(OutletGroup([a, b]), clock)
    result = asyncio.run(power.cycle(20.0, timed=True))
    assert a.commands == b.commands == ["timed off 22"]
    assert result.verified
    c = TimedOutlet(clock, plan=TimedOn(None, "cannot"))
    d = TimedOutlet(clock)
    power, steps = make(OutletGroup([c, d]), clock)
    asyncio.run(power.cycle(20.0, timed=True))
    assert c.commands == d.commands == ["off", "on"]
    assert "timed outlet 1: cannot" in steps[0].detail


def test_the_plugs_and_the_pdu_are_self_timing_backends() -> None:
    from spark_watchdog.power.plugs import ShellyPlug, TasmotaPlug
    from spark_watchdog.power.shelly_gen1 import ShellyGen1Plug
    from spark_watchdog.power.snmp_outlet import SnmpOutlet

    for cls in (ShellyPlug, ShellyGen1Plug, TasmotaPlug, SnmpOutlet, OutletGroup):
        assert issubclass(cls, SelfTimingBackend), cls


# -- against the stand-ins, over the wire ---------------------------------------


@pytest.fixture(params=["shelly", "shelly_gen1", "tasmota"])
def plug(request: pytest.FixtureRequest) -> Iterator[object]:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin

    with PlugStandin(request.param) as standin:
        yield standin


def _plug_backend(standin: object) -> object:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin
    from spark_watchdog.power.plugs import ShellyPlug, TasmotaPlug
    from spark_watchdog.power.shelly_gen1 import ShellyGen1Plug

    assert isinstance(standin, PlugStandin)
    if standin.kind == "shelly":
        return ShellyPlug(standin.url, 0, timeout=5.0)
    if standin.kind == "shelly_gen1":
        return ShellyGen1Plug(standin.url, 0, timeout=5.0)
    return TasmotaPlug(standin.url, 1, timeout=5.0)


def _real_time_power(backend: object) -> VerifiedPower:
    timing = PowerTiming(poll_interval=0.1, power_timeout=20.0, min_command_interval=0.0)
    return VerifiedPower(backend, timing, spacing=CommandSpacing())  # type: ignore[arg-type]


def test_a_plug_switches_itself_back_on_after_its_own_timer(plug: object) -> None:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin

    assert isinstance(plug, PlugStandin)
    power = _real_time_power(_plug_backend(plug))
    result = asyncio.run(power.cycle(1.0, timed=True))
    assert result.verified and plug.is_on()
    sent = plug.commands
    # One command left the controller: the armed off. The on was the plug's own.
    assert [(c.on, c.on_after_s) for c in sent] == [(False, 3.0), (True, None)]
    assert sent[-1].answered == "own timer"
    assert "on_verified" in [s.name for s in result.steps]


def test_a_plug_whose_timer_does_not_fire_is_switched_on_by_the_caller(plug: object) -> None:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin

    assert isinstance(plug, PlugStandin)
    plug.timers_fire = False
    timing = PowerTiming(poll_interval=0.1, power_timeout=2.0, min_command_interval=0.0)
    power = VerifiedPower(_plug_backend(plug), timing, spacing=CommandSpacing())  # type: ignore[arg-type]
    result = asyncio.run(power.cycle(1.0, timed=True))
    assert result.verified and plug.is_on()
    assert [(c.on, c.answered) for c in plug.commands] == [(False, "yes"), (True, "yes")]
    assert "on_not_by_device" in [s.name for s in result.steps]


@dataclass
class FlakyTimedOutlet(TimedOutlet):
    """Reads fail on the numbered reads with ``error`` (a missed or garbled answer)."""

    errors: dict[int, Exception] = field(default_factory=dict)

    async def read_state(self) -> PowerState:
        error = self.errors.get(self._reads + 1)
        if error is not None:
            self._reads += 1
            raise error
        return await super().read_state()


def test_a_garbled_read_during_the_hold_never_leaves_the_outlet_off() -> None:
    from spark_watchdog.errors import Refused

    clock = FakeClock()
    outlet = FlakyTimedOutlet(clock, fires=False, errors={5: Refused("timed outlet 1", "garbled")})
    power, _ = make(outlet, clock)
    result = asyncio.run(power.cycle(30.0, timed=True))
    assert result.verified and outlet.state is ON
    assert outlet.commands == ["timed off 32", "on"]


def test_an_early_on_that_then_goes_nowhere_is_followed_by_the_callers_on() -> None:
    clock = FakeClock()
    outlet = TimedOutlet(clock, fires=False)
    power, steps = make(outlet, clock)

    async def go() -> None:
        task = asyncio.ensure_future(power.cycle(30.0, timed=True))
        while not outlet.commands:
            await asyncio.sleep(0)
        for _ in range(20):
            await asyncio.sleep(0)
        outlet.state = PowerState.MIXED  # one supply back, the other not
        await task

    asyncio.run(go())
    assert "hold_cut_short" in names(steps) and outlet.commands[-1] == "on"
    assert outlet.state is ON


def test_a_timed_off_not_read_back_is_ambiguous_never_a_failure() -> None:
    """The device may have cycled between two reads: a next rung must not cut again."""
    from spark_watchdog.errors import Ambiguous

    clock = FakeClock()
    outlet = FlakyTimedOutlet(
        clock, errors={n: Unreachable("timed outlet 1", "missed") for n in range(2, 40)}
    )
    power, _ = make(outlet, clock)
    with pytest.raises(Ambiguous, match="may already have switched off and on"):
        asyncio.run(power.cycle(1.0, timed=True))
    assert outlet.commands == ["timed off 3"]
