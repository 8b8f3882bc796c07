"""A stateful switched PDU that speaks SNMP on loopback, for tests and the lab.

It answers like a real PDU of one vendor profile (APC rPDU2 by default,
Raritan PX2, or any profile in ``power/snmp_profiles.py``): sysObjectID so
``vendor: auto`` works, an outlet name table, a status column that follows
the control column the way the device does (an immediateOff makes status
read off; a reboot is off, then on after ``reboot_seconds``), optionally
``switch_delay`` seconds late, like a relay behind a management card.

v1/v2c communities (one read-only, one read-write) and SNMPv3 users are
configured like on a real agent. ``on_change`` is called when an outlet's
power really changes, which is how the lab kills and restarts a simulated
host; ``lab.hardware.host_process.HostProcess`` is such a host.

Fault knobs, settable while it runs:

- ``drop_set_responses``: apply a SET but never answer it (the answer was
  lost: the manager must treat it as ambiguous and read back);
- ``refuse``: answer every SET with wrongValue and change nothing;
- ``silent``: answer nothing at all (the PDU's management card is down);
- ``status_fault``: corrupt status reads (``wrong_type``, ``no_such_instance``
  or ``unknown_value``) to exercise the manager's malformed-answer path.

``switch_by_hand`` is a person at the PDU itself: the outlet switches, and
no SET is recorded.

It is an in-process pysnmp command responder with its own MIB
instrumentation (no MIB files, no snmpd), so a test starts it in well under
a second, as root or not. ``PduStandinThread`` runs it on a private event
loop in a background thread; ``python -m spark_watchdog.lab.hardware pdu``
runs it as a process. It binds 127.0.0.0/8 only (or lab/mgmt_switch.py's network).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import shlex
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pysnmp.carrier.asyncio.dgram import udp
from pysnmp.entity import config, engine
from pysnmp.entity.rfc3413 import cmdrsp, context
from pysnmp.error import PySnmpError
from pysnmp.proto import rfc1902, rfc1905
from pysnmp.smi import error as smi_error
from pysnmp.smi import instrum

from spark_watchdog.config.secrets import read_secret
from spark_watchdog.errors import ConfigError
from spark_watchdog.lab.hardware.host_process import HostProcess
from spark_watchdog.power.base import PowerState
from spark_watchdog.power.snmp import AUTH_PROTOCOLS, PRIV_PROTOCOLS
from spark_watchdog.power.snmp_profiles import (
    SYS_DESCR,
    PduProfile,
    oid_parts,
    profile_by_name,
)

StatusFault = Literal["wrong_type", "no_such_instance", "unknown_value"]
Oid = tuple[int, ...]

_SYS_UPTIME = oid_parts("1.3.6.1.2.1.1.3.0")
_SYS_NAME = oid_parts("1.3.6.1.2.1.1.5.0")
_SYS_OBJECT_ID_OID = oid_parts("1.3.6.1.2.1.1.2.0")
_BINDS = [ipaddress.ip_network(n) for n in ("127.0.0.0/8", "198.51.100.0/24")]


@dataclass(frozen=True)
class StandinUser:
    """An SNMPv3 user of the stand-in (test credentials, never real ones)."""

    name: str
    auth_protocol: str | None = None
    auth_key: str | None = None
    priv_protocol: str | None = None
    priv_key: str | None = None

    @property
    def level(self) -> str:
        if self.priv_protocol:
            return "authPriv"
        return "authNoPriv" if self.auth_protocol else "noAuthNoPriv"


@dataclass(frozen=True)
class SetRequest:
    """One SET that reached the stand-in, in arrival order."""

    oid: str
    outlet: int | None
    value: object
    outcome: Literal["applied", "applied_unanswered", "refused"]
    at: float


@dataclass
class _Outlet:
    number: int
    name: str
    on: bool
    # Bumped on each accepted command, so a superseded delayed switch is dropped.
    generation: int = 0


@dataclass
class StandinConfig:
    profile: PduProfile
    outlets: int = 8
    names: dict[int, str] = field(default_factory=dict)
    initially_off: frozenset[int] = frozenset()
    read_community: str = "public"
    write_community: str = "private"
    users: tuple[StandinUser, ...] = ()
    switch_delay: float = 0.0
    reboot_seconds: float = 5.0
    sys_name: str = "pdu-standin"


class _TransportWithSilence(udp.UdpAsyncioTransport):  # type: ignore[misc]
    """UDP transport that drops every datagram while the stand-in is ``silent``."""

    standin: PduStandin | None = None

    def datagram_received(self, datagram: bytes, transportAddress: Any) -> None:
        if self.standin is not None and self.standin.silent:
            return
        super().datagram_received(datagram, transportAddress)


class _PduMib(instrum.AbstractMibInstrumController):  # type: ignore[misc]
    """The stand-in's MIB, computed from its outlet states on every request."""

    def __init__(self, standin: PduStandin) -> None:
        self.standin = standin

    def read_variables(self, *var_binds: Any, **ctx: Any) -> list[tuple[Any, Any]]:
        answers = []
        for name, _ in var_binds:
            oid = tuple(name)
            if _denied("read", name, ctx):
                answers.append((name, rfc1905.noSuchObject))
                continue
            answers.append((name, self.standin._value(oid)))
        return answers

    def read_next_variables(self, *var_binds: Any, **ctx: Any) -> list[tuple[Any, Any]]:
        answers = []
        for name, _ in var_binds:
            current = tuple(name)
            for oid in self.standin._oids():
                if oid > current and not _denied("read", rfc1902.ObjectName(oid), ctx):
                    answers.append((rfc1902.ObjectName(oid), self.standin._value(oid)))
                    break
            else:
                answers.append((name, rfc1905.endOfMibView))
        return answers

    def write_variables(self, *var_binds: Any, **ctx: Any) -> list[tuple[Any, Any]]:
        standin = self.standin
        for idx, (name, _) in enumerate(var_binds):
            if _denied("write", name, ctx):
                raise smi_error.NoAccessError(name=name, idx=idx)
        changes = []
        for idx, (name, value) in enumerate(var_binds):
            oid = tuple(name)
            command = standin._command_for(oid)
            if command is None:
                standin._record(oid, value, "refused")
                raise smi_error.NotWritableError(name=name, idx=idx)
            if standin.refuse:
                standin._record(oid, value, "refused")
                raise smi_error.WrongValueError(name=name, idx=idx)
            if getattr(value, "tagSet", None) != rfc1902.Integer32.tagSet:
                standin._record(oid, value, "refused")
                raise smi_error.WrongTypeError(name=name, idx=idx)
            target = command.get(int(value))
            if target is None:
                standin._record(oid, value, "refused")
                raise smi_error.WrongValueError(name=name, idx=idx)
            changes.append((oid, value, target))
        unanswered = standin.drop_set_responses
        for oid, value, (outlet, action) in changes:
            standin._record(oid, value, "applied_unanswered" if unanswered else "applied")
            standin._apply(outlet, action)
        if unanswered:
            # A plain PySnmpError makes the command responder drop the request
            # without answering (cmdrsp.CommandResponderBase.process_pdu): the
            # SET landed, its answer is lost.
            raise PySnmpError("stand-in fault: SET applied, answer dropped")
        return list(var_binds)


def _denied(view: str, name: Any, ctx: dict[str, Any]) -> bool:
    """VACM: True when ``name`` is outside the requester's read or write view."""
    check = ctx.get("acFun")
    if check is None:
        return False
    return bool(check(view, (name, None), **ctx))


def _define_views(snmp_engine: Any) -> None:
    config.add_context(snmp_engine, b"")
    config.add_vacm_view(snmp_engine, "everything", "included", (1, 3, 6), "")
    # A view with an explicit exclusion, not an empty one: pysnmp 7.1's VACM
    # returns (instead of raising) notInView for a view without entries, which
    # would let a read-only community write.
    config.add_vacm_view(snmp_engine, "nothing", "excluded", (1, 3, 6), "")


def _grant(snmp_engine: Any, model: int, security_name: str, level: str, *, write: bool) -> None:
    """VACM: ``security_name`` may read everything, and write everything if ``write``."""
    (security_level,) = snmp_engine.get_mib_builder().import_symbols(
        "SNMP-FRAMEWORK-MIB", "SnmpSecurityLevel"
    )
    group = f"{security_name}-{model}"
    config.add_vacm_group(snmp_engine, group, model, security_name)
    config.add_vacm_access(
        snmp_engine,
        group,
        b"",
        model,
        security_level(level),
        "exact",
        "everything",
        "everything" if write else "nothing",
        "nothing",
    )


class PduStandin:
    """The stand-in agent. ``start`` and ``stop`` run on the caller's event loop."""

    def __init__(
        self,
        cfg: StandinConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        on_change: Callable[[int, PowerState], None] | None = None,
    ) -> None:
        if not any(ipaddress.ip_address(host) in net for net in _BINDS):
            raise ValueError(f"the PDU stand-in binds loopback only (or {_BINDS[1]}), not {host}")
        if cfg.outlets < 1:
            raise ValueError(f"outlets: expected ≥ 1, got {cfg.outlets}")
        self.cfg = cfg
        self.profile = cfg.profile
        self.host = host
        self.port = port
        self.on_change = on_change
        # Fault knobs (plain attributes: tests flip them from another thread).
        self.drop_set_responses = False
        self.refuse = False
        self.silent = False
        self.status_fault: StatusFault | None = None
        self.set_requests: list[SetRequest] = []
        self.outlets = {
            n: _Outlet(n, cfg.names.get(n, f"Outlet {n}"), n not in cfg.initially_off)
            for n in range(1, cfg.outlets + 1)
        }
        self._engine: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = time.monotonic()
        self._timers: list[asyncio.TimerHandle] = []
        self._prefix: Oid = ()
        self._static_oids: list[Oid] = []
        self._commands: dict[Oid, dict[int, tuple[int, str]]] = {}
        self._columns: dict[Oid, str] = {}
        self._build_tables()

    # -- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        snmp_engine = engine.SnmpEngine()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        transport = _TransportWithSilence()
        transport.standin = self
        config.add_transport(snmp_engine, udp.DOMAIN_NAME, transport.open_server_mode(sock=sock))
        _define_views(snmp_engine)
        for model in (1, 2):  # SNMPv1 and SNMPv2c share the communities
            _grant(snmp_engine, model, "read-area", "noAuthNoPriv", write=False)
            _grant(snmp_engine, model, "write-area", "noAuthNoPriv", write=True)
        config.add_v1_system(snmp_engine, "read-area", self.cfg.read_community)
        config.add_v1_system(snmp_engine, "write-area", self.cfg.write_community)
        for user in self.cfg.users:
            config.add_v3_user(
                snmp_engine,
                user.name,
                AUTH_PROTOCOLS[user.auth_protocol] if user.auth_protocol else config.USM_AUTH_NONE,
                user.auth_key,
                PRIV_PROTOCOLS[user.priv_protocol] if user.priv_protocol else config.USM_PRIV_NONE,
                user.priv_key,
            )
            _grant(snmp_engine, 3, user.name, user.level, write=True)
        snmp_context = context.SnmpContext(snmp_engine)
        snmp_context.unregister_context_name(b"")
        snmp_context.register_context_name(b"", _PduMib(self))
        cmdrsp.GetCommandResponder(snmp_engine, snmp_context)
        cmdrsp.NextCommandResponder(snmp_engine, snmp_context)
        cmdrsp.BulkCommandResponder(snmp_engine, snmp_context)
        cmdrsp.SetCommandResponder(snmp_engine, snmp_context)
        # Wait until the socket is really attached to the loop.
        for _ in range(100):
            if transport.transport is not None:
                break
            await asyncio.sleep(0.01)
        self._engine = snmp_engine

    async def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if self._engine is not None:
            self._engine.close_dispatcher()
            self._engine = None

    # -- observation ------------------------------------------------------------

    def state(self, outlet: int) -> PowerState:
        return PowerState.ON if self.outlets[outlet].on else PowerState.OFF

    def sets_for(self, outlet: int) -> list[SetRequest]:
        """The SET requests that addressed ``outlet``."""
        return [s for s in self.set_requests if s.outlet == outlet]

    # -- tables -----------------------------------------------------------------

    def _build_tables(self) -> None:
        p = self.profile
        prefix = oid_parts(p.index_prefix) if p.index_prefix else ()
        self._columns[oid_parts(p.status_oid)] = "status"
        if p.names_oid is not None:
            self._columns[oid_parts(p.names_oid)] = "name"
        if p.reboot_duration_oid is not None:
            self._columns[oid_parts(p.reboot_duration_oid)] = "reboot_duration"
        commands = [(p.control_on, "on"), (p.control_off, "off")]
        if p.control_reboot is not None:
            commands.append((p.control_reboot, "reboot"))
        for command, _ in commands:
            # sPDUOutletCtl is status and control at once: keep it a status column.
            self._columns.setdefault(oid_parts(command.oid), "control")
        oids: set[Oid] = {oid_parts(SYS_DESCR), _SYS_OBJECT_ID_OID, _SYS_UPTIME, _SYS_NAME}
        for column in self._columns:
            oids.update(column + prefix + (n,) for n in self.outlets)
        for command, action in commands:
            for n in self.outlets:
                instance = oid_parts(command.oid) + prefix + (n,)
                self._commands.setdefault(instance, {})[command.value] = (n, action)
        self._static_oids = sorted(oids)
        self._prefix = prefix

    def _oids(self) -> list[Oid]:
        return self._static_oids

    def _locate(self, oid: Oid) -> tuple[str, int] | None:
        """(column role, outlet) for an outlet instance OID."""
        for column, role in self._columns.items():
            head = column + self._prefix
            if oid[: len(head)] == head and len(oid) == len(head) + 1:
                outlet = oid[-1]
                if outlet in self.outlets:
                    return role, outlet
        return None

    def _value(self, oid: Oid) -> Any:
        p = self.profile
        if oid == oid_parts(SYS_DESCR):
            return rfc1902.OctetString(f"spark_watchdog PDU stand-in ({p.title})")
        if oid == _SYS_OBJECT_ID_OID:
            if not p.sys_object_ids:
                return rfc1902.ObjectIdentifier((1, 3, 6, 1, 4, 1, 99999))
            return rfc1902.ObjectIdentifier(oid_parts(p.sys_object_ids[0]))
        if oid == _SYS_UPTIME:
            return rfc1902.TimeTicks(int((time.monotonic() - self._started) * 100))
        if oid == _SYS_NAME:
            return rfc1902.OctetString(self.cfg.sys_name)
        located = self._locate(oid)
        if located is None:
            return rfc1905.noSuchObject
        role, n = located
        outlet = self.outlets[n]
        if role == "name":
            return rfc1902.OctetString(outlet.name)
        if role == "reboot_duration":
            return rfc1902.Integer32(round(self.cfg.reboot_seconds))
        if role == "status":
            if self.status_fault == "wrong_type":
                return rfc1902.OctetString("on")
            if self.status_fault == "no_such_instance":
                return rfc1905.noSuchInstance
            if self.status_fault == "unknown_value":
                return rfc1902.Integer32(99)
            return rfc1902.Integer32(p.status_on[0] if outlet.on else p.status_off[0])
        # A control column read gives the command that matches the state
        # (rPDU2OutletSwitchedControlCommand's DESCRIPTION in PowerNet-MIB).
        command = p.control_on if outlet.on else p.control_off
        if oid_parts(command.oid) == oid[: -1 - len(self._prefix)]:
            return rfc1902.Integer32(command.value)
        return rfc1902.Integer32(-1)  # Eaton-style per-action column: nothing pending

    def _command_for(self, oid: Oid) -> dict[int, tuple[int, str]] | None:
        return self._commands.get(oid)

    # -- switching --------------------------------------------------------------

    def _record(self, oid: Oid, value: Any, outcome: Any) -> None:
        try:
            shown: object = int(value)
        except (TypeError, ValueError):
            shown = str(value)
        located = self._locate(oid)
        outlet = None if located is None else located[1]
        self.set_requests.append(
            SetRequest(".".join(map(str, oid)), outlet, shown, outcome, time.monotonic())
        )

    def switch_by_hand(self, n: int, on: bool) -> None:
        """A person at the PDU (its front panel or web page) switches outlet ``n``.

        The relay switches like after any command (``switch_delay`` late), but
        no SNMP SET is involved: ``set_requests`` stays what managers sent.
        Call it on the stand-in's loop (``PduStandinThread.call``).
        """
        if n not in self.outlets:
            raise ValueError(f"outlet {n}: expected 1 to {len(self.outlets)}")
        self._apply(n, "on" if on else "off")

    def _apply(self, n: int, action: str) -> None:
        outlet = self.outlets[n]
        outlet.generation += 1
        generation = outlet.generation
        if action == "reboot":
            self._later(self.cfg.switch_delay, n, generation, False)
            self._later(self.cfg.switch_delay + self.cfg.reboot_seconds, n, generation, True)
        else:
            self._later(self.cfg.switch_delay, n, generation, action == "on")

    def _later(self, delay: float, n: int, generation: int, on: bool) -> None:
        if delay <= 0:
            self._switch(n, generation, on)
            return
        assert self._loop is not None
        self._timers.append(self._loop.call_later(delay, self._switch, n, generation, on))

    def _switch(self, n: int, generation: int, on: bool) -> None:
        outlet = self.outlets[n]
        if outlet.generation != generation or outlet.on == on:
            return
        outlet.on = on
        if self.on_change is not None:
            self.on_change(n, PowerState.ON if on else PowerState.OFF)


class PduStandinThread:
    """Runs a ``PduStandin`` on its own event loop in a daemon thread."""

    def __init__(self, standin: PduStandin) -> None:
        self.standin = standin
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="pdu-standin", daemon=True)
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.standin.port

    def start(self, timeout: float = 10.0) -> PduStandinThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"PDU stand-in did not start within {timeout:g}s")
        if self._error is not None:
            raise RuntimeError(f"PDU stand-in failed to start: {self._error}") from self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self.standin.stop(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def call(self, fn: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Run ``fn`` on the stand-in's loop (to read or change its state safely)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def __enter__(self) -> PduStandinThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.standin.start())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()


# -- standalone -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_watchdog.lab.hardware pdu",
        description="A stateful switched PDU on loopback SNMP (lab and tests).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="127.0.0.0/8 address to bind")
    parser.add_argument("--port", type=int, default=0, help="UDP port (0: pick a free one)")
    parser.add_argument("--vendor", default="apc_rpdu2", help="profile to speak")
    parser.add_argument("--outlets", type=int, default=8)
    parser.add_argument("--name", action="append", default=[], metavar="N=NAME")
    parser.add_argument("--off", action="append", type=int, default=[], metavar="N")
    parser.add_argument("--read-community-file", help="default community: public")
    parser.add_argument("--write-community-file", help="default community: private")
    parser.add_argument("--v3-user", help="an SNMPv3 user name")
    parser.add_argument("--auth-protocol", choices=sorted(AUTH_PROTOCOLS))
    parser.add_argument("--auth-key-file")
    parser.add_argument("--priv-protocol", choices=sorted(PRIV_PROTOCOLS))
    parser.add_argument("--priv-key-file")
    parser.add_argument("--switch-delay", type=float, default=0.0)
    parser.add_argument("--reboot-seconds", type=float, default=5.0)
    parser.add_argument(
        "--host-command",
        action="append",
        default=[],
        metavar="N=COMMAND",
        help="outlet N powers this command: off kills its process group, on starts it",
    )
    parser.add_argument("--boot-seconds", type=float, default=0.0)
    return parser


def _pairs(values: list[str], what: str) -> dict[int, str]:
    pairs = {}
    for value in values:
        number, sep, rest = value.partition("=")
        if not sep or not number.isdigit():
            raise SystemExit(f"{what}: expected N=VALUE, got {value!r}")
        pairs[int(number)] = rest
    return pairs


def config_from_args(args: argparse.Namespace) -> StandinConfig:
    def secret(key: str, path: str | None, default: str | None) -> str | None:
        return default if path is None else read_secret(key, path).reveal()

    users: tuple[StandinUser, ...] = ()
    if args.v3_user:
        users = (
            StandinUser(
                args.v3_user,
                args.auth_protocol,
                secret("auth_key_file", args.auth_key_file, None),
                args.priv_protocol,
                secret("priv_key_file", args.priv_key_file, None),
            ),
        )
    return StandinConfig(
        profile=profile_by_name(args.vendor),
        outlets=args.outlets,
        names=_pairs(args.name, "--name"),
        initially_off=frozenset(args.off),
        read_community=secret("read_community_file", args.read_community_file, "public") or "",
        write_community=secret("write_community_file", args.write_community_file, "private") or "",
        users=users,
        switch_delay=args.switch_delay,
        reboot_seconds=args.reboot_seconds,
    )


async def _serve(args: argparse.Namespace) -> None:
    cfg = config_from_args(args)

    def booted(outlet: int) -> Callable[[int], None]:
        return lambda pid: print(f"host {outlet} up pid={pid}", flush=True)

    hosts = {
        n: HostProcess(shlex.split(cmd), boot_seconds=args.boot_seconds, on_boot=booted(n))
        for n, cmd in _pairs(args.host_command, "--host-command").items()
    }

    def on_change(outlet: int, state: PowerState) -> None:
        print(f"outlet {outlet} {state.value}", flush=True)
        host = hosts.get(outlet)
        if host is not None:
            host.power(state)
            if state is PowerState.OFF:
                print(f"host {outlet} down", flush=True)

    standin = PduStandin(cfg, host=args.host, port=args.port, on_change=on_change)
    await standin.start()
    for n, host in hosts.items():
        if standin.outlets.get(n) is not None and standin.outlets[n].on:
            host.power_on()
    print(
        f"pdu-standin ready host={standin.host} port={standin.port} "
        f"vendor={cfg.profile.key} outlets={cfg.outlets}",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await standin.stop()
        for host in hosts.values():
            host.power_off()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except (ValueError, OSError, LookupError, ConfigError) as exc:
        print(f"pdu-standin: {exc}", file=sys.stderr)
        return 2
    return 0
