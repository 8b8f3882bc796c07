"""The controller processes of a simulated run, as the world tells them apart:
each start of the controller is an :class:`Incarnation`, and a call made by a
killed one does nothing (:class:`Killed`)."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass

# The controller process the running code belongs to (its tasks inherit it):
# what a device attributes a command to, and what a kill cancels.
PROCESS: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar(
    "process", default=None
)


class InjectedBug(RuntimeError):
    """A bug planted in a simulated device: the controller must hold, not crash or retry."""


class Killed(BaseException):
    """The controller incarnation that made this call was killed: nothing happens."""


@dataclass
class Incarnation:
    """One run of the controller process, from start to crash or end."""

    number: int
    alive: bool = True
    host: str | None = None  # the Spark it runs on (simulation/hosts.py); None: a host of its own

    def check(self) -> None:
        if not self.alive:
            raise Killed(f"controller #{self.number} is dead")


def asking_host() -> str | None:
    """The host of the controller process running this code: where its
    requests leave from (None: a host of its own, or the world itself)."""
    process = PROCESS.get()
    return None if process is None else process.host
