"""NUT outlets as a power path, against a real ``upsd`` started by the test on loopback.

``nut_server`` (tests/conftest.py) runs Debian's ``upsd`` in a temporary
directory with its own config, and two UPSes behind it:

- ``pdu``: the real ``dummy-ups`` driver. Its dummy mode offers one instant
  command, ``load.off``, and switches nothing (dummy-ups(8), BUGS: "Instant
  commands are not yet supported in Dummy Mode"), so upsd refuses
  ``outlet.N.load.off`` for it: the tests against it are the reads, the
  refusals and the credentials. Where an outlet changes, the test plays the
  device: it sets ``outlet.N.status`` through upsd (``SET VAR``, as upsrw
  does) after a delay, as the hardware would report it;
- ``rack``: a driver of our own behind the same upsd
  (lab/hardware/nut_outlet_driver.py, NUT's driver socket protocol) whose
  outlets switch on ``outlet.N.load.off|on``, after a delay like a relay.

Answers a real upsd cannot be made to give (silence after the INSTCMD line,
garbage, a connection dropped mid-command) come from a few lines of asyncio
speaking the same protocol, said so where used.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import NutDevice, device_timeout, parse_controller_config
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import (
    Ambiguous,
    ConfigError,
    Refused,
    SendRefused,
    StateTimeout,
    Unreachable,
)
from spark_watchdog.lab.hardware.nut_server import NutServer, NutUnavailable
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.nut import NutOutlet, build_nut_backend, parse_var, quote

pytestmark = pytest.mark.integration

ON, OFF = PowerState.ON, PowerState.OFF
PASSWORD = "nut-pw-4711"  # tests/conftest.py's


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def outlet(
    nut: NutServer,
    ups: str = "rack",
    number: int = 1,
    password: str = PASSWORD,
    timeout: float = 5.0,
) -> NutOutlet:
    return NutOutlet(
        nut.host,
        ups,
        number,
        user="watchdog",
        password=Secret(password, "test"),
        port=nut.port,
        timeout=timeout,
    )


async def _record(steps: list[str], step: Any) -> None:
    steps.append(step.name)


def verified(backend: NutOutlet, steps: list[str], power_timeout: float = 20.0) -> VerifiedPower:
    timing = PowerTiming(
        poll_interval=0.1,
        power_timeout=power_timeout,
        min_command_interval=0.0,
        read_timeout=10.0,
        command_timeout=30.0,
    )
    return VerifiedPower(
        backend, timing, on_step=lambda step: _record(steps, step), spacing=CommandSpacing()
    )


def test_a_verified_cycle_through_upsd(nut_server: NutServer) -> None:
    nut_server.rack.switch_delay = 0.5  # the relay follows late: read back until it has
    steps: list[str] = []
    result = run(verified(outlet(nut_server), steps).cycle(off_seconds=0.5))
    assert result.verified and result.state_after is ON
    assert result.off_held_s is not None and result.off_held_s >= 0.5
    assert steps == [
        "off_requested",
        "off_verified",
        "hold_started",
        "hold_done",
        "on_requested",
        "on_verified",
    ]
    assert nut_server.rack.commands == ["outlet.1.load.off", "outlet.1.load.on"]
    assert nut_server.rack.state(1) == "on" and nut_server.rack.state(2) == "on"


def test_reads_follow_dummy_ups_as_the_device_reports(nut_server: NutServer) -> None:
    """The test plays the device: the outlet's change reaches upsd through the driver
    half a second later, and the read follows it."""
    pdu = outlet(nut_server, "pdu", 2)
    assert run(pdu.read_state()) is ON
    later = threading.Timer(0.5, nut_server.set_var, ("pdu", "outlet.2.status", "off"))
    later.start()
    later.join()
    nut_server.wait_var("pdu", "outlet.2.status", "off")
    assert run(pdu.read_state()) is OFF
    assert run(outlet(nut_server, "pdu", 1).read_state()) is ON


def test_a_command_the_driver_does_not_offer_is_refused_and_nothing_changes(
    nut_server: NutServer,
) -> None:
    steps: list[str] = []
    with pytest.raises(Refused, match=r"ERR CMD-NOT-SUPPORTED: the driver does not offer it"):
        run(verified(outlet(nut_server, "pdu", 1), steps).off())
    assert steps == ["off_requested"]
    assert nut_server.talk(["GET VAR pdu outlet.1.status"]) == ['VAR pdu outlet.1.status "on"']


def test_a_wrong_password_is_refused_never_shown_and_nothing_switches(
    nut_server: NutServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "wrong-password-99"
    with caplog.at_level(logging.DEBUG), pytest.raises(Refused) as caught:
        run(outlet(nut_server, password=wrong).command(OFF))
    assert (
        "ERR ACCESS-DENIED" in caught.value.message and "nothing was sent" in caught.value.message
    )
    for text in (caplog.text, str(caught.value)):
        assert wrong not in text and PASSWORD not in text
    assert nut_server.rack.commands == [] and nut_server.rack.state(1) == "on"


def test_an_unknown_ups_or_outlet_is_refused(nut_server: NutServer) -> None:
    with pytest.raises(Refused, match=r"ERR UNKNOWN-UPS: upsd has no such UPS"):
        run(outlet(nut_server, "nosuch").read_state())
    with pytest.raises(Refused, match=r"VAR-NOT-SUPPORTED: the UPS has no outlet 9"):
        run(outlet(nut_server, "rack", 9).read_state())


def test_an_outlet_that_reads_on_after_an_off_is_never_sent_again(nut_server: NutServer) -> None:
    nut_server.rack.ignores_commands = True
    steps: list[str] = []
    with pytest.raises(StateTimeout, match=r"off not read back within 3s \(last read on"):
        run(verified(outlet(nut_server), steps, power_timeout=3.0).off())
    assert steps == ["off_requested"]
    assert nut_server.rack.commands == ["outlet.1.load.off"]


def test_a_command_past_its_send_window_never_leaves(nut_server: NutServer) -> None:
    steps: list[str] = []
    power = VerifiedPower(
        outlet(nut_server),
        PowerTiming(poll_interval=0.1, power_timeout=5.0, min_command_interval=0.0),
        on_step=lambda step: _record(steps, step),
        send_window=lambda: "past the send deadline",
        spacing=CommandSpacing(),
    )
    with pytest.raises(SendRefused):
        run(power.off())
    assert steps == ["off_requested", "off_withdrawn"] and nut_server.rack.commands == []


# -- answers a real upsd cannot be made to give: a protocol stand-in ------------------

Reply = Callable[[str], Awaitable[str | None]]


@asynccontextmanager
async def fake_upsd(reply: Reply) -> AsyncIterator[int]:
    """A TCP server speaking NUT's line protocol: ``reply(line)`` is the answer (None: close)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                answer = await reply(line.decode().rstrip("\n"))
                if answer is None:
                    break
                writer.write(answer.encode() + b"\n")
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def _fake_outlet(port: int, timeout: float = 0.5) -> NutOutlet:
    return NutOutlet(
        "127.0.0.1", "rack", 1, user="u", password=Secret("p", "t"), port=port, timeout=timeout
    )


def _instcmd(answer: Callable[[], Awaitable[str | None]]) -> Reply:
    async def reply(line: str) -> str | None:
        if line.startswith("INSTCMD"):
            return await answer()
        return "OK"

    return reply


async def _silence() -> str | None:
    await asyncio.sleep(30)
    return "OK"


async def _garbage() -> str | None:
    return "BEGIN LIST VAR rack"


async def _hang_up() -> str | None:
    return None


async def _failed() -> str | None:
    return "ERR INSTCMD-FAILED"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_silence, r"no answer to INSTCMD rack outlet.1.load.off within 0.5s"),
        (_garbage, r"answered 'BEGIN LIST VAR rack', expected OK"),
        (_hang_up, r"the connection broke at INSTCMD"),
        (_failed, r"ERR INSTCMD-FAILED; it may have been applied"),
    ],
)
def test_bad_answers_after_the_command_are_ambiguous(
    answer: Callable[[], Awaitable[str | None]], message: str
) -> None:
    async def go() -> None:
        async with fake_upsd(_instcmd(answer)) as port:
            with pytest.raises(Ambiguous, match=message):
                await _fake_outlet(port).command(OFF)

    run(go())


def test_garbage_to_a_read_is_refused_and_silence_unreachable() -> None:
    async def garbage(line: str) -> str | None:
        return '{"state": "on"}'

    async def silent(line: str) -> str | None:
        await asyncio.sleep(30)
        return None

    async def go() -> None:
        async with fake_upsd(garbage) as port:
            with pytest.raises(Refused, match=r'expected "on" or "off"'):
                await _fake_outlet(port).read_state()
        async with fake_upsd(silent) as port:
            with pytest.raises(Unreachable, match=r"no answer to GET VAR"):
                await _fake_outlet(port).read_state()

    run(go())


def test_a_login_that_fails_sent_no_command() -> None:
    lines: list[str] = []

    async def reply(line: str) -> str | None:
        lines.append(line.split(" ")[0])
        return "ERR PASSWORD-REQUIRED" if line.startswith("PASSWORD") else "OK"

    async def go() -> None:
        async with fake_upsd(reply) as port:
            with pytest.raises(Refused, match="no command was sent"):
                await _fake_outlet(port).command(OFF)

    run(go())
    assert "INSTCMD" not in lines


def test_nothing_listening_is_unreachable_and_nothing_was_sent() -> None:
    with pytest.raises(Unreachable, match=r"cannot connect .*nothing was sent"):
        run(_fake_outlet(free_port()).command(OFF))


@pytest.mark.parametrize("password", ["pa#ss", 'pa"ss', "pa\\ss", '#"\\ all # three "\\'])
def test_a_password_with_hash_quote_or_backslash_logs_in_to_the_real_upsd(
    tmp_path_factory: pytest.TempPathFactory, password: str
) -> None:
    """upsd reads ``#`` as a comment even inside quotes: unescaped, the PASSWORD
    line never ended and the login read as a silence ("no answer within 1.5s")."""
    directory = Path(tempfile.mkdtemp(prefix="nut-"))
    try:
        try:
            server = NutServer(directory, password)
            server.__enter__()
        except NutUnavailable as exc:
            pytest.skip(f"NUT tier skipped: {exc}")
        try:
            rack = outlet(server, password=password, timeout=1.5)
            run(rack.command(OFF))
            server.wait_var("rack", "outlet.1.status", "off")
            assert server.rack.commands == ["outlet.1.load.off"]
            wrong = outlet(server, password=password + "x", timeout=1.5)
            refused = r"ERR ACCESS-DENIED: the user or password was refused"
            with pytest.raises(Refused, match=refused):
                run(wrong.command(ON))
        finally:
            server.__exit__(None, None, None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- the protocol's pieces and the config -------------------------------------------


def test_quoting_and_parsing() -> None:
    assert quote('pa"ss\\word') == '"pa\\"ss\\\\word"'
    assert quote("pa#ss") == '"pa\\#ss"'
    for bad in ("two\nlines", "cr\r", "euro€", "tab\t", "nul\0"):
        with pytest.raises(ValueError, match="printable ASCII"):
            quote(bad)
    assert parse_var('VAR rack outlet.1.status "on"', "rack", "outlet.1.status") == "on"
    assert parse_var('VAR rack outlet.1.status "a \\"b\\""', "rack", "outlet.1.status") == 'a "b"'
    assert parse_var('VAR rack outlet.2.status "on"', "rack", "outlet.1.status") is None
    assert parse_var("VAR rack outlet.1.status on", "rack", "outlet.1.status") is None


def _device(**keys: object) -> dict[str, object]:
    device: dict[str, object] = {
        "type": "nut",
        "host": "ups.lan",
        "ups": "rack",
        "outlet": 1,
        "user": "watchdog",
        "password_file": "/etc/spark-watchdog/nut-password",
    }
    device.update(keys)
    return {"nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [device]}]}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"password_file": None}, "nodes[0].power[0].password_file: expected a non-empty string"),
        ({"password": PASSWORD}, "nodes[0].power[0].password: inline secrets are not accepted"),
        ({"ups": "rack 1"}, "nodes[0].power[0].ups: expected a name of letters, digits"),
        ({"outlet": -1}, "nodes[0].power[0].outlet: expected an integer ≥ 0 and ≤ 1000, got -1"),
        ({"outlet": None}, "nodes[0].power[0].outlet: expected an integer"),
    ],
)
def test_config_errors_name_the_field_and_the_fix(keys: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_device(**keys))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems
    assert all(PASSWORD not in p for p in caught.value.problems)


def test_build_from_config() -> None:
    device = parse_controller_config(_device(port=3494, timeout=1)).nodes[0].power[0]
    assert isinstance(device, NutDevice)
    backend = build_nut_backend(device, {"password_file": Secret("pw", "t")})
    assert backend.name == "nut rack@ups.lan:3494 outlet 1"
    assert device_timeout(device) == 4.0  # connect, USERNAME, PASSWORD, INSTCMD
    with pytest.raises(ConfigError, match="password_file: the NUT password was not read"):
        build_nut_backend(device, {})
    with pytest.raises(ConfigError, match="line break"):
        build_nut_backend(device, {"password_file": Secret("a\nb", "t")})
