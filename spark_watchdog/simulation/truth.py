"""What happened in a simulated run, as the invariants need it
(simulation/invariants.py): every power command, every life the controller was
told of, the restarts, reboots and halts it asked for, and the violations."""

from __future__ import annotations

from dataclasses import dataclass, field

from spark_watchdog.power.base import PowerState


@dataclass
class Command:
    at: float
    node: str
    outlet: str
    target: PowerState
    incarnation: int
    landed: bool


@dataclass
class Truth:
    """What happened, as the invariants need it."""

    freeze_after: float
    life: dict[str, list[float]] = field(default_factory=dict)  # answers delivered, per node
    commands: list[Command] = field(default_factory=list)
    person_switches: list[tuple[float, str, PowerState]] = field(default_factory=list)
    # (when, node): an outlet switched on by its own timer.
    timed_ons: list[tuple[float, str]] = field(default_factory=list)
    # (when, node, its GPU latched then, its boot): clean halts sent over SSH.
    halts: list[tuple[float, str, bool, int]] = field(default_factory=list)
    serving_restarts: list[float] = field(default_factory=list)
    # (time, node, whether its GPU was wedged then) of each forced reboot received.
    reboots: list[tuple[float, str, bool]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def note_life(self, node: str, at: float) -> None:
        """The controller was told the node was alive at ``at`` (its own answer,
        or a believed peer's sighting); the list stays in order of time."""
        times = self.life.setdefault(node, [])
        if not times or at > times[-1]:
            times.append(at)

    def alive_at(self, node: str, now: float) -> float | None:
        """The last life the controller was told of within freeze_after before now."""
        times = self.life.get(node)
        if not times:
            return None
        last = times[-1]
        return last if now - last < self.freeze_after else None
