"""Home Assistant switch entities as a power path, against a stand-in over real HTTP.

No Home Assistant runs here: the stand-in (spark_watchdog.lab.hardware.
home_assistant_standin) is built from Home Assistant's REST API documentation
(developers.home-assistant.io, "REST API": ``GET /api/states/<entity_id>``,
``POST /api/services/switch/turn_off|turn_on``, Bearer tokens). Its clock runs
an hour behind the test's, its state can lag the device, and its faults are
the bad answers of a real one: garbage, a service call that fails or never
answers, a state restored from before the command, an entity gone
``unavailable``, a refused token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.config.controller import HomeAssistantDevice, parse_controller_config
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import (
    Ambiguous,
    ConfigError,
    Refused,
    SendRefused,
    StateTimeout,
    Unreachable,
)
from spark_watchdog.lab.hardware.home_assistant_standin import HomeAssistantStandin, ServiceCall
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.home_assistant import HomeAssistantSwitch, build_home_assistant_backend

pytestmark = pytest.mark.integration

ON, OFF = PowerState.ON, PowerState.OFF
TOKEN = "eyJhbGciOiJIUzI1NiJ9.standin-long-lived-token"
ENTITY = "switch.spark_1"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def home() -> Iterator[HomeAssistantStandin]:
    # An hour behind: timestamps must be compared with Home Assistant's own.
    with HomeAssistantStandin(TOKEN, clock_offset_s=-3600.0) as standin:
        yield standin


def switch(
    home: HomeAssistantStandin, token: str = TOKEN, timeout: float = 5.0
) -> HomeAssistantSwitch:
    return HomeAssistantSwitch(home.url, ENTITY, Secret(token, "test"), timeout=timeout)


async def _record(steps: list[str], step: Any) -> None:
    steps.append(step.name)


def verified(
    backend: HomeAssistantSwitch, steps: list[str], power_timeout: float = 20.0
) -> VerifiedPower:
    timing = PowerTiming(
        poll_interval=0.1,
        power_timeout=power_timeout,
        min_command_interval=0.0,
        read_timeout=10.0,
        command_timeout=15.0,
    )
    return VerifiedPower(
        backend, timing, on_step=lambda step: _record(steps, step), spacing=CommandSpacing()
    )


def test_a_verified_cycle_with_a_lagging_state() -> None:
    with HomeAssistantStandin(TOKEN, lag_s=0.5, clock_offset_s=-3600.0) as home:
        steps: list[str] = []
        result = run(verified(switch(home), steps).cycle(off_seconds=0.5))
        assert result.verified and result.state_after is ON
        assert steps == [
            "off_requested",
            "off_verified",
            "hold_started",
            "hold_done",
            "on_requested",
            "on_verified",
        ]
        assert home.calls == [
            ServiceCall(ENTITY, "turn_off", "yes"),
            ServiceCall(ENTITY, "turn_on", "yes"),
        ]
        assert home.state() == "on"


def test_a_state_from_before_the_command_is_no_read_back(home: HomeAssistantStandin) -> None:
    """The entity reads off, but its last_changed is older than the command: not proof."""
    home.set_fault("stale", times=1)
    steps: list[str] = []
    backend = switch(home)
    with pytest.raises(StateTimeout, match=r"off not read back within 3s"):
        run(verified(backend, steps, power_timeout=3.0).off())
    assert steps == ["off_requested"] and len(home.calls) == 1
    assert home.state() == "off"  # what HA shows; the proof is missing
    with pytest.raises(Unreachable, match=r"reads off, but .* not after the command was sent"):
        run(backend.read_state())


def test_unavailable_after_the_command_is_ambiguous_never_off(home: HomeAssistantStandin) -> None:
    home.set_fault("unavailable", times=1)
    steps: list[str] = []
    with pytest.raises(Ambiguous, match="reads unavailable after the off command"):
        run(verified(switch(home), steps).off())
    assert steps == ["off_requested"] and len(home.calls) == 1


def test_unavailable_before_a_command_sends_nothing(home: HomeAssistantStandin) -> None:
    home.set_state("unavailable")
    steps: list[str] = []
    with pytest.raises(Unreachable, match="reads unavailable: Home Assistant cannot see"):
        run(verified(switch(home), steps).off())
    home.set_state("unknown")
    with pytest.raises(Unreachable, match="reads unknown"):
        run(switch(home).read_state())
    assert steps == [] and home.calls == []


def test_garbage_is_refused_for_a_read_and_ambiguous_for_a_command(
    home: HomeAssistantStandin,
) -> None:
    home.set_fault("garbage")
    with pytest.raises(Refused, match=r"'<html>Home Assistant</html>': not JSON"):
        run(switch(home).read_state())
    with pytest.raises(Ambiguous, match=r"not JSON\); it may have been applied"):
        run(switch(home).command(OFF))


def test_an_entity_home_assistant_does_not_have_is_refused(home: HomeAssistantStandin) -> None:
    other = HomeAssistantSwitch(home.url, "switch.spark_2", Secret(TOKEN, "t"), timeout=5.0)
    with pytest.raises(Refused, match=r"has no entity switch\.spark_2 \(HTTP 404\)"):
        run(other.read_state())


def test_a_refused_token_is_refused_and_never_shown(
    home: HomeAssistantStandin, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-token-4711"
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(Refused, match=r"the token was refused \(HTTP 401\)") as read:
            run(switch(home, wrong).read_state())
        with pytest.raises(Refused, match="check token_file") as sent:
            run(switch(home, wrong).command(OFF))
    for text in (caplog.text, str(read.value), str(sent.value)):
        assert wrong not in text and TOKEN not in text
    assert home.calls == [] and home.state() == "on"


def test_dropped_after_applying_is_ambiguous_then_read_back(home: HomeAssistantStandin) -> None:
    home.set_fault("drop", times=1)
    steps: list[str] = []
    result = run(verified(switch(home), steps).off())
    assert result.verified and steps == ["off_requested", "off_ambiguous", "off_verified"]
    assert [c.answered for c in home.calls] == ["drop"]


def test_a_timeout_in_the_middle_of_a_command_is_ambiguous(home: HomeAssistantStandin) -> None:
    backend = switch(home, timeout=0.5)
    assert run(backend.read_state()) is ON
    home.set_fault("hang", times=1)
    with pytest.raises(Ambiguous, match=r"no answer within 0\.5s.*may have been applied"):
        run(backend.command(OFF))


def test_a_failed_service_call_still_on_is_held_not_resent(home: HomeAssistantStandin) -> None:
    home.set_fault("error", times=1)
    steps: list[str] = []
    with pytest.raises(Ambiguous, match=r"HTTP 500.*Not retried"):
        run(verified(switch(home), steps, power_timeout=3.0).off())
    assert steps == ["off_requested", "off_ambiguous"]
    assert [c.answered for c in home.calls] == [] and home.state() == "on"


def test_a_device_that_never_follows_is_a_state_timeout(home: HomeAssistantStandin) -> None:
    home.set_fault("ignore")
    steps: list[str] = []
    with pytest.raises(StateTimeout, match=r"off not read back within 3s \(last read on"):
        run(verified(switch(home), steps, power_timeout=3.0).off())
    assert [c.service for c in home.calls] == ["turn_off"]


def test_an_attribute_update_is_not_a_state_change(home: HomeAssistantStandin) -> None:
    """A power reading moves last_updated; only last_changed says the state changed."""
    home.set_fault("ignore", times=1)
    backend = switch(home)
    assert run(backend.read_state()) is ON
    run(backend.command(OFF))
    home.touch()
    assert run(backend.read_state()) is ON
    home.set_state("off")
    assert run(backend.read_state()) is OFF


def test_a_command_past_its_send_window_never_reaches_home_assistant(
    home: HomeAssistantStandin,
) -> None:
    steps: list[str] = []
    power = VerifiedPower(
        switch(home),
        PowerTiming(poll_interval=0.1, power_timeout=5.0, min_command_interval=0.0),
        on_step=lambda step: _record(steps, step),
        send_window=lambda: "past the send deadline",
        spacing=CommandSpacing(),
    )
    with pytest.raises(SendRefused):
        run(power.off())
    assert steps == ["off_requested", "off_withdrawn"] and home.calls == []


def test_nothing_listening_is_unreachable_and_nothing_was_sent() -> None:
    backend = HomeAssistantSwitch(
        f"http://127.0.0.1:{free_port()}", ENTITY, Secret(TOKEN, "t"), timeout=2.0
    )
    with pytest.raises(Unreachable, match="nothing was sent"):
        run(backend.command(OFF))


def _device(**keys: object) -> dict[str, object]:
    device: dict[str, object] = {
        "type": "home_assistant",
        "url": "http://homeassistant.lan:8123",
        "entity_id": ENTITY,
        "token_file": "/etc/spark-watchdog/ha-token",
    }
    device.update(keys)
    return {"nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [device]}]}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"entity_id": "light.spark_1"}, "nodes[0].power[0].entity_id: expected a switch entity"),
        ({"token_file": None}, "nodes[0].power[0].token_file: expected a non-empty string"),
        ({"token": TOKEN}, "nodes[0].power[0].token: inline secrets are not accepted"),
        ({"url": "homeassistant.lan"}, "nodes[0].power[0].url: expected an http(s)://"),
    ],
)
def test_config_errors_name_the_field_and_the_fix(keys: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_device(**keys))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems
    assert all(TOKEN not in p for p in caught.value.problems)


def test_build_from_config() -> None:
    device = parse_controller_config(_device()).nodes[0].power[0]
    assert isinstance(device, HomeAssistantDevice)
    backend = build_home_assistant_backend(device, {"token_file": Secret(TOKEN, "t")})
    assert backend.name == "home_assistant http://homeassistant.lan:8123 switch.spark_1"
    with pytest.raises(ConfigError, match="token_file"):
        build_home_assistant_backend(device, {})
