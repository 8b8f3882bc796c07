"""The node state machine, in one place, as a table a reader can check.

What the controller is doing about a node, apart from what it sees of the
node (the observations the monitor writes into controller/look/node_watch.py);
docs/architecture.md, "The node state machine", draws it. The state is one tagged value,
:data:`Doing`: ``Watching``, ``Fencing(rung)``, ``Booting(rung)``,
``Unwedging(incident)``, ``Unlatching(incident)`` or ``Held(reason, by)``, and
it changes only through :func:`enter`, which asks the table. The reported
verdict of a node is its detector verdict while watching, unwedging or
unlatching (the host answers), ``host_frozen`` while fencing, and ``booting`` /
``held`` otherwise.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar, TypeAlias


class NodeState(enum.Enum):
    WATCHING = "watching"  # no ladder runs; the detector's verdict stands
    FENCING = "fencing"  # a power rung is in progress: off, verify, hold, on, verify
    BOOTING = "booting"  # power restored; waiting for the agent with a new boot id
    # The wedged-but-alive ladder runs (controller/act/wedged.py): serving restart,
    # forced reboot over SSH; the host answers, so no power is cut.
    UNWEDGING = "unwedging"
    # The clock-latch ladder runs (controller/act/unlatch.py) until the halted host
    # is handed to the power path.
    UNLATCHING = "unlatching"
    HELD = "held"  # nothing automatic until an operator releases the node


class NodeEvent(enum.Enum):
    FROZEN_CONFIRMED = "frozen_confirmed"  # host_frozen, every guard allows a rung
    GUARD_BLOCKED = "guard_blocked"  # host_frozen, but a budget or the breaker says no
    POWER_RESTORED = "power_restored"  # the rung's cycle read back "on"
    RUNG_FAILED = "rung_failed"  # this rung failed; a later rung remains
    BOOT_TIMEOUT = "boot_timeout"  # no new boot id within boot_timeout; a later rung remains
    LADDER_EXHAUSTED = "ladder_exhausted"  # no rung left: a person decides
    AMBIGUOUS = "ambiguous"  # a power outcome that reads cannot settle
    FALSE_ALARM = "false_alarm"  # the agent answered again before power was cut
    NEW_BOOT = "new_boot"  # the agent answered with a new boot id
    HOLD = "hold"  # operator hold (node or cluster), or the circuit breaker
    RELEASE = "release"  # operator release
    RESUMED_LADDER = "resumed_ladder"  # a restarted controller continues a rung from the history
    RESUMED_BOOT_WAIT = "resumed_boot_wait"  # ... or the wait for a new boot
    RECOVERY_FAILED = "recovery_failed"  # an unexpected error: held, recorded, for a person
    RUNG_STARTED = "rung_started"  # a rung's first record: which power path is in progress
    WEDGED_CONFIRMED = "wedged_confirmed"  # gpu_wedged: the wedged ladder's incident is open
    LATCH_CONFIRMED = "latch_confirmed"  # a clock latch: the unlatch ladder's incident is open
    # A halted (or silent) host goes to the freeze path, with every guard of a freeze.
    HANDED_TO_POWER = "handed_to_power"
    LADDER_ENDED = "ladder_ended"  # a gentler ladder ended (recovered, or alerted and left)


W, F, B, H = NodeState.WATCHING, NodeState.FENCING, NodeState.BOOTING, NodeState.HELD
UW, UL = NodeState.UNWEDGING, NodeState.UNLATCHING
E = NodeEvent

TRANSITIONS: dict[tuple[NodeState, NodeEvent], NodeState] = {
    (W, E.FROZEN_CONFIRMED): F,  # WATCHING -> FENCING: open the incident, rung 1
    (W, E.GUARD_BLOCKED): H,  # WATCHING -> HELD: budget or breaker; alert
    (W, E.LADDER_EXHAUSTED): H,  # WATCHING -> HELD: frozen, but no power path can reach it
    (W, E.HOLD): H,  # WATCHING -> HELD: operator
    (W, E.RELEASE): W,  # nothing held: no-op
    (W, E.RESUMED_LADDER): F,  # WATCHING -> FENCING: resume a rung after a restart
    (W, E.RESUMED_BOOT_WAIT): B,  # WATCHING -> BOOTING: resume the boot wait after a restart
    (W, E.RECOVERY_FAILED): H,  # WATCHING -> HELD: failed resuming; a person decides
    (W, E.AMBIGUOUS): H,  # WATCHING -> HELD: a resumed rung whose outcome reads cannot settle
    (W, E.WEDGED_CONFIRMED): UW,  # WATCHING -> UNWEDGING: restart serving, then a forced reboot
    (W, E.LATCH_CONFIRMED): UL,  # WATCHING -> UNLATCHING: a clean halt, then the long cut
    (F, E.RUNG_STARTED): F,  # FENCING -> FENCING: this rung's power path
    (F, E.POWER_RESTORED): B,  # FENCING -> BOOTING: wait for a new boot id
    (F, E.RUNG_FAILED): F,  # FENCING -> FENCING: next rung (another device)
    (F, E.LADDER_EXHAUSTED): H,  # FENCING -> HELD: gave up; alert
    (F, E.AMBIGUOUS): H,  # FENCING -> HELD: never guess about power
    (F, E.FALSE_ALARM): W,  # FENCING -> WATCHING: came back before any off was sent
    # An operator hold during a rung stops every further command; power that
    # was already cut is still restored (restoring is not a new action).
    (F, E.HOLD): H,
    (F, E.RECOVERY_FAILED): H,  # FENCING -> HELD: an unexpected error; treated as ambiguous
    (F, E.GUARD_BLOCKED): H,  # FENCING -> HELD: a later rung's preflight: a budget or the breaker
    (B, E.NEW_BOOT): W,  # BOOTING -> WATCHING: recovered; serving restarts next
    (B, E.BOOT_TIMEOUT): F,  # BOOTING -> FENCING: next rung
    (B, E.LADDER_EXHAUSTED): H,  # BOOTING -> HELD: gave up; alert
    (B, E.HOLD): H,  # BOOTING -> HELD: operator
    (B, E.AMBIGUOUS): H,  # BOOTING -> HELD: a resumed rung whose outcome reads cannot settle
    (B, E.RECOVERY_FAILED): H,  # BOOTING -> HELD: an unexpected error
    (B, E.GUARD_BLOCKED): H,  # BOOTING -> HELD: the next rung's guard, right after a boot timeout
    (UW, E.LADDER_ENDED): W,  # UNWEDGING -> WATCHING: the GPU answers again, or a person was told
    (UW, E.HANDED_TO_POWER): W,  # UNWEDGING -> WATCHING: silent; the freeze path takes it
    (UW, E.HOLD): H,  # UNWEDGING -> HELD: a guard, a reboot not sent, still wedged, an operator
    (UW, E.RELEASE): UW,  # nothing held: no-op
    (UW, E.GUARD_BLOCKED): H,  # UNWEDGING -> HELD (every hold event holds, from every state)
    (UW, E.LADDER_EXHAUSTED): H,
    (UW, E.AMBIGUOUS): H,
    (UW, E.RECOVERY_FAILED): H,  # UNWEDGING -> HELD: the ladder failed
    (UL, E.LADDER_ENDED): W,  # UNLATCHING -> WATCHING: not cleared; alerted, left as it is
    (UL, E.HANDED_TO_POWER): W,  # UNLATCHING -> WATCHING: halted; the freeze path cuts it long
    (UL, E.HOLD): H,  # UNLATCHING -> HELD: an operator, the breaker
    (UL, E.RELEASE): UL,  # nothing held: no-op
    (UL, E.GUARD_BLOCKED): H,
    (UL, E.LADDER_EXHAUSTED): H,
    (UL, E.AMBIGUOUS): H,
    (UL, E.RECOVERY_FAILED): H,
    (H, E.HOLD): H,  # already held
    (H, E.RELEASE): W,  # HELD -> WATCHING: operator released
    (H, E.NEW_BOOT): H,  # a held node that reboots stays held
    (H, E.AMBIGUOUS): H,  # already held
    (H, E.RECOVERY_FAILED): H,  # already held
    (H, E.GUARD_BLOCKED): H,  # already held
    (H, E.LADDER_EXHAUSTED): H,  # already held
}


# The events a hold is placed with (controller/act/holds.py): each one leads from
# every state to HELD, so placing a hold never needs a second guess.
HOLD_EVENTS: frozenset[NodeEvent] = frozenset(
    {E.HOLD, E.GUARD_BLOCKED, E.LADDER_EXHAUSTED, E.AMBIGUOUS, E.RECOVERY_FAILED}
)


class InvalidTransition(Exception):
    def __init__(self, state: NodeState, event: NodeEvent) -> None:
        super().__init__(f"no transition from {state.value} on {event.value}")
        self.state = state
        self.event = event


def transition(state: NodeState, event: NodeEvent) -> NodeState:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(state, event) from None


class HeldBy(enum.Enum):
    """Who a hold is from, and so who ends it."""

    # The controller's own decision (a guard, ambiguity, an error, the breaker):
    # in the history, released only by a person.
    CONTROLLER = "controller"
    # A hold in the history that a person placed (the CLI, the page).
    OPERATOR = "operator"
    # The history cannot be written: nothing unrecorded acts, so the node
    # waits; the next sync that can read the history releases it.
    PAUSE = "pause"


@dataclass(frozen=True)
class Watching:
    kind: ClassVar[NodeState] = NodeState.WATCHING


@dataclass(frozen=True)
class Fencing:
    rung: int | None = None  # the power path in progress (0-based); None: before its first record
    kind: ClassVar[NodeState] = NodeState.FENCING


@dataclass(frozen=True)
class Booting:
    rung: int | None = None  # the power path whose cycle restored power, where known
    kind: ClassVar[NodeState] = NodeState.BOOTING


@dataclass(frozen=True)
class Unwedging:
    incident: int
    kind: ClassVar[NodeState] = NodeState.UNWEDGING


@dataclass(frozen=True)
class Unlatching:
    incident: int
    kind: ClassVar[NodeState] = NodeState.UNLATCHING


@dataclass(frozen=True)
class Held:
    reason: str
    by: HeldBy = HeldBy.CONTROLLER
    kind: ClassVar[NodeState] = NodeState.HELD


Doing: TypeAlias = Watching | Fencing | Booting | Unwedging | Unlatching | Held


class MissingDetail(InvalidTransition):
    """A transition into a state that carries something, without it."""

    def __init__(self, state: NodeState, event: NodeEvent, what: str) -> None:
        super().__init__(state, event)
        self.args = (f"{event.value} into {TRANSITIONS[(state, event)].value} needs {what}",)


def enter(
    doing: Doing,
    event: NodeEvent,
    *,
    rung: int | None = None,
    incident: int | None = None,
    reason: str | None = None,
    by: HeldBy = HeldBy.CONTROLLER,
) -> Doing:
    """The state ``event`` leads to from ``doing``, by the table, carrying what it needs:

    - fencing: ``rung`` (kept from the state before when not given);
    - booting: the rung that restored power, from fencing;
    - unwedging, unlatching: the ``incident`` the ladder runs for;
    - held: its ``reason`` and who placed it (an already held node keeps its
      hold when no new reason is given).

    :raises InvalidTransition: no such pair in the table, or what the state
        needs was not given (:class:`MissingDetail`).
    """
    target = transition(doing.kind, event)
    if target is NodeState.WATCHING:
        return Watching()
    if target is NodeState.FENCING:
        kept = doing.rung if isinstance(doing, Fencing) else None
        return Fencing(kept if rung is None else rung)
    if target is NodeState.BOOTING:
        kept = doing.rung if isinstance(doing, (Fencing, Booting)) else None
        return Booting(kept if rung is None else rung)
    if target in (NodeState.UNWEDGING, NodeState.UNLATCHING):
        if isinstance(doing, (Unwedging, Unlatching)) and doing.kind is target:
            return doing
        if incident is None:
            raise MissingDetail(doing.kind, event, "the incident")
        return Unwedging(incident) if target is NodeState.UNWEDGING else Unlatching(incident)
    if reason is None:
        if isinstance(doing, Held):
            return doing
        raise MissingDetail(doing.kind, event, "a reason")
    return Held(reason, by)


def diagram(transitions: dict[tuple[NodeState, NodeEvent], NodeState] = TRANSITIONS) -> str:
    """The table as a Mermaid state diagram: one arrow per pair of states, its
    events in the table's order (docs/architecture.md, "The node state machine")."""
    arrows: dict[tuple[NodeState, NodeState], list[str]] = {}
    for (source, event), target in transitions.items():
        arrows.setdefault((source, target), []).append(event.value)
    lines = ["stateDiagram-v2", f"    [*] --> {NodeState.WATCHING.value}"]
    for (source, target), events in arrows.items():
        lines.append(f"    {source.value} --> {target.value}: {', '.join(events)}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(diagram(), end="")
