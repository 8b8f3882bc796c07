"""TP-Link Kasa and Tapo plugs and strips as a power path, through python-kasa itself.

No real plug can run here: the stand-in (spark_watchdog.lab.hardware.
kasa_standin) is built from the protocol as python-kasa and the published
reverse engineering document it: the legacy XOR-framed JSON on TCP, KLAP's
two handshakes and AES-encrypted requests over HTTP (both versions of its
hashes), Tapo's JSON-RPC. The path under test talks to it over loopback
through python-kasa's own transports and protocols: nothing of python-kasa
is mocked. The stand-in's faults are a real plug's bad moments: a connection
dropped after the command arrived, a plug that never answers, an error code,
garbage, credentials of another account.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.config.controller import (
    KasaDevice,
    parse_controller_config,
    power_libraries_missing,
)
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, Refused, SendRefused, Unreachable
from spark_watchdog.lab.hardware.kasa_standin import KasaStandin, Switch
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.paths import preload_libraries

if importlib.util.find_spec("kasa") is None:
    if os.environ.get("SPARK_WATCHDOG_REQUIRE_KASA") == "1":
        raise RuntimeError("SPARK_WATCHDOG_REQUIRE_KASA=1 but python-kasa is not installed")
    pytest.skip(
        "python-kasa is not installed (the kasa extra; scripts/setup.sh installs it)",
        allow_module_level=True,
    )

from spark_watchdog.power.kasa import KasaOutlet, build_kasa_backend

pytestmark = pytest.mark.integration

ON, OFF = PowerState.ON, PowerState.OFF
EMAIL = "owner@example.com"
PASSWORD = "kasa-pw-4711"
DIALECTS = ("legacy", "klap", "smart")
CYCLE = ["off_requested", "off_verified", "hold_started", "hold_done", "on_requested"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def standin(dialect: str, **keys: Any) -> KasaStandin:
    return KasaStandin(dialect, username=EMAIL, password=PASSWORD, **keys)


@pytest.fixture(params=DIALECTS)
def plug(request: pytest.FixtureRequest) -> Iterator[KasaStandin]:
    with standin(request.param) as device:
        yield device


def outlet(
    device: KasaStandin,
    number: int | None = None,
    *,
    password: str = PASSWORD,
    timeout: float = 3.0,
    port: int | None = None,
) -> KasaOutlet:
    legacy = device.dialect == "legacy"
    return KasaOutlet(
        device.host,
        number,
        dialect=device.dialect,  # type: ignore[arg-type]
        port=port or device.port,
        username=None if legacy else Secret(EMAIL, "test"),
        password=None if legacy else Secret(password, "test"),
        timeout=timeout,
    )


async def _record(steps: list[str], step: Any) -> None:
    steps.append(step.name)


def verified(backend: KasaOutlet, steps: list[str], power_timeout: float = 10.0) -> VerifiedPower:
    timing = PowerTiming(
        poll_interval=0.1,
        power_timeout=power_timeout,
        min_command_interval=0.0,
        read_timeout=5.0,
        command_timeout=8.0,
    )
    return VerifiedPower(
        backend, timing, on_step=lambda step: _record(steps, step), spacing=CommandSpacing()
    )


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_verified_cycle_with_a_relay_that_lands_late(dialect: str) -> None:
    with standin(dialect, delay_s=0.3) as device:
        steps: list[str] = []
        result = run(verified(outlet(device), steps).cycle(off_seconds=0.5))
        assert result.verified and result.state_after is ON
        assert result.off_held_s is not None and result.off_held_s >= 0.5
        assert steps == [*CYCLE, "on_verified"]
        assert device.switches == [Switch(None, False, "yes"), Switch(None, True, "yes")]
        assert device.state() == "on"


def test_off_and_on_each_read_back(plug: KasaStandin) -> None:
    steps: list[str] = []
    power = verified(outlet(plug), steps)
    assert run(power.off()).state_after is OFF and plug.state() == "off"
    assert run(power.state()) is OFF
    assert run(power.on()).state_after is ON and plug.state() == "on"
    assert steps == ["off_requested", "off_verified", "on_requested", "on_verified"]
    again = run(power.on())
    assert again.verified and len(plug.switches) == 2, "an outlet already on got a command"


def test_the_off_is_held_before_the_on(plug: KasaStandin) -> None:
    seen: list[str] = []

    async def watch(step: Any) -> None:
        seen.append(step.name)
        if step.name == "hold_done":
            seen.append(f"plug {plug.state()}")  # still off at the hold's end

    power = VerifiedPower(
        outlet(plug),
        PowerTiming(poll_interval=0.1, power_timeout=5.0, min_command_interval=0.0),
        on_step=watch,
        spacing=CommandSpacing(),
    )
    result = run(power.cycle(off_seconds=1.0))
    assert result.off_held_s is not None and result.off_held_s >= 1.0
    assert seen == [*CYCLE[:4], "plug off", "on_requested", "on_verified"]


def test_a_timed_cycle_is_a_plain_one_with_the_on_sent_here(plug: KasaStandin) -> None:
    """The path arms no timer on the plug: asked for a timed cycle, it holds and sends the on."""
    steps: list[str] = []
    result = run(verified(outlet(plug), steps).cycle(off_seconds=0.3, timed=True))
    assert result.verified and steps == [*CYCLE, "on_verified"]
    assert [s.on for s in plug.switches] == [False, True]


def test_a_plug_that_closes_each_connection_still_switches_cleanly() -> None:
    """Each command goes on a connection of its own, not the one its read used."""
    with standin("legacy", outlets=2, one_answer=True) as device:
        steps: list[str] = []
        result = run(verified(outlet(device, 1), steps).off())
        assert result.verified and steps == ["off_requested", "off_verified"]
        assert device.switches == [Switch(1, False, "yes")]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_one_outlet_of_a_strip_and_no_other(dialect: str) -> None:
    with standin(dialect, outlets=3) as strip:
        steps: list[str] = []
        result = run(verified(outlet(strip, 2), steps).cycle(off_seconds=0.2))
        assert result.verified
        assert strip.switches == [Switch(2, False, "yes"), Switch(2, True, "yes")]
        strip.set_state(False, 3)
        assert run(outlet(strip, 3).read_state()) is OFF
        assert run(outlet(strip, 1).read_state()) is ON


@pytest.mark.parametrize(
    ("outlets", "number", "expected"),
    [
        (3, 5, "no outlet 5: the strip has 3"),
        (3, None, "the device is a strip of 3 outlets: set outlet"),
        (0, 2, "no outlet 2: the device is not a strip"),
    ],
)
def test_an_outlet_the_device_does_not_have_is_refused_before_sending(
    outlets: int, number: int | None, expected: str
) -> None:
    with standin("legacy", outlets=outlets) as device:
        with pytest.raises(Refused, match=expected):
            run(outlet(device, number).read_state())
        with pytest.raises(Refused, match=expected):
            run(outlet(device, number).command(OFF))
        assert device.switches == []


@pytest.mark.parametrize("dialect", ["klap", "smart"])
def test_wrong_credentials_are_refused_and_never_shown(
    dialect: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-password-0815"
    with standin(dialect) as device, caplog.at_level(logging.DEBUG):
        with pytest.raises(Refused, match="refused the credentials") as read:
            run(outlet(device, password=wrong).read_state())
        with pytest.raises(Refused, match="nothing was sent") as sent:
            run(outlet(device, password=wrong).command(OFF))
        assert device.switches == [] and device.state() == "on"
    for text in (caplog.text, str(read.value), str(sent.value)):
        assert wrong not in text and PASSWORD not in text
    assert "Handshake1 posted" not in caplog.text, "python-kasa logged the handshake's hashes"


def test_a_plug_bound_to_another_account_is_refused() -> None:
    with standin("klap") as device:
        device.set_fault("reject_auth", times=1)
        with pytest.raises(Refused, match=r"KLAP handshake.*nothing was sent"):
            run(outlet(device).command(OFF))
        device.set_fault("reject_auth")
        steps: list[str] = []
        with pytest.raises(Refused, match="refused the credentials"):
            run(verified(outlet(device), steps).off())
        assert device.switches == [] and steps == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_connection_dropped_after_the_command_is_ambiguous_and_not_resent(
    dialect: str,
) -> None:
    with standin(dialect) as device:
        device.set_fault("drop", times=1)
        with pytest.raises(Ambiguous, match="may have been applied"):
            run(outlet(device).command(OFF))
        assert device.switches == [Switch(None, False, "drop")]
        device.set_state(True)
        device.set_fault("drop", times=1)
        steps: list[str] = []
        result = run(verified(outlet(device), steps).off())
        assert result.verified and steps == ["off_requested", "off_ambiguous", "off_verified"]
        assert len(device.switches) == 2, "the command was sent again"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_plug_that_hangs_is_a_timeout_held_for_a_person(dialect: str) -> None:
    with standin(dialect, hang_s=30.0) as device:
        device.set_fault("hang", times=1)
        steps: list[str] = []
        power = verified(outlet(device, timeout=0.5), steps, power_timeout=1.5)
        with pytest.raises(Ambiguous, match="Not retried"):
            run(power.off())
        assert steps == ["off_requested", "off_ambiguous"]
        assert device.switches == [Switch(None, False, "hang")] and device.state() == "on"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_error_code_is_refused_and_garbage_is_ambiguous(dialect: str) -> None:
    with standin(dialect) as device:
        device.set_fault("error", times=1)
        with pytest.raises(Refused):
            run(outlet(device).command(OFF))
        assert device.state() == "on"
        device.set_fault("garbage", times=1)
        with pytest.raises(Ambiguous, match="may have been applied"):
            run(outlet(device).command(OFF))
        assert [s.answered for s in device.switches] == ["error", "garbage"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_nothing_listening_is_unreachable_and_nothing_was_sent(dialect: str) -> None:
    with standin(dialect) as device:
        backend = outlet(device, port=free_port(), timeout=1.0)
        with pytest.raises(Unreachable, match="nothing was sent"):
            run(backend.command(OFF))
        with pytest.raises(Unreachable):
            run(backend.read_state())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_command_past_its_send_window_never_reaches_the_plug(dialect: str) -> None:
    with standin(dialect) as device:
        steps: list[str] = []
        power = VerifiedPower(
            outlet(device),
            PowerTiming(poll_interval=0.1, power_timeout=5.0, min_command_interval=0.0),
            on_step=lambda step: _record(steps, step),
            send_window=lambda: "past the send deadline",
            spacing=CommandSpacing(),
        )
        with pytest.raises(SendRefused):
            run(power.off())
        assert steps == ["off_requested", "off_withdrawn"] and device.switches == []


def _device(**keys: object) -> dict[str, object]:
    device: dict[str, object] = {
        "type": "kasa",
        "host": "10.0.0.40",
        "protocol": "klap",
        "outlet": 2,
        "username_file": "/etc/spark-watchdog/kasa-user",
        "password_file": "/etc/spark-watchdog/kasa-password",
    }
    device.update(keys)
    return {"nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [device]}]}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"outlet": 0}, "nodes[0].power[0].outlet: expected"),
        ({"outlet": "two"}, "nodes[0].power[0].outlet: expected"),
        ({"protocol": "aes"}, "nodes[0].power[0].protocol: expected one of"),
        ({"username_file": None}, "nodes[0].power[0].username_file: protocol klap logs in"),
        ({"password": PASSWORD}, "nodes[0].power[0].password: inline secrets are not accepted"),
        (
            {"protocol": "legacy"},
            "nodes[0].power[0].username_file: the legacy protocol has no login",
        ),
        ({"host": "http://10.0.0.40"}, "nodes[0].power[0].host:"),
        ({"port": 70000}, "nodes[0].power[0].port:"),
    ],
)
def test_config_errors_name_the_field_and_the_fix(keys: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_device(**keys))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems
    assert all(PASSWORD not in p for p in caught.value.problems)


def test_a_missing_library_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    config = parse_controller_config(_device())
    assert power_libraries_missing(config) == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert power_libraries_missing(config) == [
        "nodes[0].power[0].type: kasa needs python-kasa, which is not installed here: "
        "pip install 'spark-watchdog[kasa]' (Python 3.11 or newer)"
    ]


def test_build_from_config() -> None:
    config = parse_controller_config(_device())
    preload_libraries(config)  # what a controller's start does with a kasa path
    device = config.nodes[0].power[0]
    assert isinstance(device, KasaDevice) and device.port_or_default == 80
    secrets = {"username_file": Secret(EMAIL, "u"), "password_file": Secret(PASSWORD, "p")}
    backend = build_kasa_backend(device, secrets)
    assert backend.name == "kasa klap 10.0.0.40:80 outlet 2"
    assert backend.limiter_key == "kasa:10.0.0.40:80"
    with pytest.raises(ConfigError, match="credentials were not read"):
        build_kasa_backend(device, {})
    legacy = (
        parse_controller_config(
            _device(protocol="legacy", outlet=None, username_file=None, password_file=None)
        )
        .nodes[0]
        .power[0]
    )
    assert isinstance(legacy, KasaDevice)
    assert build_kasa_backend(legacy, {}).name == "kasa legacy 10.0.0.40:9999"
