"""Run one of the cluster launcher's commands, bounded, here or over SSH
(``serving.launcher``; docs/serving.md, "a cluster launcher").

An argv, never a shell line: on this host it is executed directly, in a
session of its own (so a timeout kills the launcher and everything it
started, ``docker`` clients included); over SSH it is quoted argument by
argument (``shlex.join``) for the remote user's shell, with its environment
set by ``env NAME=VALUE ...`` in front, since the SSH client passes none, and
the node's own ``timeout`` in front of that, so that the deadline ends the
command on the node, not only the SSH client here.

Nothing here retries. A command that timed out, or whose SSH session ended
without an exit status, may have done part of its work: that is said as is
(``timed_out``, ``ended_unknown``), and the restart fails without starting
anything on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import shlex
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal, Protocol

from spark_watchdog.config.controller import LauncherSshConfig
from spark_watchdog.config.secrets import resolve_secret_path
from spark_watchdog.power.ssh_reboot import SshCommand
from spark_watchdog.redact import redact_argv, redact_text

# How a command ended. exited: it ran to its end (exit_code says how);
# not_found: it could not be started (nothing ran); timed_out: killed at its
# deadline; ended_unknown: over SSH, the session ended and whether the command
# ran to its end is not known; unreachable: over SSH, nothing was sent.
CommandEnd = Literal["exited", "not_found", "timed_out", "ended_unknown", "unreachable"]

# What systemd hands the controller alone: its notify socket and watchdog (a
# launcher that wrote there would speak for the controller), its credentials,
# its sockets.
CONTROLLER_ONLY_ENV = frozenset(
    {
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "CREDENTIALS_DIRECTORY",
        "LISTEN_FDS",
        "LISTEN_PID",
        "LISTEN_FDNAMES",
    }
)
# Over SSH: coreutils' timeout on the node ends the command at its deadline,
# SIGKILL this long after SIGTERM; its exit says so (124, or 128 + 9).
REMOTE_KILL_AFTER_S = 10.0
REMOTE_GRACE_S = 10.0
TIMEOUT_EXITS = frozenset({124, 137})
OUTPUT_KEPT = 4000  # characters of the command's output kept in the record (its tail)
_READ_LIMIT = 256 * 1024
_REAP_GRACE_S = 5.0


@dataclass(frozen=True)
class CommandResult:
    """One launcher command as it ran; what the incident records (redacted)."""

    which: str  # "stop" | "start"
    argv: tuple[str, ...]  # as shown: secret flag values read ***
    where: str  # "controller" or "user@host:port"
    end: CommandEnd
    exit_code: int | None
    duration_s: float
    output: str  # the tail of stdout and stderr, redacted
    detail: str  # one sentence

    @property
    def ok(self) -> bool:
        return self.end == "exited" and self.exit_code == 0

    @property
    def nothing_ran(self) -> bool:
        """Certainly without effect: it could not start, or never left this host."""
        return self.end in ("not_found", "unreachable")

    def to_json(self) -> dict[str, Any]:
        return {
            "which": self.which,
            "argv": list(self.argv),
            "where": self.where,
            "end": self.end,
            "exit_code": self.exit_code,
            "duration_s": round(self.duration_s, 3),
            "output": self.output,
            "detail": self.detail,
        }


class CommandRunner(Protocol):
    async def run(
        self, which: str, argv: Sequence[str], environment: Mapping[str, str], timeout: float
    ) -> CommandResult:
        """Run ``argv`` with ``environment`` added, within ``timeout`` seconds. Never raises
        for what the command or the network does: the result says it."""
        ...


def _tail(text: str) -> str:
    text = redact_text(text.strip())
    return text if len(text) <= OUTPUT_KEPT else "…" + text[-OUTPUT_KEPT:]


class LocalRunner:
    """On the controller's host, as the controller's user."""

    def __init__(self, working_directory: str | None = None) -> None:
        self.working_directory = working_directory

    async def run(
        self, which: str, argv: Sequence[str], environment: Mapping[str, str], timeout: float
    ) -> CommandResult:
        shown = tuple(redact_argv(argv))
        started = time.monotonic()
        env = {k: v for k, v in os.environ.items() if k not in CONTROLLER_ONLY_ENV}
        env.update(environment)

        def result(end: CommandEnd, code: int | None, output: str, detail: str) -> CommandResult:
            took = time.monotonic() - started
            return CommandResult(which, shown, "controller", end, code, took, output, detail)

        # Its output goes to a file, not a pipe: a process it leaves running in the
        # background (`nohup ... &` without a redirect) keeps what it inherited
        # open, and must neither block on a full pipe nor die of SIGPIPE when the
        # controller stops reading; and the command's end is its exit, not the
        # pipe's end of file (Python 3.11's asyncio waits for both).
        with tempfile.TemporaryFile() as out:
            flags = fcntl.fcntl(out.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(out.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)
            try:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    cwd=self.working_directory,
                    env=env,
                    start_new_session=True,
                )
            except OSError as exc:
                why = exc.strerror or str(exc)
                return result(
                    "not_found", None, "", f"{which}: cannot run {shown[0]!r}: {why}; nothing ran"
                )
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except asyncio.TimeoutError:
                await _kill_session(process)
                return result(
                    "timed_out",
                    None,
                    _output(out),
                    f"{which}: no end within {timeout:g} s; killed it and what it started "
                    "(it may have done part of its work)",
                )
            except BaseException:
                await _kill_session(process)
                raise
            output = _output(out)
        code = process.returncode
        said = "" if code == 0 else f" (exit {code})"
        return result("exited", code, output, f"{which}: {shlex.join(shown)} ended{said}")


def _output(out: IO[bytes]) -> str:
    """The tail of what the command wrote; the file is emptied (a process it left
    running writes on at its new end, and only that much stays on disk)."""
    size = os.fstat(out.fileno()).st_size
    kept = os.pread(out.fileno(), _READ_LIMIT, max(0, size - _READ_LIMIT))
    out.truncate(0)
    return _tail(kept.decode("utf-8", errors="replace"))


async def _kill_session(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the command's whole session (it leads one), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(process.wait(), _REAP_GRACE_S)


class SshRunner:
    """On a node, over SSH with a key and a pinned host key (power/ssh_reboot.py)."""

    def __init__(
        self,
        host: str,
        port: int,
        ssh: LauncherSshConfig,
        working_directory: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.command = SshCommand(
            host,
            user=ssh.user,
            key_file=str(resolve_secret_path(ssh.key_file, environ)),
            known_hosts_file=str(resolve_secret_path(ssh.known_hosts_file, environ)),
            port=port,
            connect_timeout=ssh.connect_timeout,
        )
        self.working_directory = working_directory

    def remote_line(
        self, argv: Sequence[str], environment: Mapping[str, str], timeout: float
    ) -> str:
        """The one line the remote shell gets: every word quoted, the environment by
        env, and the node's own ``timeout`` ending the command (and, ``-k``, what
        ignores SIGTERM) at the deadline: a killed ssh client would leave it running."""
        limit = str(max(1, math.ceil(timeout)))
        words = [
            "timeout",
            "-k",
            str(int(REMOTE_KILL_AFTER_S)),
            limit,
            "env",
            *(f"{k}={v}" for k, v in environment.items()),
            *argv,
        ]
        line = shlex.join(words)
        if self.working_directory:
            line = f"cd {shlex.quote(self.working_directory)} && {line}"
        return line

    async def run(
        self, which: str, argv: Sequence[str], environment: Mapping[str, str], timeout: float
    ) -> CommandResult:
        shown = tuple(redact_argv(argv))
        line = self.remote_line(argv, environment, timeout)
        # The node's timeout ends it first; the client waits a little longer.
        ran = await self.command.run(line, timeout + REMOTE_KILL_AFTER_S + REMOTE_GRACE_S)
        output = _tail("\n".join(t for t in (ran.stdout, ran.stderr) if t.strip()))
        target = self.command.target
        end: CommandEnd
        code: int | None
        if ran.outcome == "exited" and ran.exit_status in TIMEOUT_EXITS:
            end, code = "timed_out", ran.exit_status
            detail = (
                f"{which} on {target}: no end within {timeout:g} s; the node's timeout ended "
                f"it (exit {code}; it may have done part of its work)"
            )
        elif ran.outcome == "exited":
            end, code = "exited", ran.exit_status
            said = "" if code == 0 else f" (exit {code})"
            detail = f"{which} on {target}: {shlex.join(shown)} ended{said}"
        elif ran.command_sent is False:
            end, code = "unreachable", None
            detail = f"{which} on {target}: nothing sent: {redact_text(ran.detail)}"
        elif ran.outcome == "timeout":
            end, code = "timed_out", None
            detail = (
                f"{which} on {target}: no end within {timeout:g} s (it may have done part "
                "of its work)"
            )
        else:
            end, code = "ended_unknown", None
            detail = (
                f"{which} on {target}: sent, but the session ended without an exit status "
                f"({redact_text(ran.detail)}); it may have done part of its work"
            )
        return CommandResult(which, shown, target, end, code, ran.elapsed_s, output, detail)
