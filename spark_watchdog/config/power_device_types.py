"""Every power device type, one entry each: the one table a new type is added to.

An entry carries everything that differs between types: its config class
(config/power_devices.py: its keys, bounds and checks), the factory that
builds its power driver, what identifies the physical outlet, plug, BMC or
system it switches (so two nodes on one outlet are refused at load), how
long its command may take to leave, why it cannot serve a controller pair
(if it cannot), its secret files and what each travels in, its row in
docs/power.md, "Every supported device", and the tests that cover it. The
rest is derived from here: power/paths.py builds the driver, the controller's
config (config/controller.py) checks the targets and the send times,
config/secret_refs.py lists the secrets. Every column is required; tests in
tests/config/test_power_device_types.py hold each entry to its docs row,
its tests, its factory and its physical target.

The factory is named, not imported: the config may not import the power
layer (docs/design.md, "Layers"), and a driver's module is imported only
when a device of its type is first built (pysnmp is heavy).
"""

from __future__ import annotations

import shlex
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar
from urllib.parse import urlsplit

from spark_watchdog.config.power_devices import (
    ExecDevice,
    HomeAssistantDevice,
    IpmiDevice,
    KasaDevice,
    NutDevice,
    PowerDevice,
    RedfishDevice,
    ShellyDevice,
    ShellyGen1Device,
    SnmpDevice,
    SshDevice,
    TasmotaDevice,
)
from spark_watchdog.config.secrets import SecretUse

D = TypeVar("D")


class PhysicalTarget(NamedTuple):
    """One physical thing a device switches: two with one ``identity`` cut the same power."""

    identity: tuple[str, ...]
    described: str  # "outlet 3 of PDU 10.0.0.5:161", for the refusal
    what: str  # "outlet", "switch", "BMC", "system", "command"


@dataclass(frozen=True)
class SecretFile:
    """A key of the device naming a secret file (a path, or a credential name)."""

    key: str
    # What it travels in (config/secrets.py, ``SecretUse``): which characters it may hold.
    use: SecretUse = "text"
    # False where a program of ours never reads it (ssh -i reads the key itself).
    read: bool = True


@dataclass(frozen=True, kw_only=True)
class PowerDeviceType(Generic[D]):
    """One power device type; every field is required (a new type states each)."""

    # The config class (config/power_devices.py), tagged by its ``type``.
    config: type[D]
    # "module:function" of the power driver's builder, ``(device, secrets) -> PowerBackend``;
    # None only for the soft path (ssh), which switches no power.
    factory: str | None
    # What identifies each outlet, plug, BMC or system it switches; none for the soft path.
    physical_targets: Callable[[D], list[PhysicalTarget]]
    # The longest its command may take to leave after the gate (a controller pair's bound).
    send_time: Callable[[D], float]
    # Why it cannot serve a controller pair, or None.
    pair_refusal: Callable[[D], str | None]
    secret_files: tuple[SecretFile, ...]
    # The "device" cell of its row in docs/power.md, "Every supported device".
    docs_row: str
    # The test files (from the repository's root) that drive it over its protocol.
    tests: tuple[str, ...]

    @property
    def name(self) -> str:
        """The ``type`` a config names it by."""
        (tag,) = typing.get_args(typing.get_type_hints(self.config)["type"])
        return str(tag)

    @property
    def switches_power(self) -> bool:
        return self.factory is not None


# -- physical targets -----------------------------------------------------------


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _url_host_port(url: str) -> str:
    """``host:port`` of an (already checked) http(s) URL, host lowercased, default port filled."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return _host_port(parts.hostname or "", port)


def _pdu_outlets(device: SnmpDevice) -> list[PhysicalTarget]:
    pdu = _host_port(device.host.lower(), device.port)
    return [
        PhysicalTarget(("snmp", pdu, str(outlet)), f"outlet {outlet} of PDU {pdu}", "outlet")
        for outlet in device.outlet_list
    ]


def _plug_switch(device: ShellyDevice | ShellyGen1Device | TasmotaDevice) -> list[PhysicalTarget]:
    plug = _url_host_port(device.url)
    return [
        PhysicalTarget(
            (device.type, plug, str(device.switch_id)),
            f"switch {device.switch_id} of {device.type} plug {plug}",
            "switch",
        )
    ]


def _ups_outlet(device: NutDevice) -> list[PhysicalTarget]:
    upsd = _host_port(device.host.lower(), device.port)
    return [
        PhysicalTarget(
            ("nut", upsd, device.ups, str(device.outlet)),
            f"outlet {device.outlet} of {device.ups}@{upsd}",
            "outlet",
        )
    ]


def _kasa_outlet(device: KasaDevice) -> list[PhysicalTarget]:
    plug = _host_port(device.host.lower(), device.port_or_default)
    outlet = "" if device.outlet is None else str(device.outlet)
    shown = "the plug" if device.outlet is None else f"outlet {device.outlet}"
    return [PhysicalTarget(("kasa", plug, outlet), f"{shown} of kasa device {plug}", "outlet")]


def _ha_switch(device: HomeAssistantDevice) -> list[PhysicalTarget]:
    home = _url_host_port(device.url)
    return [
        PhysicalTarget(
            ("home_assistant", home, device.entity_id),
            f"{device.entity_id} of Home Assistant {home}",
            "switch",
        )
    ]


def _exec_command(device: ExecDevice) -> list[PhysicalTarget]:
    off = shlex.join(device.off_command)
    return [PhysicalTarget(("exec", off), f'the exec off command "{off}"', "command")]


def _ipmi_bmc(device: IpmiDevice) -> list[PhysicalTarget]:
    bmc = _host_port(device.host.lower(), device.port)
    return [PhysicalTarget(("ipmi", bmc), f"IPMI BMC {bmc}", "BMC")]


def _redfish_system(device: RedfishDevice) -> list[PhysicalTarget]:
    bmc = _url_host_port(device.url)
    named = f"Redfish system {device.system}" if device.system else "the Redfish system"
    return [PhysicalTarget(("redfish", bmc, device.system or ""), f"{named} of {bmc}", "system")]


def no_physical_target(device: object) -> list[PhysicalTarget]:
    """The soft path switches no power of its own: nothing to share."""
    return []


# -- send times (leadership.send_deadline) -----------------------------------------


def _timeout(device: IpmiDevice | RedfishDevice | ExecDevice) -> float:
    return device.timeout


def _snmp_tries(device: SnmpDevice) -> float:
    # SNMP resends on a timeout.
    return device.timeout * (device.retries + 1)


def _four_exchanges(device: NutDevice | KasaDevice) -> float:
    # NUT: connect, USERNAME, PASSWORD, then the INSTCMD line. Kasa: KLAP's two
    # handshakes (or the legacy connect), a strip's outlet id, the command.
    return 4 * device.timeout


def _over_http(
    device: ShellyDevice | ShellyGen1Device | TasmotaDevice | HomeAssistantDevice,
) -> float:
    # HTTPS shakes hands before the request.
    return 2 * device.timeout if device.url.startswith("https:") else device.timeout


def _ssh_connect(device: SshDevice) -> float:
    return device.connect_timeout


# -- controller pair refusals ------------------------------------------------------


def _one_request(device: object) -> str | None:
    """After the gate its command is one request, with nothing to look up first."""
    return None


def _pdu_pair_refusal(device: SnmpDevice) -> str | None:
    outlets = [device.outlet] if device.outlets is None else list(device.outlets)
    if len(outlets) > 1:
        return (
            "an outlet group's members are switched one after another after the "
            "gate; not with a controller pair yet: one outlet per power path"
        )
    if any(isinstance(o, str) for o in outlets):
        return "a named outlet is looked up after the gate: give its number"
    return None


def _redfish_pair_refusal(device: RedfishDevice) -> str | None:
    return (
        "a Redfish reset takes several requests after the gate (the system, its "
        "reset action); not with a controller pair yet: use the node's PDU outlet"
    )


# -- the table -----------------------------------------------------------------

_PASSWORD = SecretFile("password_file")

POWER_DEVICE_TYPES: tuple[PowerDeviceType[Any], ...] = (
    PowerDeviceType(
        config=SnmpDevice,
        factory="spark_watchdog.power.snmp_outlet:build_snmp_backend",
        physical_targets=_pdu_outlets,
        send_time=_snmp_tries,
        pair_refusal=_pdu_pair_refusal,
        secret_files=(
            SecretFile("community_file"),
            SecretFile("auth_key_file"),
            SecretFile("priv_key_file"),
        ),
        docs_row="switched PDU outlet (APC, Raritan, Eaton, CyberPower, ServerTech, "
        "Vertiv Geist, any by OID)",
        tests=("tests/power/test_snmp_standin.py", "tests/power/test_snmp_profiles.py"),
    ),
    PowerDeviceType(
        config=IpmiDevice,
        factory="spark_watchdog.power.ipmi:build_ipmi_backend",
        physical_targets=_ipmi_bmc,
        send_time=_timeout,
        pair_refusal=_one_request,
        secret_files=(_PASSWORD,),
        docs_row="a BMC, over IPMI (ipmitool -I lanplus)",
        tests=("tests/power/test_ipmi.py",),
    ),
    PowerDeviceType(
        config=RedfishDevice,
        factory="spark_watchdog.power.redfish:build_redfish_backend",
        physical_targets=_redfish_system,
        send_time=_timeout,
        pair_refusal=_redfish_pair_refusal,
        # HTTP Basic auth: Latin-1.
        secret_files=(SecretFile("password_file", "basic"),),
        docs_row="a BMC or PDU over Redfish",
        tests=("tests/power/test_redfish.py",),
    ),
    PowerDeviceType(
        config=ShellyDevice,
        factory="spark_watchdog.power.plugs:build_shelly_backend",
        physical_targets=_plug_switch,
        send_time=_over_http,
        pair_refusal=_one_request,
        # Digest auth hashes UTF-8: any text.
        secret_files=(_PASSWORD,),
        docs_row="Shelly Gen2+ plug or relay",
        tests=("tests/power/test_plugs.py",),
    ),
    PowerDeviceType(
        config=ShellyGen1Device,
        factory="spark_watchdog.power.shelly_gen1:build_shelly_gen1_backend",
        physical_targets=_plug_switch,
        send_time=_over_http,
        pair_refusal=_one_request,
        secret_files=(SecretFile("password_file", "basic"),),
        docs_row="Shelly Gen1 plug or relay (Plug S, 1, 1PM, 2.5)",
        tests=("tests/power/test_plugs.py", "tests/cli/test_power_small_lab.py"),
    ),
    PowerDeviceType(
        config=TasmotaDevice,
        factory="spark_watchdog.power.plugs:build_tasmota_backend",
        physical_targets=_plug_switch,
        send_time=_over_http,
        pair_refusal=_one_request,
        # Sent in the URL's query, encoded: any text.
        secret_files=(_PASSWORD,),
        docs_row="Tasmota plug",
        tests=("tests/power/test_plugs.py",),
    ),
    PowerDeviceType(
        config=HomeAssistantDevice,
        factory="spark_watchdog.power.home_assistant:build_home_assistant_backend",
        physical_targets=_ha_switch,
        send_time=_over_http,
        pair_refusal=_one_request,
        # A Bearer header: visible ASCII.
        secret_files=(SecretFile("token_file", "header"),),
        docs_row="any Home Assistant `switch` entity",
        tests=("tests/power/test_home_assistant.py",),
    ),
    PowerDeviceType(
        config=NutDevice,
        factory="spark_watchdog.power.nut:build_nut_backend",
        physical_targets=_ups_outlet,
        send_time=_four_exchanges,
        pair_refusal=_one_request,
        # A line of upsd's protocol: printable ASCII.
        secret_files=(SecretFile("password_file", "nut"),),
        docs_row="an outlet of a UPS or PDU that Network UPS Tools drives",
        tests=("tests/power/test_nut.py",),
    ),
    PowerDeviceType(
        config=KasaDevice,
        factory="spark_watchdog.power.kasa:build_kasa_backend",
        physical_targets=_kasa_outlet,
        send_time=_four_exchanges,
        pair_refusal=_one_request,
        # python-kasa hashes UTF-8: any text.
        secret_files=(_PASSWORD, SecretFile("username_file")),
        docs_row="TP-Link Kasa or Tapo plug, or one outlet of a power strip (python-kasa: "
        "Kasa's legacy protocol, KLAP, Tapo's)",
        tests=("tests/power/test_kasa.py",),
    ),
    PowerDeviceType(
        config=ExecDevice,
        factory="spark_watchdog.power.exec_path:build_exec_backend",
        physical_targets=_exec_command,
        send_time=_timeout,
        pair_refusal=_one_request,
        secret_files=(),
        docs_row="anything a command can switch: a homemade relay board, a vendor's CLI",
        tests=("tests/power/test_exec.py",),
    ),
    PowerDeviceType(
        config=SshDevice,
        factory=None,
        physical_targets=no_physical_target,
        send_time=_ssh_connect,
        pair_refusal=_one_request,
        secret_files=(SecretFile("key_file", read=False),),
        docs_row="the soft path: a reboot over SSH",
        tests=("tests/power/test_ssh.py",),
    ),
)

_BY_CONFIG: dict[type, PowerDeviceType[Any]] = {t.config: t for t in POWER_DEVICE_TYPES}


def power_device_type(device: PowerDevice) -> PowerDeviceType[Any]:
    """The table's entry for a configured device (by its config class)."""
    try:
        return _BY_CONFIG[type(device)]
    except KeyError:
        raise TypeError(f"{type(device).__name__} is not in POWER_DEVICE_TYPES") from None
