"""One start of the vLLM rank, whatever runs it: the seam between the serving
launcher (:mod:`spark_watchdog.agent.serving`: profiles, one operation at a
time, stop and kill policy, status) and the runtime that holds the rank's
processes: a process group the agent forked (:mod:`.rank_process`) or a
container of the local Docker Engine (:mod:`.rank_container`).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from spark_watchdog.errors import WatchdogError


class ServingError(WatchdogError):
    """A serving request could not be carried out."""


class UnknownProfile(ServingError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f'unknown profile "{name}"; known profiles: {", ".join(known)}')


class ServingConflict(ServingError):
    """Refused because of the state things are in (old rank alive, busy)."""


class LaunchFailed(ServingError):
    """The rank could not be started (not found, log not writable, no image, ...)."""


class StopFailed(ServingError):
    """Something of the rank survived SIGKILL."""


class Rank(Protocol):
    """A started rank. Every method is cheap and may be called from any thread."""

    @property
    def pid(self) -> int | None:
        """Its main process, as this host numbers it (None once unknown)."""

    def alive(self) -> bool:
        """Whether anything of it still lives (any process that holds GPU memory)."""

    def exit_code(self) -> int | None:
        """Its main process's exit status once it ended (negative: the signal), else None."""

    def ended_at(self) -> float | None:
        """When (wall clock) its main process ended, as this runtime first knew it:
        Docker's own record of the end (its ``die``), or the agent's first sight of
        the forked process gone. None while it runs, or when the end is not known."""

    def pids(self) -> list[int]:
        """Its live processes, as this host numbers them (for stack dumps and reports)."""

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` to all of it; nothing when it is gone. Never waits."""

    def describe(self) -> dict[str, Any]:
        """The runtime's own fields of the serving status (``pgid``, ``container``)."""

    def close(self) -> None:
        """Let go of what watches it (threads, connections); it keeps running."""


class RankRuntime(Protocol):
    """Starts ranks, and knows what an earlier one may have left."""

    kind: str

    def leftover(self) -> str | None:
        """Why a start must be refused now (something of an earlier rank lives), or None.
        :raises LaunchFailed: the runtime cannot be asked (no Docker Engine)."""

    def adopt(self, log_file: Path) -> tuple[Rank, list[str], str | None] | None:
        """A live rank this agent did not start (an earlier agent's, the operator's)
        that it can watch, stop and kill: with its command and its profile where
        known. None when there is none, or the runtime cannot take one over."""

    def base_command(self, configured: list[str]) -> list[str]:
        """The argv a profile is merged into: ``serving.command``, or where the
        runtime re-creates a rank it found (the launcher's container), that one's.

        :raises LaunchFailed: there is nothing to start from.
        """

    def creates_from(self) -> dict[str, Any]:
        """What a start creates the rank from (``source``, ``detail``), for status."""

    def watch_arrivals(self, arrived: Callable[[], None]) -> None:
        """Call ``arrived`` (on a thread of the runtime's) whenever a rank this
        agent may adopt starts outside it (the cluster's launcher); or never."""

    def close(self) -> None:
        """Stop watching for arrivals; nothing it started is touched."""

    def launch(
        self, argv: list[str], environment: dict[str, str], log_file: Path, profile: str
    ) -> Rank:
        """Start the rank with ``argv``; its output is appended to ``log_file``.
        :raises LaunchFailed: it could not be started (nothing of it runs)."""
