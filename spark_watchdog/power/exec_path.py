"""The operator's own commands as a power path: a homemade relay board, a vendor's CLI.

Three argvs from the config (``type: exec``: ``off_command``, ``on_command``,
``status_command``), each run without a shell, in a
session of its own, bounded by ``timeout`` and killed with its whole process
group when it runs over or its caller gives up. The contract
(docs/power.md, "exec"):

- ``status`` exits 0 and prints one JSON line as its last line of output,
  ``{"state": "on"}`` or ``{"state": "off"}``; any other exit status says
  the device could not be read (``Unreachable``: the read-back keeps
  polling), an answer of another shape is ``Refused``;
- ``off`` and ``on`` exit 0 once the device took the command (the read-back
  decides whether it switched); ``EXEC_NOT_SENT_EXIT`` (75) says the command
  certainly did not reach the device (``Unreachable``: nothing was sent);
  any other status, a kill by a signal or a run past ``timeout`` may have
  switched (``Ambiguous``: read back, never sent again).

A command that cannot be started (no such file, not executable) never ran:
``Unreachable``. The environment is small on purpose: ``PATH``, ``LC_ALL=C``
and, where systemd set it, ``CREDENTIALS_DIRECTORY``, so a command can read
its own secrets as credentials; they never go on its command line. What a
command prints goes to the log and into errors only redacted and cut short.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence

from spark_watchdog.child_run import ChildNotStarted, ChildRun, run_child
from spark_watchdog.config.controller import EXEC_NOT_SENT_EXIT, ExecDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power.base import PowerState
from spark_watchdog.redact import redact_argv, redact_text

log = logging.getLogger("spark_watchdog.power.exec")

OUTPUT_SHOWN = 300  # characters of a command's output in a log line or an error


def said(ran: ChildRun) -> str:
    """What a run printed, redacted, quoted with its control characters escaped, and
    cut to its last ``OUTPUT_SHOWN`` characters."""
    printed = "\n".join((ran.stdout.text(), ran.stderr.text()))
    text = " ".join(redact_text(printed).split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return f"'{text if len(text) <= OUTPUT_SHOWN else '…' + text[-(OUTPUT_SHOWN - 1) :]}'"


def command_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The commands' environment: a PATH, the C locale, systemd's credentials directory."""
    env = os.environ if environ is None else environ
    chosen = {"PATH": env.get("PATH", os.defpath), "LC_ALL": "C"}
    if env.get("CREDENTIALS_DIRECTORY"):
        chosen["CREDENTIALS_DIRECTORY"] = env["CREDENTIALS_DIRECTORY"]
    return chosen


async def run_argv(
    argv: Sequence[str], timeout: float, environment: Mapping[str, str], *, device: str = ""
) -> ChildRun:
    """Run ``argv`` once, no shell, bounded in bytes and time (spark_watchdog/child_run.py).

    ``device`` given: the send window is asked right before the process starts
    (power/send_window.py), so a command past its window never runs.

    :raises ChildNotStarted: it could not be started; nothing ran.
    """
    if device:
        send_window.enforce(device)
    return await run_child(argv, timeout=timeout, environment=environment)


def parse_status(stdout: str) -> PowerState | None:
    """The state in the last non-empty line of ``stdout`` (``{"state": "on"|"off"}``), or None."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if not lines:
        return None
    try:
        answer = json.loads(lines[-1])
    except ValueError:
        return None
    state = answer.get("state") if isinstance(answer, dict) else None
    if state == "on":
        return PowerState.ON
    if state == "off":
        return PowerState.OFF
    return None


class ExecPower:
    """The ``off``, ``on`` and ``status`` commands of one ``type: exec`` path."""

    def __init__(
        self,
        off: Sequence[str],
        on: Sequence[str],
        status: Sequence[str],
        *,
        timeout: float = 10.0,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self._argv = {PowerState.OFF: tuple(off), PowerState.ON: tuple(on)}
        self._status = tuple(status)
        self._timeout = timeout
        self._environment = command_environment() if environment is None else dict(environment)
        self._name = f"exec {shlex.join(redact_argv(self._status))}"
        self._key = f"exec:{shlex.join(self._argv[PowerState.OFF])}"

    @property
    def name(self) -> str:
        return self._name

    @property
    def limiter_key(self) -> str:
        return self._key

    async def read_state(self) -> PowerState:
        try:
            ran = await run_argv(self._status, self._timeout, self._environment)
        except ChildNotStarted as exc:
            raise Unreachable(self.name, f"status could not be started: {exc}") from None
        if ran.returncode != 0:
            raise Unreachable(self.name, f"status {ran.ended()}: {said(ran)}")
        state = parse_status(ran.stdout.text())
        if state is None:
            raise Refused(
                self.name,
                f"status printed {said(ran)}: expected a last line "
                '{"state": "on"} or {"state": "off"} (docs/power.md, "exec")',
            )
        return state

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"an exec path switches on or off, not {target.value}")
        which = target.value
        try:
            ran = await run_argv(
                self._argv[target], self._timeout, self._environment, device=self.name
            )
        except ChildNotStarted as exc:
            raise Unreachable(
                self.name, f"{which} could not be started: {exc}; nothing was sent"
            ) from None
        if ran.returncode == 0:
            if ran.stdout.kept or ran.stderr.kept:
                log.info("%s: %s said %s", self.name, which, said(ran))
            return
        if ran.returncode == EXEC_NOT_SENT_EXIT:
            raise Unreachable(
                self.name,
                f"{which} exited {EXEC_NOT_SENT_EXIT} (nothing was sent): {said(ran)}",
            )
        # Killed by a signal, or run over its timeout (killed with its group): it may
        # have switched, as may any other exit status.
        raise Ambiguous(self.name, f"{which} {ran.ended()}: {said(ran)}; it may have switched")

    async def aclose(self) -> None:
        return None


def build_exec_backend(device: ExecDevice, secrets: Mapping[str, Secret]) -> ExecPower:
    """The backend of one ``type: exec`` path (no secrets: its commands read their own)."""
    return ExecPower(
        device.off_command, device.on_command, device.status_command, timeout=device.timeout
    )
