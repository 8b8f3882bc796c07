"""The rank as a process group the agent forks (``serving.runtime: process``).

The command runs without a shell, in a session and process group of its
own, with stdout and stderr appended to ``serving.log_file``. Why the
process *group*: killing only vLLM's API server leaves the engine and worker
processes alive and holding the GPU (vllm #55510), so the group is signalled
and "gone" means no live process is left in it. Processes that leave the
group on purpose (``setsid``, a container started by a daemon) are out of its
reach: ``serving.runtime: docker`` is the way for containers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from spark_watchdog.agent.rank import LaunchFailed
from spark_watchdog.probes.vllm import rank_process_alive

# Variables systemd hands the agent that are about the agent, not the rank
# (sd_notify(3), sd_listen_fds(3), systemd.exec(5) $CREDENTIALS_DIRECTORY): a
# child that found NOTIFY_SOCKET could speak for the agent, and the agent's
# credentials (the serving token) are none of the rank's business.
AGENT_ONLY_ENV = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "CREDENTIALS_DIRECTORY",
)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in group ``pgid``. kill(pgid, 0) alone also
    counts zombies, which hold nothing and may linger where no init reaps."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone else's process in it: look closer
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                members.append(int(proc.info["pid"]))
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


class ProcessRank:
    """A rank the agent forked: its process group."""

    def __init__(
        self, process: subprocess.Popen[bytes], clock: Callable[[], float] = time.time
    ) -> None:
        self.process = process
        self._clock = clock
        # Once the group is seen empty its id may be reused: never signal it again.
        self._group_gone = False
        # When (wall clock) the agent first saw the leader ended: its first sign of death.
        self._ended_at: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the child leads its own group

    def alive(self) -> bool:
        return bool(self.pids())

    def exit_code(self) -> int | None:
        return self._poll()

    def ended_at(self) -> float | None:
        self._poll()
        return self._ended_at

    def _poll(self) -> int | None:
        """The leader's exit status (reaping it), noting when it was first seen ended."""
        code = self.process.poll()
        if code is not None and self._ended_at is None:
            self._ended_at = self._clock()
        return code

    def pids(self) -> list[int]:
        """Live processes of the group; reaps the leader as a side effect."""
        if self._group_gone:
            return []
        if self._poll() is None:
            return [self.pgid]  # the leader itself is alive: no need to look further
        members = group_members(self.pgid)
        if not members:
            self._group_gone = True
        return members

    def signal(self, signum: signal.Signals) -> None:
        if self._group_gone:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signum)

    def describe(self) -> dict[str, Any]:
        return {"pgid": self.pgid}

    def close(self) -> None:
        return None


class ProcessRuntime:
    """Forks the rank; refuses while a process matching ``process_match`` lives."""

    kind = "process"

    def __init__(self, working_directory: str | None, process_match: str | None) -> None:
        self.working_directory = working_directory
        self.process_match = process_match

    def leftover(self) -> str | None:
        if self.process_match and rank_process_alive(self.process_match):
            return (
                f'a process matching probes.vllm.process_match "{self.process_match}" '
                "still runs (an old rank not started by this agent?); stop it first"
            )
        return None

    def adopt(self, log_file: Path) -> None:
        """A process group of an earlier agent is no child of this one: it is found
        (``process_match``) and refused, never adopted."""
        return None

    def base_command(self, configured: list[str]) -> list[str]:
        if not configured:  # the config requires one with this runtime
            raise LaunchFailed("serving.command: not set")
        return configured

    def creates_from(self) -> dict[str, Any]:
        return {"source": "serving.command", "detail": None}

    def watch_arrivals(self, arrived: Callable[[], None]) -> None:
        """A process started by someone else is refused, never adopted: nothing to watch."""

    def close(self) -> None:
        """Nothing to let go of."""

    def launch(
        self, argv: list[str], environment: dict[str, str], log_file: Path, profile: str
    ) -> ProcessRank:
        env = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}
        env.update(environment)
        try:
            fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise LaunchFailed(
                f"serving.log_file: cannot open {log_file} for appending: {exc.strerror or exc}"
            ) from None
        with os.fdopen(fd, "ab") as sink:
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    cwd=self.working_directory,
                    env=env,
                    close_fds=True,
                    start_new_session=True,
                )
            except OSError as exc:
                sink.write(f"--- spark-watchdog: launch failed: {exc}\n".encode())
                raise LaunchFailed(
                    f"serving.command: cannot start {argv[0]!r}: {exc.strerror or exc}"
                ) from None
        return ProcessRank(process)
