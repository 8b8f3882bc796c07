"""Switched PDU outlets over SNMP v1, v2c and v3: the power path of last resort.

A DGX Spark has no BMC: when the host freezes, switching its PDU outlet off
and on again is the only way back. This module is the only place in the
watchdog that imports pysnmp (openstack/ironic dropped its SNMP driver when
the pysnmp API broke under it; keeping the dependency in one file keeps the
next break small). The lab's PDU stand-in is the other user: it is an SNMP
agent, built on pysnmp's agent side, for tests only.

What an SNMP answer means for a power action:

- a read that gets no answer (wrong community, dead host, a v3 key the agent
  rejects) is ``Unreachable``; reads use the configured ``retries``;
- a SET is sent once (``retries=0``): pysnmp's own retries would resend it,
  which is a blind retry. A SET that gets no answer is ``Ambiguous`` (it may
  have landed); an error status (wrongValue, notWritable, noAccess, ...) is
  ``Refused``; a v3 security report (unknown user, wrong digest) means the
  agent dropped the request unprocessed, so ``Unreachable``;
- an answer of the wrong type or with a value the profile does not know is
  ``MalformedAnswer``; an outlet or name the PDU does not have is
  ``DeviceMismatch``. Neither is ever guessed into on or off.

Verification, polling and spacing are ``VerifiedPower``'s job, not this one's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyasn1.type import univ
from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config as snmp_config
from pysnmp.error import PySnmpError
from pysnmp.hlapi.v3arch.asyncio import (
    CommunityData,
    ContextData,
    Integer32,
    ObjectIdentity,
    ObjectType,
    SnmpEngine,
    UdpTransportTarget,
    UsmUserData,
    get_cmd,
    next_cmd,
    set_cmd,
    usm3DESEDEPrivProtocol,
    usmAesCfb128Protocol,
    usmAesCfb192Protocol,
    usmAesCfb256Protocol,
    usmDESPrivProtocol,
    usmHMAC128SHA224AuthProtocol,
    usmHMAC192SHA256AuthProtocol,
    usmHMAC256SHA384AuthProtocol,
    usmHMAC384SHA512AuthProtocol,
    usmHMACMD5AuthProtocol,
    usmHMACSHAAuthProtocol,
    usmNoAuthProtocol,
    usmNoPrivProtocol,
)
from pysnmp.proto import errind
from pysnmp.proto.rfc1902 import OctetString
from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance, NoSuchObject

from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import (
    Ambiguous,
    PowerError,
    Refused,
    SendRefused,
    Unreachable,
)
from spark_watchdog.power import send_window
from spark_watchdog.power.snmp_command import CommandSocket
from spark_watchdog.power.snmp_profiles import (
    SYS_OBJECT_ID,
    PduProfile,
    UnknownVendor,
    normalize_oid,
    oid_parts,
    profile_by_name,
    profile_for_sys_object_id,
)

log = logging.getLogger("spark_watchdog.power.snmp")

# Config names -> pysnmp protocol ids. AES192/AES256 are the "Reeder" key
# extension pysnmp calls usmAesCfb192/256Protocol (Cisco-style, what
# openstack/ironic mapped 'aes192'/'aes256' to); AES-128 needs no extension.
AUTH_PROTOCOLS: Mapping[str, Any] = {
    "MD5": usmHMACMD5AuthProtocol,
    "SHA": usmHMACSHAAuthProtocol,
    "SHA224": usmHMAC128SHA224AuthProtocol,
    "SHA256": usmHMAC192SHA256AuthProtocol,
    "SHA384": usmHMAC256SHA384AuthProtocol,
    "SHA512": usmHMAC384SHA512AuthProtocol,
}
PRIV_PROTOCOLS: Mapping[str, Any] = {
    "DES": usmDESPrivProtocol,
    "3DES": usm3DESEDEPrivProtocol,
    "AES": usmAesCfb128Protocol,
    "AES128": usmAesCfb128Protocol,
    "AES192": usmAesCfb192Protocol,
    "AES256": usmAesCfb256Protocol,
}

# Error indications that mean the agent (or our own engine) dropped the
# request before it was processed: USM reports (RFC 3414 3.2) and failures to
# build or encrypt the message. A SET that ends this way certainly did not land.
_NOT_PROCESSED = (
    errind.UnknownUserName,
    errind.WrongDigest,
    errind.UnsupportedSecurityLevel,
    errind.UnknownSecurityName,
    errind.UnknownEngineID,
    errind.NotInTimeWindow,
    errind.DecryptionError,
    errind.AuthenticationFailure,
    errind.AuthenticationError,
    errind.EncryptionError,
    errind.NoEncryption,
    errind.NoAuthentication,
    errind.UnsupportedAuthProtocol,
    errind.UnsupportedPrivProtocol,
    errind.SerializationError,
    errind.TooBig,
)

_MAX_NAME_ROWS = 1024  # bigger than any PDU; bounds a walk of a misbehaving agent
# Outlet names are walked again when older than this: a relabelled or re-cabled
# outlet must not keep the old number for the life of the controller, and one
# power cycle (60 s off by default) should not walk more than a few times.
NAMES_MAX_AGE_S = 30.0
MIN_V3_KEY = 8  # RFC 3414 11.2: pass phrases shorter than 8 octets are refused


class _NoMibCompiler:
    """Stands in for pysmi's MIB compiler: this module speaks numeric OIDs only.

    With pysmi installed, pysnmp attaches a compiler to every new engine on
    its first request (about a second of parser building), and would compile
    (or look for) MIB files for anything it cannot resolve. Neither is wanted.
    """

    def compile(self, *names: str, **options: Any) -> dict[str, str]:
        return dict.fromkeys(names, "missing")


def _new_engine() -> SnmpEngine:
    engine = SnmpEngine()
    builder = engine.get_mib_builder()
    builder.set_mib_compiler(_NoMibCompiler(), builder.get_mib_sources()[0].full_path())
    return engine


class MalformedAnswer(PowerError):
    """The device answered, but not with something this profile understands."""


class DeviceMismatch(PowerError):
    """The device is not what the config says: unknown model, no such outlet or name."""


@dataclass(frozen=True)
class SnmpCredentials:
    """Community (v1/v2c) or USM user (v3). Keys stay ``Secret`` until pysnmp needs them."""

    version: str
    community: Secret | None = None
    user: str | None = None
    auth_protocol: str | None = None
    auth_key: Secret | None = None
    priv_protocol: str | None = None
    priv_key: Secret | None = None

    @property
    def description(self) -> str:
        """For messages: the security parameters, never a secret."""
        if self.version != "3":
            return f"SNMPv{self.version} community from the community file"
        level = "authPriv" if self.priv_key else "authNoPriv" if self.auth_key else "noAuthNoPriv"
        protocols = "/".join(p for p in (self.auth_protocol, self.priv_protocol) if p)
        return f"SNMPv3 user {self.user!r} {level}" + (f" ({protocols})" if protocols else "")

    def auth_data(self) -> CommunityData | UsmUserData:
        if self.version in ("1", "2c"):
            if self.community is None:
                raise ValueError(f"SNMPv{self.version} needs a community")
            return CommunityData(self.community.reveal(), mpModel=0 if self.version == "1" else 1)
        if self.user is None:
            raise ValueError("SNMPv3 needs a user")
        return UsmUserData(
            self.user,
            authKey=None if self.auth_key is None else self.auth_key.reveal(),
            privKey=None if self.priv_key is None else self.priv_key.reveal(),
            authProtocol=(
                usmNoAuthProtocol
                if self.auth_protocol is None
                else AUTH_PROTOCOLS[self.auth_protocol]
            ),
            privProtocol=(
                usmNoPrivProtocol
                if self.priv_protocol is None
                else PRIV_PROTOCOLS[self.priv_protocol]
            ),
        )


@dataclass(frozen=True)
class OutletDescription:
    """What ``power --check`` shows about one configured outlet."""

    device: str
    vendor: str
    sys_object_id: str | None
    outlet: int
    outlet_name: str | None
    caveat: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "vendor": self.vendor,
            "sys_object_id": self.sys_object_id,
            "outlet": self.outlet,
            "outlet_name": self.outlet_name,
            "caveat": self.caveat,
        }


class SnmpPdu:
    """One SNMP agent: transport, credentials and the vendor profile, found once.

    The vendor profile is looked up once; outlet names are walked again when
    older than ``NAMES_MAX_AGE_S``. A failed lookup is tried again on the
    next call.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        credentials: SnmpCredentials,
        timeout: float = 2.0,
        retries: int = 1,
        vendor: str = "auto",
        profile: PduProfile | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if vendor not in ("auto", "generic") and profile is None:
            profile = profile_by_name(vendor)
        if vendor == "generic" and profile is None:
            raise ValueError("vendor generic needs a profile built from the config")
        self.host = host
        self.port = port
        self.credentials = credentials
        self.timeout = timeout
        self.retries = retries
        self.vendor = vendor
        self._profile = profile
        self._sys_object_id: str | None = None
        self._names: dict[int, str] | None = None
        self._names_at = 0.0
        self._clock = clock
        self._engine_instance: SnmpEngine | None = None
        self._engine_loop: asyncio.AbstractEventLoop | None = None
        self._command: tuple[asyncio.AbstractEventLoop, SnmpEngine, CommandSocket] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def label(self) -> str:
        """``snmp apc_rpdu2 10.0.0.5:161``; the vendor only when it was configured."""
        if self.vendor == "auto":
            return f"snmp {self.address}"
        return f"snmp {self.vendor} {self.address}"

    @property
    def limiter_key(self) -> str:
        return f"snmp:{self.address}"

    @property
    def sys_object_id(self) -> str | None:
        """The device's sysObjectID, once ``vendor: auto`` has asked for it."""
        return self._sys_object_id

    # -- vendor and names -----------------------------------------------------

    async def profile(self, device: str) -> PduProfile:
        """The vendor profile: configured, or chosen by the device's sysObjectID."""
        if self._profile is not None:
            return self._profile
        # Two concurrent first calls may both ask: harmless, the answer is the same.
        value = await self.get(device, SYS_OBJECT_ID)
        if getattr(value, "tagSet", None) != univ.ObjectIdentifier.tagSet:
            raise MalformedAnswer(
                device,
                f"sysObjectID.0 ({SYS_OBJECT_ID}): expected an OBJECT IDENTIFIER, "
                f"got {describe_value(value)}",
            )
        self._sys_object_id = "." + str(value)
        try:
            profile = profile_for_sys_object_id(self._sys_object_id)
        except UnknownVendor as exc:
            raise DeviceMismatch(device, str(exc)) from None
        if profile.caveat:
            log.warning(
                "%s: sysObjectID %s -> %s; unconfirmed profile: %s",
                device,
                self._sys_object_id,
                profile.key,
                profile.caveat,
            )
        self._profile = profile
        return self._profile

    async def outlet_names(self, device: str | None = None) -> dict[int, str]:
        """Outlet number -> name, as the PDU reports them (cached for NAMES_MAX_AGE_S)."""
        device = device or self.label
        if self._names is not None and self._clock() - self._names_at < NAMES_MAX_AGE_S:
            return dict(self._names)
        profile = await self.profile(device)
        root = profile.names_root()
        if root is None:
            raise DeviceMismatch(
                device, f"profile {profile.key} has no outlet names table; use outlet numbers"
            )
        names: dict[int, str] = {}
        for suffix, value in await self.walk(device, root):
            if len(suffix) != 1:
                continue  # another unit of a daisy chain: not addressable by this profile
            names[suffix[0]] = text_value(value)
        self._names, self._names_at = names, self._clock()
        return dict(names)

    async def resolve_outlet(self, device: str, outlet: int | str) -> int:
        if isinstance(outlet, int):
            return outlet
        names = await self.outlet_names(device)
        wanted = outlet.strip()
        matches = sorted(n for n, name in names.items() if name.strip() == wanted)
        seen = ", ".join(f"{n}={name!r}" for n, name in sorted(names.items())) or "none"
        if not matches:
            self._names = None  # renamed on the PDU? walk again next time
            raise DeviceMismatch(device, f'no outlet named "{wanted}"; names seen: {seen}')
        if len(matches) > 1:
            raise DeviceMismatch(
                device,
                f'outlet name "{wanted}" is ambiguous (outlets {matches}); '
                f"use the number. Names seen: {seen}",
            )
        return matches[0]

    # -- the three SNMP operations --------------------------------------------

    async def get(self, device: str, oid: str) -> Any:
        """GET one instance; ``Unreachable`` on silence. Returns the pysnmp value."""
        oid = normalize_oid(oid)
        engine = self._engine()
        try:
            target = await self._target(device, self.retries)
            call = self._get_request(engine, target, oid)
            indication, status, index, var_binds = await self._bounded_read(device, call)
        except PySnmpError as exc:
            raise Unreachable(device, f"GET {oid} failed before an answer: {exc}") from None
        if indication:
            raise self._silence(device, f"GET {oid}", indication)
        if status:
            raise self._status_error(device, f"GET {oid}", status, index)
        if len(var_binds) != 1:
            raise MalformedAnswer(
                device, f"GET {oid}: expected 1 variable in the answer, got {len(var_binds)}"
            )
        name, value = var_binds[0]
        if tuple(name) != oid_parts(oid):
            raise MalformedAnswer(device, f"GET {oid}: the answer is for another OID ({name})")
        if isinstance(value, (NoSuchInstance, NoSuchObject, EndOfMibView)):
            raise DeviceMismatch(
                device, f"{oid} does not exist on this device ({describe_value(value)})"
            )
        await self._prime_command_engine(device)
        return value

    def _get_request(self, engine: SnmpEngine, target: Any, oid: str) -> Any:
        """A GET of one instance through ``engine``, as a coroutine to await."""
        return get_cmd(
            engine,
            self.credentials.auth_data(),
            target,
            ContextData(),
            ObjectType(ObjectIdentity(oid)),
            lookupMib=False,
        )

    async def _prime_command_engine(self, device: str) -> None:
        """Once per command engine, after a read the PDU answered: one GET
        through it, so that what a first request costs (about 50 ms of engine
        set-up, an SNMPv3 discovery) is paid now, not between a command's
        step and its datagram. Its outcome does not matter, and it takes at
        most one ``timeout`` (a single try) on top of the read."""
        engine, socket = self._command_engine()
        if socket.primed:
            return
        socket.primed = True
        async with socket.lock:
            socket.arm(None)
            try:
                target = await self._target(device, retries=0)
                call = self._get_request(engine, target, SYS_OBJECT_ID)
                await asyncio.wait_for(call, self.timeout)
            except (asyncio.TimeoutError, PySnmpError, Unreachable) as exc:
                log.debug("%s: the command engine's first GET: %s", device, exc)
            finally:
                socket.disarm()

    async def set_integer(self, device: str, oid: str, value: int) -> None:
        """SET one INTEGER, sent exactly once (no pysnmp retries), each of its
        datagrams checked against the caller's send window right before it
        leaves (power/snmp_command.py)."""
        oid = normalize_oid(oid)
        what = f"SET {oid} = {value}"
        window = send_window.current()  # the caller's, read in its own task
        engine, socket = self._command_engine()
        async with socket.lock:
            target = await self._target(device, retries=0)  # Unreachable: nothing sent yet
            withheld = socket.arm(window)
            answer = None
            try:
                answer = await self._set_once(device, what, engine, target, oid, value, withheld)
                if answer is None:
                    why = withheld.result()
                    if socket.left:
                        # A datagram of it left before (a v3 discovery, say): it may have landed.
                        raise Ambiguous(
                            device, f"{what}: stopped part-way ({why}); it may have been applied"
                        )
                    raise SendRefused(device, f"{what} not sent: {why}")
            finally:
                socket.disarm()
                if answer is None:
                    self._renew_command_engine(engine)
        _read_set_answer(device, what, answer, self.timeout, self.credentials.description)

    async def _set_once(
        self,
        device: str,
        what: str,
        engine: SnmpEngine,
        target: UdpTransportTarget,
        oid: str,
        value: int,
        withheld: asyncio.Future[str],
    ) -> Any:
        """The SET's answer, or None when the command socket held it back."""
        call = asyncio.ensure_future(
            set_cmd(
                engine,
                self.credentials.auth_data(),
                target,
                ContextData(),
                ObjectType(ObjectIdentity(oid), Integer32(value)),
                lookupMib=False,
            )
        )
        # One try: timeout plus slack for the v3 engine discovery round trip.
        limit = 2 * self.timeout + 1.0
        try:
            await asyncio.wait({call, withheld}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not call.done():
                call.cancel()
        if call.done() and not call.cancelled():
            try:
                return call.result()
            except PySnmpError as exc:
                raise Ambiguous(
                    device, f"{what}: the SNMP engine failed while sending ({exc}); not resent"
                ) from None
        if withheld.done():
            return None
        raise Ambiguous(
            device,
            f"{what} sent, no answer within {limit:g}s; it may have been applied "
            "(not resent: read the state)",
        )

    async def walk(self, device: str, root: str) -> list[tuple[tuple[int, ...], Any]]:
        """GETNEXT under ``root``: (index suffix, value) pairs, bounded in rows."""
        root_parts = oid_parts(root)
        rows: list[tuple[tuple[int, ...], Any]] = []
        cursor = normalize_oid(root)
        engine = self._engine()
        try:
            target = await self._target(device, self.retries)
            auth = self.credentials.auth_data()
            while len(rows) < _MAX_NAME_ROWS:
                call = next_cmd(
                    engine,
                    auth,
                    target,
                    ContextData(),
                    ObjectType(ObjectIdentity(cursor)),
                    lookupMib=False,
                )
                indication, status, index, var_binds = await self._bounded_read(device, call)
                if indication:
                    raise self._silence(device, f"GETNEXT {cursor}", indication)
                if status:
                    if _status_name(status) == "noSuchName":
                        break  # SNMPv1's end of the MIB view
                    raise self._status_error(device, f"GETNEXT {cursor}", status, index)
                if not var_binds:
                    break
                name, value = var_binds[0]
                parts = tuple(name)
                if isinstance(value, EndOfMibView) or parts[: len(root_parts)] != root_parts:
                    break
                if parts <= oid_parts(cursor):
                    raise MalformedAnswer(
                        device, f"GETNEXT {cursor} answered {name}: OIDs not increasing"
                    )
                rows.append((parts[len(root_parts) :], value))
                cursor = ".".join(str(p) for p in parts)
        except PySnmpError as exc:
            raise Unreachable(device, f"walk of {root} failed: {exc}") from None
        return rows

    async def aclose(self) -> None:
        """Close the engine's socket if it runs on this loop; a later call opens a new one."""
        if self._engine_instance is not None and self._engine_loop is asyncio.get_running_loop():
            self._engine_instance.close_dispatcher()
        self._engine_instance = None
        self._engine_loop = None
        if self._command is not None and self._command[0] is asyncio.get_running_loop():
            self._command[1].close_dispatcher()
        self._command = None

    # -- internals ------------------------------------------------------------

    def _engine(self) -> SnmpEngine:
        """The pysnmp engine of this PDU on the running event loop.

        One engine per PDU and loop: it keeps one UDP socket and the agent's
        SNMPv3 engine id and time window between calls. pysnmp binds an engine
        to the loop it first ran on, so a new loop (a new ``asyncio.run``)
        gets a new engine; the old one went with its loop.
        """
        loop = asyncio.get_running_loop()
        if self._engine_instance is None or self._engine_loop is not loop:
            self._engine_instance = _new_engine()
            self._engine_loop = loop
            # The SETs' engine too, now: building one takes about 0.1 s, which
            # would otherwise fall between a command's step and its datagram.
            self._command_engine()
        return self._engine_instance

    def _command_engine(self) -> tuple[SnmpEngine, CommandSocket]:
        """The engine of this PDU's SETs on the running loop, and its checked socket."""
        loop = asyncio.get_running_loop()
        if self._command is None or self._command[0] is not loop:
            engine = _new_engine()
            socket = CommandSocket()
            snmp_config.add_transport(engine, udp.DOMAIN_NAME, socket.open_client_mode())
            self._command = (loop, engine, socket)
        return self._command[1], self._command[2]

    def _renew_command_engine(self, used: SnmpEngine) -> None:
        """After a SET without an answer: its engine may still hold the request
        (and resend it on a late SNMPv3 report); a new one takes over at once.
        Unless ``aclose`` closed it meanwhile: then nothing is opened again."""
        if self._command is None or self._command[1] is not used:
            return
        self._command[1].close_dispatcher()
        self._command = None
        self._command_engine()

    async def _target(self, device: str, retries: int) -> UdpTransportTarget:
        try:
            return await UdpTransportTarget.create(
                (self.host, self.port), timeout=self.timeout, retries=retries
            )
        except PySnmpError as exc:
            raise Unreachable(device, f"cannot resolve {self.host}: {exc}") from None

    async def _bounded_read(self, device: str, call: Any) -> Any:
        # pysnmp times out by itself; this outer bound only catches a stuck engine.
        limit = (self.timeout + 0.5) * (self.retries + 1) + 2 * self.timeout + 1.0
        try:
            return await asyncio.wait_for(call, limit)
        except asyncio.TimeoutError:
            raise Unreachable(device, f"no answer from {self.address} within {limit:g}s") from None

    def _silence(self, device: str, what: str, indication: Any) -> Unreachable:
        tries = self.retries + 1
        return Unreachable(
            device,
            f"{what}: no usable answer from {self.address} ({indication}) after {tries} "
            f"tr{'y' if tries == 1 else 'ies'} of {self.timeout:g}s; expected an SNMP agent "
            f"accepting {self.credentials.description}",
        )

    def _status_error(self, device: str, what: str, status: Any, index: Any) -> PowerError:
        name = _status_name(status)
        if name == "noSuchName":
            return DeviceMismatch(device, f"{what}: the device has no such object (noSuchName)")
        return Refused(device, f"{what}: the device answered {name} (index {int(index)})")


def _read_set_answer(device: str, what: str, answer: Any, timeout: float, credentials: str) -> None:
    """What a SET's answer means: nothing when it was applied; ``Unreachable``
    when the agent dropped it unprocessed (a v3 security report), ``Ambiguous``
    when no answer came (it may have landed), ``Refused`` for an error status
    or an exception value (``credentials``: their description, for the hint)."""
    indication, status, _, var_binds = answer
    if indication:
        if isinstance(indication, _NOT_PROCESSED):
            raise Unreachable(
                device,
                f"{what} not applied: {indication} (check {credentials})",
            )
        raise Ambiguous(
            device,
            f"{what} sent, no answer ({indication}) within {timeout:g}s; "
            "it may have been applied (not resent: read the state)",
        )
    if status:
        raise Refused(
            device,
            f"{what} refused: {_status_name(status)} "
            "(expected the PDU to accept the outlet command; check write access "
            f"for {credentials} and the vendor profile)",
        )
    for _, answer in var_binds:
        # A SET answer never carries an exception value (RFC 3416 4.2.5);
        # some agents (snmpsim among them) answer a non-existent or
        # read-only instance this way instead of with an error status.
        if isinstance(answer, (NoSuchInstance, NoSuchObject, EndOfMibView)):
            raise Refused(
                device,
                f"{what} not applied: the device answered {describe_value(answer)} "
                "(no writable outlet command at that OID; check the vendor profile)",
            )


# -- value helpers --------------------------------------------------------------


def integer_value(value: Any) -> int | None:
    """An INTEGER (Integer32) as int; None for any other type, Gauge32 and friends included."""
    # Compare ASN.1 tags: the decoder hands back pyasn1 base types, and Gauge32,
    # Counter32 or TimeTicks are integers too but not an INTEGER status.
    if getattr(value, "tagSet", None) == univ.Integer.tagSet:
        return int(value)
    return None


def text_value(value: Any) -> str:
    if isinstance(value, OctetString):
        return bytes(value).decode("utf-8", errors="replace").strip()
    return str(value).strip()


def describe_value(value: Any) -> str:
    kind = type(value).__name__
    if isinstance(value, (NoSuchInstance, NoSuchObject, EndOfMibView)):
        return kind
    try:
        shown = value.prettyPrint()
    except Exception:  # a value pysnmp itself cannot print: show its type only
        return kind
    return f"{kind} {shown!r}"


def _status_name(status: Any) -> str:
    try:
        return str(status.prettyPrint())
    except AttributeError:
        return str(status)


__all__ = [
    "AUTH_PROTOCOLS",
    "MIN_V3_KEY",
    "PRIV_PROTOCOLS",
    "DeviceMismatch",
    "MalformedAnswer",
    "OutletDescription",
    "SnmpCredentials",
    "SnmpPdu",
    "describe_value",
    "integer_value",
    "text_value",
]
