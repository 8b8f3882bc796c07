"""Shelly Gen2+, Shelly Gen1 and Tasmota backends against the plug stand-in, over real
HTTP on loopback.

The stand-in (spark_watchdog.lab.hardware.plug_standin) speaks each firmware's
documented HTTP API (Shelly's gen2 RPC and gen1 ``/relay/N`` API docs,
Tasmota's Commands page), including Shelly Gen2+'s SHA-256 digest auth, Shelly
Gen1's Basic auth and Tasmota's query-string password, and injects faults:
refuse, drop after applying, stall after applying, hang, and answers of an
unknown shape.
"""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.config.controller import ShellyDevice, ShellyGen1Device, TasmotaDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, Refused, SendRefused, Unreachable
from spark_watchdog.lab.hardware.plug_standin import AppliedCommand, PlugStandin
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.plugs import (
    ShellyPlug,
    TasmotaPlug,
    build_shelly_backend,
    build_tasmota_backend,
)
from spark_watchdog.power.shelly_gen1 import ShellyGen1Plug, build_shelly_gen1_backend

ON, OFF = PowerState.ON, PowerState.OFF
KINDS = ("shelly", "shelly_gen1", "tasmota")
# Characters that break a hand-built query string (Arksine/moonraker#393).
PASSWORD = "pl&g #pw%20=x"

Plug = ShellyPlug | ShellyGen1Plug | TasmotaPlug


def plug_at(kind: str, url: str, password: Secret | None = None, timeout: float = 5.0) -> Plug:
    if kind == "shelly":
        return ShellyPlug(url, password=password, timeout=timeout)
    if kind == "shelly_gen1":
        return ShellyGen1Plug(url, password=password, timeout=timeout)
    return TasmotaPlug(url, password=password, timeout=timeout)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def plug_for(standin: PlugStandin, password: str | None = None, **kwargs: Any) -> Plug:
    secret = None if password is None else Secret(password, "test")
    kwargs.setdefault("timeout", 2.0)
    if standin.kind == "shelly":
        return ShellyPlug(standin.url, password=secret, **kwargs)
    if standin.kind == "shelly_gen1":
        return ShellyGen1Plug(standin.url, password=secret, **kwargs)
    return TasmotaPlug(standin.url, password=secret, **kwargs)


def timing(power_timeout: float = 3.0) -> PowerTiming:
    return PowerTiming(
        poll_interval=0.1,
        power_timeout=power_timeout,
        min_command_interval=0.1,
        read_timeout=2.0,
        command_timeout=3.0,
    )


async def _record_steps(steps: list[str], step: Any) -> None:
    steps.append(step.name)


def verified(backend: Plug, steps: list[str], power_timeout: float = 3.0) -> VerifiedPower:
    return VerifiedPower(
        backend,
        timing(power_timeout),
        on_step=lambda step: _record_steps(steps, step),
        spacing=CommandSpacing(),
    )


@pytest.fixture(params=KINDS)
def standin(request: pytest.FixtureRequest) -> Iterator[PlugStandin]:
    with PlugStandin(request.param, password=PASSWORD) as plug:
        yield plug


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_verified_cycle(kind: str) -> None:
    changes: list[tuple[int, bool]] = []
    with PlugStandin(
        kind,
        password=PASSWORD,
        switch_delay=0.3,  # the relay follows late: VerifiedPower has to poll
        on_change=lambda relay, on: changes.append((relay, on)),
    ) as standin:
        steps: list[str] = []
        result = run(verified(plug_for(standin, PASSWORD), steps).cycle(off_seconds=0.5))
        relay = standin.first_relay
        assert result.verified is True
        assert result.state_before is ON and result.state_after is ON
        assert result.off_held_s is not None and result.off_held_s >= 0.5
        assert steps == [
            "off_requested",
            "off_verified",
            "hold_started",
            "hold_done",
            "on_requested",
            "on_verified",
        ]
        assert standin.commands == [
            AppliedCommand(relay, False, "yes"),
            AppliedCommand(relay, True, "yes"),
        ]
        assert changes == [(relay, False), (relay, True)]
        assert standin.is_on()


@pytest.mark.integration
def test_state_reads_follow_the_relay(standin: PlugStandin) -> None:
    plug = plug_for(standin, PASSWORD)
    assert run(plug.read_state()) is ON
    standin.set_output(False)
    assert run(plug.read_state()) is OFF
    run(plug.command(ON))
    assert standin.is_on()


@pytest.mark.integration
def test_a_missing_password_is_refused(standin: PlugStandin) -> None:
    plug = plug_for(standin)
    with pytest.raises(Refused, match=r"requires a password \(HTTP 401"):
        run(plug.read_state())
    with pytest.raises(Refused, match="requires a password"):
        run(plug.command(OFF))
    assert standin.commands == [] and standin.is_on()


@pytest.mark.integration
def test_a_wrong_password_is_refused_and_never_shown(
    standin: PlugStandin, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-secret-123"
    plug = plug_for(standin, wrong)
    with caplog.at_level(logging.DEBUG), pytest.raises(Refused) as caught:
        run(plug.command(OFF))
    assert "credentials rejected (HTTP 401" in caught.value.message
    assert wrong not in str(caught.value) and wrong not in caplog.text
    assert standin.commands == [] and standin.is_on()


@pytest.mark.integration
def test_tasmota_password_stays_out_of_logs_and_errors(caplog: pytest.LogCaptureFixture) -> None:
    with PlugStandin("tasmota", password=PASSWORD) as standin:
        plug = plug_for(standin, PASSWORD)
        with caplog.at_level(logging.DEBUG):
            assert run(plug.read_state()) is ON
            standin.set_fault("drop", times=1)
            with pytest.raises(Ambiguous) as caught:
                run(plug.command(OFF))
    # urllib3 logs each request line at DEBUG: the query is there, the password is not.
    assert "password=***" in caplog.text
    encoded = "pl%26g%20%23pw%2520%3Dx"
    for text in (caplog.text, str(caught.value)):
        assert PASSWORD not in text and encoded not in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.integration
def test_old_tasmota_says_200_with_a_warning_and_is_still_refused() -> None:
    with PlugStandin("tasmota", password=PASSWORD, legacy_auth_answer=True) as standin:
        with pytest.raises(Refused, match=r'\(HTTP 200, "Need user=<username>&password='):
            run(plug_for(standin, "wrong").read_state())
        with pytest.raises(Refused, match="credentials rejected"):
            run(plug_for(standin, "wrong").command(OFF))
        assert standin.commands == []


@pytest.mark.integration
def test_dropped_after_applying_is_ambiguous_then_read_back_verifies(
    standin: PlugStandin,
) -> None:
    plug = plug_for(standin, PASSWORD)
    standin.set_fault("drop", times=1)
    with pytest.raises(Ambiguous, match="connection broke after the request was sent"):
        run(plug.command(OFF))
    assert not standin.is_on()  # it did land
    # Through VerifiedPower: ambiguous, read back, verified, never resent.
    standin.set_fault("drop", times=1)
    steps: list[str] = []
    result = run(verified(plug, steps).on())
    assert result.verified is True and result.state_after is ON
    assert steps == ["on_requested", "on_ambiguous", "on_verified"]
    relay = standin.first_relay
    assert standin.commands == [
        AppliedCommand(relay, False, "drop"),
        AppliedCommand(relay, True, "drop"),
    ]


@pytest.mark.integration
def test_no_answer_after_applying_is_ambiguous(standin: PlugStandin) -> None:
    standin.set_fault("stall", times=1)
    with pytest.raises(Ambiguous, match=r"no answer within 0\.5s after the request was sent"):
        run(plug_for(standin, PASSWORD, timeout=0.5).command(OFF))
    assert [c.answered for c in standin.commands] == ["stall"]


@pytest.mark.integration
def test_a_hung_plug_is_unreachable_for_reads_and_ambiguous_for_commands(
    standin: PlugStandin,
) -> None:
    plug = plug_for(standin, PASSWORD, timeout=0.3)
    standin.set_fault("hang")
    with pytest.raises(Unreachable, match=r"no answer within 0\.3s"):
        run(plug.read_state())
    with pytest.raises(Ambiguous, match="may have been applied"):
        run(plug.command(OFF))
    # VerifiedPower reads before it acts: an unreadable plug gets no command.
    steps: list[str] = []
    with pytest.raises(Unreachable, match="no answer"):
        run(verified(plug, steps).off())
    assert steps == []
    assert standin.commands == [] and standin.is_on()


@pytest.mark.integration
def test_a_refusing_plug_is_refused_and_nothing_changes(standin: PlugStandin) -> None:
    standin.set_fault("refuse")
    with pytest.raises(Refused) as caught:
        run(plug_for(standin, PASSWORD).command(OFF))
    if standin.kind == "shelly":
        assert caught.value.message.startswith('Switch.Set failed: code -109: "Switch is in safe')
    elif standin.kind == "shelly_gen1":
        assert caught.value.message.startswith("/relay/0?turn=off refused (HTTP 400)")
    else:
        assert caught.value.message == 'Power1 Off answered Command "Error"'
    assert standin.is_on() and standin.commands == [] and standin.refused_commands == 1


@pytest.mark.integration
def test_an_answer_of_unknown_shape_is_a_clear_error(standin: PlugStandin) -> None:
    plug = plug_for(standin, PASSWORD)
    standin.set_fault("garble")
    expected = {
        "shelly": '{"output": true|false}',
        "shelly_gen1": '{"ison": true|false}',
        "tasmota": '{"POWER1": "ON"|"OFF"}',
    }[standin.kind]
    with pytest.raises(Refused) as caught:
        run(plug.read_state())
    assert "garbled" in caught.value.message and expected in caught.value.message
    # After a command, an odd answer cannot prove it did not switch.
    with pytest.raises(Ambiguous, match=r"garbled.*may have been applied"):
        run(plug.command(OFF))


@pytest.mark.integration
def test_a_switch_the_plug_does_not_have_is_refused() -> None:
    with (
        PlugStandin("shelly") as shelly,
        PlugStandin("shelly_gen1") as gen1,
        PlugStandin("tasmota") as tasmota,
    ):
        with pytest.raises(Refused, match=r'Switch.GetStatus failed: code -105: "Bad id=3"'):
            run(ShellyPlug(shelly.url, 3, timeout=2.0).read_state())
        with pytest.raises(Refused, match=r"/relay/3 answered 'Bad relay index': no relay 3"):
            run(ShellyGen1Plug(gen1.url, 3, timeout=2.0).read_state())
        with pytest.raises(Refused, match="no relay 3"):
            run(ShellyGen1Plug(gen1.url, 3, timeout=2.0).command(OFF))
        assert gen1.commands == []
        with pytest.raises(Refused, match=r'Power3 answered Command "Unknown".*no relay 3'):
            run(TasmotaPlug(tasmota.url, 3, timeout=2.0).read_state())


@pytest.mark.integration
def test_tasmota_indexed_keys_and_several_relays() -> None:
    with PlugStandin("tasmota", relays=2, initially_on=False) as standin:
        second = TasmotaPlug(standin.url, 2, timeout=2.0)
        assert run(second.read_state()) is OFF
        run(second.command(ON))
        assert standin.is_on(2) and not standin.is_on(1)
    with PlugStandin("tasmota", indexed_keys=True) as standin:
        assert run(TasmotaPlug(standin.url, timeout=2.0).read_state()) is ON


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_nothing_listening_is_unreachable_and_nothing_was_sent(kind: str) -> None:
    plug = plug_at(kind, f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Unreachable, match=r"cannot connect .*; nothing was sent"):
        run(plug.read_state())
    with pytest.raises(Unreachable, match="nothing was sent"):
        run(plug.command(OFF))


@pytest.mark.integration
@pytest.mark.parametrize("kind", KINDS)
def test_the_standin_runs_standalone(kind: str, tmp_path: Any) -> None:
    password_file = tmp_path / "pw"
    password_file.write_text(PASSWORD + "\n")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_watchdog.lab.hardware",
            "plug",
            "--kind",
            kind,
            "--port",
            "0",
            "--password-file",
            str(password_file),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        url = match.group(1)
        plug = plug_at(kind, url, Secret(PASSWORD, "t"), timeout=2.0)
        assert run(plug.read_state()) is ON
        run(plug.command(OFF))
        assert run(plug.read_state()) is OFF
        relay = 0 if kind.startswith("shelly") else 1
        assert process.stdout.readline().strip() == f"relay {relay} -> off"
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


def test_build_backends_from_config() -> None:
    secrets = {"password_file": Secret("pw", "test")}
    shelly = build_shelly_backend(
        ShellyDevice(type="shelly", url="http://10.0.0.7", switch_id=1, password_file="/run/pw"),
        secrets,
    )
    assert shelly.name == "shelly http://10.0.0.7:80 switch 1"
    assert shelly.limiter_key == "shelly:10.0.0.7:80"
    tasmota = build_tasmota_backend(
        TasmotaDevice(type="tasmota", url="http://admin:x@10.0.0.8:8080", switch_id=2), {}
    )
    assert tasmota.name == "tasmota http://10.0.0.8:8080 relay 2"
    assert tasmota.limiter_key == "tasmota:10.0.0.8:8080"
    with pytest.raises(ConfigError, match="password_file"):
        build_tasmota_backend(
            TasmotaDevice(type="tasmota", url="http://10.0.0.8", password_file="/run/pw"), {}
        )
    gen1 = build_shelly_gen1_backend(
        ShellyGen1Device(type="shelly_gen1", url="http://10.0.0.9", switch_id=1), {}
    )
    assert gen1.name == "shelly_gen1 http://10.0.0.9:80 relay 1"
    assert gen1.limiter_key == "shelly_gen1:10.0.0.9:80"
    with pytest.raises(ConfigError, match="password_file"):
        build_shelly_gen1_backend(
            ShellyGen1Device(type="shelly_gen1", url="http://10.0.0.9", password_file="/run/pw"),
            {},
        )


@pytest.mark.integration
def test_a_command_past_its_send_window_never_reaches_the_plug(standin: PlugStandin) -> None:
    # The window is asked in the worker thread, right before the request
    # (power/send_window.py): a pair's deadline that ran out after the gate.
    steps: list[str] = []
    plug = plug_for(standin, PASSWORD)
    power = VerifiedPower(
        plug,
        timing(),
        on_step=lambda step: _record_steps(steps, step),
        send_window=lambda: "past the send deadline",
        spacing=CommandSpacing(),
    )
    with pytest.raises(SendRefused, match="past the send deadline"):
        run(power.off())
    assert steps == ["off_requested", "off_withdrawn"]
    assert standin.commands == [] and standin.is_on()


@pytest.mark.integration
def test_shelly_gen1_sends_its_password_only_as_basic_auth(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Gen1's login is HTTP Basic (user admin): the password is never in a URL, a log
    line or an error, and a wrong one is refused before anything switches."""
    with PlugStandin("shelly_gen1", password=PASSWORD) as standin:
        with caplog.at_level(logging.DEBUG):
            plug = plug_for(standin, PASSWORD)
            assert run(plug.read_state()) is ON
            run(plug.command(OFF))
            with pytest.raises(Refused, match=r"credentials rejected \(HTTP 401"):
                run(plug_for(standin, "wrong").command(ON))
        assert PASSWORD not in caplog.text
        assert [c.on for c in standin.commands] == [False]
        assert not standin.is_on()


@pytest.mark.integration
def test_shelly_gen1_that_answers_on_to_an_off_is_ambiguous_and_never_resent() -> None:
    """A relay that answers "ison": true to turn=off (a welded relay, firmware that
    lies) has done something else than asked: ambiguous, read back, held for a
    person; the off is sent once."""
    with PlugStandin("shelly_gen1") as standin:
        steps: list[str] = []
        power = verified(plug_for(standin), steps, power_timeout=3.0)
        standin.ignores_commands = True
        with pytest.raises(Ambiguous, match=r'answered "ison": true.*Not retried'):
            run(power.off())
        assert steps == ["off_requested", "off_ambiguous"]
        assert standin.is_on() and [c.on for c in standin.commands] == [False]
