"""The lab's PDU: the stand-in whose outlets power the nodes, what it was
told to do, and switching an outlet from outside the watchdog: over real
SNMP, as an operator with the PDU's community would, or by hand at the PDU
itself (lab/cluster.py's ``switch`` and ``switch_by_hand``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.lab_configs import LAB_PDU_REBOOT_S
from spark_watchdog.lab.node import LOOPBACK, LabNode
from spark_watchdog.power.base import PowerState, close_quietly
from spark_watchdog.power.snmp_profiles import profile_by_name

PDU_SWITCH_DELAY_S = 0.3


def start_pdu(
    vendor: str,
    nodes: list[LabNode],
    on_change: Callable[[int, PowerState], None],
    host: str | None = None,
) -> PduStandinThread:
    """The lab's PDU (``vendor``'s SNMP profile), an outlet per node (eight at
    least), each named after its node, on ``host`` (default loopback);
    ``on_change`` hears each switch."""
    standin = PduStandin(
        StandinConfig(
            profile=profile_by_name(vendor),
            outlets=max(8, len(nodes)),
            names={n.outlet: n.name for n in nodes},
            write_community="lab-write",
            # A relay behind a management card takes a moment to switch.
            switch_delay=PDU_SWITCH_DELAY_S,
            reboot_seconds=LAB_PDU_REBOOT_S,
        ),
        host=host or LOOPBACK,
        on_change=on_change,
    )
    return PduStandinThread(standin).start()


def outlet_commands(standin: PduStandin, since: int = 0) -> list[tuple[int, str]]:
    """(outlet, "on" | "off" | value) for each SET the PDU received, in order."""
    profile = standin.profile
    names = {profile.control_on.value: "on", profile.control_off.value: "off"}
    return [
        (s.outlet or 0, names.get(s.value, str(s.value)) if isinstance(s.value, int) else "?")
        for s in list(standin.set_requests)[since:]
    ]


def switch_over_snmp(
    pdu_port: int, community_file: Path, outlet: int, on: bool, host: str = LOOPBACK
) -> None:
    """Switch ``outlet`` of the lab's PDU over SNMP through the verified power cycle."""
    import asyncio

    from spark_watchdog.config.controller import SnmpDevice
    from spark_watchdog.config.secrets import read_secret
    from spark_watchdog.power.base import PowerTiming, VerifiedPower
    from spark_watchdog.power.snmp_outlet import build_snmp_backend

    device = SnmpDevice(
        type="snmp",
        host=host,
        port=pdu_port,
        outlet=outlet,
        community_file=str(community_file),
    )
    secret = read_secret("lab.community_file", str(community_file))

    async def go() -> None:
        backend = build_snmp_backend(device, {"community_file": secret})
        power = VerifiedPower(backend, PowerTiming(poll_interval=0.2, min_command_interval=0))
        try:
            await (power.on() if on else power.off())
        finally:
            await close_quietly(backend)

    asyncio.run(go())


def wait_for_outlet(standin: PduStandin, outlet: int, wanted: PowerState, timeout: float) -> None:
    """Until the PDU reads ``wanted`` for ``outlet``; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while standin.state(outlet) is not wanted:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"outlet {outlet} did not switch {wanted.value}")
        time.sleep(0.05)
