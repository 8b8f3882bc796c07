"""Reading a frozen host's incident log back: where a controller that stopped
(killed, deposed, restarted) left its recovery, so that the next one goes on
from there through the same code (controller/act/recovery.py;
docs/design.md, "Restart and resume"). Pure: steps in, a plan out."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.history.records import IncidentStep
from spark_watchdog.steps import NOTHING_SENT, StepName


class Phase(enum.Enum):
    LADDER = "ladder"  # resume or continue the ladder
    BOOT_WAIT = "boot_wait"  # power was restored; wait for the new boot
    SERVING = "serving"  # the node is back; finish


@dataclass
class RungPlan:
    """Where to (re)start a rung: from the top, or resuming after a crash."""

    rung: int
    resume_from: str | None = None  # the last recorded step of this rung
    off_verified_at: float | None = None  # wall clock, from the record
    action_id: int | None = None  # the rung's action row, when it was recorded
    boot_before: str | None = None  # the frozen boot's id: recovery means another one
    # The rung's off hold when not power_off_seconds (a clock latch's long cut).
    off_seconds: float | None = None
    # The rung's off armed the device's own on this long after it (from the record).
    timed_on_after: float | None = None
    off_requested_at: float | None = None  # wall clock of that off_requested
    # 2: the rung's second try, after its first off was never seen to land.
    attempt: int = 1
    # The resume chose the boot wait, then this rung once more (Unsettled.THEN_AGAIN).
    again_after_wait: bool = False
    # Wall clock of the first resume that chose that boot wait (from the record):
    # a controller restarted during the wait goes on with it, not over again.
    boot_wait_from: float | None = None
    # The breaker's refusal of this rung is recorded (once per wait for it).
    breaker_noted: bool = False

    def again(self) -> RungPlan:
        """This rung's second try: from the top, as a new action."""
        return RungPlan(
            self.rung, boot_before=self.boot_before, off_seconds=self.off_seconds, attempt=2
        )

    @property
    def fresh(self) -> bool:
        """Nothing of this rung was sent: it (re)starts with the preflight."""
        return self.resume_from is None or self.resume_from in NOTHING_SENT


@dataclass
class ResumeInfo:
    """What an incident's log says about where a killed controller stopped."""

    plan: RungPlan | None
    rungs_done: set[int] = field(default_factory=set)
    phase: Phase = Phase.LADDER
    boot_before: str | None = None
    restored_at: float | None = None  # wall clock of power_restored


def _rung_started(rung: int, detail: dict[str, Any]) -> RungPlan:
    """The plan of a rung from its ``rung_started`` record."""
    action_id = detail.get("action_id")
    before = detail.get("boot_id_before")
    off = detail.get("off_seconds")
    attempt = detail.get("attempt")
    return RungPlan(
        rung,
        StepName.RUNG_STARTED,
        None,
        action_id if isinstance(action_id, int) else None,
        before if isinstance(before, str) else None,
        off_seconds=float(off) if isinstance(off, (int, float)) else None,
        attempt=attempt if isinstance(attempt, int) and attempt > 1 else 1,
    )


def resume_plan(steps: Sequence[IncidentStep], node: str) -> ResumeInfo:
    """Read an incident's log: the rung to resume, the rungs done, and the phase."""
    info = ResumeInfo(None)
    current: RungPlan | None = None
    for step in steps:
        if step.node not in (node, None):
            continue
        detail = step.detail if isinstance(step.detail, dict) else {}
        rung = detail.get("rung")
        name = step.step
        if name == StepName.RUNG_STARTED and isinstance(rung, int):
            if current is not None:
                info.rungs_done.add(current.rung)
            current = _rung_started(rung, detail)
            info.boot_before = current.boot_before
            info.phase = Phase.LADDER
        elif name == StepName.BOOT_TIMEOUT and current is not None and current.again_after_wait:
            # Killed after the boot wait that settles an unsent off: its second try is due.
            current, info.phase = current.again(), Phase.LADDER
        elif name in (StepName.RUNG_FAILED, StepName.BOOT_TIMEOUT) and current is not None:
            info.rungs_done.add(current.rung)
            current, info.phase = None, Phase.LADDER
        elif name == StepName.RESUMED and current is not None and "again" in detail:
            # A resume that chose the boot wait: the first one started it.
            current.again_after_wait = detail["again"] is True
            if current.boot_wait_from is None:
                current.boot_wait_from = step.at
        elif name == StepName.BOOT_TIMEOUT:
            info.phase = Phase.LADDER
        elif name == StepName.POWER_RESTORED:
            info.phase, info.restored_at = Phase.BOOT_WAIT, step.at
            if current is not None:
                info.rungs_done.add(current.rung)
        elif name == StepName.NEW_BOOT_SEEN:
            info.phase = Phase.SERVING
        elif current is not None and name in _RUNG_PROGRESS:
            current.resume_from = name
            on_after = detail.get("on_after_s")
            if name == StepName.OFF_REQUESTED:
                # Each off says for itself whether it armed the device's own on
                # (a retried rung's plain off must not inherit a withdrawn timed one).
                timed = on_after if isinstance(on_after, (int, float)) else None
                current.timed_on_after = None if timed is None else float(timed)
                current.off_requested_at = step.at
            if name in (StepName.OFF_VERIFIED, StepName.ALREADY_OFF):
                current.off_verified_at = step.at
    if info.phase is Phase.LADDER:
        info.plan = current
    return info


# Steps that move a rung along, in the power layer's vocabulary.
_RUNG_PROGRESS = frozenset(
    {
        StepName.OFF_SPACING,
        StepName.OFF_REQUESTED,
        StepName.OFF_WITHDRAWN,
        StepName.OFF_AMBIGUOUS,
        StepName.OFF_VERIFIED,
        StepName.ALREADY_OFF,
        StepName.HOLD_STARTED,
        StepName.HOLD_DONE,
        StepName.TIMED_ON_UNAVAILABLE,
        StepName.HOLD_CUT_SHORT,
        StepName.ON_AWAITED,
        StepName.ON_NOT_BY_DEVICE,
        StepName.ON_SPACING,
        StepName.ON_REQUESTED,
        StepName.ON_WITHDRAWN,
        StepName.ON_AMBIGUOUS,
        StepName.ON_VERIFIED,
        StepName.FOUND_OFF,
        "spacing",
    }
)
