"""One switched outlet of an SNMP PDU as a power backend, and the backend a
config's ``snmp`` device builds (one outlet, or a group of them). The SNMP
itself, and every pysnmp import, is power/snmp.py's."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from spark_watchdog.config.controller import SnmpDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import (
    ConfigError,
    Refused,
)
from spark_watchdog.power.base import OutletGroup, PowerBackend, PowerState, TimedOn
from spark_watchdog.power.snmp import (
    MIN_V3_KEY,
    DeviceMismatch,
    MalformedAnswer,
    OutletDescription,
    SnmpCredentials,
    SnmpPdu,
    describe_value,
    integer_value,
    text_value,
)
from spark_watchdog.power.snmp_profiles import (
    PduProfile,
    UnknownVendor,
    generic_profile,
    profile_by_name,
)

log = logging.getLogger("spark_watchdog.power.snmp")


class SnmpOutlet:
    """One switched outlet of an SNMP PDU, as a raw ``PowerBackend``."""

    def __init__(self, pdu: SnmpPdu, outlet: int | str) -> None:
        if isinstance(outlet, int) and outlet < 1:
            raise ValueError(f"outlet: expected a number ≥ 1 or a name, got {outlet}")
        self.pdu = pdu
        self.outlet = outlet
        self._number: int | None = outlet if isinstance(outlet, int) else None

    @property
    def name(self) -> str:
        shown = self.outlet if isinstance(self.outlet, int) else f'"{self.outlet}"'
        return f"{self.pdu.label} outlet {shown}"

    @property
    def limiter_key(self) -> str:
        return self.pdu.limiter_key

    async def number(self) -> int:
        """The outlet's index on the PDU; a configured name is looked up in the names table."""
        if isinstance(self.outlet, int):
            return self.outlet
        number = await self.pdu.resolve_outlet(self.name, self.outlet)
        if self._number is not None and number != self._number:
            log.warning(
                "%s: the PDU now names outlet %d, not %d, %r",
                self.name,
                number,
                self._number,
                self.outlet,
            )
        self._number = number
        return number

    async def read_state(self) -> PowerState:
        profile = await self.pdu.profile(self.name)
        number = await self.number()
        oid = profile.instance(profile.status_oid, number)
        try:
            value = await self.pdu.get(self.name, oid)
        except DeviceMismatch as exc:
            raise DeviceMismatch(
                self.name,
                f"outlet {number} has no status on this PDU ({exc.message}); "
                f"check the outlet number and the vendor ({profile.key})",
            ) from None
        reading = integer_value(value)
        if reading is None:
            raise MalformedAnswer(
                self.name, f"status {oid}: expected an INTEGER, got {describe_value(value)}"
            )
        if reading in profile.status_on:
            return PowerState.ON
        if reading in profile.status_off:
            return PowerState.OFF
        raise MalformedAnswer(
            self.name,
            f"status {oid} = {reading}: not a state {profile.key} knows "
            f"(on: {_values(profile.status_on)}, off: {_values(profile.status_off)})",
        )

    async def aclose(self) -> None:
        await self.pdu.aclose()

    async def command(self, target: PowerState) -> None:
        if target is PowerState.MIXED:
            raise ValueError("an outlet can only be switched on or off")
        profile = await self.pdu.profile(self.name)
        command = profile.control_on if target is PowerState.ON else profile.control_off
        oid = profile.instance(command.oid, await self.number())
        await self.pdu.set_integer(self.name, oid, command.value)

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        """The outlet's reboot as a self-timed cycle, when its own duration covers the hold.

        The duration is the PDU's setting, read here, never written: a reboot
        shorter than ``off_seconds`` is not used (the on is then sent by the
        controller after its own hold).
        """
        profile = await self.pdu.profile(self.name)
        if profile.control_reboot is None or profile.reboot_duration_oid is None:
            return TimedOn(None, f"{profile.key}: no outlet reboot with a readable duration")
        oid = profile.instance(profile.reboot_duration_oid, await self.number())
        duration = integer_value(await self.pdu.get(self.name, oid))
        if duration is None or duration < 0:
            return TimedOn(None, f"the outlet's reboot duration {oid} reads no number of seconds")
        if duration < off_seconds:
            return TimedOn(
                None,
                f"the outlet's reboot duration is {duration}s, shorter than the {off_seconds:g}s "
                "hold (set it on the PDU to let the outlet time its own cycle)",
            )
        return TimedOn(float(duration), f"{profile.key} reboot, {duration}s off by the PDU")

    async def command_timed_off(self, on_after_s: float) -> None:
        """The outlet's reboot: off now, on after the PDU's own duration (read in the plan)."""
        profile = await self.pdu.profile(self.name)
        if profile.control_reboot is None:
            raise Refused(self.name, f"{profile.key} has no outlet reboot command")
        oid = profile.instance(profile.control_reboot.oid, await self.number())
        await self.pdu.set_integer(self.name, oid, profile.control_reboot.value)

    async def describe(self) -> OutletDescription:
        """Vendor, outlet number and the PDU's own name for it (``power --check``)."""
        profile = await self.pdu.profile(self.name)
        number = await self.number()
        outlet_name: str | None = None
        if profile.names_oid is not None:
            value = await self.pdu.get(self.name, profile.instance(profile.names_oid, number))
            outlet_name = text_value(value)
        return OutletDescription(
            device=self.name,
            vendor=profile.key,
            sys_object_id=self.pdu.sys_object_id,
            outlet=number,
            outlet_name=outlet_name,
            caveat=profile.caveat,
        )


async def describe_snmp_backend(backend: PowerBackend) -> list[OutletDescription]:
    """Describe each outlet of a backend built by ``build_snmp_backend``."""
    members: Sequence[PowerBackend]
    members = backend.members if isinstance(backend, OutletGroup) else (backend,)
    descriptions = []
    for member in members:
        if not isinstance(member, SnmpOutlet):
            raise TypeError(f"{member.name} is not an SNMP outlet")
        descriptions.append(await member.describe())
    return descriptions


def build_snmp_backend(device: SnmpDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    """An ``SnmpOutlet`` for ``outlet:``, an ``OutletGroup`` of them for ``outlets:``.

    ``secrets`` holds the already-read ``*_file`` values by config key
    (``community_file``, ``auth_key_file``, ``priv_key_file``).
    """
    source = f"snmp device {device.host}"
    problems: list[str] = []
    community, auth_key, priv_key = _secrets_of(device, secrets, problems)
    profile = _profile_of(device, problems)
    if problems:
        raise ConfigError(source, problems)
    credentials = SnmpCredentials(
        version=device.snmp_version,
        community=community,
        user=device.user,
        auth_protocol=device.auth_protocol,
        auth_key=auth_key,
        priv_protocol=device.priv_protocol,
        priv_key=priv_key,
    )
    pdu = SnmpPdu(
        host=device.host,
        port=device.port,
        credentials=credentials,
        timeout=device.timeout,
        retries=device.retries,
        vendor=device.vendor,
        profile=profile,
    )
    if profile is not None and profile.caveat:
        log.warning("%s: unconfirmed profile %s: %s", pdu.label, profile.key, profile.caveat)
    outlets = [SnmpOutlet(pdu, outlet) for outlet in device.outlet_list]
    if device.outlets is None:
        return outlets[0]
    return OutletGroup(outlets)


def _secrets_of(
    device: SnmpDevice, secrets: Mapping[str, Secret], problems: list[str]
) -> tuple[Secret | None, Secret | None, Secret | None]:
    """The community, auth key and priv key the device names; what is wrong goes to problems."""

    def secret(key: str) -> Secret | None:
        if getattr(device, key) is None:
            return None
        value = secrets.get(key)
        if value is None:
            problems.append(f"{key}: the secret was not read (expected it in the secrets given)")
        return value

    community = secret("community_file")
    auth_key = secret("auth_key_file")
    priv_key = secret("priv_key_file")
    for key, value in (("auth_key_file", auth_key), ("priv_key_file", priv_key)):
        if value is not None and len(value.reveal()) < MIN_V3_KEY:
            problems.append(
                f"{key}: SNMPv3 keys must be at least {MIN_V3_KEY} characters (RFC 3414)"
            )
    return community, auth_key, priv_key


def _profile_of(device: SnmpDevice, problems: list[str]) -> PduProfile | None:
    """The PDU profile ``vendor:`` names (None for auto); what is wrong goes to problems."""
    if device.vendor == "generic":
        try:
            return generic_profile(
                control_oid=device.control_oid or "",
                status_oid=device.status_oid or "",
                control_on=_required(device.control_on),
                control_off=_required(device.control_off),
                status_on=_required(device.status_on),
                status_off=_required(device.status_off),
                names_oid=device.names_oid,
            )
        except ValueError as exc:
            problems.append(f"vendor: {exc}")
    elif device.vendor != "auto":
        try:
            return profile_by_name(device.vendor)
        except UnknownVendor as exc:
            problems.append(f"vendor: {exc}")
    return None


def _required(value: int | None) -> int:
    if value is None:
        raise ValueError("generic needs control_on, control_off, status_on and status_off")
    return value


def _values(values: tuple[int, ...]) -> str:
    return "/".join(str(v) for v in values)
