"""The PDU profile table and the SNMP backend's config handling: pure, no network.

The same profiles are exercised on the wire in test_snmp_standin.py (the
stateful stand-in) and test_snmp_snmpsim.py (recorded device data).
"""

from __future__ import annotations

import re

import pytest

from spark_watchdog.config.controller import SnmpDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import ConfigError
from spark_watchdog.power.base import OutletGroup
from spark_watchdog.power.snmp_outlet import SnmpOutlet, build_snmp_backend
from spark_watchdog.power.snmp_profiles import (
    APC_MASTERSWITCH,
    APC_RPDU,
    APC_RPDU2,
    EATON_EPDU,
    PROFILES,
    RARITAN_PX2,
    OutletCommand,
    PduProfile,
    UnknownVendor,
    generic_profile,
    oid_parts,
    profile_by_name,
    profile_for_sys_object_id,
)

NUMERIC_OID = re.compile(r"^\.?[0-9]+(\.[0-9]+)+$")


def test_rpdu_and_rpdu2_read_the_same_number_as_opposite_states() -> None:
    # PowerNet-MIB: rPDUOutletStatusOutletState outletStatusOn(1)/outletStatusOff(2),
    # rPDU2OutletSwitchedStatusState off(1)/on(2). Conflating them inverts every read.
    assert APC_RPDU.status_on == (1,) and APC_RPDU.status_off == (2,)
    assert APC_RPDU2.status_on == (2,) and APC_RPDU2.status_off == (1,)
    assert 1 in APC_RPDU.status_on and 1 in APC_RPDU2.status_off


def test_apc_status_and_control_are_different_columns_with_the_same_commands() -> None:
    for profile in (APC_RPDU, APC_RPDU2):
        assert oid_parts(profile.status_oid) != oid_parts(profile.control_off.oid)
        assert (profile.control_on.value, profile.control_off.value) == (1, 2)
        assert profile.control_reboot is not None and profile.control_reboot.value == 3


def test_longest_sys_object_id_prefix_wins() -> None:
    broad = PduProfile(
        key="apc_any",
        title="any APC product",
        sys_object_ids=(".1.3.6.1.4.1.318",),
        status_oid="1.3.6.1.4.1.318.9",
        status_on=(1,),
        status_off=(2,),
        control_on=OutletCommand("1.3.6.1.4.1.318.8", 1),
        control_off=OutletCommand("1.3.6.1.4.1.318.8", 2),
        control_reboot=None,
        names_oid=None,
        index_prefix="",
        source="test",
    )
    table = {"apc_any": broad, "apc_rpdu2": APC_RPDU2, "apc_rpdu": APC_RPDU}
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.6", table) is APC_RPDU2
    assert profile_for_sys_object_id("1.3.6.1.4.1.318.1.3.4.5", table) is APC_RPDU
    # A longer device OID under a known prefix still matches that prefix...
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.6.1", table) is APC_RPDU2
    # ...but prefixes match whole components: .4.60 is not under .4.6.
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.60", table) is broad
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.2", table) is broad


def test_builtin_table_picks_each_vendor() -> None:
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.6").key == "apc_rpdu2"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.5").key == "apc_rpdu"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.318.1.3.4.2").key == "apc_masterswitch"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.13742.6").key == "raritan_px2"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.534.6.6.7").key == "eaton_epdu"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.1718.3").key == "servertech_sentry3"
    assert profile_for_sys_object_id(".1.3.6.1.4.1.1718.4").key == "servertech_sentry4"


def test_unknown_sys_object_id_names_it_and_the_known_vendors() -> None:
    with pytest.raises(UnknownVendor) as info:
        profile_for_sys_object_id(".1.3.6.1.4.1.8072.3.2.10")
    message = str(info.value)
    assert ".1.3.6.1.4.1.8072.3.2.10" in message
    assert "apc_rpdu2" in message and "raritan_px2" in message and "generic" in message


def test_vendor_names_and_aliases() -> None:
    assert profile_by_name("apc_rpdu2") is APC_RPDU2
    assert profile_by_name("raritan") is RARITAN_PX2
    assert profile_by_name("eaton") is EATON_EPDU
    with pytest.raises(UnknownVendor, match=r'unknown PDU vendor "acme".*apc_rpdu2'):
        profile_by_name("acme")


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_profile_is_consistent_data(profile: PduProfile) -> None:
    assert profile.sys_object_ids, "auto-detection needs at least one sysObjectID prefix"
    oids = [profile.status_oid, profile.control_on.oid, profile.control_off.oid]
    oids += [profile.names_oid] if profile.names_oid else []
    oids += [profile.control_reboot.oid] if profile.control_reboot else []
    oids += list(profile.sys_object_ids)
    assert all(NUMERIC_OID.match(oid) for oid in oids), oids
    assert not set(profile.status_on) & set(profile.status_off)
    same_column = oid_parts(profile.control_on.oid) == oid_parts(profile.control_off.oid)
    if same_column:
        assert profile.control_on.value != profile.control_off.value
    assert profile.source


def test_profiles_confirmed_against_mib_text_carry_no_caveat() -> None:
    confirmed = {APC_RPDU, APC_RPDU2, APC_MASTERSWITCH, RARITAN_PX2}
    for profile in PROFILES.values():
        assert (profile.caveat is None) == (profile in confirmed), profile.key


def test_instance_oids_carry_the_unit_index() -> None:
    assert APC_RPDU2.instance(APC_RPDU2.status_oid, 3) == "1.3.6.1.4.1.318.1.1.26.9.2.3.1.5.3"
    # Raritan outletSwitchControlEntry INDEX { pduId, outletId }
    assert RARITAN_PX2.instance(RARITAN_PX2.status_oid, 3) == "1.3.6.1.4.1.13742.6.4.1.2.1.3.1.3"
    # Eaton: strapping index 0, and on/off are two different columns
    assert EATON_EPDU.instance(EATON_EPDU.control_off.oid, 5).endswith(".6.6.1.3.0.5")
    assert EATON_EPDU.instance(EATON_EPDU.control_on.oid, 5).endswith(".6.6.1.4.0.5")
    assert RARITAN_PX2.names_root() == "1.3.6.1.4.1.13742.6.3.5.3.1.3.1"


def test_generic_profile_from_config_values() -> None:
    profile = generic_profile(
        control_oid=".1.3.6.1.4.1.99.1.2",
        status_oid="1.3.6.1.4.1.99.1.3",
        control_on=1,
        control_off=0,
        status_on=1,
        status_off=0,
        names_oid=".1.3.6.1.4.1.99.1.1",
    )
    assert profile.instance(profile.control_on.oid, 4) == "1.3.6.1.4.1.99.1.2.4"
    with pytest.raises(ValueError, match="status_on and status_off are both 1"):
        generic_profile(
            control_oid="1.3.6.1",
            status_oid="1.3.6.2",
            control_on=1,
            control_off=0,
            status_on=1,
            status_off=1,
        )


# -- build_snmp_backend -----------------------------------------------------------


def _device(**overrides: object) -> SnmpDevice:
    values: dict[str, object] = {
        "type": "snmp",
        "host": "10.0.0.5",
        "outlet": 3,
        "community_file": "/etc/spark-watchdog/pdu-community",
    }
    values.update(overrides)
    return SnmpDevice(**values)  # type: ignore[arg-type]


COMMUNITY = {"community_file": Secret("private", "/etc/spark-watchdog/pdu-community")}


def test_one_outlet_is_an_outlet_with_a_stable_name_and_limiter_key() -> None:
    backend = build_snmp_backend(_device(vendor="apc_rpdu2"), COMMUNITY)
    assert isinstance(backend, SnmpOutlet)
    assert backend.name == "snmp apc_rpdu2 10.0.0.5:161 outlet 3"
    assert backend.limiter_key == "snmp:10.0.0.5:161"
    auto = build_snmp_backend(_device(outlet="spark-3"), COMMUNITY)
    assert auto.name == 'snmp 10.0.0.5:161 outlet "spark-3"'


def test_several_outlets_are_a_group_on_one_device() -> None:
    backend = build_snmp_backend(_device(outlet=None, outlets=(3, "spark-3b")), COMMUNITY)
    assert isinstance(backend, OutletGroup)
    assert [m.limiter_key for m in backend.members] == ["snmp:10.0.0.5:161"] * 2
    pdus = {m.pdu for m in backend.members if isinstance(m, SnmpOutlet)}
    assert len(pdus) == 1, "one vendor lookup and one name walk per PDU"


def test_config_problems_are_reported_together_without_secrets() -> None:
    device = _device(
        version=3,
        community_file=None,
        user="ops",
        auth_protocol="SHA256",
        auth_key_file="/k/auth",
        priv_protocol="AES128",
        priv_key_file="/k/priv",
        vendor="acme",
    )
    secrets = {"auth_key_file": Secret("short", "/k/auth")}
    with pytest.raises(ConfigError) as info:
        build_snmp_backend(device, secrets)
    problems = "\n".join(info.value.problems)
    assert "priv_key_file: the secret was not read" in problems
    assert "auth_key_file: SNMPv3 keys must be at least 8 characters" in problems
    assert 'unknown PDU vendor "acme"' in problems
    assert "short" not in str(info.value)


def test_generic_vendor_uses_the_config_oids() -> None:
    device = _device(
        vendor="generic",
        control_oid=".1.3.6.1.4.1.99.2",
        status_oid=".1.3.6.1.4.1.99.3",
        control_on=1,
        control_off=0,
        status_on=1,
        status_off=0,
    )
    backend = build_snmp_backend(device, COMMUNITY)
    assert isinstance(backend, SnmpOutlet)
    assert backend.name == "snmp generic 10.0.0.5:161 outlet 3"
