"""IpmiBmc against a real OpenIPMI ``ipmi_sim`` BMC on loopback, driven by real ipmitool.

The simulated BMC's "host" is a stand-in process (``sleep``) that ipmi_sim
starts on power on and kills on power off (``startcmd``), so a power cycle is
checked by process ids, not just by what the BMC reports.

The pure tests at the end feed recorded ipmitool output to the interpreter;
each case says whether the text was seen for real (ipmitool 1.8.19 against
ipmi_sim 2.0.33) or comes from ipmitool's source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from spark_watchdog.config.controller import IpmiDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import (
    Ambiguous,
    ConfigError,
    PowerError,
    Refused,
    SendRefused,
    Unreachable,
)
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power import send_window
from spark_watchdog.power.base import PowerState, PowerStep, PowerTiming, VerifiedPower
from spark_watchdog.power.ipmi import (
    KNOWN_FAILURES,
    IpmiBmc,
    IpmitoolNotFound,
    IpmitoolRun,
    UnexpectedOutput,
    build_ipmi_backend,
    interpret_control,
    interpret_status,
    retries_within,
)

ON, OFF = PowerState.ON, PowerState.OFF
PASSWORD = "s3cret-Bmc-pw"
IPMI_SIM = shutil.which("ipmi_sim")
IPMITOOL = shutil.which("ipmitool")

needs_ipmi = pytest.mark.skipif(
    IPMI_SIM is None or IPMITOOL is None,
    reason="needs ipmi_sim (Debian package openipmi) and ipmitool (Debian package ipmitool)",
)


# Ports outside the kernel's ephemeral range, in this worker's slice (lab.ports).
free_udp_port = free_tcp_port = free_port


# ipmi_sim's LAN config (ipmi_lan(5)). Chassis power only works when MC 0x20
# has a power-capable system interface: the "serial 15 ... codec VM" line
# (bmc_chassis.c set_power -> HW_OP_POWERON on channel 15). Without it every
# power command fails with "Invalid data field in request". Nothing connects
# to that serial port, so power off skips the graceful VM shutdown and
# SIGTERMs the startcmd process at the next one-second tick.
LAN_CONF = """\
name "spark-test-bmc"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid a123456789abcdefa123456789abcdef
  endlan
  serial 15 127.0.0.1 {serial_port} codec VM
  startcmd "{startcmd}"
  startnow {startnow}
  poweroff_wait 1
  kill_wait 1
  user 2 true "admin" "{password}" admin 10 none md2 md5 straight
  user 3 true "viewer" "{password}" user 10 none md2 md5 straight
"""

# ipmi_sim_cmd(5): the MC at 0x20 is the BMC; it needs adding and enabling.
BMC_EMU = """\
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
mc_enable 0x20
"""


@dataclass
class IpmiSim:
    """One running ipmi_sim, in its own process group with its stand-in host."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    host: str = "127.0.0.1"
    stopped: bool = field(default=False)

    def host_pids(self) -> set[int]:
        """The stand-in host processes ipmi_sim runs ("power on" = one exists)."""
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return set()
        return {c.pid for c in children if c.is_running() and c.status() != "zombie"}

    def backend(self, **overrides: object) -> IpmiBmc:
        settings: dict[str, object] = {
            "port": self.port,
            "user": "admin",
            "password": Secret(PASSWORD, "test"),
            "cipher_suite": 3,  # ipmi_sim's suite; without it ipmitool probes ~10 s
            "timeout": 5.0,
        }
        settings.update(overrides)
        return IpmiBmc(self.host, **settings)  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        # The stand-in host shares ipmi_sim's process group (start_new_session
        # below) and outlives ipmi_sim otherwise: end the group we created.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5)
        # Anything of the group still running (a stand-in that ignored TERM).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)


def start_ipmi_sim(tmp_path: Path, *, startnow: bool) -> IpmiSim:
    assert IPMI_SIM is not None and IPMITOOL is not None
    port, serial_port = free_udp_port(), free_tcp_port()
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "lan.conf").write_text(
        LAN_CONF.format(
            port=port,
            serial_port=serial_port,
            startcmd="sleep 3600",
            startnow="true" if startnow else "false",
            password=PASSWORD,
        )
    )
    (tmp_path / "bmc.emu").write_text(BMC_EMU)
    log_path = tmp_path / "ipmi_sim.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            # -n: no console on stdin/stdout; -s: persistent state in tmp, not /var.
            [IPMI_SIM, "-n", "-c", "lan.conf", "-f", "bmc.emu", "-s", str(state)],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sim = IpmiSim(port=port, process=process, log_path=log_path)
    # Ready when a real status read answers.
    env = {"PATH": os.environ.get("PATH", ""), "IPMI_PASSWORD": PASSWORD}
    status = [IPMITOOL, "-I", "lanplus", "-H", "127.0.0.1", "-p", str(port), "-U", "admin"]
    status += ["-E", "-C", "3", "-N", "1", "-R", "1", "chassis", "power", "status"]
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"ipmi_sim exited {process.returncode}: {log_path.read_text()}")
        probe = subprocess.run(status, env=env, capture_output=True, timeout=10, check=False)
        if probe.returncode == 0:
            break
        if time.monotonic() > deadline:
            sim.stop()
            raise RuntimeError(f"ipmi_sim not answering: {probe.stderr!r} {log_path.read_text()}")
        time.sleep(0.1)
    if startnow:
        wait_for(lambda: len(sim.host_pids()) == 1, 5, "stand-in host to start")
    return sim


def wait_for(condition: object, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def sim_off(tmp_path: Path) -> Iterator[IpmiSim]:
    sim = start_ipmi_sim(tmp_path, startnow=False)
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def sim_on(tmp_path: Path) -> Iterator[IpmiSim]:
    sim = start_ipmi_sim(tmp_path, startnow=True)
    try:
        yield sim
    finally:
        sim.stop()


def ipmitool_children() -> set[int]:
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "ipmitool":
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


async def first_ipmitool_child(within: float = 2.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pids = ipmitool_children()
        if pids:
            return min(pids)
        await asyncio.sleep(0.01)
    raise AssertionError("no ipmitool child appeared")


def gone(pid: int) -> bool:
    """Not running and reaped (a zombie still 'exists' until its parent waits)."""
    return not psutil.pid_exists(pid)


# -- against the real ipmi_sim ------------------------------------------------


@pytest.mark.integration
@needs_ipmi
def test_status_reads_the_simulated_chassis(sim_off: IpmiSim) -> None:
    bmc = sim_off.backend()
    assert asyncio.run(bmc.read_state()) is OFF
    assert sim_off.host_pids() == set()


@pytest.mark.integration
@needs_ipmi
def test_status_reads_on_while_the_host_process_runs(sim_on: IpmiSim) -> None:
    assert asyncio.run(sim_on.backend().read_state()) is ON


@pytest.mark.integration
@needs_ipmi
def test_verified_cycle_kills_and_restarts_the_host_process(sim_on: IpmiSim) -> None:
    (old_host,) = sim_on.host_pids()
    seen_during_hold: list[set[int]] = []

    async def on_step(step: PowerStep) -> None:
        if step.name == "hold_started":
            seen_during_hold.append(sim_on.host_pids())

    timing = PowerTiming(
        poll_interval=0.2,
        power_timeout=6.0,
        min_command_interval=0.5,
        read_timeout=3.0,
        command_timeout=5.0,
    )
    power = VerifiedPower(sim_on.backend(), timing, on_step=on_step)
    result = asyncio.run(power.cycle(off_seconds=1))

    assert result.verified
    assert result.state_before is ON and result.state_after is ON
    assert result.off_held_s is not None and result.off_held_s >= 1.0
    steps = [str(s.name) for s in result.steps]
    assert steps.index("off_requested") < steps.index("off_verified") < steps.index("hold_started")
    assert steps.index("on_requested") < steps.index("on_verified")
    # Really off during the hold: the stand-in host was killed...
    assert seen_during_hold == [set()]
    assert not psutil.pid_exists(old_host) or old_host not in sim_on.host_pids()
    # ...and really on again: a new one runs.
    (new_host,) = sim_on.host_pids()
    assert new_host != old_host
    assert asyncio.run(sim_on.backend().read_state()) is ON


@pytest.mark.integration
@needs_ipmi
def test_plain_on_and_off_commands_switch_the_host_process(sim_off: IpmiSim) -> None:
    bmc = sim_off.backend()
    asyncio.run(bmc.command(ON))
    wait_for(lambda: len(sim_off.host_pids()) == 1, 5, "power on to start the host")
    asyncio.run(bmc.command(OFF))
    wait_for(lambda: sim_off.host_pids() == set(), 5, "power off to kill the host")
    assert asyncio.run(bmc.read_state()) is OFF


@pytest.mark.integration
@needs_ipmi
def test_a_command_past_its_send_window_never_starts_ipmitool(sim_on: IpmiSim) -> None:
    async def main() -> None:
        with send_window.checking(lambda: "past the send deadline"):
            await sim_on.backend().command(OFF)

    with pytest.raises(SendRefused, match="past the send deadline"):
        asyncio.run(main())
    time.sleep(1.0)  # an off that did leave kills the host within this
    assert len(sim_on.host_pids()) == 1
    assert asyncio.run(sim_on.backend().read_state()) is ON


@pytest.mark.integration
@needs_ipmi
def test_wrong_password_is_refused_at_once_and_never_quoted(sim_off: IpmiSim) -> None:
    bmc = sim_off.backend(password=Secret("not-the-password", "test"), timeout=5.0)
    started = time.monotonic()
    with pytest.raises(Refused) as read_error:
        asyncio.run(bmc.read_state())
    with pytest.raises(Refused) as command_error:
        asyncio.run(bmc.command(ON))
    # The BMC answers a bad password straight away: both together inside one timeout.
    assert time.monotonic() - started < 5.0
    for error in (read_error.value, command_error.value):
        assert "wrong password" in error.message
        assert "RAKP 2 HMAC is invalid" in error.message
        assert "not-the-password" not in str(error)
        assert PASSWORD not in str(error)
    assert sim_off.host_pids() == set()  # the refused "on" did nothing


@pytest.mark.integration
@needs_ipmi
def test_unknown_user_is_refused(sim_off: IpmiSim) -> None:
    with pytest.raises(Refused, match="does not know this user"):
        asyncio.run(sim_off.backend(user="nobody").read_state())


@pytest.mark.integration
@needs_ipmi
def test_user_privilege_session_cannot_switch_power(sim_off: IpmiSim) -> None:
    viewer = sim_off.backend(user="viewer", privilege="USER")
    assert asyncio.run(viewer.read_state()) is OFF  # reading is allowed at USER
    with pytest.raises(Refused, match="Insufficient privilege level"):
        asyncio.run(viewer.command(ON))
    assert sim_off.host_pids() == set()


@pytest.mark.integration
@needs_ipmi
def test_cipher_suite_the_bmc_does_not_offer_is_refused(sim_off: IpmiSim) -> None:
    with pytest.raises(Refused, match="cipher_suite"):
        asyncio.run(sim_off.backend(cipher_suite=17).read_state())


@pytest.mark.integration
@needs_ipmi
def test_no_bmc_listening_is_unreachable_within_the_timeout() -> None:
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=1.0,
    )
    started = time.monotonic()
    with pytest.raises(Unreachable, match="within 1s"):
        asyncio.run(bmc.read_state())
    # Our 1 s, not ipmitool's own retries (several seconds); room for a loaded machine.
    assert time.monotonic() - started < 3.5
    assert ipmitool_children() == set()


@pytest.mark.integration
@needs_ipmi
def test_command_to_silent_bmc_is_unreachable_when_ipmitool_gives_up_itself() -> None:
    # timeout 6 s -> -R 1: ipmitool gives up after ~2 s with "Unable to
    # establish ... session", which proves nothing was sent: Unreachable, not
    # Ambiguous.
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=6.0,
    )
    assert bmc.retries == 1
    started = time.monotonic()
    with pytest.raises(Unreachable, match="nothing was sent"):
        asyncio.run(bmc.command(OFF))
    assert time.monotonic() - started < 4.0


@pytest.mark.integration
@needs_ipmi
def test_password_is_in_the_child_environment_never_on_its_command_line() -> None:
    # A silent port keeps ipmitool alive (~2 s) long enough to inspect it.
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=3.0,
    )

    async def scenario() -> tuple[bytes, bytes]:
        task = asyncio.create_task(bmc.read_state())
        pid = await first_ipmitool_child()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        with pytest.raises(Unreachable):
            await task
        return cmdline, environ

    cmdline, environ = asyncio.run(scenario())
    argv = cmdline.split(b"\0")
    assert PASSWORD.encode() not in cmdline
    assert b"-P" not in argv
    assert b"-E" in argv
    assert b"-f" not in argv
    # How it does travel: the child's own environment, readable by its user only.
    assert f"IPMI_PASSWORD={PASSWORD}".encode() in environ.split(b"\0")


@pytest.mark.integration
@needs_ipmi
def test_timeout_kills_and_reaps_ipmitool_and_a_command_is_ambiguous() -> None:
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=0.5,
    )

    async def scenario() -> tuple[int, float]:
        task = asyncio.create_task(bmc.command(OFF))
        pid = await first_ipmitool_child()
        started = time.monotonic()
        with pytest.raises(Ambiguous, match="killed; the command may have landed"):
            await task
        return pid, time.monotonic() - started

    pid, waited = asyncio.run(scenario())
    assert waited < 1.0
    assert gone(pid)
    assert ipmitool_children() == set()


@pytest.mark.integration
@needs_ipmi
def test_cancellation_kills_and_reaps_ipmitool() -> None:
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=10.0,
    )

    async def scenario() -> int:
        task = asyncio.create_task(bmc.read_state())
        pid = await first_ipmitool_child()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return pid

    pid = asyncio.run(scenario())
    assert gone(pid)
    assert ipmitool_children() == set()


@pytest.mark.integration
@needs_ipmi
def test_verified_power_deadline_kills_ipmitool() -> None:
    # VerifiedPower's own read deadline cancels the backend: same cleanup.
    bmc = IpmiBmc(
        "127.0.0.1",
        port=free_udp_port(),
        user="admin",
        password=Secret(PASSWORD, "test"),
        cipher_suite=3,
        timeout=10.0,
    )
    power = VerifiedPower(bmc, PowerTiming(read_timeout=0.5))

    async def scenario() -> set[int]:
        seen: set[int] = set()
        task = asyncio.create_task(power.state())
        while not task.done():
            seen |= ipmitool_children()
            await asyncio.sleep(0.01)
        with pytest.raises(Unreachable):
            await task
        return seen

    seen = asyncio.run(scenario())
    assert seen
    assert all(gone(pid) for pid in seen)


def test_missing_ipmitool_names_the_debian_package() -> None:
    bmc = IpmiBmc(
        "127.0.0.1",
        user="admin",
        password=Secret(PASSWORD, "test"),
        ipmitool="/nonexistent/bin/ipmitool",
    )
    with pytest.raises(IpmitoolNotFound, match="Debian package ipmitool"):
        asyncio.run(bmc.read_state())
    with pytest.raises(IpmitoolNotFound, match="Debian package ipmitool"):
        asyncio.run(bmc.command(ON))


# -- pure: argv, config, retries ---------------------------------------------


def test_argv_never_carries_the_password() -> None:
    bmc = IpmiBmc(
        "10.0.0.7",
        port=6230,
        user="fence",
        password=Secret(PASSWORD, "test"),
        cipher_suite=17,
        privilege="operator",
    )
    for action in ("status", "on", "off"):
        argv = bmc.argv(action)
        assert PASSWORD not in " ".join(argv)
        assert "-P" not in argv and "-f" not in argv and "-E" in argv
        assert argv[-3:] == ["chassis", "power", action]
        assert argv[argv.index("-C") + 1] == "17"
        assert argv[argv.index("-p") + 1] == "6230"
        assert argv[argv.index("-L") + 1] == "OPERATOR"
        assert argv[argv.index("-I") + 1] == "lanplus"
    assert bmc.name == "ipmi fence@10.0.0.7:6230"
    assert bmc.limiter_key == "ipmi:10.0.0.7:6230"
    assert PASSWORD not in repr(bmc.__dict__)


def test_build_from_config_uses_the_password_file_secret() -> None:
    device = IpmiDevice(
        type="ipmi",
        host="bmc-spark3.lab",
        port=623,
        user="fence",
        password_file="/etc/spark-watchdog/bmc3.pw",
        cipher_suite=17,
        timeout=12.0,
    )
    bmc = build_ipmi_backend(device, {"password_file": Secret(PASSWORD, "file")})
    assert (bmc.host, bmc.port, bmc.user, bmc.cipher_suite, bmc.timeout) == (
        "bmc-spark3.lab",
        623,
        "fence",
        17,
        12.0,
    )
    assert bmc.retries == retries_within(12.0)
    with pytest.raises(ConfigError, match="password_file"):
        build_ipmi_backend(device, {})
    # IPMI v2 passwords are at most 20 bytes: caught at build time, value unquoted.
    too_long = "p" * 21
    with pytest.raises(ConfigError, match="21 bytes") as error:
        build_ipmi_backend(device, {"password_file": Secret(too_long, "file")})
    assert too_long not in str(error.value)


@pytest.mark.parametrize(
    ("timeout", "retries"), [(0.5, 1), (3.0, 1), (5.0, 1), (10.0, 2), (15.0, 2), (30.0, 3)]
)
def test_retries_leave_ipmitool_time_to_give_up_by_itself(timeout: float, retries: int) -> None:
    assert retries_within(timeout) == retries


def test_bad_settings_are_rejected() -> None:
    pw = Secret(PASSWORD, "test")
    with pytest.raises(ValueError, match="privilege"):
        IpmiBmc("h", user="u", password=pw, privilege="root")
    with pytest.raises(ValueError, match="host"):
        IpmiBmc("-oops", user="u", password=pw)
    with pytest.raises(ValueError, match="on or off"):
        asyncio.run(IpmiBmc("h", user="u", password=pw).command(PowerState.MIXED))


# -- pure: recorded ipmitool output -> PowerState or error --------------------

# (stdout, stderr) as ipmitool 1.8.19 printed them against ipmi_sim, with -v.
OBSERVED_VERBOSE_NOISE = (
    "Loading IANA PEN Registry...\n"
    "Running Get VSO Capabilities my_addr 0x20, transit 0, target 0x20\n"
    "Invalid completion code received: Invalid command\n"
    "Discovered IPMB address 0x0\n"
)


def run(code: int, stdout: str = "", stderr: str = "") -> IpmitoolRun:
    return IpmitoolRun(code, stdout, stderr)


def test_status_lines_observed_for_real() -> None:
    assert interpret_status(run(0, "Chassis Power is on\n", OBSERVED_VERBOSE_NOISE), "d") is ON
    assert interpret_status(run(0, "Chassis Power is off\n", OBSERVED_VERBOSE_NOISE), "d") is OFF


def test_control_lines_observed_for_real() -> None:
    interpret_control(run(0, "Chassis Power Control: Up/On\n", OBSERVED_VERBOSE_NOISE), ON, "d")
    interpret_control(run(0, "Chassis Power Control: Down/Off\n"), OFF, "d")


@pytest.mark.parametrize(
    "stdout",
    ["Chassis Power is unknown\n", "Chassis Power is On-ish\n", "", "System Power : on\n"],
)
def test_malformed_status_is_an_error_never_a_guess(stdout: str) -> None:
    with pytest.raises(UnexpectedOutput, match="expected"):
        interpret_status(run(0, stdout), "d")


def test_control_acknowledging_the_wrong_action_is_ambiguous() -> None:
    with pytest.raises(Ambiguous, match="Down/Off"):
        interpret_control(run(0, "Chassis Power Control: Up/On\n"), OFF, "d")


# stderr, expected error on a read, on a command, observed for real?
FAILURE_CASES = [
    # Observed: wrong password (ipmi_sim user 2, other password), with -v.
    (
        "Loading IANA PEN Registry...\n> RAKP 2 HMAC is invalid\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Refused,
        Refused,
        True,
    ),
    # Observed: unknown user name, with -v.
    (
        "Loading IANA PEN Registry...\nRAKP 2 message indicates an error : unauthorized name\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Refused,
        Refused,
        True,
    ),
    # Observed: nothing listening on the port (also: wrong password without -v).
    ("Error: Unable to establish IPMI v2 / RMCP+ session\n", Unreachable, Unreachable, True),
    # Observed: -C 17 against ipmi_sim (cipher suite 3 only).
    (
        "Error in open session response message : invalid authentication algorithm\n\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Refused,
        Refused,
        True,
    ),
    # Observed: -L USER, chassis power on.
    (
        "Get HPM.x Capabilities request failed, compcode = d4\n"
        "Set Chassis Power Control to Up/On failed: Insufficient privilege level\n",
        Refused,
        Refused,
        True,
    ),
    # Observed: ipmi_sim without a power-capable channel 15.
    (
        "Set Chassis Power Control to Up/On failed: Invalid data field in request\n",
        Refused,
        Refused,
        True,
    ),
    # Observed: a host name that does not resolve.
    (
        "Address lookup for no-such-bmc.invalid failed\nCould not open socket!\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Unreachable,
        Unreachable,
        True,
    ),
    # From ipmitool's source (not reproduced with ipmi_sim):
    (
        "Error in open session response message : insufficient resources for session\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Unreachable,
        Unreachable,
        False,
    ),
    (
        "RAKP 2 message indicates an error : unauthorized role requested\n"
        "Error: Unable to establish IPMI v2 / RMCP+ session\n",
        Refused,
        Refused,
        False,
    ),
    (
        "Set Session Privilege Level to ADMINISTRATOR failed: Requested privilege level "
        "exceeds limit\nError: Unable to establish IPMI v2 / RMCP+ session\n",
        Refused,
        Refused,
        False,
    ),
    ("Unable to set Chassis Power Control to Down/Off\n", Unreachable, Ambiguous, False),
    (
        "Set Chassis Power Control to Down/Off failed: Timeout while processing command. "
        "Response unavailable.\n",
        Unreachable,
        Ambiguous,
        False,
    ),
    ("Unable to get Chassis Power Status\n", Unreachable, Ambiguous, False),
    ("Get Chassis Power Status failed: Node busy\n", Refused, Refused, False),
    ("Error: Unable to establish LAN session\n", Unreachable, Unreachable, False),
    # Observed: a 25-byte IPMI_PASSWORD (IpmiBmc refuses those before running ipmitool).
    ("lanplus: password is longer than 20 bytes.\n", PowerError, PowerError, True),
]


@pytest.mark.parametrize(("stderr", "on_read", "on_command", "observed"), FAILURE_CASES)
def test_recorded_failures_map_to_error_types(
    stderr: str, on_read: type[PowerError], on_command: type[PowerError], observed: bool
) -> None:
    with pytest.raises(PowerError) as read_error:
        interpret_status(run(1, "", stderr), "ipmi admin@bmc:623")
    assert type(read_error.value) is on_read
    with pytest.raises(PowerError) as command_error:
        interpret_control(run(1, "", stderr), OFF, "ipmi admin@bmc:623")
    assert type(command_error.value) is on_command
    assert read_error.value.device == "ipmi admin@bmc:623"
    assert 'ipmitool: "' in read_error.value.message  # the line it was decided on


def test_every_known_failure_is_documented() -> None:
    for failure in KNOWN_FAILURES:
        assert failure.source.strip() and failure.meaning.strip()
    observed = {f.text for f in KNOWN_FAILURES if f.observed}
    assert "RAKP 2 HMAC is invalid" in observed
    assert "Unable to establish IPMI v2 / RMCP+ session" in observed


def test_unknown_failure_quotes_a_trimmed_line_and_no_secret() -> None:
    stderr = "something new went wrong with secret " + PASSWORD + " " + "x" * 500 + "\n"
    with pytest.raises(UnexpectedOutput) as read_error:
        interpret_status(run(1, "", stderr), "d", secrets=[PASSWORD])
    message = read_error.value.message
    assert "something new went wrong" in message
    assert PASSWORD not in message and "***" in message
    assert len(message) < 400
    # A command with output we do not know may have landed: never claim otherwise.
    with pytest.raises(Ambiguous, match="may have landed"):
        interpret_control(run(1, "", stderr), ON, "d", secrets=[PASSWORD])


def test_silent_failure_says_so() -> None:
    with pytest.raises(UnexpectedOutput, match="no output, exit status 139"):
        interpret_status(run(139), "d")


# An ipmitool gone wrong: it writes without end as fast as a pipe takes it. Run
# in a process of its own, so the test bounds a run that does not end, and
# reads that process's peak memory.
_FLOODED_STATUS = """
import asyncio, json, re, sys, time
def _peak_kib():
    # This process's own peak (VmHWM). Not ru_maxrss: Linux keeps the forking
    # process's peak in it across exec, a whole test worker's.
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
from spark_watchdog.config.secrets import Secret
from spark_watchdog.power.ipmi import IpmiBmc
bmc = IpmiBmc("127.0.0.1", user="admin", password=Secret("pw", "test"), timeout=1.0,
              ipmitool=sys.argv[1])
started = time.monotonic()
try:
    asyncio.run(bmc.read_state())
    error = None
except Exception as exc:
    error = [type(exc).__name__, str(exc)]
print(json.dumps({"took": time.monotonic() - started, "error": error,
                  "peak_mib": _peak_kib() / 1024}))
"""


@pytest.mark.integration
def test_an_ipmitool_that_floods_its_output_is_cut_and_killed_in_time(tmp_path: Path) -> None:
    flood = tmp_path / "ipmitool"
    flood.write_text("#!/bin/sh\nexec cat /dev/zero\n")
    flood.chmod(0o755)
    done = subprocess.run(
        [sys.executable, "-c", _FLOODED_STATUS, str(flood)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    # Generous for a loaded machine; before, the flood ran on past its timeout.
    assert report["took"] < 1.0 + 10.0
    assert report["peak_mib"] < 200
    assert report["error"][0] == "Unreachable"
    assert "no answer to a power status read within 1s" in report["error"][1]
