"""Switched-PDU vendor profiles for SNMP, as data.

Each vendor is one frozen record: which sysObjectID prefixes it answers to,
where its outlet status, control and name columns live, and which integers
mean on and off. No vendor has a code path of its own (openstack/ironic's
last snmp.py: one client, each PDU a table of OIDs and values).

An outlet's instance OID is ``<column>.<index_prefix>.<outlet>``: the index
prefix holds the table indices before the outlet (Raritan's pduId, Eaton's
strapping index, ServerTech's tower and infeed); it names the first unit of a
daisy chain. Other units, and any PDU not listed, use ``vendor: generic`` with
their own OIDs in the config.

Where each OID and value was checked is written next to it. "PowerNet-MIB"
means APC's PowerNet-MIB as compiled by pysmi (DotZero24/pysnmp-mibs,
pysnmp_mibs/PowerNet-MIB.py); "PDU2-MIB" means Raritan's PDU2-MIB, same
collection. A profile whose ``caveat`` is set was assembled from public code
that drives the device, not from the vendor's MIB text: its values are not
confirmed, and the backend logs the caveat when the profile is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

SYS_OBJECT_ID = "1.3.6.1.2.1.1.2.0"  # SNMPv2-MIB::sysObjectID.0 (RFC 3418)
SYS_DESCR = "1.3.6.1.2.1.1.1.0"  # SNMPv2-MIB::sysDescr.0 (RFC 3418)


def normalize_oid(oid: str) -> str:
    """``.1.3.6`` and ``1.3.6`` are the same OID; keep one spelling."""
    return oid.strip().lstrip(".")


def oid_parts(oid: str) -> tuple[int, ...]:
    return tuple(int(part) for part in normalize_oid(oid).split("."))


@dataclass(frozen=True)
class OutletCommand:
    """A SET that switches an outlet: write ``value`` to ``<oid>.<index>``."""

    oid: str
    value: int


@dataclass(frozen=True)
class PduProfile:
    """How one family of switched PDUs exposes its outlets over SNMP."""

    key: str
    title: str
    sys_object_ids: tuple[str, ...]
    status_oid: str
    # Several values can mean one state: Eaton's pendingOff is still on.
    status_on: tuple[int, ...]
    status_off: tuple[int, ...]
    control_on: OutletCommand
    control_off: OutletCommand
    control_reboot: OutletCommand | None
    names_oid: str | None
    index_prefix: str
    source: str
    caveat: str | None = None
    # The outlet's own reboot duration (seconds off in a control_reboot), read
    # before a reboot is used as a self-timed cycle; None: not used that way.
    reboot_duration_oid: str | None = None

    def instance(self, column: str, outlet: int) -> str:
        """The instance OID of ``outlet`` in ``column``."""
        prefix = f".{self.index_prefix}" if self.index_prefix else ""
        return f"{normalize_oid(column)}{prefix}.{outlet}"

    def names_root(self) -> str | None:
        """The subtree walked for outlet names (the column plus the unit's index prefix)."""
        if self.names_oid is None:
            return None
        prefix = f".{self.index_prefix}" if self.index_prefix else ""
        return f"{normalize_oid(self.names_oid)}{prefix}"


_APC_COMMANDS = "rPDUOutletControlOutletCommand immediateOn(1)/immediateOff(2)/immediateReboot(3)"

APC_RPDU = PduProfile(
    key="apc_rpdu",
    title="APC rack PDU (rPDU branch: AP78xx/79xx)",
    # masterSwitchrPDU ::= { masterSwitch 5 } (PowerNet-MIB, products.system)
    sys_object_ids=(".1.3.6.1.4.1.318.1.3.4.5",),
    # rPDUOutletStatusOutletState: outletStatusOn(1), outletStatusOff(2) (PowerNet-MIB)
    status_oid=".1.3.6.1.4.1.318.1.1.12.3.5.1.1.4",
    status_on=(1,),
    status_off=(2,),
    # rPDUOutletControlOutletCommand (PowerNet-MIB), a different column from the status
    control_on=OutletCommand(".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.318.1.1.12.3.3.1.1.4", 3),
    # rPDUOutletStatusOutletName (PowerNet-MIB)
    names_oid=".1.3.6.1.4.1.318.1.1.12.3.5.1.1.2",
    index_prefix="",
    source=f"PowerNet-MIB; {_APC_COMMANDS}; also ClusterLabs fence_apc_snmp (ApcRPDU)",
    # rPDUOutletConfigRebootDuration (PowerNet-MIB; NUT's apc-pdu-mib walk)
    reboot_duration_oid=".1.3.6.1.4.1.318.1.1.12.3.4.1.1.6",
)

APC_RPDU2 = PduProfile(
    key="apc_rpdu2",
    title="APC rack PDU 2G (rPDU2 branch: AP84xx/86xx/88xx/89xx)",
    # masterSwitchrPDU2 ::= { masterSwitch 6 } (PowerNet-MIB). NUT's apc-pdu-mib.c
    # labels .4.4/.4.5/.4.6 differently; the MIB text is what is used here.
    sys_object_ids=(".1.3.6.1.4.1.318.1.3.4.6",),
    # rPDU2OutletSwitchedStatusState: off(1), on(2) (PowerNet-MIB) -- the OPPOSITE
    # encoding of rPDU's outletStatusOn(1)/outletStatusOff(2).
    status_oid=".1.3.6.1.4.1.318.1.1.26.9.2.3.1.5",
    status_on=(2,),
    status_off=(1,),
    # rPDU2OutletSwitchedControlCommand: immediateOn(1), immediateOff(2),
    # immediateReboot(3) (PowerNet-MIB), same command values as rPDU
    control_on=OutletCommand(".1.3.6.1.4.1.318.1.1.26.9.2.4.1.5", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.318.1.1.26.9.2.4.1.5", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.318.1.1.26.9.2.4.1.5", 3),
    # rPDU2OutletSwitchedStatusName (PowerNet-MIB). The tables are indexed by
    # rPDU2OutletSwitchedStatusIndex, which equals the outlet number on a single
    # PDU; on a daisy chain later units continue the numbering.
    names_oid=".1.3.6.1.4.1.318.1.1.26.9.2.3.1.3",
    index_prefix="",
    source="PowerNet-MIB (rPDU2OutletSwitchedStatusTable, rPDU2OutletSwitchedControlTable)",
    # rPDU2OutletSwitchedConfigRebootDuration (PowerNet-MIB, column 7 of
    # rPDU2OutletSwitchedConfigTable): the seconds immediateReboot stays off.
    reboot_duration_oid=".1.3.6.1.4.1.318.1.1.26.9.2.1.1.7",
)

APC_MASTERSWITCH = PduProfile(
    key="apc_masterswitch",
    title="APC MasterSwitch (sPDU branch: AP92xx/AP96xx)",
    # masterSwitchV1 ::= { masterSwitch 1 }, masterSwitchV2 ::= { masterSwitch 2 } (PowerNet-MIB)
    sys_object_ids=(".1.3.6.1.4.1.318.1.3.4.1", ".1.3.6.1.4.1.318.1.3.4.2"),
    # sPDUOutletCtl is both: read gives the state, write switches. outletOn(1),
    # outletOff(2), outletReboot(3), outletUnknown(4), ... (PowerNet-MIB)
    status_oid=".1.3.6.1.4.1.318.1.1.4.4.2.1.3",
    status_on=(1,),
    status_off=(2,),
    control_on=OutletCommand(".1.3.6.1.4.1.318.1.1.4.4.2.1.3", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.318.1.1.4.4.2.1.3", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.318.1.1.4.4.2.1.3", 3),
    # sPDUOutletCtlName (PowerNet-MIB)
    names_oid=".1.3.6.1.4.1.318.1.1.4.4.2.1.4",
    index_prefix="",
    source="PowerNet-MIB (sPDUOutletControlTable); also openstack/ironic SNMPDriverAPCMasterSwitch",
)

RARITAN_PX2 = PduProfile(
    key="raritan_px2",
    title="Raritan PX2/PX3 (PDU2-MIB)",
    # The PDU2-MIB root (raritan 6); GLPI agent's Raritan MibSupport matches
    # sysObjectID on this prefix. Not checked against a device walk.
    sys_object_ids=(".1.3.6.1.4.1.13742.6",),
    # outletSwitchingState (SensorStateEnumeration): on(7), off(8) (PDU2-MIB)
    status_oid=".1.3.6.1.4.1.13742.6.4.1.2.1.3",
    status_on=(7,),
    status_off=(8,),
    # switchingOperation (OutletSwitchingOperationsEnumeration): off(0), on(1),
    # cycle(2) (PDU2-MIB)
    control_on=OutletCommand(".1.3.6.1.4.1.13742.6.4.1.2.1.2", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.13742.6.4.1.2.1.2", 0),
    control_reboot=OutletCommand(".1.3.6.1.4.1.13742.6.4.1.2.1.2", 2),
    # outletName (outletConfigurationTable, .6.3.5.3.1.3): from public code that
    # walks it (e.g. Raritan PX monitoring scripts), not from the MIB text.
    names_oid=".1.3.6.1.4.1.13742.6.3.5.3.1.3",
    # outletSwitchControlEntry INDEX { pduId, outletId } (PDU2-MIB): pduId 1 is
    # the unit answering (or the first of a chain).
    index_prefix="1",
    source="PDU2-MIB (outletSwitchControlTable, SensorStateEnumeration)",
)

EATON_EPDU = PduProfile(
    key="eaton_epdu",
    title="Eaton ePDU G2/G3 (EATON-EPDU-MIB, 'Marlin')",
    # EATON_MARLIN_SYSOID in networkupstools/nut drivers/eaton-pdu-marlin-mib.c
    sys_object_ids=(".1.3.6.1.4.1.534.6.6.7",),
    # outletControlStatus: off(0), on(1), pendingOff(2), pendingOn(3). A pending
    # command has not switched yet: pendingOff is still on, pendingOn still off
    # (same reading as openstack/ironic SNMPDriverEatonPower).
    status_oid=".1.3.6.1.4.1.534.6.6.7.6.6.1.2",
    status_on=(1, 2),
    status_off=(0, 3),
    # Two columns: outletControlOffCmd (.3) and outletControlOnCmd (.4); the
    # value is a delay in seconds, 0 = now (NUT eaton-pdu-marlin-mib.c). Note:
    # ironic's last snmp.py documents .3 as off and .4 as on but its class
    # attributes swap them; NUT and other public scripts agree with .3 = off.
    control_on=OutletCommand(".1.3.6.1.4.1.534.6.6.7.6.6.1.4", 0),
    control_off=OutletCommand(".1.3.6.1.4.1.534.6.6.7.6.6.1.3", 0),
    # outletControlRebootCmd (.5), delay 0 (NUT)
    control_reboot=OutletCommand(".1.3.6.1.4.1.534.6.6.7.6.6.1.5", 0),
    # outletName (NUT outlet.%i.desc: .534.6.6.7.6.1.1.3.0.%i)
    names_oid=".1.3.6.1.4.1.534.6.6.7.6.1.1.3",
    # strappingIndex 0 is the master unit of a daisy chain (NUT: ...%i.%i with 0 first)
    index_prefix="0",
    source="networkupstools/nut eaton-pdu-marlin-mib.c; openstack/ironic SNMPDriverEatonPower",
    caveat="OIDs and values from NUT's driver and ironic, not from EATON-EPDU-MIB text",
)

CYBERPOWER = PduProfile(
    key="cyberpower",
    title="CyberPower switched ePDU (CPS-MIB ePDU branch)",
    # The whole enterprise, as openstack/ironic's SNMPDriverCyberPower did; the
    # exact per-model sysObjectID was not confirmed.
    sys_object_ids=(".1.3.6.1.4.1.3808",),
    # ePDUOutletStatusOutletState: outletStatusOn(1), outletStatusOff(2)
    status_oid=".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.4",
    status_on=(1,),
    status_off=(2,),
    # ePDUOutletControlOutletCommand: immediateOn(1), immediateOff(2), immediateReboot(3)
    control_on=OutletCommand(".1.3.6.1.4.1.3808.1.1.3.3.3.1.1.4", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.3808.1.1.3.3.3.1.1.4", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.3808.1.1.3.3.3.1.1.4", 3),
    # ePDUOutletStatusOutletName
    names_oid=".1.3.6.1.4.1.3808.1.1.3.3.5.1.1.2",
    index_prefix="",
    source="openstack/ironic SNMPDriverCyberPower; public scripts citing CyberPower_MIB_v2.11",
    caveat="values from public code citing CyberPower's MIB v2.11; sysObjectID prefix is "
    "the whole CyberPower enterprise (UPSes match too)",
)

SERVERTECH_SENTRY3 = PduProfile(
    key="servertech_sentry3",
    title="Server Technology Sentry3 (Sentry Switched CDU)",
    # sentry3 ::= { serverTech 3 }; devices' sysObjectID not checked against a walk
    sys_object_ids=(".1.3.6.1.4.1.1718.3",),
    # outletStatus: off(0), on(1); offWait/onWait and error states are reported
    # as an unknown status rather than guessed.
    status_oid=".1.3.6.1.4.1.1718.3.2.3.1.5",
    status_on=(1,),
    status_off=(0,),
    # outletControlAction: on(1), off(2), reboot(3)
    control_on=OutletCommand(".1.3.6.1.4.1.1718.3.2.3.1.11", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.1718.3.2.3.1.11", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.1718.3.2.3.1.11", 3),
    # outletName
    names_oid=".1.3.6.1.4.1.1718.3.2.3.1.3",
    # outletEntry INDEX { systemTowerIndex, systemInfeedIndex, outletIndex }: tower 1, infeed 1
    index_prefix="1.1",
    source="sonic-mgmt snmp_pdu_controllers (Sentry Switched CDU); Mozilla releng reboot scripts",
    caveat="OIDs and values from public code, not from the Sentry3-MIB text",
)

SERVERTECH_SENTRY4 = PduProfile(
    key="servertech_sentry4",
    title="Server Technology Sentry4 (PRO1/PRO2 switched PDUs)",
    # sentry4 ::= { serverTech 4 }; devices' sysObjectID not checked against a walk
    sys_object_ids=(".1.3.6.1.4.1.1718.4",),
    # st4OutletState: unknown(0), on(1), off(2)
    status_oid=".1.3.6.1.4.1.1718.4.1.8.3.1.1",
    status_on=(1,),
    status_off=(2,),
    # st4OutletControlAction: on(1), off(2), reboot(3)
    control_on=OutletCommand(".1.3.6.1.4.1.1718.4.1.8.5.1.2", 1),
    control_off=OutletCommand(".1.3.6.1.4.1.1718.4.1.8.5.1.2", 2),
    control_reboot=OutletCommand(".1.3.6.1.4.1.1718.4.1.8.5.1.2", 3),
    # st4OutletName
    names_oid=".1.3.6.1.4.1.1718.4.1.8.2.1.3",
    # INDEX { st4UnitIndex, st4InputCordIndex, st4OutletIndex }: unit 1, cord 1
    index_prefix="1.1",
    source="osstest pdu-snmp (model_sentry4); sonic-mgmt snmp_pdu_controllers; check_pdu_health",
    caveat="OIDs and values from public code, not from the Sentry4-MIB text",
)

VERTIV_GEIST = PduProfile(
    key="vertiv_geist",
    title="Vertiv Geist upgradeable PDU (GEIST-V5-MIB)",
    # The whole Geist enterprise: not confirmed which sysObjectID V5 firmware reports
    sys_object_ids=(".1.3.6.1.4.1.21239",),
    # ctrlOutletStatus (.4): on(1), off(2) as used by sonic-mgmt
    status_oid=".1.3.6.1.4.1.21239.5.2.3.5.1.4",
    status_on=(1,),
    status_off=(2,),
    # control column (.6): on(2), off(4) as used by sonic-mgmt
    control_on=OutletCommand(".1.3.6.1.4.1.21239.5.2.3.5.1.6", 2),
    control_off=OutletCommand(".1.3.6.1.4.1.21239.5.2.3.5.1.6", 4),
    control_reboot=None,
    # ctrlOutletName (.3)
    names_oid=".1.3.6.1.4.1.21239.5.2.3.5.1.3",
    index_prefix="",
    source="sonic-mgmt snmp_pdu_controllers ('Vertiv Geist Upgradeable PDU')",
    caveat="OIDs and values from one public script only, not from GEIST-V5-MIB text; "
    "older Geist firmware (GEIST-MIB-V3, .21239.1/.2) uses other tables",
)

# Every built-in profile, by the name a config uses in ``vendor:``.
PROFILES: Mapping[str, PduProfile] = MappingProxyType(
    {
        p.key: p
        for p in (
            APC_RPDU,
            APC_RPDU2,
            APC_MASTERSWITCH,
            RARITAN_PX2,
            EATON_EPDU,
            CYBERPOWER,
            SERVERTECH_SENTRY3,
            SERVERTECH_SENTRY4,
            VERTIV_GEIST,
        )
    }
)

# Names a config may use for the same profile.
ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "apc": "apc_rpdu2",
        "raritan": "raritan_px2",
        "raritan_px3": "raritan_px2",
        "eaton": "eaton_epdu",
        "sentry3": "servertech_sentry3",
        "sentry4": "servertech_sentry4",
        "geist": "vertiv_geist",
    }
)


class UnknownVendor(LookupError):
    """No profile fits: an unknown vendor name, or a sysObjectID no profile claims."""


def known_vendors() -> str:
    return ", ".join(sorted(PROFILES)) + ", generic, auto"


def profile_by_name(name: str) -> PduProfile:
    key = ALIASES.get(name, name)
    try:
        return PROFILES[key]
    except KeyError:
        raise UnknownVendor(f'unknown PDU vendor "{name}"; known: {known_vendors()}') from None


def profile_for_sys_object_id(
    sys_object_id: str, profiles: Mapping[str, PduProfile] = PROFILES
) -> PduProfile:
    """The profile whose sysObjectID prefix is the longest match (whole OID components)."""
    device = oid_parts(sys_object_id)
    best: PduProfile | None = None
    best_len = 0
    for profile in profiles.values():
        for prefix in profile.sys_object_ids:
            parts = oid_parts(prefix)
            if len(parts) > best_len and device[: len(parts)] == parts:
                best, best_len = profile, len(parts)
    if best is None:
        raise UnknownVendor(
            f"sysObjectID .{normalize_oid(sys_object_id)} matches no known PDU "
            f"(known: {', '.join(sorted(profiles))}); set vendor: to one of them, "
            "or vendor: generic with control_oid/status_oid/... in the config"
        )
    return best


def generic_profile(
    *,
    control_oid: str,
    status_oid: str,
    control_on: int,
    control_off: int,
    status_on: int,
    status_off: int,
    names_oid: str | None = None,
) -> PduProfile:
    """A profile from the config's own OIDs and values (``vendor: generic``)."""
    if status_on == status_off:
        raise ValueError(f"status_on and status_off are both {status_on}; they must differ")
    if control_on == control_off:
        raise ValueError(f"control_on and control_off are both {control_on}; they must differ")
    return PduProfile(
        key="generic",
        title="generic switched PDU (OIDs from the config)",
        sys_object_ids=(),
        status_oid=normalize_oid(status_oid),
        status_on=(status_on,),
        status_off=(status_off,),
        control_on=OutletCommand(normalize_oid(control_oid), control_on),
        control_off=OutletCommand(normalize_oid(control_oid), control_off),
        control_reboot=None,
        names_oid=None if names_oid is None else normalize_oid(names_oid),
        index_prefix="",
        source="the config",
    )
