"""The SNMP backend against the stateful PDU stand-in, over real SNMP on loopback.

The stand-in (spark_watchdog/lab/hardware/pdu_standin.py) is a pysnmp command
responder that behaves like a switched PDU: its status follows the control
column, it can be slow to switch, lose SET answers, refuse, or fall silent.
Every test wraps the backend in ``VerifiedPower`` where the behaviour under
test is VerifiedPower's reaction to what the device did.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import socket as sockets
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from spark_watchdog.config.controller import SnmpDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, PowerError, Refused, SendRefused, Unreachable
from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.lab.hardware.pdu_standin import (
    PduStandin,
    PduStandinThread,
    StandinConfig,
    StandinUser,
)
from spark_watchdog.power import send_window
from spark_watchdog.power.base import (
    CommandSpacing,
    OutletGroup,
    PowerState,
    PowerTiming,
    VerifiedPower,
)
from spark_watchdog.power.snmp import (
    NAMES_MAX_AGE_S,
    DeviceMismatch,
    MalformedAnswer,
    SnmpCredentials,
    SnmpPdu,
)
from spark_watchdog.power.snmp_outlet import SnmpOutlet, build_snmp_backend, describe_snmp_backend
from spark_watchdog.power.snmp_profiles import APC_RPDU2, PROFILES, RARITAN_PX2, PduProfile

pytestmark = pytest.mark.integration

ON, OFF = PowerState.ON, PowerState.OFF
# Quick polls, no spacing between commands, and the limits of a loaded machine:
# the stand-in answers from a thread of the test's own process, which a busy
# 2-core machine can leave waiting for seconds (a 5 s read limit ended two
# tests with the suite and stress-ng beside them). No test here waits for
# these limits to pass: the ones about silence use the SNMP backend's own.
FAST = PowerTiming(
    poll_interval=0.2,
    power_timeout=60.0,
    min_command_interval=0.0,
    read_timeout=30.0,
    command_timeout=30.0,
)
V3_USER = StandinUser("ops", "SHA256", "auth-secret-1", "AES128", "priv-secret-1")
V3_STRONG = StandinUser("ops512", "SHA512", "auth-secret-2", "AES256", "priv-secret-2")
NAMES = {1: "spark-1", 2: "spark-2", 3: "spark-3", 4: "spark-1b"}
T = TypeVar("T")
OPENED: list[SnmpPdu] = []  # the PDUs a test talked to; closed on the loop that used them


def run(call: Awaitable[T]) -> T:
    """``asyncio.run`` that also closes the SNMP sockets the call opened."""

    async def main() -> T:
        try:
            return await call
        finally:
            for pdu in OPENED:
                await pdu.aclose()

    return asyncio.run(main())


def tracked(pdu: SnmpPdu) -> SnmpPdu:
    OPENED.append(pdu)
    return pdu


@pytest.fixture
def standin() -> Iterator[PduStandinThread]:
    cfg = StandinConfig(profile=APC_RPDU2, outlets=4, names=NAMES, users=(V3_USER, V3_STRONG))
    OPENED.clear()
    with PduStandinThread(PduStandin(cfg)) as runner:
        yield runner


def community(secret: str = "private", version: str = "2c") -> SnmpCredentials:
    return SnmpCredentials(version=version, community=Secret(secret, "test"))


def v3(user: StandinUser, auth_key: str | None = None) -> SnmpCredentials:
    return SnmpCredentials(
        version="3",
        user=user.name,
        auth_protocol=user.auth_protocol,
        auth_key=Secret(auth_key or user.auth_key or "", "test"),
        priv_protocol=user.priv_protocol,
        priv_key=Secret(user.priv_key or "", "test"),
    )


def outlet(
    runner: PduStandinThread,
    number: int | str,
    credentials: SnmpCredentials | None = None,
    *,
    vendor: str = "auto",
    # Room for a loaded CI machine, where the stand-in thread answers late;
    # tests about lost answers name their own shorter wait.
    timeout: float = 2.0,
    retries: int = 1,
) -> SnmpOutlet:
    pdu = SnmpPdu(
        host="127.0.0.1",
        port=runner.port,
        credentials=credentials or community(),
        timeout=timeout,
        retries=retries,
        vendor=vendor,
    )
    return SnmpOutlet(tracked(pdu), number)


def verified(backend: Any) -> VerifiedPower:
    return VerifiedPower(backend, FAST, spacing=CommandSpacing())


def step_names(steps: Any) -> list[str]:
    return [s.name for s in steps]


# -- reads, names, vendor ---------------------------------------------------------


def test_reads_state_by_number_and_name_with_auto_vendor(standin: PduStandinThread) -> None:
    standin.standin.outlets[2].on = False

    async def main() -> None:
        assert await outlet(standin, 1).read_state() is ON
        by_name = outlet(standin, "spark-2")
        assert await by_name.read_state() is OFF
        assert await by_name.number() == 2
        description = await by_name.describe()
        assert description.vendor == "apc_rpdu2"
        assert description.sys_object_id == ".1.3.6.1.4.1.318.1.3.4.6"
        assert description.outlet_name == "spark-2"
        assert await by_name.pdu.outlet_names() == NAMES

    run(main())


def test_snmpv1_reads_too(standin: PduStandinThread) -> None:
    assert run(outlet(standin, 3, community(version="1")).read_state()) is ON


def test_unknown_outlet_name_lists_the_names_seen(standin: PduStandinThread) -> None:
    with pytest.raises(DeviceMismatch) as info:
        run(outlet(standin, "spark-9").read_state())
    assert 'no outlet named "spark-9"' in info.value.message
    assert "2='spark-2'" in info.value.message and "4='spark-1b'" in info.value.message


def test_named_outlet_follows_a_relabel_once_the_names_are_old(standin: PduStandinThread) -> None:
    now = [0.0]
    pdu = tracked(
        SnmpPdu(
            host="127.0.0.1",
            port=standin.port,
            credentials=community(),
            timeout=0.5,
            clock=lambda: now[0],
        )
    )
    named = SnmpOutlet(pdu, "spark-2")

    async def main() -> None:
        assert await named.number() == 2
        standin.standin.outlets[2].name = "retired"
        standin.standin.outlets[3].name = "spark-2"  # the node was moved to outlet 3
        assert await named.number() == 2  # names still fresh
        now[0] += NAMES_MAX_AGE_S
        assert await named.number() == 3

    run(main())


def test_outlet_number_the_pdu_does_not_have(standin: PduStandinThread) -> None:
    with pytest.raises(DeviceMismatch, match="outlet 9 has no status on this PDU"):
        run(outlet(standin, 9).read_state())


# -- (b) the full verified cycle kills and restarts the host -------------------


def test_verified_cycle_kills_the_host_and_boots_it_again(standin: PduStandinThread) -> None:
    host = HostProcess(["sleep", "3600"])
    standin.standin.on_change = lambda n, state: host.power(state) if n == 1 else None
    host.power_on()
    first_pid = host.pid
    assert first_pid is not None and host.running
    try:
        result = run(verified(outlet(standin, "spark-1")).cycle(off_seconds=1.0))
        assert result.verified
        assert result.state_before is ON and result.state_after is ON
        assert result.off_held_s is not None and result.off_held_s >= 1.0
        names = step_names(result.steps)
        assert names.index("off_requested") < names.index("off_verified")
        assert names.index("hold_done") < names.index("on_requested") < names.index("on_verified")
        assert host.process is not None
        assert host.boots == 2 and host.running
        assert host.pid != first_pid
        # The first host really died (reaped, not just signalled).
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)
        assert [s.value for s in standin.standin.sets_for(1)] == [2, 1]
    finally:
        host.power_off()


def test_slow_relay_needs_several_reads(standin: PduStandinThread) -> None:
    standin.standin.cfg.switch_delay = 0.7
    result = run(verified(outlet(standin, 3, timeout=2.0, retries=2)).off())
    assert result.verified and result.state_after is OFF
    verified_step = next(s for s in result.steps if s.name == "off_verified")
    reads = int(verified_step.detail.split()[1])
    assert reads >= 2, verified_step


# -- (c) SNMPv3 --------------------------------------------------------------------


@pytest.mark.parametrize("user", [V3_USER, V3_STRONG], ids=["sha256-aes128", "sha512-aes256"])
def test_snmpv3_auth_priv_switches_verified(standin: PduStandinThread, user: StandinUser) -> None:
    power = verified(outlet(standin, 2, v3(user)))

    async def main() -> None:
        off = await power.off()
        assert off.verified and off.state_after is OFF
        on = await power.on()
        assert on.verified and on.state_after is ON

    run(main())
    assert standin.standin.state(2) is ON
    assert len(standin.standin.sets_for(2)) == 2  # one SET per action, discovery included


def test_wrong_v3_key_is_unreachable_for_reads_and_sets(standin: PduStandinThread) -> None:
    wrong = v3(V3_USER, auth_key="not-the-key")
    started = time.monotonic()
    # The stand-in answers a wrong digest with a report; the generous wait is
    # for a loaded machine (CI once missed 2 tries of 0.5 s), and the answer
    # still comes long before it runs out.
    with pytest.raises(Unreachable, match="Wrong SNMP PDU digest"):
        run(outlet(standin, 2, wrong, timeout=5.0).read_state())
    assert time.monotonic() - started < 9.0
    # A SET with the wrong key is dropped by the agent's USM: certainly not applied.
    with pytest.raises(Unreachable, match="not applied"):
        run(outlet(standin, 2, wrong, vendor="apc_rpdu2").command(OFF))
    assert standin.standin.set_requests == []
    assert standin.standin.state(2) is ON


# -- (d) wrong community -------------------------------------------------------------


def test_wrong_community_is_unreachable_within_the_deadline(standin: PduStandinThread) -> None:
    started = time.monotonic()
    with pytest.raises(Unreachable) as info:
        run(outlet(standin, 1, community("nope"), timeout=0.5, retries=1).read_state())
    elapsed = time.monotonic() - started
    assert elapsed < 5.0, f"took {elapsed:.1f}s for 2 tries of 0.5s"
    assert "after 2 tries of 0.5s" in info.value.message
    assert "nope" not in str(info.value)  # the community never reaches a message


# -- (e) refused ---------------------------------------------------------------------


def test_refused_set_is_refused_and_nothing_changes(standin: PduStandinThread) -> None:
    standin.standin.refuse = True
    with pytest.raises(Refused, match="wrongValue") as info:
        run(verified(outlet(standin, 1)).off())
    assert step_names(info.value.steps)[-1] == "off_requested"
    assert standin.standin.state(1) is ON


def test_read_only_community_cannot_switch(standin: PduStandinThread) -> None:
    with pytest.raises(Refused, match="noAccess"):
        run(outlet(standin, 1, community("public"), vendor="apc_rpdu2").command(OFF))
    assert standin.standin.state(1) is ON


# -- (f) the SET answer is lost ----------------------------------------------------


def test_lost_set_answer_is_ambiguous_then_read_back_never_resent(
    standin: PduStandinThread,
) -> None:
    standin.standin.drop_set_responses = True
    result = run(verified(outlet(standin, 2, timeout=0.5)).off())
    names = step_names(result.steps)
    assert names.index("off_requested") < names.index("off_ambiguous") < names.index("off_verified")
    assert result.verified and result.state_after is OFF
    sets = standin.standin.sets_for(2)
    assert len(sets) == 1, f"the SET was resent: {sets}"
    assert sets[0].outcome == "applied_unanswered"


def test_silent_pdu_reads_unreachable_and_a_set_is_ambiguous(standin: PduStandinThread) -> None:
    standin.standin.silent = True
    with pytest.raises(Unreachable):
        run(outlet(standin, 1, retries=0).read_state())
    # Nothing says whether a SET into silence landed: never report it as not sent.
    with pytest.raises(Ambiguous, match="may have been applied"):
        run(outlet(standin, 1, vendor="apc_rpdu2").command(OFF))


# -- the send window, asked at the socket (power/snmp_command.py) -----------------


def paused_after_its_gate(pause: float, window_s: float) -> tuple[Any, Any]:
    """A gate that says yes and then the process stalls (the loop blocked, as
    a SIGSTOP would), and the window of a pair: ``window_s`` from the gate."""
    checked = [0.0]

    def gate(target: PowerState) -> str | None:
        checked[0] = time.monotonic()
        time.sleep(pause)
        return None

    def window() -> str | None:
        waited = time.monotonic() - checked[0]
        return None if waited < window_s else f"{waited:.1f}s since the gate: not sent"

    return gate, window


def test_a_set_past_its_send_window_never_leaves(standin: PduStandinThread) -> None:
    backend = outlet(standin, 1, vendor="apc_rpdu2")
    gate, window = paused_after_its_gate(0.6, 0.3)
    power = VerifiedPower(backend, FAST, gate=gate, send_window=window, spacing=CommandSpacing())

    async def main() -> None:
        for _ in range(2):  # the first and a later SET: neither leaves
            with pytest.raises(SendRefused, match="since the gate: not sent") as info:
                await power.off()
            assert step_names(info.value.steps)[-2:] == ["off_requested", "off_withdrawn"]
        assert standin.standin.sets_for(1) == []
        assert await backend.read_state() is ON
        # The same socket lets a command out while the window is open.
        quick, open_window = paused_after_its_gate(0.0, 5.0)
        result = await VerifiedPower(
            backend, FAST, gate=quick, send_window=open_window, spacing=CommandSpacing()
        ).off()
        assert result.verified and result.state_after is OFF

    run(main())
    assert [s.outcome for s in standin.standin.sets_for(1)] == ["applied"]


def test_a_v3_set_stopped_after_its_discovery_is_ambiguous(standin: PduStandinThread) -> None:
    # The engine discovery left, the SET itself was held back: "not sent" could
    # be wrong in general (a datagram of it did leave), so it is ambiguous.
    backend = outlet(standin, 2, v3(V3_USER), vendor="apc_rpdu2")
    let_out = [1]

    def window() -> str | None:
        let_out[0] -= 1
        return None if let_out[0] >= 0 else "past the send deadline"

    async def main() -> None:
        with send_window.checking(window), pytest.raises(Ambiguous, match="stopped part-way"):
            await backend.command(OFF)

    run(main())
    assert let_out[0] < 0, "the window was never asked twice"
    assert standin.standin.sets_for(2) == []


def test_reads_are_never_held_back(standin: PduStandinThread) -> None:
    async def main() -> PowerState:
        with send_window.checking(lambda: "closed"):
            return await outlet(standin, 3).read_state()

    assert run(main()) is ON


def test_a_set_cut_short_by_aclose_opens_no_socket_again() -> None:
    """A SET to a PDU that never answers, its sockets closed meanwhile (the rung
    ends): the SET ends ambiguous, and the PDU keeps no command engine open."""
    with sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))  # takes every datagram, answers none
        silent.setblocking(False)
        pdu = SnmpPdu(
            host="127.0.0.1", port=silent.getsockname()[1], credentials=community(), timeout=3.0
        )

        async def left() -> bytes:
            while True:  # polled, so the loop keeps sending while the test waits
                with contextlib.suppress(BlockingIOError):
                    return silent.recv(4096)
                await asyncio.sleep(0.02)

        async def main() -> None:
            pdu._command_engine()
            sending = asyncio.create_task(
                pdu.set_integer("t", "1.3.6.1.4.1.318.1.1.4.4.2.1.3.1", 2)
            )
            assert await asyncio.wait_for(left(), 30.0)  # the SET left
            await pdu.aclose()  # while it waits for its answer
            with pytest.raises(Ambiguous):
                await sending
            assert pdu._command is None  # nothing left open by the SET's end
            await pdu.aclose()

        asyncio.run(main())


# -- (g) several outlets feed one node ---------------------------------------------


def test_multi_outlet_node_off_means_all_off_verified(standin: PduStandinThread) -> None:
    device = SnmpDevice(
        type="snmp",
        host="127.0.0.1",
        port=standin.port,
        outlets=("spark-1", "spark-1b"),
        community_file="/unused/in/this/test",
        timeout=0.5,
    )
    backend = build_snmp_backend(device, {"community_file": Secret("private", "test")})
    assert isinstance(backend, OutletGroup)
    power = verified(backend)

    async def main() -> None:
        off = await power.off()
        assert off.verified and off.state_after is OFF
        assert await power.state() is OFF
        descriptions = await describe_snmp_backend(backend)
        assert [(d.outlet, d.outlet_name) for d in descriptions] == [
            (1, "spark-1"),
            (4, "spark-1b"),
        ]
        on = await power.on()
        assert on.verified
        await backend.aclose()

    run(main())
    assert [len(standin.standin.sets_for(n)) for n in (1, 2, 3, 4)] == [2, 0, 0, 2]


def test_half_switched_group_reads_mixed(standin: PduStandinThread) -> None:
    standin.standin.outlets[4].on = False
    group = OutletGroup([outlet(standin, 1), outlet(standin, 4)])
    assert run(group.read_state()) is PowerState.MIXED


# -- (i) malformed answers -----------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "error", "text"),
    [
        ("wrong_type", MalformedAnswer, "expected an INTEGER, got OctetString 'on'"),
        ("unknown_value", MalformedAnswer, "= 99: not a state apc_rpdu2 knows (on: 2, off: 1)"),
        ("no_such_instance", DeviceMismatch, "NoSuchInstance"),
    ],
)
def test_malformed_status_is_an_error_never_a_state(
    standin: PduStandinThread, fault: Any, error: type[PowerError], text: str
) -> None:
    standin.standin.status_fault = fault
    with pytest.raises(error) as info:
        run(verified(outlet(standin, 1)).state())
    assert text in info.value.message


# -- the stand-in itself: control -> status like the device --------------------------


def test_control_column_drives_status_like_the_device(standin: PduStandinThread) -> None:
    standin.standin.cfg.reboot_seconds = 0.6
    pdu = tracked(
        SnmpPdu(host="127.0.0.1", port=standin.port, credentials=community(), timeout=0.5)
    )
    control = APC_RPDU2.instance(APC_RPDU2.control_off.oid, 3)
    status = APC_RPDU2.instance(APC_RPDU2.status_oid, 3)

    async def main() -> None:
        assert int(await pdu.get("t", control)) == 1  # reads back immediateOn while on
        await pdu.set_integer("t", control, 2)  # immediateOff
        assert int(await pdu.get("t", status)) == 1  # rPDU2: off(1)
        assert int(await pdu.get("t", control)) == 2
        await pdu.set_integer("t", control, 1)
        await pdu.set_integer("t", control, 3)  # immediateReboot: off now, on later
        assert int(await pdu.get("t", status)) == 1
        await asyncio.sleep(1.0)
        assert int(await pdu.get("t", status)) == 2
        with pytest.raises(Refused, match="wrongValue"):
            await pdu.set_integer("t", control, 9)
        with pytest.raises(Refused, match="notWritable"):
            await pdu.set_integer("t", status, 1)

    run(main())


def test_raritan_profile_on_the_wire() -> None:
    cfg = StandinConfig(profile=RARITAN_PX2, outlets=3, names={3: "spark-3"})
    with PduStandinThread(PduStandin(cfg)) as runner:
        backend = outlet(runner, "spark-3")

        async def main() -> None:
            result = await verified(backend).off()
            assert result.verified
            assert (await backend.describe()).vendor == "raritan_px2"
            # outletSwitchingState.1.3 reads off(8) (PDU2-MIB SensorStateEnumeration)
            status = RARITAN_PX2.instance(RARITAN_PX2.status_oid, 3)
            assert status == "1.3.6.1.4.1.13742.6.4.1.2.1.3.1.3"
            assert int(await backend.pdu.get("t", status)) == 8

        run(main())
        # switchingOperation off(0) (PDU2-MIB OutletSwitchingOperationsEnumeration)
        assert [s.value for s in runner.standin.sets_for(3)] == [0]


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_profile_round_trips_through_auto_detection(profile: PduProfile) -> None:
    # The stand-in speaks each profile from the same data the backend reads:
    # this proves the plumbing (sysObjectID match, index prefixes, split on/off
    # columns), not the vendor's OIDs -- those are checked against MIB text.
    cfg = StandinConfig(profile=profile, outlets=2, names={2: "node"})
    with PduStandinThread(PduStandin(cfg)) as runner:
        backend = outlet(runner, "node")
        power = verified(backend)

        async def main() -> None:
            assert (await power.off()).verified
            assert (await backend.describe()).vendor == profile.key
            assert (await power.on()).verified

        run(main())
        values = [s.value for s in runner.standin.sets_for(2)]
        assert values == [profile.control_off.value, profile.control_on.value]
        assert runner.standin.state(1) is ON


def test_binds_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        PduStandin(StandinConfig(profile=APC_RPDU2), host="0.0.0.0")


# -- the stand-in as a process (how the lab runs it) -------------------------------


class OutputLines:
    """A process's stdout lines, read by a thread so a silent process fails the test."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.process = process
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put("")  # end of output

    def next(self, timeout: float = 15.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output from the stand-in within {timeout:g}s") from None


def test_standalone_process_powers_a_host_command(tmp_path: Any) -> None:
    community_file = tmp_path / "write-community"
    community_file.write_text("lab-write\n")
    community_file.chmod(0o600)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_watchdog.lab.hardware",
            "pdu",
            "--outlets",
            "2",
            "--name",
            "1=node-a",
            "--write-community-file",
            str(community_file),
            "--host-command",
            "1=sleep 3600",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output = OutputLines(process)
    host_pid: int | None = None
    try:
        lines: list[str] = []
        while not any(line.startswith("pdu-standin ready") for line in lines):
            line = output.next()
            assert line, f"stand-in exited: {lines}"
            lines.append(line)
        ready = next(line for line in lines if line.startswith("pdu-standin ready"))
        port = int(ready.split("port=")[1].split()[0])
        host_pid = int(next(x for x in lines if x.startswith("host 1 up")).split("pid=")[1])
        pdu = tracked(
            SnmpPdu(host="127.0.0.1", port=port, credentials=community("lab-write"), timeout=0.5)
        )
        result = run(verified(SnmpOutlet(pdu, "node-a")).off())
        assert result.verified
        assert output.next() == "outlet 1 off"
        assert output.next() == "host 1 down"
        with pytest.raises(ProcessLookupError):
            os.kill(host_pid, 0)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if host_pid is not None:  # a stand-in killed above cannot kill its host any more
            with contextlib.suppress(ProcessLookupError):
                os.killpg(host_pid, signal.SIGKILL)


def test_an_outlet_reboot_is_a_self_timed_cycle_when_its_duration_covers_the_hold() -> None:
    cfg = StandinConfig(profile=APC_RPDU2, outlets=4, names=NAMES, reboot_seconds=2.0)
    OPENED.clear()
    with PduStandinThread(PduStandin(cfg)) as runner:
        backend = outlet(runner, 2)
        plan = run(backend.plan_timed_on(1.5))
        assert plan.on_after_s == 2.0 and "apc_rpdu2 reboot" in plan.how
        result = run(verified(backend).cycle(1.5, timed=True))
        assert result.verified and runner.standin.state(2) is PowerState.ON
        # One SET: immediateReboot. The on was the PDU's own.
        assert [s.value for s in runner.standin.sets_for(2)] == [3]
        assert "on_awaited" in step_names(result.steps)
        # A hold longer than the PDU's reboot duration: a plain off and on.
        plan = run(backend.plan_timed_on(5.0))
        assert plan.on_after_s is None and "shorter than the 5s hold" in plan.how
        result = run(verified(backend).cycle(5.0, timed=True))
        assert result.verified
        assert [s.value for s in runner.standin.sets_for(2)] == [3, 2, 1]
        assert step_names(result.steps)[0] == "timed_on_unavailable"


def test_a_profile_without_a_reboot_duration_is_not_self_timed(standin: PduStandinThread) -> None:
    backend = outlet(standin, 1, vendor="raritan_px2")
    plan = run(backend.plan_timed_on(60.0))
    assert plan.on_after_s is None and "no outlet reboot" in plan.how
