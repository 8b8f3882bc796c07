"""What a verified power action reads and leaves behind: the state a device is
read in, the timing an action keeps, and its record (each step, and the
result). power/base.py's ``VerifiedPower`` produces them; the controller's
history, the CLI and doctor read them."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from spark_watchdog.steps import StepName


class PowerState(enum.Enum):
    ON = "on"
    OFF = "off"
    # Only a group of outlets is ever mixed: some on, some off.
    MIXED = "mixed"


@dataclass(frozen=True)
class PowerTiming:
    """Timing of verified actions (fence-agents' power_wait / power_timeout)."""

    poll_interval: float = 1.0
    power_timeout: float = 30.0
    min_command_interval: float = 2.0
    read_timeout: float = 10.0
    command_timeout: float = 15.0

    @property
    def switch_budget(self) -> float:
        """The longest one verified switch may take: a read, the spacing, the
        command and its read-back, and a few seconds' slack."""
        waits = self.read_timeout + self.min_command_interval + self.command_timeout
        return waits + self.power_timeout + 5.0


@dataclass(frozen=True)
class PowerStep:
    """One recorded step of an action, in order: what and when (monotonic s from start)."""

    name: StepName  # the incident's vocabulary (steps.py): a name outside it fails here
    at_s: float
    detail: str = ""
    # An off that armed the device's own on: seconds from the command to that on.
    on_after_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step": self.name, "at_s": round(self.at_s, 3)}
        data["detail"] = self.detail
        if self.on_after_s is not None:
            data["on_after_s"] = self.on_after_s
        return data


@dataclass(frozen=True)
class PowerResult:
    device: str
    action: str
    state_before: PowerState | None
    state_after: PowerState | None
    verified: bool
    elapsed_s: float
    dry_run: bool
    steps: tuple[PowerStep, ...] = ()
    error: str | None = None
    off_held_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "action": self.action,
            "state_before": None if self.state_before is None else self.state_before.value,
            "state_after": None if self.state_after is None else self.state_after.value,
            "verified": self.verified,
            "elapsed_s": round(self.elapsed_s, 3),
            "dry_run": self.dry_run,
            "off_held_s": None if self.off_held_s is None else round(self.off_held_s, 3),
            "error": self.error,
            "steps": [step.to_json() for step in self.steps],
        }


# Step hook: awaited before each command (write-ahead) and after each verification.
StepHook = Callable[[PowerStep], Awaitable[None]]
