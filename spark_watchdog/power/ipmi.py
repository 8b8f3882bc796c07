"""A BMC's chassis power over IPMI v2 (RMCP+), driven through ``ipmitool -I lanplus``.

One ipmitool process per call, run by ``spark_watchdog.child_run`` (no
shell), bounded by a per-call timeout and killed (and reaped) on timeout or
cancellation. The password travels in the child's environment
(``-E`` reads ``IPMI_PASSWORD``), never on its command line: ``ps`` shows
argv to every user, ``/proc/<pid>/environ`` only to the same user and root.

The backend only reads and sends; ``VerifiedPower`` reads back, never resends
after ``Ambiguous``, and spaces commands per ``limiter_key``.

Which failure is which comes from ipmitool's own messages. ipmitool opens the
RMCP+ session (``ipmi_lanplus_open``: Get Channel Auth Capabilities, Open
Session, RAKP 1-4) before it sends any chassis request, so "Unable to
establish IPMI v2 / RMCP+ session" means the power command was certainly not
sent: ``Unreachable`` is honest even for a command. A command whose request
went out and got no reply ("Unable to set Chassis Power Control"), or that we
had to kill, may have landed: ``Ambiguous``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from spark_watchdog.child_run import ChildNotStarted, run_child
from spark_watchdog.config.controller import IpmiDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, PowerError, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power.base import PowerState

log = logging.getLogger("spark_watchdog.power.ipmi")

IPMITOOL_PACKAGE = "ipmitool"  # Debian/Ubuntu package that ships /usr/bin/ipmitool
PRIVILEGE_LEVELS = ("CALLBACK", "USER", "OPERATOR", "ADMINISTRATOR", "OEM")
# RMCP+ passwords are at most 20 bytes (IPMI v2 "Set User Password", 20-byte
# form); ipmitool says "lanplus: password is longer than 20 bytes." and sends nothing.
MAX_PASSWORD_BYTES = 20

# What longer quoted output is cut to in messages: one line, enough to recognise.
_QUOTE_LIMIT = 200


class IpmitoolNotFound(PowerError):
    """The ipmitool binary is missing: nothing was sent to the BMC."""


class UnexpectedOutput(PowerError):
    """ipmitool said something this module does not recognise; never guessed into on/off."""


@dataclass(frozen=True)
class IpmitoolRun:
    """What one finished ipmitool process left behind."""

    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class KnownFailure:
    """One ipmitool failure message and what it means for a read and for a command."""

    text: str  # matched case-insensitively anywhere in a line of stdout or stderr
    on_read: type[PowerError]
    on_command: type[PowerError]
    meaning: str
    source: str  # where the string comes from
    observed: bool  # seen for real: ipmitool 1.8.19 against OpenIPMI ipmi_sim 2.0.33


_LANPLUS = "ipmitool src/plugins/lanplus/lanplus.c"
_RAKP_CODES = "ipmitool src/plugins/lanplus/lanplus_strings.c (RAKP status codes)"
_CHASSIS = "ipmitool lib/ipmi_chassis.c"
_INTF = "ipmitool src/plugins/ipmi_intf.c (socket connect)"

_CIPHER_HINT = (
    "the BMC rejected the cipher suite: set cipher_suite to one it offers "
    "(OpenIPMI ipmi_sim speaks 3, many current BMCs want 17)"
)
_ROLE_HINT = "the BMC will not give this user a session at the requested privilege level"

# First match wins, so the specific lines come before the generic ones: a
# wrong password prints "RAKP 2 HMAC is invalid" *and then* the same "Unable to
# establish IPMI v2 / RMCP+ session" line that a dead BMC prints.
KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    # Wrong credentials: the BMC did answer. Its RAKP 2 reply carries an HMAC
    # keyed with *its* copy of the user's password; ipmitool recomputes it with
    # ours, and a mismatch proves the passwords differ. That is a spoken "no",
    # not silence: Refused (an operator must fix password_file; retrying is useless).
    KnownFailure(
        "RAKP 2 HMAC is invalid",
        Refused,
        Refused,
        "wrong password: the BMC's RAKP 2 reply does not match the password in password_file",
        f"{_LANPLUS} ipmi_lanplus_rakp1, printed with -v",
        observed=True,
    ),
    KnownFailure(
        "unauthorized name",
        Refused,
        Refused,
        "the BMC does not know this user name (or the user is disabled)",
        f"{_LANPLUS} 'RAKP 2 message indicates an error', {_RAKP_CODES}",
        observed=True,
    ),
    # The BMC's session table is full (many BMCs allow only a handful). It
    # answered, but this is transient and nothing was sent: treat as silence so
    # VerifiedPower's polling tolerates it.
    KnownFailure(
        "insufficient resources for session",
        Unreachable,
        Unreachable,
        "the BMC has no free session slot (too many open sessions); nothing was sent",
        f"{_LANPLUS} open session / RAKP 2 errors, {_RAKP_CODES}",
        observed=False,
    ),
    KnownFailure(
        "invalid authentication algorithm",
        Refused,
        Refused,
        _CIPHER_HINT,
        f"{_LANPLUS} 'Error in open session response message', {_RAKP_CODES}",
        observed=True,  # -C 17 against ipmi_sim
    ),
    KnownFailure("invalid integrity algorithm", Refused, Refused, _CIPHER_HINT, _RAKP_CODES, False),
    KnownFailure(
        "invalid confidentiality algorithm", Refused, Refused, _CIPHER_HINT, _RAKP_CODES, False
    ),
    KnownFailure("no matching cipher suite", Refused, Refused, _CIPHER_HINT, _RAKP_CODES, False),
    KnownFailure(
        "no matching authentication algorithm", Refused, Refused, _CIPHER_HINT, _RAKP_CODES, False
    ),
    KnownFailure(
        "no matching integrity payload", Refused, Refused, _CIPHER_HINT, _RAKP_CODES, False
    ),
    KnownFailure("unauthorized role requested", Refused, Refused, _ROLE_HINT, _RAKP_CODES, False),
    KnownFailure(
        "insufficient resources for role", Refused, Refused, _ROLE_HINT, _RAKP_CODES, False
    ),
    KnownFailure("invalid role", Refused, Refused, _ROLE_HINT, _RAKP_CODES, False),
    KnownFailure(
        "Set Session Privilege Level to",
        Refused,
        Refused,
        _ROLE_HINT,
        f"{_LANPLUS} ipmi_set_session_privlvl_cmd",
        observed=False,
    ),
    KnownFailure(
        "RAKP 4 message has invalid integrity check value",
        Refused,
        Refused,
        "the session key check failed at RAKP 4 (usually a password or BMC key mismatch)",
        f"{_LANPLUS} ipmi_lanplus_rakp3",
        observed=False,
    ),
    # Any other RMCP+ status code: the BMC answered the session setup with a no.
    KnownFailure(
        "Error in open session response message",
        Refused,
        Refused,
        "the BMC refused to open an RMCP+ session",
        f"{_LANPLUS} ipmi_lanplus_open_session",
        observed=False,
    ),
    KnownFailure(
        "message indicates an error",
        Refused,
        Refused,
        "the BMC refused the RMCP+ session handshake (RAKP)",
        f"{_LANPLUS} 'RAKP 2/4 message indicates an error'",
        observed=False,
    ),
    # Completion code 0xD4 on the chassis request itself: the session opened at
    # a privilege too low for Chassis Control (needs OPERATOR, IPMI v2 table G-1).
    KnownFailure(
        "Insufficient privilege level",
        Refused,
        Refused,
        "the user's session privilege is too low for chassis power control (needs OPERATOR)",
        f"{_CHASSIS} completion code 0xD4",
        observed=True,  # -L USER against ipmi_sim
    ),
    # Completion code 0xC3: the BMC accepted the request and then timed out
    # itself; it may or may not have switched.
    KnownFailure(
        "Timeout while processing command",
        Unreachable,
        Ambiguous,
        "the BMC timed out while processing the request",
        f"{_CHASSIS} completion code 0xC3",
        observed=False,
    ),
    # The chassis request was sent inside an open session and no reply came.
    KnownFailure(
        "Unable to set Chassis Power Control",
        Unreachable,
        Ambiguous,
        "the power command was sent but the BMC never answered it",
        f"{_CHASSIS} ipmi_chassis_power_control",
        observed=False,
    ),
    KnownFailure(
        "Set Chassis Power Control to",
        Refused,
        Refused,
        "the BMC rejected the power command",
        f"{_CHASSIS} ipmi_chassis_power_control (completion code)",
        observed=True,  # "Invalid data field in request": ipmi_sim with no power control
    ),
    KnownFailure(
        "Unable to get Chassis Power Status",
        Unreachable,
        Ambiguous,
        "the status request was sent but the BMC never answered it",
        f"{_CHASSIS} ipmi_chassis_power_status",
        observed=False,
    ),
    KnownFailure(
        "Get Chassis Power Status failed",
        Refused,
        Refused,
        "the BMC rejected the power status request",
        f"{_CHASSIS} ipmi_chassis_power_status (completion code)",
        observed=False,
    ),
    KnownFailure(
        "Address lookup for",
        Unreachable,
        Unreachable,
        "the BMC's host name does not resolve; nothing was sent",
        _INTF,
        observed=True,
    ),
    KnownFailure(
        "Could not open socket",
        Unreachable,
        Unreachable,
        "ipmitool could not open its UDP socket; nothing was sent",
        f"{_LANPLUS} ipmi_lanplus_open",
        observed=True,
    ),
    # ipmitool checks its own arguments before opening a socket; IpmiBmc
    # rejects such a password up front, this is the backstop.
    KnownFailure(
        "password is longer than",
        PowerError,
        PowerError,
        "the password is longer than IPMI allows (20 bytes); nothing was sent",
        "ipmitool 1.8.19 with a 25-byte IPMI_PASSWORD (message of its lanplus plugin)",
        observed=True,
    ),
    # Last of the session lines: no RMCP+ session, so no chassis request left.
    KnownFailure(
        "Unable to establish IPMI v2 / RMCP+ session",
        Unreachable,
        Unreachable,
        "no RMCP+ session (BMC down, wrong host or port, or IPMI over LAN disabled); "
        "nothing was sent",
        "ipmitool src/ipmitool.c / ipmi_main.c after ipmi_lanplus_open fails",
        observed=True,  # nothing listening on the port
    ),
    # The IPMI 1.5 interface's equivalent (-I lan); this module always uses
    # lanplus, but the line means the same if someone runs it by hand.
    KnownFailure(
        "Unable to establish LAN session",
        Unreachable,
        Unreachable,
        "no IPMI 1.5 LAN session; nothing was sent",
        "ipmitool src/plugins/lan/lan.c",
        observed=False,
    ),
)

_STATUS_LINE = re.compile(r"^Chassis Power is (\S+)\s*$", re.MULTILINE)
_CONTROL_LINE = re.compile(r"^Chassis Power Control: (\S+)\s*$", re.MULTILINE)
_CONTROL_WORD = {PowerState.ON: "Up/On", PowerState.OFF: "Down/Off"}
_ACTION = {PowerState.ON: "on", PowerState.OFF: "off"}


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def _quote(line: str, secrets: Sequence[str]) -> str:
    line = _scrub(" ".join(line.split()), secrets)
    return line if len(line) <= _QUOTE_LIMIT else line[: _QUOTE_LIMIT - 3] + "..."


def _last_line(run: IpmitoolRun) -> str:
    """ipmitool prints its final complaint last, on stderr."""
    for text in (run.stderr, run.stdout):
        lines = [line for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return f"(no output, exit status {run.returncode})"


def _known_failure(run: IpmitoolRun) -> tuple[KnownFailure, str] | None:
    lines = [line for text in (run.stderr, run.stdout) for line in text.splitlines()]
    for failure in KNOWN_FAILURES:
        needle = failure.text.lower()
        for line in lines:
            if needle in line.lower():
                return failure, line
    return None


def interpret_status(run: IpmitoolRun, device: str, secrets: Sequence[str] = ()) -> PowerState:
    """The state ``chassis power status`` reported, or the PowerError it amounts to."""
    if run.returncode == 0:
        match = _STATUS_LINE.search(run.stdout)
        if match is None:
            raise UnexpectedOutput(
                device,
                'expected "Chassis Power is on|off" from ipmitool, got: '
                f'"{_quote(_last_line(run), secrets)}"',
            )
        word = match.group(1)
        if word == "on":
            return PowerState.ON
        if word == "off":
            return PowerState.OFF
        raise UnexpectedOutput(
            device, f'chassis power status: expected "on" or "off", got "{_quote(word, secrets)}"'
        )
    known = _known_failure(run)
    if known is None:
        raise UnexpectedOutput(
            device,
            f"chassis power status failed (exit {run.returncode}) with output this backend "
            f'does not know: "{_quote(_last_line(run), secrets)}"',
        )
    failure, line = known
    raise failure.on_read(
        device, f'power status: {failure.meaning} (ipmitool: "{_quote(line, secrets)}")'
    )


def interpret_control(
    run: IpmitoolRun, target: PowerState, device: str, secrets: Sequence[str] = ()
) -> None:
    """Return if ``chassis power on|off`` was acknowledged, else raise what it amounts to."""
    action = _ACTION[target]
    if run.returncode == 0:
        match = _CONTROL_LINE.search(run.stdout)
        if match is not None and match.group(1) == _CONTROL_WORD[target]:
            return
        # ipmitool said "success" in words we do not know: the request went out
        # and something answered, so it may have acted.
        raise Ambiguous(
            device,
            f'power {action}: expected "Chassis Power Control: {_CONTROL_WORD[target]}" '
            f'from ipmitool, got: "{_quote(_last_line(run), secrets)}"',
        )
    known = _known_failure(run)
    if known is None:
        # We cannot show it did not land, so we do not claim it.
        raise Ambiguous(
            device,
            f"power {action} failed (exit {run.returncode}) with output this backend does "
            f'not know, so it may have landed: "{_quote(_last_line(run), secrets)}"',
        )
    failure, line = known
    raise failure.on_command(
        device, f'power {action}: {failure.meaning} (ipmitool: "{_quote(line, secrets)}")'
    )


def retries_within(timeout: float) -> int:
    """ipmitool ``-R`` so that it gives up on a silent BMC by itself, well inside ``timeout``.

    With ``-N 1`` ipmitool's wait grows by a second per retry, in two rounds;
    measured against a port nobody answers (ipmitool 1.8.19): -R 1/2/3/4 give
    up after 2/6/12/20 s, i.e. R*(R+1) s. Giving up by itself, it prints
    "Unable to establish ... session": a certain no-send, so even a command
    is ``Unreachable``. Killed by our timeout instead, a command can only be
    ``Ambiguous``. So R is the largest with R*(R+1) <= 60 % of the timeout.

    Inside an open session ipmitool also resends an unanswered request up to
    R times with the same sequence number. That is the protocol's own
    retransmission, not a new decision, and on/off are idempotent.
    """
    retries = 1
    while (retries + 1) * (retries + 2) <= 0.6 * timeout:
        retries += 1
    return retries


class IpmiBmc:
    """Chassis power of one host through its BMC (``ipmitool -I lanplus``)."""

    def __init__(
        self,
        host: str,
        *,
        user: str,
        password: Secret,
        port: int = 623,
        cipher_suite: int = 17,
        timeout: float = 15.0,
        privilege: str | None = None,
        retries: int | None = None,
        ipmitool: str = "ipmitool",
    ) -> None:
        if not host or host.startswith("-"):
            raise ValueError(f'host: expected a host name or address, got "{host}"')
        if not user or user.startswith("-"):
            raise ValueError(f'user: expected a BMC user name, got "{user}"')
        if timeout <= 0:
            raise ValueError(f"timeout: expected > 0, got {timeout}")
        if len(password.reveal().encode()) > MAX_PASSWORD_BYTES:
            # Only the length: the value never goes into a message.
            raise ValueError(
                f"password_file: the password is {len(password.reveal().encode())} bytes; "
                f"IPMI v2 allows at most {MAX_PASSWORD_BYTES} and ipmitool refuses longer ones"
            )
        if privilege is not None and privilege.upper() not in PRIVILEGE_LEVELS:
            raise ValueError(
                f"privilege: expected one of {', '.join(PRIVILEGE_LEVELS)}, got {privilege!r}"
            )
        self.host = host
        self.port = port
        self.user = user
        self.cipher_suite = cipher_suite
        self.timeout = timeout
        # None: ipmitool's default for lanplus, ADMINISTRATOR. Chassis control
        # needs OPERATOR; a fencing-only BMC account often has just that.
        self.privilege = None if privilege is None else privilege.upper()
        self.retries = retries_within(timeout) if retries is None else retries
        self.ipmitool = ipmitool
        self._password = password

    @property
    def name(self) -> str:
        return f"ipmi {self.user}@{self.host}:{self.port}"

    @property
    def limiter_key(self) -> str:
        # One BMC, one key: VerifiedPower spaces commands per key. BMCs drop
        # or mishandle back-to-back sessions; keep >= a few seconds between
        # commands to one BMC (docs/facts.md, "IPMI"; ironic's IPMI driver
        # keeps a minimum interval per BMC for the same reason).
        return f"ipmi:{self.host}:{self.port}"

    def argv(self, action: str) -> list[str]:
        """ipmitool's arguments (after the binary) for ``chassis power <action>``.

        Never the password: ``-E`` makes ipmitool read it from ``IPMI_PASSWORD``.
        """
        if action not in ("status", "on", "off"):
            raise ValueError(f'action: expected status, on or off, got "{action}"')
        # fmt: off
        args = [
            "-I", "lanplus",
            "-H", self.host,
            "-p", str(self.port),
            "-U", self.user,
            "-E",
            # Without -C ipmitool asks the BMC for its suites first (about
            # 10 s against ipmi_sim); real BMCs differ, so it is configured.
            "-C", str(self.cipher_suite),
            "-N", "1",
            "-R", str(self.retries),
            # -v makes ipmitool say *why* a session failed ("RAKP 2 HMAC is
            # invalid" = wrong password, "unauthorized name" = unknown user).
            # Without it those print only "Unable to establish IPMI v2 / RMCP+
            # session", the same line as a dead BMC. One -v prints no keys
            # or passwords (checked; -vv and up print handshake buffers).
            "-v",
        ]
        # fmt: on
        if self.privilege is not None:
            args += ["-L", self.privilege]
        return [*args, "chassis", "power", action]

    async def read_state(self) -> PowerState:
        try:
            run = await self._run("status")
        except asyncio.TimeoutError:
            raise Unreachable(
                self.name, f"no answer to a power status read within {self.timeout:g}s"
            ) from None
        return interpret_status(run, self.name, self._secrets())

    async def aclose(self) -> None:
        """Nothing held open: each read and command is an ipmitool process of its own."""

    async def command(self, target: PowerState) -> None:
        if target not in _ACTION:
            raise ValueError(f"command: expected on or off, got {target.value}")
        # "off" is Chassis Control 0h, an immediate hard off; "soft" would
        # only ask the OS (ACPI), which a frozen host never answers.
        action = _ACTION[target]
        # Right before ipmitool starts: the send window once more (power/send_window.py).
        send_window.enforce(self.name)
        try:
            run = await self._run(action)
        except asyncio.TimeoutError:
            # ipmitool was running and may have sent the request already.
            raise Ambiguous(
                self.name,
                f"power {action}: ipmitool did not finish within {self.timeout:g}s and was "
                "killed; the command may have landed",
            ) from None
        interpret_control(run, target, self.name, self._secrets())

    # -- internals ----------------------------------------------------------

    def _secrets(self) -> tuple[str, ...]:
        return (self._password.reveal(),)

    def _binary(self) -> str:
        found = shutil.which(self.ipmitool)
        if found is None:
            raise IpmitoolNotFound(
                self.name,
                f'ipmitool not found ("{self.ipmitool}"): install the Debian package '
                f"{IPMITOOL_PACKAGE} (apt-get install {IPMITOOL_PACKAGE}) or set its path",
            )
        return found

    def _environment(self) -> dict[str, str]:
        # A small environment on purpose: the password, a PATH, and a C locale
        # so the messages matched above are the English ones.
        return {
            "PATH": os.environ.get("PATH", os.defpath),
            "LC_ALL": "C",
            "IPMI_PASSWORD": self._password.reveal(),
        }

    async def _run(self, action: str) -> IpmitoolRun:
        """Run ipmitool once, its output bounded (spark_watchdog/child_run.py); raise
        asyncio.TimeoutError after ``timeout`` (its process group killed and reaped)."""
        binary = self._binary()
        args = self.argv(action)
        log.debug("%s: %s %s", self.name, binary, " ".join(args))
        try:
            ran = await run_child(
                [binary, *args], timeout=self.timeout, environment=self._environment()
            )
        except ChildNotStarted as exc:
            if exc.missing:
                raise IpmitoolNotFound(
                    self.name,
                    f'ipmitool disappeared ("{binary}"): install the Debian package '
                    f"{IPMITOOL_PACKAGE}",
                ) from None
            raise PowerError(self.name, f'cannot start ipmitool ("{binary}"): {exc}') from None
        if ran.returncode is None:
            raise asyncio.TimeoutError
        return IpmitoolRun(
            returncode=ran.returncode, stdout=ran.stdout.text(), stderr=ran.stderr.text()
        )


def build_ipmi_backend(device: IpmiDevice, secrets: Mapping[str, Secret]) -> IpmiBmc:
    """The backend for one configured BMC; ``secrets["password_file"]`` is its password."""
    password = secrets.get("password_file")
    if password is None:
        raise ConfigError(
            f"ipmi {device.host}",
            [
                "password_file: the BMC password was not read (expected a secret under "
                '"password_file")'
            ],
        )
    try:
        return IpmiBmc(
            device.host,
            port=device.port,
            user=device.user,
            password=password,
            cipher_suite=device.cipher_suite,
            timeout=device.timeout,
        )
    except ValueError as exc:
        raise ConfigError(f"ipmi {device.host}", [str(exc)]) from None
