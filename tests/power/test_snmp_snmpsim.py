"""The SNMP backend against snmpsim, an independent SNMP agent fed recorded PDU data.

Data files live in tests/fixtures/snmpsim/; snmpsim serves each one under the
community of the same name. They hold what an APC rPDU2, an APC rPDU, a
Raritan PX3 and a non-PDU device answer for the OIDs the backend uses.
snmpsim's data is static (``writecache`` makes an OID writable but does not
map control to status), so these tests cover reading, vendor detection and
names, and show that a device which accepts a command but never switches is
reported as not verified, never as done.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Refused, StateTimeout, Unreachable
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.snmp import DeviceMismatch, SnmpCredentials, SnmpPdu
from spark_watchdog.power.snmp_outlet import SnmpOutlet

pytestmark = pytest.mark.integration

DATA_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "snmpsim"
ON, OFF = PowerState.ON, PowerState.OFF
T = TypeVar("T")


# A port outside the kernel's ephemeral range, in this worker's slice (lab.ports).
_free_udp_port = free_port


def _responder() -> str:
    # The venv's own copy first: CI may not put the venv's bin on PATH.
    beside = Path(sys.executable).parent / "snmpsim-command-responder"
    found = str(beside) if beside.exists() else shutil.which("snmpsim-command-responder")
    if found is None:
        pytest.skip("snmpsim-command-responder not installed (pip install snmpsim pysmi)")
    return found


def _answers(port: int) -> bool:
    pdu = SnmpPdu(
        host="127.0.0.1",
        port=port,
        credentials=SnmpCredentials(version="2c", community=Secret("apc_rpdu2", "test")),
        timeout=0.3,
        retries=0,
    )

    async def probe() -> bool:
        try:
            await pdu.get("probe", "1.3.6.1.2.1.1.2.0")
            return True
        except Exception:
            return False
        finally:
            await pdu.aclose()

    return asyncio.run(probe())


@pytest.fixture(scope="module")
def snmpsim_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    cache = tmp_path_factory.mktemp("snmpsim-cache")
    port = _free_udp_port()
    env = dict(os.environ)
    # snmpsim refuses to run as root unless told (it would otherwise drop to
    # an unprivileged user it may not find); CI containers run tests as root.
    env["SNMPSIM_ALLOW_ROOT"] = "true"
    log = cache / "snmpsim.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [
                _responder(),
                f"--data-dir={DATA_DIR}",
                f"--agent-udpv4-endpoint=127.0.0.1:{port}",
                f"--cache-dir={cache}",
                "--logging-method=null",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 20
        while not _answers(port):
            if process.poll() is not None:
                pytest.fail(f"snmpsim exited ({process.returncode}): {log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"snmpsim did not answer within 20s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def outlet(port: int, data_file: str, number: int | str, vendor: str = "auto") -> SnmpOutlet:
    pdu = SnmpPdu(
        host="127.0.0.1",
        port=port,
        credentials=SnmpCredentials(version="2c", community=Secret(data_file, "test")),
        timeout=1.0,
        retries=1,
        vendor=vendor,
    )
    return SnmpOutlet(pdu, number)


def run(backend: SnmpOutlet, call: Awaitable[T]) -> T:
    async def main() -> T:
        try:
            return await call
        finally:
            await backend.pdu.aclose()

    return asyncio.run(main())


def test_reads_apc_rpdu2_states_and_detects_the_vendor(snmpsim_port: int) -> None:
    first = outlet(snmpsim_port, "apc_rpdu2", 1)
    assert run(first, first.read_state()) is ON  # rPDU2 on(2)
    second = outlet(snmpsim_port, "apc_rpdu2", 2)
    assert run(second, second.read_state()) is OFF  # rPDU2 off(1)
    description = run(second, second.describe())
    assert (description.vendor, description.sys_object_id) == (
        "apc_rpdu2",
        ".1.3.6.1.4.1.318.1.3.4.6",
    )
    assert description.outlet_name == "spark-2"


def test_rpdu_reads_the_same_number_as_the_opposite_state(snmpsim_port: int) -> None:
    # Both data files hold a status of 1 on one outlet: rPDU on, rPDU2 off.
    rpdu = outlet(snmpsim_port, "apc_rpdu", 1)
    rpdu2 = outlet(snmpsim_port, "apc_rpdu2", 2)
    assert run(rpdu, rpdu.read_state()) is ON
    assert run(rpdu, rpdu.describe()).vendor == "apc_rpdu"
    assert run(rpdu2, rpdu2.read_state()) is OFF


def test_raritan_by_name(snmpsim_port: int) -> None:
    backend = outlet(snmpsim_port, "raritan", "spark-2")
    assert run(backend, backend.read_state()) is OFF  # outletSwitchingState off(8)
    assert run(backend, backend.number()) == 2
    assert run(backend, backend.describe()).vendor == "raritan_px2"
    names = run(backend, backend.pdu.outlet_names())
    assert names == {1: "spark-1", 2: "spark-2", 3: "switch"}


def test_outlet_names_missing_or_ambiguous(snmpsim_port: int) -> None:
    missing = outlet(snmpsim_port, "apc_rpdu2", "spark-7")
    with pytest.raises(DeviceMismatch) as info:
        run(missing, missing.read_state())
    assert "no outlet named \"spark-7\"; names seen: 1='spark-1', 2='spark-2'" in info.value.message
    twice = outlet(snmpsim_port, "apc_rpdu2", "spare")
    with pytest.raises(DeviceMismatch, match=r"ambiguous \(outlets \[3, 4\]\)"):
        run(twice, twice.read_state())


def test_unknown_device_names_its_sys_object_id(snmpsim_port: int) -> None:
    backend = outlet(snmpsim_port, "unknown", 1)
    with pytest.raises(DeviceMismatch) as info:
        run(backend, backend.read_state())
    assert "sysObjectID .1.3.6.1.4.1.8072.3.2.10 matches no known PDU" in info.value.message
    assert "vendor: generic" in info.value.message


def test_accepted_command_that_never_switches_is_not_verified(snmpsim_port: int) -> None:
    # apc_rpdu2 outlet 1: the control OID is writable (writecache), the status
    # never follows. The SET "succeeds"; only the read-back tells the truth.
    backend = outlet(snmpsim_port, "apc_rpdu2", 1)
    timing = PowerTiming(
        poll_interval=0.2,
        power_timeout=1.0,
        min_command_interval=0.0,
        read_timeout=3.0,
        command_timeout=3.0,
    )
    power = VerifiedPower(backend, timing, spacing=CommandSpacing())
    with pytest.raises(StateTimeout, match="off not read back within 1s") as info:
        run(backend, power.off())
    names = [getattr(s, "name", "") for s in info.value.steps]
    assert "off_requested" in names and "off_verified" not in names


def test_set_on_a_read_only_instance_is_refused(snmpsim_port: int) -> None:
    # snmpsim answers a SET of a non-writable instance with noSuchInstance in
    # the varbind instead of an error status: still a "no", never a success.
    backend = outlet(snmpsim_port, "apc_rpdu2", 2, vendor="apc_rpdu2")
    with pytest.raises(Refused, match="NoSuchInstance"):
        run(backend, backend.command(ON))


def test_wrong_community_is_silence(snmpsim_port: int) -> None:
    backend = outlet(snmpsim_port, "no_such_data_file", 1)
    started = time.monotonic()
    with pytest.raises(Unreachable):
        run(backend, backend.read_state())
    assert time.monotonic() - started < 6.0
