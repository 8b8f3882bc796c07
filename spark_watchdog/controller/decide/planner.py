"""What to do about one node now: a pure decision from its state, verdict and guards.

Every safety rule that can be decided without I/O is decided here, so the
property tests can hammer it: no power on a node whose agent answered within
``freeze_after`` (only ``host_frozen`` leads to power), never beyond a
budget, never a rung twice in one incident, never an action while held, and
never a command in dry run.

:func:`power_blocked` is the one guard of every action that cuts power or
forces a reboot: the planner asks it before it plans a rung, a rung asks it
again right before its first command (recovery.py), and the wedged and
clock-latch ladders ask it before they reboot or cut. What differs between
those actions (which budget, whether the breaker applies) is written there,
once.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass

from spark_watchdog.controller.decide.detector import Finding, Verdict, verdicts_where
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.verdicts import Answer


class Step(enum.Enum):
    NOTHING = "nothing"
    FENCE = "fence"  # run power rung ``rung`` (verified cycle)
    RECORD_DRY_RUN = "record_dry_run"  # decide and record a rung; send nothing
    WAIT_TURN = "wait_turn"  # max_concurrent_power_actions reached: queue
    HOLD = "hold"  # a guard forbids power: hold the node and alert
    RESTART_AGENT = "restart_agent"  # agent_down: SSH restart of the agent, alert
    # serving_stalled / serving_dead / memory_exhausted / gpu_fault: the whole cluster
    RESTART_SERVING = "restart_serving"
    # gpu_wedged: serving restart, then a forced reboot over SSH (controller/act/wedged.py)
    UNWEDGE = "unwedge"
    # What controller/decide/decisions.py adds around the verdict: what the controller is doing,
    # the alerts that are news once, and what the history says.
    HOLD_UNRECORDED = "hold_unrecorded"  # host_frozen, history unwritable: held, not recorded
    HAND_TO_POWER = "hand_to_power"  # silent during the wedged ladder: the freeze path takes it
    RESUME_INCIDENT = "resume_incident"  # an open incident nothing runs: resumed from its record
    ALERT_CLOCK_LATCH = "alert_clock_latch"  # a clock-latched boot: one critical alert
    UNLATCH = "unlatch"  # the clock-latch ladder: a clean halt, then a long AC cut
    TELL_NO_AUTO_RESTART = "tell_no_auto_restart"  # a kill, auto_restart off: told once
    SERVING_BUDGET_SPENT = "serving_budget_spent"  # alert once; a person decides
    ANSWER_KILL = "answer_kill"  # a kill an earlier controller already answered
    FORGET_DRY_RUN = "forget_dry_run"  # the next freeze is a new dry-run incident
    # A memory guard kill that is not a cluster restart: one that killed nothing
    # (an alert: look at the node now), or one that grew old pending (no longer news).
    ALERT_GUARD_FAILED = "alert_guard_failed"
    FORGET_OLD_KILL = "forget_old_kill"
    # For the cluster (controller/decide/decisions.py, ``plan_cluster``):
    ALERT_WATCHER_DOUBT = "alert_watcher_doubt"  # the watcher doubts its own view: one alert
    LATCH_BREAKER = "latch_breaker"  # the breaker stayed open: the whole cluster held


# Steps that change nothing the cluster's view is read from (controller/decide/decisions.py).
QUIET_STEPS = frozenset(
    {
        Step.NOTHING,
        Step.FORGET_DRY_RUN,
        Step.ALERT_CLOCK_LATCH,
        Step.ALERT_GUARD_FAILED,
        Step.FORGET_OLD_KILL,
        Step.ALERT_WATCHER_DOUBT,
    }
)


class Action(enum.Enum):
    """An action the guard stands before."""

    CYCLE = "cycle"  # a rung of the freeze ladder: power off, hold, on
    LONG_CUT = "long_cut"  # the clock-latch ladder: a clean halt, then a long AC cut
    FORCED_REBOOT = "forced_reboot"  # the wedged ladder: a reboot over SSH, no power cut


class Block(enum.Enum):
    """Why the guard stops an action."""

    NOT_MINE = "not_mine"  # another controller on the Sparks acts for the node
    HELD = "held"
    BREAKER = "breaker"
    BUDGET = "budget"
    DRY_RUN = "dry_run"


@dataclass(frozen=True)
class Blocked:
    block: Block
    reason: str


@dataclass(frozen=True)
class Guards:
    """The guard inputs, read from the history and the running controller."""

    node_held: bool = False
    cluster_held: bool = False
    breaker_tripped: bool = False
    dry_run: bool = False
    node_cycles_in_window: int = 0
    node_budget: int = 3
    cluster_cycles_in_window: int = 0
    cluster_budget: int = 8
    power_actions_in_flight: int = 0
    max_concurrent_power_actions: int = 1
    rungs: int = 1  # power paths of the node that can reach a frozen host
    rungs_done: frozenset[int] = frozenset()  # rungs already run in this incident
    # What a hold in the history says (None: no reason known, or no hold).
    hold_reason: str | None = None
    # Forced reboots of the node in the budget window (asked for FORCED_REBOOT only).
    node_reboots_in_window: int = 0
    budget_window: float = 3600.0
    # Why another controller acts for the node (controller/decide/colocation.py);
    # None: this one does, or it is the only controller.
    not_mine: str | None = None


def power_blocked(guards: Guards, action: Action) -> Blocked | None:
    """Why ``action`` may not happen now; None when it may. In this order:

    - another controller on the Sparks acts for the node, or a hold: no action;
    - the circuit breaker stops a cycle and a long cut (more than its share of
      nodes looks frozen: the controller itself may be what is wrong); not a
      forced reboot, which goes to a host that answers SSH;
    - the budgets: a cycle needs one of the node's and one of the cluster's; a
      long cut also leaves the cluster's last one for a real freeze; a forced
      reboot counts against the node's budget in forced reboots; dry run: nothing.
    """
    if guards.not_mine is not None:
        return Blocked(Block.NOT_MINE, guards.not_mine)
    if guards.node_held or guards.cluster_held:
        said = f" ({guards.hold_reason})" if guards.hold_reason else ""
        return Blocked(Block.HELD, f"held{said}")
    if guards.breaker_tripped and action is not Action.FORCED_REBOOT:
        return Blocked(Block.BREAKER, "the circuit breaker is tripped")
    window = f"in {guards.budget_window:g}s"
    if action is Action.FORCED_REBOOT:
        if guards.node_reboots_in_window >= guards.node_budget:
            return Blocked(
                Block.BUDGET,
                f"node budget spent ({guards.node_reboots_in_window}/{guards.node_budget} "
                f"forced reboots {window})",
            )
    elif guards.node_cycles_in_window >= guards.node_budget:
        return Blocked(
            Block.BUDGET,
            f"node budget spent ({guards.node_cycles_in_window}/{guards.node_budget} "
            f"cycles {window})",
        )
    else:
        # One cycle of the cluster's budget stays for a real freeze.
        spare = 1 if action is Action.LONG_CUT else 0
        if guards.cluster_cycles_in_window + spare >= guards.cluster_budget:
            kept = ", one kept for a freeze" if spare else ""
            return Blocked(
                Block.BUDGET,
                f"cluster budget spent ({guards.cluster_cycles_in_window}/"
                f"{guards.cluster_budget} cycles {window}{kept})",
            )
    if guards.dry_run:
        return Blocked(Block.DRY_RUN, "dry run: nothing is sent")
    return None


@dataclass(frozen=True)
class Decision:
    step: Step
    reason: str
    rung: int | None = None  # 0-based index into the node's power paths
    event: NodeEvent | None = None  # what to feed the state machine, if anything
    # UNWEDGE: whether its first rung restarts serving (not past the serving budget).
    with_serving: bool = True


# The verdicts ``decide`` can act on. For any other it decides nothing, so the
# controller reads no guards from the history for it (a test checks the two agree).
ACTED_ON: frozenset[Verdict] = verdicts_where(lambda row: row.acted_on)


# Faults a serving restart answers: the rank stalled or died, or something on
# the node ended it (its memory guard, a GPU fault that ended its CUDA context).
SERVING_FAULTS = verdicts_where(lambda row: row.answer is Answer.RESTART_SERVING)


def decide(state: NodeState, finding: Finding, guards: Guards) -> Decision:
    if state is NodeState.HELD:
        return Decision(Step.NOTHING, "held: nothing automatic until released")
    if state is not NodeState.WATCHING:
        # FENCING and BOOTING are driven by the incident runner, step by step.
        return Decision(Step.NOTHING, f"{state.value}: the incident runner drives it")
    verdict = finding.verdict
    if verdict is Verdict.HOST_FROZEN:
        return _frozen(guards)
    if verdict is Verdict.AGENT_DOWN:
        # Never power for this alone (docs/design.md, "Verdicts"): the host still
        # answers SSH.
        return Decision(Step.RESTART_AGENT, finding.summary)
    if verdict is Verdict.GPU_WEDGED:
        if guards.node_held or guards.cluster_held:
            return Decision(Step.NOTHING, "gpu_wedged but held: nothing automatic")
        return Decision(Step.UNWEDGE, finding.summary)
    if verdict in SERVING_FAULTS:
        if guards.node_held or guards.cluster_held:
            return Decision(Step.NOTHING, "held: serving is not restarted automatically")
        return Decision(Step.RESTART_SERVING, finding.summary)
    return Decision(Step.NOTHING, finding.summary)


def _frozen(guards: Guards) -> Decision:
    blocked = power_blocked(guards, Action.CYCLE)
    if blocked is not None and blocked.block is Block.NOT_MINE:
        return Decision(Step.NOTHING, f"host_frozen, not this controller's: {blocked.reason}")
    if blocked is not None and blocked.block in (Block.HELD, Block.BREAKER):
        return Decision(Step.NOTHING, f"host_frozen but {blocked.reason}: no power action")
    if blocked is not None and blocked.block is Block.BUDGET:
        return Decision(Step.HOLD, blocked.reason, event=NodeEvent.GUARD_BLOCKED)
    remaining = [r for r in range(guards.rungs) if r not in guards.rungs_done]
    if not remaining:
        return Decision(
            Step.HOLD, "no power path left for this incident", event=NodeEvent.LADDER_EXHAUSTED
        )
    rung = remaining[0]
    if blocked is not None:  # dry run: decided and recorded, nothing sent
        return Decision(Step.RECORD_DRY_RUN, f"dry run: would run power path {rung + 1}", rung)
    if guards.power_actions_in_flight >= guards.max_concurrent_power_actions:
        return Decision(Step.WAIT_TURN, "another power action is in flight: queued", rung)
    return Decision(
        Step.FENCE, f"host_frozen: power path {rung + 1}", rung, NodeEvent.FROZEN_CONFIRMED
    )


def serving_after_recovery(
    others_recovering: Collection[str], *, for_incident: bool, not_mine: str | None = None
) -> Decision:
    """A recovery's serving rung: every rank restarts together, so while another
    node is still being recovered (frozen, fenced or booting) the restart waits
    for that recovery, which ends with one of its own. Where controllers run on
    the Sparks and serving is another's (``not_mine``: controller/decide/colocation.py),
    that one restarts it when it finds serving down."""
    if not_mine is not None:
        return Decision(Step.NOTHING, f"serving is another controller's: {not_mine}")
    if others_recovering and for_incident:
        waiting = ", ".join(sorted(others_recovering))
        return Decision(Step.NOTHING, f"waiting for {waiting}: its recovery restarts serving")
    return Decision(Step.RESTART_SERVING, "the recovery ends with serving restarted")


def breaker_trips(host_trouble: int, nodes: int, max_unhealthy_fraction: float) -> bool:
    """More than this fraction of nodes in host-level trouble at once: stop and ask.

    Serving verdicts are not counted: one frozen rank stalls every node of a
    TP=4 cluster, which is not evidence against the controller.
    """
    return nodes > 0 and host_trouble / nodes > max_unhealthy_fraction
