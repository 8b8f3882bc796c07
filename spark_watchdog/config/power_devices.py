"""The power devices a node's power path may name, each tagged by ``type``
and accepting only its own keys (docs/power.md; the controller's config,
config/controller.py, names them in ``nodes[].power``)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from spark_watchdog.config.addresses import (
    check_host,
    check_http_url,
)
from spark_watchdog.config.schema import InvalidSetting, setting
from spark_watchdog.redact import redact_argv

# The bounds of every number of a power device (docs/power.md, "Bounds"): a
# timeout up to 5 minutes (a device slower than that is not answering); an
# outlet index, and a value of a generic SNMP profile, within 16 bits.
MAX_TIMEOUT_S = 300.0
MIN_SNMP_INTEGER = -65535
MAX_SNMP_INTEGER = 65535

_OID = re.compile(r"^\.?[0-9]+(\.[0-9]+)+$")

AuthProtocol = Literal["SHA", "SHA224", "SHA256", "SHA384", "SHA512", "MD5"]
PrivProtocol = Literal["AES", "AES128", "AES192", "AES256", "DES"]


def check_url_key(key: str, url: str) -> None:
    check_http_url(key, url)


@dataclass(frozen=True, kw_only=True)
class SnmpDevice:
    """A switched PDU outlet (or several, for redundant supplies) over SNMP."""

    type: Literal["snmp"] = setting()
    host: str = setting()
    port: int = setting(161, minimum=1, maximum=65535)
    outlet: int | str | None = setting(None, minimum=1, maximum=MAX_SNMP_INTEGER)
    outlets: tuple[int | str, ...] | None = setting(None, minimum=1, maximum=MAX_SNMP_INTEGER)
    vendor: str = setting("auto")
    version: int | str = setting("2c")
    community_file: str | None = setting(None)
    user: str | None = setting(None)
    auth_protocol: AuthProtocol | None = setting(None)
    auth_key_file: str | None = setting(None)
    priv_protocol: PrivProtocol | None = setting(None)
    priv_key_file: str | None = setting(None)
    timeout: float = setting(2.0, above=0, maximum=MAX_TIMEOUT_S)
    retries: int = setting(1, minimum=0, maximum=5)
    # The generic profile: OIDs and values for any other PDU.
    control_oid: str | None = setting(None)
    status_oid: str | None = setting(None)
    names_oid: str | None = setting(None)
    control_on: int | None = setting(None, minimum=MIN_SNMP_INTEGER, maximum=MAX_SNMP_INTEGER)
    control_off: int | None = setting(None, minimum=MIN_SNMP_INTEGER, maximum=MAX_SNMP_INTEGER)
    status_on: int | None = setting(None, minimum=MIN_SNMP_INTEGER, maximum=MAX_SNMP_INTEGER)
    status_off: int | None = setting(None, minimum=MIN_SNMP_INTEGER, maximum=MAX_SNMP_INTEGER)

    def __post_init__(self) -> None:
        check_host("host", self.host)
        if str(self.version) not in ("1", "2c", "3"):
            raise InvalidSetting("version", f"expected 1, 2c or 3, got {self.version!r}")
        if (self.outlet is None) == (self.outlets is None):
            raise InvalidSetting(
                "outlet", "expected exactly one of outlet (number or name) or outlets (a list)"
            )
        if self.outlets is not None and not self.outlets:
            raise InvalidSetting("outlets", "expected at least one outlet")
        if str(self.version) == "3":
            if self.user is None:
                raise InvalidSetting("user", "SNMPv3 needs a user")
            if self.community_file is not None:
                raise InvalidSetting("community_file", "SNMPv3 uses user and keys, not a community")
            if (self.auth_protocol is None) != (self.auth_key_file is None):
                raise InvalidSetting("auth_key_file", "auth_protocol and auth_key_file go together")
            if (self.priv_protocol is None) != (self.priv_key_file is None):
                raise InvalidSetting("priv_key_file", "priv_protocol and priv_key_file go together")
            if self.priv_protocol is not None and self.auth_protocol is None:
                raise InvalidSetting("priv_protocol", "privacy needs authentication (authPriv)")
        else:
            if self.community_file is None:
                raise InvalidSetting(
                    "community_file", f"SNMPv{self.version} needs a community_file"
                )
            for key in ("user", "auth_protocol", "auth_key_file", "priv_protocol", "priv_key_file"):
                if getattr(self, key) is not None:
                    raise InvalidSetting(key, "only for SNMPv3 (version: 3)")
        generic = (
            "control_oid",
            "status_oid",
            "control_on",
            "control_off",
            "status_on",
            "status_off",
        )
        given = [k for k in generic if getattr(self, k) is not None]
        if self.vendor == "generic":
            missing = [k for k in generic if getattr(self, k) is None]
            if missing:
                raise InvalidSetting("vendor", f"generic needs {', '.join(missing)}")
        elif given:
            raise InvalidSetting(given[0], "only with vendor: generic")
        for key in ("control_oid", "status_oid", "names_oid"):
            value = getattr(self, key)
            if value is not None and not _OID.match(value):
                raise InvalidSetting(
                    key, f'expected a numeric OID like 1.3.6.1.4.1.318, got "{value}"'
                )

    @property
    def snmp_version(self) -> str:
        return str(self.version)

    @property
    def outlet_list(self) -> tuple[int | str, ...]:
        return self.outlets if self.outlets is not None else (self.outlet,)  # type: ignore[return-value]


@dataclass(frozen=True, kw_only=True)
class IpmiDevice:
    """A BMC over IPMI (ipmitool -I lanplus)."""

    type: Literal["ipmi"] = setting()
    host: str = setting()
    port: int = setting(623, minimum=1, maximum=65535)
    user: str = setting()
    password_file: str = setting()
    # Real BMCs often need 17; OpenIPMI's ipmi_sim speaks 3 (docs/facts.md, "IPMI").
    cipher_suite: int = setting(17, minimum=0, maximum=17)
    timeout: float = setting(15.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_host("host", self.host)


@dataclass(frozen=True, kw_only=True)
class RedfishDevice:
    type: Literal["redfish"] = setting()
    url: str = setting()
    user: str = setting()
    password_file: str = setting()
    system: str | None = setting(None)
    ca_file: str | None = setting(None)
    verify_tls: bool = setting(True)
    timeout: float = setting(10.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_url_key("url", self.url)


@dataclass(frozen=True, kw_only=True)
class ShellyDevice:
    """A Shelly Gen2+ smart plug (RPC over HTTP)."""

    type: Literal["shelly"] = setting()
    url: str = setting()
    switch_id: int = setting(0, minimum=0, maximum=255)
    user: str | None = setting(None)
    password_file: str | None = setting(None)
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_url_key("url", self.url)


@dataclass(frozen=True, kw_only=True)
class ShellyGen1Device:
    """A Shelly Gen1 plug or relay (``/relay/N`` over HTTP, Basic auth)."""

    type: Literal["shelly_gen1"] = setting()
    url: str = setting()
    switch_id: int = setting(0, minimum=0, maximum=255)
    user: str | None = setting(None)
    password_file: str | None = setting(None)
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_url_key("url", self.url)
        if self.user is not None and self.password_file is None:
            raise InvalidSetting(
                "user", "a Shelly Gen1 login needs its password: set password_file, or remove user"
            )


@dataclass(frozen=True, kw_only=True)
class TasmotaDevice:
    """A Tasmota smart plug (``/cm?cmnd=Power``)."""

    type: Literal["tasmota"] = setting()
    url: str = setting()
    switch_id: int = setting(1, minimum=1, maximum=32)
    user: str | None = setting(None)
    password_file: str | None = setting(None)
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_url_key("url", self.url)


_SWITCH_ENTITY = re.compile(r"^switch\.[a-z0-9_]+$")


@dataclass(frozen=True, kw_only=True)
class HomeAssistantDevice:
    """A Home Assistant ``switch`` entity, through HA's REST API (docs/power.md)."""

    type: Literal["home_assistant"] = setting()
    url: str = setting()
    entity_id: str = setting()
    token_file: str = setting()
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_url_key("url", self.url)
        if not _SWITCH_ENTITY.match(self.entity_id):
            raise InvalidSetting(
                "entity_id",
                f'expected a switch entity like switch.spark_1, got "{self.entity_id}": only '
                "switches are power (wrap anything else in a template switch)",
            )


_NUT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # whole: no line break after it


@dataclass(frozen=True, kw_only=True)
class NutDevice:
    """An outlet of a UPS or PDU driven by Network UPS Tools, through upsd (docs/power.md)."""

    type: Literal["nut"] = setting()
    host: str = setting()
    port: int = setting(3493, minimum=1, maximum=65535)
    # The UPS's name in upsd (ups.conf's section: `upsc -l HOST` lists them).
    ups: str = setting()
    outlet: int = setting(minimum=0, maximum=1000)
    user: str = setting()
    password_file: str = setting()
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_host("host", self.host)
        for key in ("ups", "user"):
            if not _NUT_NAME.fullmatch(getattr(self, key)):
                raise InvalidSetting(
                    key,
                    f'expected a name of letters, digits, ".", "_" and "-", got '
                    f"{getattr(self, key)!a} (as upsd.conf and upsd.users spell it)",
                )


_KASA_PORTS = {"legacy": 9999, "klap": 80, "smart": 80}


@dataclass(frozen=True, kw_only=True)
class KasaDevice:
    """A TP-Link Kasa or Tapo plug, or one outlet of a strip, through python-kasa
    (docs/power.md, "Kasa and Tapo")."""

    type: Literal["kasa"] = setting()
    host: str = setting()
    # legacy: Kasa's original protocol (TCP 9999, no login); klap: Kasa firmware with
    # the authenticated protocol; smart: Tapo, and Kasa that discovery shows as SMART.*.
    protocol: Literal["legacy", "klap", "smart"] = setting("legacy")
    port: int | None = setting(None, minimum=1, maximum=65535)
    # A strip's outlet, counted from 1 as printed on it; none for a single plug.
    outlet: int | None = setting(None, minimum=1, maximum=64)
    # The TP-Link account's e-mail and password (klap and smart only).
    username_file: str | None = setting(None)
    password_file: str | None = setting(None)
    timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_host("host", self.host)
        files = ("username_file", "password_file")
        if self.protocol == "legacy":
            for key in files:
                if getattr(self, key) is not None:
                    raise InvalidSetting(
                        key, "the legacy protocol has no login: only for protocol klap or smart"
                    )
            return
        for key in files:
            if getattr(self, key) is None:
                raise InvalidSetting(
                    key,
                    f"protocol {self.protocol} logs in with the TP-Link account's e-mail "
                    "(username_file) and password (password_file): set both",
                )

    @property
    def port_or_default(self) -> int:
        return self.port if self.port is not None else _KASA_PORTS[self.protocol]


def kasa_library_missing(paths: Iterable[tuple[str, object]]) -> list[str]:
    """At load: a ``kasa`` path where python-kasa (the ``kasa`` extra) is not installed."""
    if importlib.util.find_spec("kasa") is not None:
        return []
    return [
        f"{key}.type: kasa needs python-kasa, which is not installed here: "
        "pip install 'spark-watchdog[kasa]' (Python 3.11 or newer)"
        for key, device in paths
        if isinstance(device, KasaDevice)
    ]


# The exit status with which an exec path's off or on command says that it certainly
# did not reach the device (sysexits.h EX_TEMPFAIL; docs/power.md, "exec").
EXEC_NOT_SENT_EXIT = 75


@dataclass(frozen=True, kw_only=True)
class ExecDevice:
    """The operator's own commands switch and read the power (docs/power.md, "exec")."""

    type: Literal["exec"] = setting()
    # Each an argv (no shell): the program's absolute path, then its arguments. Not
    # "off:" and "on:": YAML 1.1 reads those keys as the booleans false and true.
    off_command: tuple[str, ...] = setting()
    on_command: tuple[str, ...] = setting()
    status_command: tuple[str, ...] = setting()
    # Seconds each run may take before it is killed.
    timeout: float = setting(10.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        for key in ("off_command", "on_command", "status_command"):
            argv: tuple[str, ...] = getattr(self, key)
            if not argv or not argv[0].strip():
                raise InvalidSetting(
                    key, "required: the command as a list, e.g. [/usr/local/bin/relay, off, 3]"
                )
            if not argv[0].startswith("/"):
                raise InvalidSetting(
                    f"{key}[0]",
                    f'expected the program\'s absolute path, got "{argv[0]}": the controller '
                    "runs it without a shell or a search of PATH",
                )
            shown = redact_argv(argv)
            for i, (given, said) in enumerate(zip(argv, shown, strict=True)):
                if given != said:
                    raise InvalidSetting(
                        f"{key}[{i}]",
                        f'looks like a secret ("{said}"): any user can read a command line '
                        "(ps); let the command read it from a file (mode 0600) instead",
                    )


def program_unusable(program: str) -> str | None:
    """Why ``program`` cannot be run (missing, a directory, not a regular file, not
    executable), or None. A bare name is looked up on ``$PATH``."""
    if "/" not in program:
        if shutil.which(program) is None:
            return f'no program "{program}" on $PATH ({os.environ.get("PATH", os.defpath)})'
        return None
    try:
        info = os.stat(program)
    except FileNotFoundError:
        return f'"{program}" does not exist'
    except OSError as exc:
        return f'"{program}" cannot be looked at: {exc.strerror or exc}'
    if stat.S_ISDIR(info.st_mode):
        return f'"{program}" is a directory, not a program'
    if not stat.S_ISREG(info.st_mode):
        return f'"{program}" is not a regular file'
    if not os.access(program, os.X_OK):
        return f'"{program}" is not executable by this user (chmod +x, or check its owner)'
    return None


def power_programs_unusable(paths: Iterable[tuple[str, object]]) -> list[str]:
    """At load (``--check`` and a start): each program an ``exec`` path runs exists,
    is a regular file and may be executed, rather than a failed cycle in an incident."""
    problems: list[str] = []
    for key, device in paths:
        if not isinstance(device, ExecDevice):
            continue
        for command in ("off_command", "on_command", "status_command"):
            program = getattr(device, command)[0]
            why = program_unusable(program)
            if why is not None:
                problems.append(
                    f"{key}.{command}[0]: {why}: give the absolute path of an executable "
                    'file (docs/power.md, "exec")'
                )
    return problems


# Sync, remount read-only, restart: sysrq's emergency path, which neither waits for
# services nor calls the drivers' shutdown hooks (where a wedged driver hangs a reboot).
# Detached, so the ssh session ends (exit 0) before the host drops.
FORCED_REBOOT = (
    "sudo sh -c '(sleep 1; echo 1 > /proc/sys/kernel/sysrq; echo s > /proc/sysrq-trigger; "
    "sleep 2; echo u > /proc/sysrq-trigger; sleep 1; echo b > /proc/sysrq-trigger) "
    "</dev/null >/dev/null 2>&1 &'"
)


@dataclass(frozen=True, kw_only=True)
class SshDevice:
    """The soft path: reboot over SSH. Useless on a frozen host, fine for a stuck one."""

    type: Literal["ssh"] = setting()
    host: str = setting()
    port: int = setting(22, minimum=1, maximum=65535)
    user: str = setting()
    key_file: str = setting()
    known_hosts_file: str = setting()
    command: str = setting("sudo systemctl reboot")
    # The reboot for a wedged GPU driver, one that cannot hang on it: sysrq "b" restarts
    # at once, skipping the drivers' shutdown (docs/design.md, "Wedged but alive").
    forced_command: str = setting(FORCED_REBOOT)
    # A clean halt (the host stays powered, as a frozen one does), before a long AC
    # cut clears a GPU clock latch (policy.clock_latch_off_seconds;
    # docs/design.md, "Clock latch").
    halt_command: str = setting("sudo systemctl halt")
    connect_timeout: float = setting(5.0, above=0, maximum=MAX_TIMEOUT_S)

    def __post_init__(self) -> None:
        check_host("host", self.host)


PowerDevice = (
    SnmpDevice
    | IpmiDevice
    | RedfishDevice
    | ShellyDevice
    | ShellyGen1Device
    | TasmotaDevice
    | HomeAssistantDevice
    | NutDevice
    | KasaDevice
    | ExecDevice
    | SshDevice
)
