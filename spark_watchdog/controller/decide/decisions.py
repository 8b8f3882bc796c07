"""Whether anything happens to one node now, and what: the one place that decides.

Each tick the controller gathers, for each node, what deciding needs: the
node as it stands (:class:`NodeView`), the rest of the cluster and the
controller itself (:class:`ClusterView`), and what the history says
(:class:`Reads`, read only where :func:`needs` says the decision depends on
it). :func:`plan` returns the steps to carry out, in order. The ladders,
the serving restarts and the agent restarts carry out what they are given
and never ask again whether they may
(docs/architecture.md, "Deciding and carrying out").

Pure: no I/O, no clock. The verdict-driven core (what a frozen host, a
serving fault or a wedged GPU calls for, behind the power guard) is
:func:`spark_watchdog.controller.decide.planner.decide`; this adds what the
controller is already doing, the alerts that are news once, and the doubt
about the watcher itself (controller/decide/watcher_doubt.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from spark_watchdog.controller.decide.detector import Finding, Verdict
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import (
    ACTED_ON,
    SERVING_FAULTS,
    Decision,
    Guards,
    Step,
    decide,
)


class Kill(enum.Enum):
    """A kill of the node's rank its verdict answers (memory_exhausted, gpu_fault)."""

    NONE = "none"  # the verdict answers no kill
    PENDING = "pending"  # reported, not answered yet
    ANSWERED = "answered"  # answered this very tick: the next tick judges afresh


class GuardKill(enum.Enum):
    """The node's memory guard kill reported and not answered yet, whatever the verdict."""

    NONE = "none"
    KILLED = "killed"  # fresh, and it killed the rank: answered by a serving restart
    FAILED = "failed"  # fresh, and it killed nothing: an alert, not a cluster restart
    OLD = "old"  # reported longer ago than a report is news (a hold, a failed restart)


@dataclass(frozen=True)
class NodeView:
    """One node as the decision sees it."""

    name: str
    state: NodeState
    finding: Finding
    incident_id: int | None = None  # the open incident this controller has for it
    fencing: bool = False  # the freeze ladder's task runs for it
    unwedging: bool = False  # the wedged ladder's task runs for it
    kill: Kill = Kill.NONE
    latched_boot: str | None = None  # the boot whose GPU the agent found clock-latched
    latch_alerted: str | None = None  # the boot the latch alert went out for
    latch_answered: str | None = None  # the boot an unlatch ladder was started for
    agent_restart_cooling: bool = False  # an agent restart within its cooldown
    agent_restart_running: bool = False
    guard_kill: GuardKill = GuardKill.NONE
    # What this spell's dry-run incident recorded (RECORD_DRY_RUN, UNWEDGE or
    # RESTART_SERVING), or None: not one yet.
    dry_run_recorded: Step | None = None
    # Why another controller on the Sparks acts for it (controller/decide/colocation.py);
    # None: this one does, or it is the only controller.
    not_mine: str | None = None


@dataclass(frozen=True)
class ClusterView:
    """The rest of the cluster and the controller itself."""

    history_problem: str | None = None
    stalled: str | None = None  # the controller's loop stalled (watcher_doubt.py)
    all_silent: str | None = None  # every node fell silent at once
    latch_acting: bool = False  # policy.clock_latch_off_seconds > 0
    unlatch_in_progress: bool = False
    ladders_running: bool = False  # a freeze or wedged ladder runs somewhere
    busy: bool = False  # some node is being fenced or booted
    auto_restart: bool = True  # serving.auto_restart
    serving_running: bool = False  # a serving restart for a fault is under way
    serving_blocked: bool = False  # refused by the budget a while ago: not yet again
    serving_cooling: bool = False  # within serving.restart_cooldown of the last restart
    recovering: frozenset[str] = frozenset()  # frozen, being fenced or booted
    held_down: frozenset[str] = frozenset()  # held for a person and not healthy
    doubt_alerted: bool = False  # the doubt's alert went out this spell
    nodes: int = 0
    breaker_open_s: float | None = None  # how long the circuit breaker has been open
    breaker_trouble: tuple[str, ...] = ()  # the nodes it counts
    breaker_latch_after: float = 300.0  # guards.breaker_latch_after
    cluster_held: bool = False  # the history holds the whole cluster
    # Why another controller on the Sparks restarts serving (colocation.py); None: this one.
    serving_not_mine: str | None = None


@dataclass(frozen=True)
class Reads:
    """What the history says, read where :func:`needs` asked for it."""

    guards: Guards | None = None
    # An earlier controller opened an incident for this kill (None: unreadable).
    kill_recorded: bool | None = False
    serving_restarts: int | None = None  # automatic ones for serving faults in the window
    serving_budget: int = 6
    serving_window: float = 3600.0


@dataclass(frozen=True)
class Needs:
    guards: bool = False
    kill_record: bool = False
    serving_count: bool = False


def needs(node: NodeView, cluster: ClusterView) -> Needs:
    """Which history reads the decision for ``node`` depends on (none for most)."""
    if _others(node, cluster):
        return Needs()
    node = _after_guard(node)
    if _settled_before_reads(node, cluster) is not None or node.finding.verdict not in ACTED_ON:
        return Needs()
    verdict = node.finding.verdict
    serving = verdict is Verdict.GPU_WEDGED or (
        verdict in SERVING_FAULTS and _serving_gate(node, cluster) is None
    )
    return Needs(guards=True, kill_record=node.kill is Kill.PENDING, serving_count=serving)


def plan(node: NodeView, cluster: ClusterView, reads: Reads) -> tuple[Decision, ...]:
    """Every step the controller takes for ``node`` now, in order."""
    if _others(node, cluster):
        return (Decision(Step.NOTHING, f"another controller acts for it: {node.not_mine}"),)
    steps = (*_guard(node), *_latch(node, cluster))
    node = _after_guard(node)
    if any(d.step is Step.UNLATCH for d in steps):
        return steps  # the node is the unlatch ladder's now
    settled = _settled_before_reads(node, cluster)
    if settled is not None:
        return (*steps, settled)
    return (*steps, *_acted_on(node, cluster, reads))


def _others(node: NodeView, cluster: ClusterView) -> bool:
    """Another controller on the Sparks acts for the node: this one starts nothing
    and tells nothing of it; a ladder of its own already running carries on, and
    asks again right before it cuts (planner.power_blocked). A serving fault is
    the cluster's: the controller that restarts serving answers it, whichever node
    it shows on (its own host's included)."""
    if node.not_mine is None or node.fencing or node.unwedging:
        return False
    return not (node.finding.verdict in SERVING_FAULTS and cluster.serving_not_mine is None)


def _guard(node: NodeView) -> tuple[Decision, ...]:
    """A memory guard kill that restarts nothing: one that killed nothing is an
    alert; one pending too long (a hold, a failed restart) is no longer news."""
    if node.guard_kill is GuardKill.FAILED:
        return (Decision(Step.ALERT_GUARD_FAILED, "the memory guard tripped and killed nothing"),)
    if node.guard_kill is GuardKill.OLD:
        return (Decision(Step.FORGET_OLD_KILL, "the memory guard's kill is no longer news"),)
    return ()


def _after_guard(node: NodeView) -> NodeView:
    """The node as the rest of the plan sees it once :func:`_guard`'s steps are
    carried out: a memory_exhausted verdict's kill answered, judged afresh next tick."""
    settled = node.guard_kill in (GuardKill.FAILED, GuardKill.OLD)
    if settled and node.finding.verdict is Verdict.MEMORY_EXHAUSTED and node.kill is Kill.PENDING:
        return replace(node, kill=Kill.ANSWERED)
    return node


def plan_cluster(cluster: ClusterView) -> tuple[Decision, ...]:
    """What the controller does for the cluster as a whole now, before any node:
    one alert when it begins to doubt its own view (controller/decide/watcher_doubt.py),
    and a cluster hold when the circuit breaker stayed open ``breaker_latch_after``
    (docs/design.md, "Guards"). An open breaker itself fences nothing: the power
    guard reads it (planner.power_blocked)."""
    steps: list[Decision] = []
    doubt = cluster.stalled or cluster.all_silent
    if doubt is not None and not cluster.doubt_alerted:
        steps.append(Decision(Step.ALERT_WATCHER_DOUBT, doubt))
    open_s = cluster.breaker_open_s
    if open_s is not None and open_s >= cluster.breaker_latch_after and not cluster.cluster_held:
        trouble = cluster.breaker_trouble
        steps.append(
            Decision(
                Step.LATCH_BREAKER,
                f"circuit breaker: {len(trouble)}/{cluster.nodes} nodes look frozen without a "
                f"TCP handshake ({', '.join(trouble)}) for {open_s:.0f}s; "
                "release with: spark-watchdog release '*'",
            )
        )
    return tuple(steps)


def _latch(node: NodeView, cluster: ClusterView) -> tuple[Decision, ...]:
    """A clock-latched boot: its alert once, and its ladder once when the node is free."""
    boot = node.latched_boot
    if boot is None:
        return ()
    steps: list[Decision] = []
    if node.latch_alerted != boot:
        steps.append(Decision(Step.ALERT_CLOCK_LATCH, f"clock latched on boot {boot}"))
    if cluster.latch_acting and node.latch_answered != boot and _free_to_unlatch(node, cluster):
        steps.append(Decision(Step.UNLATCH, f"clock latched on boot {boot}: halt, then a long cut"))
    return tuple(steps)


def _free_to_unlatch(node: NodeView, cluster: ClusterView) -> bool:
    """One unlatch at a time, on a healthy node, while nothing else in the
    cluster is being recovered (a held node elsewhere does not count)."""
    return (
        node.finding.verdict is Verdict.HEALTHY
        and node.incident_id is None
        and node.state is NodeState.WATCHING
        and not (node.fencing or node.unwedging)
        and not cluster.unlatch_in_progress
        and not cluster.busy
        and not cluster.ladders_running
    )


def _settled_before_reads(node: NodeView, cluster: ClusterView) -> Decision | None:
    """What is decided before the history is asked anything: something already
    has the node, the watcher is in doubt, or nothing can be recorded."""
    verdict = node.finding.verdict
    if node.kill is Kill.ANSWERED:
        return Decision(Step.NOTHING, "its kill was answered this tick: judged afresh next tick")
    if node.fencing:
        return Decision(Step.NOTHING, "the freeze ladder runs for it")
    if node.unwedging:
        if verdict is Verdict.HOST_FROZEN:
            return Decision(Step.HAND_TO_POWER, "silent during the wedged ladder: the freeze path")
        return Decision(Step.NOTHING, "the wedged ladder runs for it")
    if node.state is not NodeState.WATCHING:
        return Decision(Step.NOTHING, f"{node.state.value}: its ladder or a person has it")
    if node.incident_id is not None:
        return Decision(Step.RESUME_INCIDENT, f"incident #{node.incident_id} open, nothing runs it")
    if verdict is Verdict.HOST_FROZEN and cluster.history_problem:
        # Holds rather than acts blind: nothing unrecorded touches power.
        return Decision(
            Step.HOLD_UNRECORDED,
            f"history unwritable: {cluster.history_problem}",
            event=NodeEvent.HOLD,
        )
    doubt = _doubt(verdict, cluster)
    if doubt is not None:
        return Decision(Step.NOTHING, doubt)
    if verdict not in ACTED_ON:
        return Decision(Step.FORGET_DRY_RUN, node.finding.summary)
    return None


def _doubt(verdict: Verdict, cluster: ClusterView) -> str | None:
    """A silent node's verdict while the watcher is in doubt: nothing is done for it."""
    if verdict is Verdict.AGENT_DOWN and (cluster.stalled or cluster.all_silent):
        return f"agent_down not acted on: {cluster.stalled or cluster.all_silent}"
    if verdict is Verdict.HOST_FROZEN and cluster.stalled:
        return f"host_frozen not acted on: {cluster.stalled}"
    return None


def _serving_gate(node: NodeView, cluster: ClusterView) -> Decision | None:
    """Why a serving fault gets no serving restart now; None: it may have one."""
    if cluster.serving_not_mine is not None:
        return Decision(Step.NOTHING, f"not this controller's: {cluster.serving_not_mine}")
    if cluster.unlatch_in_progress:
        return Decision(Step.NOTHING, "a node halts for its long cut: serving restarts after it")
    if not cluster.auto_restart:
        if node.kill is Kill.PENDING:
            return Decision(Step.TELL_NO_AUTO_RESTART, "serving.auto_restart is off")
        return Decision(Step.NOTHING, "serving.auto_restart is off")
    if cluster.serving_blocked:
        return Decision(Step.NOTHING, "the serving budget was spent a short while ago")
    if cluster.serving_running:
        return Decision(Step.NOTHING, "a serving restart is under way")
    if cluster.ladders_running:
        return Decision(Step.NOTHING, "a recovery under way ends with a serving restart")
    others = (cluster.recovering | cluster.held_down) - {node.name}
    if node.kill is not Kill.PENDING and others:
        # The group stalls because another node is down: its recovery restarts
        # serving, or a person who releases it does (a kill still gets one).
        return Decision(Step.NOTHING, f"waiting for {', '.join(sorted(others))}")
    if cluster.serving_cooling:
        return Decision(Step.NOTHING, "within serving.restart_cooldown of the last restart")
    return None


def _acted_on(node: NodeView, cluster: ClusterView, reads: Reads) -> tuple[Decision, ...]:
    """An acted-on verdict on a free node: the planner's decision, then what
    the controller is doing and the history say of carrying it out now."""
    if node.kill is Kill.PENDING and reads.kill_recorded is not False:
        if reads.kill_recorded is None:
            return (Decision(Step.NOTHING, "the kill's record could not be read: next tick"),)
        return (Decision(Step.ANSWER_KILL, "an earlier controller answered this kill"),)
    if reads.guards is None:
        return (Decision(Step.NOTHING, "the guards could not be read: next tick"),)
    decision = decide(node.state, node.finding, reads.guards)
    if decision.step in _DRY_RUN_ONCE and node.dry_run_recorded is decision.step:
        # Dry run: one incident a spell records what would be done, not one a tick.
        return (Decision(Step.NOTHING, "dry run: recorded for this spell already"),)
    if decision.step is Step.RESTART_AGENT and (
        node.agent_restart_running or node.agent_restart_cooling
    ):
        decision = Decision(Step.NOTHING, "an agent restart is under way or cooling down")
    if decision.step is Step.RESTART_SERVING:
        decision = _serving_gate(node, cluster) or _serving_budget(decision, reads)
    if decision.step is Step.UNWEDGE:
        return _unwedge(decision, reads)
    if decision.step is Step.NOTHING and node.finding.verdict is not Verdict.HOST_FROZEN:
        return (decision, Decision(Step.FORGET_DRY_RUN, decision.reason))
    return (decision,)


# What opens an incident that dry run records and closes at once: once a spell
# of each (a serving fault's record does not hide the freeze that follows it).
_DRY_RUN_ONCE = (Step.RECORD_DRY_RUN, Step.UNWEDGE, Step.RESTART_SERVING)


def _unwedge(decision: Decision, reads: Reads) -> tuple[Decision, ...]:
    """The wedged ladder, its first rung a serving restart within the budget."""
    budget = _serving_budget(decision, reads)
    if budget.step is Step.NOTHING:
        return (budget,)  # the serving restarts could not be counted: next tick
    if budget.step is Step.SERVING_BUDGET_SPENT:
        return (budget, replace(decision, with_serving=False))
    return (decision,)


def _serving_budget(decision: Decision, reads: Reads) -> Decision:
    if reads.serving_restarts is None:
        return Decision(Step.NOTHING, "the serving restarts could not be counted: next tick")
    if reads.serving_restarts >= reads.serving_budget:
        return Decision(
            Step.SERVING_BUDGET_SPENT,
            f"{reads.serving_restarts} automatic serving restarts in "
            f"{reads.serving_window:g} s (budget {reads.serving_budget})",
        )
    return decision
