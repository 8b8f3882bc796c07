"""The soft path: run a command over SSH, bounded; reboot a stuck (not frozen) host.

:class:`SshCommand` runs one remote command with the system ``ssh`` client as
an asyncio subprocess and classifies how it ended. It authenticates with a key
file only (``BatchMode``: never a password prompt), trusts exactly the host
keys in the configured known_hosts file (``StrictHostKeyChecking=yes``: an
unknown or changed key is refused, never learned; the file is never written),
reads no ssh_config (``-F none``: no ProxyCommand, ControlMaster or SendEnv
from the controller's environment) and passes the ssh child a minimal
environment (no agent socket). Only the key file's *path* is on the argv.
The child is killed at the deadline and when the caller is cancelled.

It runs ``ssh -v`` and reads the client's own debug lines to tell how far it
got: ``Authenticated to`` and ``Sending command:`` say whether the command
left, ``rtype exit-status`` whether the remote side reported an exit status.
That is what lets a failure be called "certainly not sent" (``Unreachable``)
or "may have landed" (``Ambiguous``) honestly.

:class:`SshReboot` is a thin use of it. A reboot command's connection often
drops as the host goes down (ssh exits 255, "Connection to ... closed by remote
host"); once the command was sent that is as good as an exit 0: both are
``sent``. Neither is a verified reboot: the controller verifies a reboot only by
the agent reporting a *new boot id* (DESIGN.md §4). This path is useless on a
frozen host (sshd there cannot answer); it is for a stuck one, and for
restarting the agent over SSH (``run_ssh_command``).
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from spark_watchdog.child_run import ChildNotStarted, run_child
from spark_watchdog.config.controller import SshDevice
from spark_watchdog.config.secrets import resolve_secret_path
from spark_watchdog.errors import Ambiguous, Refused, Unreachable

SshOutcome = Literal[
    "exited",  # the remote command ran and reported an exit status (exit_status)
    "dropped",  # the command was sent; the connection ended without an exit status
    "timeout",  # killed at the deadline; command_sent says whether the command had left
    "auth_refused",  # the host refused our key
    "host_key_unknown",  # the host's key is not in known_hosts: refused, not learned
    "host_key_changed",  # the host's key differs from known_hosts: refused
    "unreachable",  # nothing sent: no connection, no banner, or closed before auth
    "failed",  # ssh failed otherwise (could not start, negotiation failed, ...)
]
SSH_OUTCOMES: tuple[SshOutcome, ...] = get_args(SshOutcome)

# Extra time a reboot gets on top of ConnectTimeout: key exchange, auth and the
# command itself (systemctl reboot queues a job and returns at once).
REBOOT_EXTRA_S = 15.0
# Kept of each stream (spark_watchdog/child_run.py): its first and its last 256 KiB.
# ssh -v writes a few KiB of debug lines per session: whether the command was sent
# ("Authenticated to", "Sending command") near the start, the exit status last, so
# a long banner or a remote command's flood in between cuts neither.
_STDERR_LIMIT = 256 * 1024
_MESSAGE_CHARS = 600

# Markers in ssh's -v output (OpenSSH 7.x to 9.x; sshconnect2.c, clientloop.c).
_AUTHENTICATED = "Authenticated to "
_SENDING_COMMAND = "debug1: Sending command:"
_EXIT_STATUS = "rtype exit-status"
_EXIT_SIGNAL = "rtype exit-signal"
_DEBUG_LINE = re.compile(r"^debug\d: ")
# What -v prints around every session besides debug lines: not worth a message.
_CHATTER = re.compile(r"^(OpenSSH_|Authenticated to |Transferred: sent |Bytes per second: )")
_CONNECT_FAILURES = (
    "Connection refused",
    "Connection timed out",
    "timed out during banner exchange",
    "No route to host",
    "Network is unreachable",
    "Could not resolve hostname",
    "Name or service not known",
    "Connection closed by",
    "Connection reset by",
    "kex_exchange_identification",
)
_HOST_KEY_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "has changed and you have requested")
_HOST_KEY_FAILED = "Host key verification failed"
_AUTH_REFUSED = "Permission denied ("


@dataclass(frozen=True)
class SshCommandResult:
    """How one remote command ended. ``command_sent`` is None where ssh did not say."""

    target: str  # "user@host:port"
    command: str
    outcome: SshOutcome
    command_sent: bool | None
    exit_status: int | None  # the remote command's, when it reported one
    returncode: int | None  # the ssh process's; None when we killed it
    elapsed_s: float
    stdout: str  # the command's output, bounded
    stderr: str  # ssh's and the command's messages, without ssh's -v output, bounded
    detail: str  # one human sentence

    @property
    def ok(self) -> bool:
        return self.outcome == "exited" and self.exit_status == 0

    def raise_for_outcome(self, device: str, *, drop_means_sent: bool = False) -> None:
        """Raise the PowerError this outcome means, or return when the command ran (exit 0).

        ``drop_means_sent``: a connection dropped after the command left counts
        as done (a reboot); otherwise it is ``Ambiguous``.
        """
        message = self.detail  # the device name already says which host
        if self.ok:
            return
        if self.outcome == "exited":
            raise Refused(device, message)
        if self.outcome == "dropped":
            if drop_means_sent:
                return
            raise Ambiguous(device, message)
        if self.outcome in ("auth_refused", "host_key_unknown", "host_key_changed"):
            raise Refused(device, message)
        if self.outcome == "unreachable":
            raise Unreachable(device, message)
        if self.outcome == "timeout":
            if self.command_sent is False:
                raise Unreachable(device, message)
            raise Ambiguous(device, message)
        # "failed": before the command left nothing can have landed.
        if self.command_sent is False:
            raise Refused(device, message)
        raise Ambiguous(device, message)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "command": self.command,
            "outcome": self.outcome,
            "ok": self.ok,
            "command_sent": self.command_sent,
            "exit_status": self.exit_status,
            "returncode": self.returncode,
            "elapsed_s": round(self.elapsed_s, 3),
            "stdout": self.stdout,
            "stderr": self.stderr,
            "detail": self.detail,
        }


class SshCommand:
    """Runs commands on one host over SSH with a key, a pinned host key and a deadline."""

    def __init__(
        self,
        host: str,
        *,
        user: str,
        key_file: str,
        known_hosts_file: str,
        port: int = 22,
        connect_timeout: float = 5.0,
        ssh_binary: str = "ssh",
    ) -> None:
        for key, value in (("host", host), ("user", user)):
            if not value or value.startswith("-") or any(c.isspace() for c in value):
                raise ValueError(
                    f"{key}: expected a name without whitespace not starting with '-', "
                    f"got {value!r}"
                )
        if not 1 <= port <= 65535:
            raise ValueError(f"port: expected 1..65535, got {port}")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout: expected seconds > 0, got {connect_timeout}")
        for key, path in (("key_file", key_file), ("known_hosts_file", known_hosts_file)):
            if not os.path.isabs(path):
                raise ValueError(f"{key}: expected an absolute path, got {path!r}")
        self.host = host
        self.user = user
        self.port = port
        self.key_file = key_file
        self.known_hosts_file = known_hosts_file
        self.connect_timeout = connect_timeout
        self.ssh_binary = ssh_binary

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.user}@{host}:{self.port}"

    def argv(self, command: str) -> list[str]:
        """The ssh command line. It names the key file; it never holds key material."""
        return [
            self.ssh_binary,
            "-F",
            "none",
            "-v",  # its debug lines tell how far the session got (module doc)
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(1, math.ceil(self.connect_timeout))}",
            "-o",
            "ConnectionAttempts=1",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={_config_path(self.known_hosts_file)}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            # Never write known_hosts: no key rotation learning, no IP aliases.
            "-o",
            "UpdateHostKeys=no",
            "-o",
            "CheckHostIP=no",
            # IdentityFile rather than -i: ssh drops an -i file it cannot stat and
            # then tries ~/.ssh/id_* instead; an IdentityFile stays the only key.
            "-o",
            f"IdentityFile={_config_path(self.key_file)}",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "PreferredAuthentications=publickey",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "ControlMaster=no",
            "-o",
            "ControlPath=none",
            "-p",
            str(self.port),
            f"{self.user}@{self.host}",
            command,
        ]

    async def run(self, command: str, timeout: float) -> SshCommandResult:
        """Run ``command`` (one string, for the remote user's shell) within ``timeout`` s.

        Never raises for anything ssh or the host does: the result says what
        happened; ``result.raise_for_outcome(device)`` turns it into the matching PowerError.
        """
        if not command.strip():
            raise ValueError("command: expected a remote command, got an empty string")
        if not timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
        started = time.monotonic()
        try:
            ran = await run_child(
                self.argv(command),
                timeout=timeout,
                environment=_child_environment(),
                head_bytes=_STDERR_LIMIT,
                tail_bytes=_STDERR_LIMIT,
            )
        except ChildNotStarted as exc:
            return self._not_started(command, time.monotonic() - started, exc)
        return classify(
            target=self.target,
            keyscan=f"ssh-keyscan -p {self.port} {self.host}",
            command=command,
            returncode=ran.returncode,
            timed_out=ran.timed_out,
            timeout=timeout,
            elapsed_s=time.monotonic() - started,
            stdout=ran.stdout.text(),
            stderr=ran.stderr.text(),
        )

    def _not_started(
        self, command: str, elapsed_s: float, exc: ChildNotStarted
    ) -> SshCommandResult:
        return SshCommandResult(
            target=self.target,
            command=command,
            outcome="failed",
            command_sent=False,
            exit_status=None,
            returncode=None,
            elapsed_s=elapsed_s,
            stdout="",
            stderr="",
            detail=f"could not start {self.ssh_binary!r} (install openssh-client): {exc}",
        )


@dataclass(frozen=True)
class _SshTrace:
    """What ssh's ``-v`` stderr says about how far one run got."""

    messages: list[str]  # stderr without debug lines and chatter
    authenticated: bool
    sent: bool  # "Sending command:"
    reported_status: bool  # the remote side reported an exit status
    reported_signal: bool  # the remote side reported an exit signal
    # Without debug lines we cannot tell; with them, no "Sending command" means not sent.
    command_sent: bool | None

    @property
    def message_text(self) -> str:
        return "\n".join(self.messages)

    @property
    def said(self) -> str:
        return _quote(self.messages)


def _read_trace(stderr: str) -> _SshTrace:
    lines = stderr.splitlines()
    debug_seen = any(_DEBUG_LINE.match(line) for line in lines)
    sent = any(line.startswith(_SENDING_COMMAND) for line in lines)
    return _SshTrace(
        messages=[
            line
            for line in lines
            if line.strip() and not _DEBUG_LINE.match(line) and not _CHATTER.match(line)
        ],
        authenticated=any(line.startswith(_AUTHENTICATED) for line in lines),
        sent=sent,
        reported_status=any(_EXIT_STATUS in line for line in lines),
        reported_signal=any(_EXIT_SIGNAL in line for line in lines),
        command_sent=True if sent else (False if debug_seen else None),
    )


# An outcome, its detail and the remote exit status (for "exited").
_Verdict = tuple[SshOutcome, str, int | None]


def classify(
    *,
    target: str,
    command: str,
    returncode: int | None,
    keyscan: str = "ssh-keyscan -p PORT HOST",
    timed_out: bool,
    timeout: float,
    elapsed_s: float,
    stdout: str,
    stderr: str,
) -> SshCommandResult:
    """Turn an ssh run (its exit code and ``-v`` stderr) into an :class:`SshCommandResult`."""
    trace = _read_trace(stderr)
    if timed_out:
        verdict = _timed_out_verdict(trace, command, timeout)
    elif trace.sent:
        verdict = _sent_verdict(trace, command, returncode)
    else:
        verdict = _unsent_verdict(trace, command, returncode, keyscan)
    outcome, detail, status = verdict
    return SshCommandResult(
        target=target,
        command=command,
        outcome=outcome,
        command_sent=trace.command_sent,
        exit_status=status,
        returncode=returncode,
        elapsed_s=elapsed_s,
        stdout=stdout,
        stderr=trace.message_text[-_STDERR_LIMIT:],
        detail=detail,
    )


def _timed_out_verdict(trace: _SshTrace, command: str, timeout: float) -> _Verdict:
    """ssh killed at the deadline: how far it had got decides what may have run."""
    if trace.sent:
        return (
            "timeout",
            f"`{command}` was sent but did not finish within {timeout:g}s; ssh was killed "
            "(the command may have run)",
            None,
        )
    if trace.command_sent is False:
        stage = "after authenticating" if trace.authenticated else "before authenticating"
        return (
            "timeout",
            f"no session within {timeout:g}s ({stage}); ssh was killed, nothing was sent",
            None,
        )
    return "timeout", f"no answer within {timeout:g}s; ssh was killed{trace.said}", None


def _sent_verdict(trace: _SshTrace, command: str, returncode: int | None) -> _Verdict:
    """The command left: it exited with a status, or the connection dropped."""
    said = trace.said
    # ssh exits 0 only on a reported status 0; without a status it exits 255.
    if returncode is not None and (trace.reported_status or returncode == 0):
        how = "ran" if returncode == 0 else f"exited with status {returncode}"
        return "exited", f"`{command}` {how}{said}", returncode
    if trace.reported_signal:
        return "dropped", f"`{command}` was sent and killed by a signal{said}", None
    return (
        "dropped",
        f"`{command}` was sent, then the connection ended without an exit status{said}",
        None,
    )


def _unsent_verdict(
    trace: _SshTrace, command: str, returncode: int | None, keyscan: str
) -> _Verdict:
    """No "Sending command" (or no debug lines): why the session did not get there."""
    message_text, said = trace.message_text, trace.said
    if any(marker in message_text for marker in _HOST_KEY_CHANGED):
        evidence = [m.strip() for m in trace.messages if "SHA256:" in m or "Offending" in m]
        return (
            "host_key_changed",
            "the host's key does NOT match the known_hosts file: refused, not replaced "
            "(reinstalled host, or someone in between); compare the fingerprint with the "
            "host's /etc/ssh/ssh_host_*_key.pub before fixing the file by hand"
            + (f" ({' '.join(evidence)})" if evidence else ""),
            None,
        )
    if _HOST_KEY_FAILED in message_text:
        return (
            "host_key_unknown",
            "the host's key is not in the known_hosts file: refused, not learned; add it "
            f"after checking its fingerprint ({keyscan}, compared with the host's "
            f"/etc/ssh/ssh_host_*_key.pub){said}",
            None,
        )
    if _AUTH_REFUSED in message_text:
        return (
            "auth_refused",
            f"the host refused the key (is its public key in the user's authorized_keys, "
            f"and the key file readable with mode 600?){said}",
            None,
        )
    if (
        returncode == 255
        and not trace.authenticated
        and any(marker in message_text for marker in _CONNECT_FAILURES)
    ):
        return "unreachable", f"no SSH session, nothing was sent{said}", None
    if returncode == 0:
        # An exit 0 without "Sending command" only happens when -v output is missing.
        return "exited", f"`{command}` ran{said}", 0
    return "failed", f"ssh exited {returncode}{said}", None


async def run_ssh_command(
    device: SshDevice,
    command: str,
    *,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> SshCommandResult:
    """Run ``command`` on ``device``'s host (e.g. ``systemctl restart spark-watchdog-agent``).

    The result is returned, not raised: ``result.raise_for_outcome(name)`` raises the
    matching PowerError. ``timeout`` defaults to ConnectTimeout + 15 s.
    """
    ssh = ssh_command_for(device, environ)
    limit = device.connect_timeout + REBOOT_EXTRA_S if timeout is None else timeout
    return await ssh.run(command, limit)


def ssh_command_for(device: SshDevice, environ: Mapping[str, str] | None = None) -> SshCommand:
    """The :class:`SshCommand` of a configured SSH device.

    ``key_file`` and ``known_hosts_file`` are absolute paths or credential names
    in ``$CREDENTIALS_DIRECTORY``; only the resolved path is passed on, the key
    itself is read by ssh alone. Raises ConfigError when a name cannot resolve.
    """
    return SshCommand(
        device.host,
        user=device.user,
        key_file=str(resolve_secret_path(device.key_file, environ)),
        known_hosts_file=str(resolve_secret_path(device.known_hosts_file, environ)),
        port=device.port,
        connect_timeout=device.connect_timeout,
    )


@dataclass(frozen=True)
class SshRebootResult:
    """The reboot command left. Not a verified reboot: see the module docstring."""

    device: str
    command: str
    outcome: Literal["sent"]
    connection_dropped: bool  # the host hung up before reporting an exit status
    exit_status: int | None
    elapsed_s: float
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "command": self.command,
            "outcome": self.outcome,
            "verified": False,
            "connection_dropped": self.connection_dropped,
            "exit_status": self.exit_status,
            "elapsed_s": round(self.elapsed_s, 3),
            "detail": self.detail,
        }


class SshReboot:
    """Reboot one host over SSH: send the configured command, once, and report.

    ``reboot()`` returns ``sent`` (exit 0, or the connection dropped after the
    command left) or raises: ``Refused`` (key refused, host key unknown or
    changed, the command exited non-zero), ``Unreachable`` (no SSH session, so
    nothing was sent) or ``Ambiguous`` (the command left but neither finished
    nor dropped in time). It never retries and never verifies: the controller
    counts a reboot done only when the agent reports a new boot id (DESIGN.md §4).
    """

    def __init__(self, ssh: SshCommand, command: str, timeout: float) -> None:
        if not command.strip():
            raise ValueError("command: expected a reboot command, got an empty string")
        if not timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
        self.ssh = ssh
        self.command = command
        self.timeout = timeout

    @property
    def name(self) -> str:
        return f"ssh {self.ssh.target}"

    async def reboot(self) -> SshRebootResult:
        result = await self.ssh.run(self.command, self.timeout)
        result.raise_for_outcome(self.name, drop_means_sent=True)
        return SshRebootResult(
            device=self.name,
            command=self.command,
            outcome="sent",
            connection_dropped=result.outcome == "dropped",
            exit_status=result.exit_status,
            elapsed_s=result.elapsed_s,
            detail=result.detail,
        )


def build_ssh_reboot(
    device: SshDevice,
    *,
    timeout: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> SshReboot:
    """The soft reboot path of a configured SSH device; ``timeout`` defaults to
    ConnectTimeout + 15 s."""
    limit = device.connect_timeout + REBOOT_EXTRA_S if timeout is None else timeout
    return SshReboot(ssh_command_for(device, environ), device.command, limit)


# -- internals ----------------------------------------------------------------


def _config_path(path: str) -> str:
    """A path as an ssh -o value: quoted (whitespace splits lists there), % escaped
    (ssh expands %-tokens in these options)."""
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


def _child_environment() -> dict[str, str]:
    # No SSH_AUTH_SOCK (no agent keys), no locale or other variables to leak.
    return {"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C"}


def _quote(messages: Sequence[str]) -> str:
    """What ssh and the command wrote to stderr, bounded, for a message."""
    if not messages:
        return ""
    # Drop the @@@ banner art around host key warnings.
    text = " / ".join(m.strip() for m in messages if not set(m.strip()) <= {"@"})
    if len(text) > _MESSAGE_CHARS:
        text = "…" + text[-_MESSAGE_CHARS:]
    return f"; stderr: {text}"
