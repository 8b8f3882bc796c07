"""The node state machine, in one place, as a table a reader can check.

docs/design.md's verdicts in states (what the controller is doing about a node), not in
verdicts (what the detector sees). The reported verdict of a node is its
detector verdict while ``watching``, ``host_frozen`` while ``fencing``, and
``booting`` / ``held`` otherwise.
"""

from __future__ import annotations

import enum


class NodeState(enum.Enum):
    WATCHING = "watching"  # no power action in progress; the detector's verdict stands
    FENCING = "fencing"  # a power rung is in progress: off, verify, hold, on, verify
    BOOTING = "booting"  # power restored; waiting for the agent with a new boot id
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


W, F, B, H = NodeState.WATCHING, NodeState.FENCING, NodeState.BOOTING, NodeState.HELD
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
    (H, E.HOLD): H,  # already held
    (H, E.RELEASE): W,  # HELD -> WATCHING: operator released
    (H, E.NEW_BOOT): H,  # a held node that reboots stays held
    (H, E.AMBIGUOUS): H,  # already held
    (H, E.RECOVERY_FAILED): H,  # already held
    (H, E.GUARD_BLOCKED): H,  # already held
    (H, E.LADDER_EXHAUSTED): H,  # already held
}


# The events a hold is placed with (controller/holds.py): each one leads from
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
