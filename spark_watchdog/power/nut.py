"""An outlet of a UPS or PDU that Network UPS Tools drives, through ``upsd``.

NUT's network protocol (networkupstools.org, developer guide, "Network
protocol information"): plain text lines over TCP, port 3493. One short
session per call:

- a read: ``GET VAR <ups> outlet.<n>.status`` answers
  ``VAR <ups> outlet.<n>.status "on"`` (or ``"off"``), no login needed;
- a command: ``USERNAME``, ``PASSWORD`` (upsd answers ``OK`` to both and
  checks them only when the command comes), then ``INSTCMD <ups>
  outlet.<n>.load.off`` (``load.on``), answered ``OK`` or ``ERR <reason>``;
  then ``LOGOUT``.

``LOGIN`` is not used: it registers the client as a system the UPS powers
(counted in ``NUMLOGINS``, waited for by upsmon before a forced shutdown),
which a power controller is not; ``upscmd`` does without it too.

upsd's ``OK`` to an INSTCMD means it handed the command to the driver, not
that the outlet switched (without ``TRACKING`` it cannot say more): the
read-back decides. An ``ERR`` from upsd before the driver was involved (the
credentials, a command the driver does not offer, an unknown UPS) means
nothing was sent (``Refused``); ``ERR DRIVER-NOT-CONNECTED`` likewise
(``Unreachable``); a silence, a broken connection or an answer of another
shape after the INSTCMD line left may have switched (``Ambiguous``).

The password goes only into the PASSWORD line: never a log line or an error.
The protocol is clear text (STARTTLS is not used): keep upsd on the
management network, or on the controller's own host.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping

from spark_watchdog.config.controller import NutDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, PowerError, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power._http import excerpt
from spark_watchdog.power.base import PowerState

NUT_PORT = 3493
# upsd's answers before the command reached any driver: nothing was sent.
_REFUSALS = {
    "ACCESS-DENIED": "the user or password was refused, or the user may not run it: check user "
    "and password_file, and instcmds for it in upsd.users",
    "USERNAME-REQUIRED": "upsd wants a user: set user and password_file",
    "PASSWORD-REQUIRED": "upsd wants a password: set password_file",
    "CMD-NOT-SUPPORTED": "the driver does not offer it (`upscmd -l UPS` lists what it does)",
    "UNKNOWN-UPS": "upsd has no such UPS (`upsc -l HOST` lists them): check ups",
    "INVALID-ARGUMENT": "upsd did not accept the command's form",
    "UNKNOWN-COMMAND": "upsd does not know the protocol command",
}
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def quote(value: str) -> str:
    """One protocol argument, quoted with ``\\`` escapes (parseconf's rules).

    ``#`` is escaped too: upsd's parser (common/parseconf.c) takes it for the
    start of a comment even inside quotes, and then waits for the rest of a
    line that never comes (a password with ``#`` read as a silence).
    """
    if any(not " " <= c <= "~" for c in value):
        raise ValueError(
            "a NUT protocol argument may hold only printable ASCII (no line break, "
            "no control character, nothing beyond ASCII)"
        )
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("#", "\\#")
    return f'"{escaped}"'


def parse_var(line: str, ups: str, variable: str) -> str | None:
    """The value in ``VAR <ups> <variable> "<value>"``, or None for another line."""
    prefix = f"VAR {ups} {variable} "
    if not line.startswith(prefix):
        return None
    match = _QUOTED.fullmatch(line[len(prefix) :])
    if match is None:
        return None
    return re.sub(r"\\(.)", r"\1", match.group(1))


class _Session:
    """One TCP connection to upsd, one line out and one line back at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def ask(self, line: str, timeout: float) -> str:
        """Send ``line``, return upsd's one-line answer; asyncio.TimeoutError, OSError as raised."""
        self._writer.write(line.encode("utf-8") + b"\n")
        await asyncio.wait_for(self._writer.drain(), timeout)
        answer = await asyncio.wait_for(self._reader.readline(), timeout)
        if not answer.endswith(b"\n"):
            raise ConnectionError("upsd closed the connection")
        return answer.decode("utf-8", "replace").rstrip("\r\n")

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.write(b"LOGOUT\n")
            await asyncio.wait_for(self._writer.drain(), 1.0)
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 1.0)


class NutOutlet:
    """``outlet.<n>`` of UPS ``ups`` on the upsd at ``host:port``."""

    def __init__(
        self,
        host: str,
        ups: str,
        outlet: int,
        *,
        user: str,
        password: Secret,
        port: int = NUT_PORT,
        timeout: float = 5.0,
    ) -> None:
        quote(password.reveal())  # a line break would end the PASSWORD line early
        self._host = host
        self._port = port
        self.ups = ups
        self.outlet = outlet
        self._user = user
        self._password = password
        self._timeout = timeout
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._name = f"nut {ups}@{where} outlet {outlet}"
        self._key = f"nut:{where}:{ups}"

    @property
    def name(self) -> str:
        return self._name

    @property
    def limiter_key(self) -> str:
        return self._key

    async def read_state(self) -> PowerState:
        variable = f"outlet.{self.outlet}.status"
        session = await self._connect(command=False)
        try:
            line = await self._ask(session, f"GET VAR {self.ups} {variable}", command=False)
        finally:
            await session.close()
        if line.startswith("ERR "):
            raise self._read_error(line[4:].strip(), variable)
        value = parse_var(line, self.ups, variable)
        if value in ("on", "off"):
            return PowerState.ON if value == "on" else PowerState.OFF
        raise Refused(
            self.name, f'GET VAR {variable} answered {excerpt(line)!r}: expected "on" or "off"'
        )

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"an outlet switches on or off, not {target.value}")
        instcmd = f"outlet.{self.outlet}.load.{target.value}"
        session = await self._connect(command=True)
        try:
            await self._login(session)
            # Right before the command's line leaves (power/send_window.py).
            send_window.enforce(self.name)
            line = await self._ask(session, f"INSTCMD {self.ups} {instcmd}", command=True)
        finally:
            await session.close()
        if line == "OK" or line.startswith("OK TRACKING"):
            return
        if line.startswith("ERR "):
            raise self._command_error(line[4:].strip(), instcmd)
        raise Ambiguous(
            self.name,
            f"INSTCMD {instcmd} answered {excerpt(line)!r}, expected OK; it may have been applied",
        )

    async def aclose(self) -> None:
        return None  # one session per call, closed by the call

    # -- internals ----------------------------------------------------------

    async def _connect(self, *, command: bool) -> _Session:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port), self._timeout
            )
        except asyncio.TimeoutError:
            raise Unreachable(
                self.name, f"no TCP connection within {self._timeout:g}s; nothing was sent"
            ) from None
        except OSError as exc:
            raise Unreachable(
                self.name, f"cannot connect ({exc.strerror or exc}); nothing was sent"
            ) from None
        return _Session(reader, writer)

    async def _login(self, session: _Session) -> None:
        """USERNAME and PASSWORD; a failure here sent no command."""
        for what, line in (
            ("USERNAME", f"USERNAME {quote(self._user)}"),
            ("PASSWORD", f"PASSWORD {quote(self._password.reveal())}"),
        ):
            answer = await self._ask(session, line, command=False, shown=what)
            if answer != "OK":
                reason = answer[4:].strip() if answer.startswith("ERR ") else excerpt(answer)
                raise Refused(
                    self.name,
                    f"{what} answered {reason!r}: {_REFUSALS.get(reason, 'check the credentials')}"
                    "; no command was sent",
                )

    async def _ask(
        self, session: _Session, line: str, *, command: bool, shown: str | None = None
    ) -> str:
        """One exchange. A failure: before a command line, Unreachable; after it, Ambiguous.

        ``shown`` replaces the line in messages (the PASSWORD line is never shown).
        """
        said = shown or line
        try:
            return await session.ask(line, self._timeout)
        except asyncio.TimeoutError:
            what = f"no answer to {said} within {self._timeout:g}s"
        except OSError as exc:
            what = f"the connection broke at {said} ({exc.strerror or exc})"
        if command:
            raise Ambiguous(self.name, f"{what}; the command may have been applied")
        raise Unreachable(self.name, what)

    def _read_error(self, reason: str, variable: str) -> PowerError:
        if reason in ("DATA-STALE", "DRIVER-NOT-CONNECTED"):
            return Unreachable(
                self.name, f"GET VAR {variable}: ERR {reason} (upsd has no fresh data)"
            )
        if reason == "VAR-NOT-SUPPORTED":
            return Refused(
                self.name,
                f"GET VAR {variable}: ERR VAR-NOT-SUPPORTED: the UPS has no outlet "
                f"{self.outlet} (`upsc {self.ups}@HOST` lists its outlet.N variables)",
            )
        hint = _REFUSALS.get(reason, "")
        return Refused(
            self.name, f"GET VAR {variable}: ERR {reason}" + (f": {hint}" if hint else "")
        )

    def _command_error(self, reason: str, instcmd: str) -> PowerError:
        if reason in _REFUSALS:
            return Refused(
                self.name, f"INSTCMD {instcmd}: ERR {reason}: {_REFUSALS[reason]}; nothing was sent"
            )
        if reason == "DRIVER-NOT-CONNECTED":
            return Unreachable(
                self.name, f"INSTCMD {instcmd}: ERR {reason}: upsd has no driver; nothing was sent"
            )
        # INSTCMD-FAILED and anything else: the driver may have acted.
        return Ambiguous(self.name, f"INSTCMD {instcmd}: ERR {reason}; it may have been applied")


def build_nut_backend(device: NutDevice, secrets: Mapping[str, Secret]) -> NutOutlet:
    """The backend of one ``type: nut`` path; password: ``secrets["password_file"]``."""
    password = secrets.get("password_file")
    if password is None:
        raise ConfigError(device.host, ["password_file: the NUT password was not read"])
    try:
        return NutOutlet(
            device.host,
            device.ups,
            device.outlet,
            user=device.user,
            password=password,
            port=device.port,
            timeout=device.timeout,
        )
    except ValueError as exc:
        raise ConfigError(device.host, [f"password_file: {exc}"]) from None
