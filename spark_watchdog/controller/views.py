"""What the decision sees: each node, the rest of the cluster and the
controller itself, read from the parts that hold it (controller/decide/decisions.py
decides from these; nothing here decides or changes anything)."""

from __future__ import annotations

import contextlib

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.act.agent_restart import AgentRestarts
from spark_watchdog.controller.act.parts import Ladder, Parts
from spark_watchdog.controller.act.power_actions import PowerActions
from spark_watchdog.controller.decide.decisions import (
    ClusterView,
    GuardKill,
    Kill,
    Needs,
    NodeView,
    Reads,
)
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.watcher_doubt import WatcherDoubt, all_silent_reason
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.controller.serving.kill_records import kill_recorded
from spark_watchdog.controller.serving.serving_policy import ServingRestarts

_BUSY = (NodeState.FENCING, NodeState.BOOTING)


def node_view(
    watch: NodeWatch, parts: Parts, agent_restarts: AgentRestarts, not_mine: str | None = None
) -> NodeView:
    """``not_mine``: why another controller on the Sparks acts for the node."""
    kills = watch.kills_of(watch.finding.verdict)
    kill = Kill.NONE
    if kills is not None:
        kill = Kill.ANSWERED if kills.pending is None else Kill.PENDING
    now = parts.clock.monotonic()
    return NodeView(
        name=watch.name,
        state=watch.state,
        finding=watch.finding,
        incident_id=watch.conduct.incident_id,
        fencing=parts.work.running_for(Ladder.FENCING, watch.name),
        unwedging=parts.work.running_for(Ladder.UNWEDGING, watch.name),
        kill=kill,
        latched_boot=watch.clock_latched_boot,
        latch_alerted=watch.conduct.clock_latch_alerted,
        latch_answered=watch.conduct.clock_latch_answered,
        agent_restart_cooling=agent_restarts.cooling(watch, now),
        agent_restart_running=agent_restarts.running(watch.name),
        guard_kill=_guard_kill(watch, parts.clock.time()),
        dry_run_recorded=watch.conduct.dry_run_step,
        not_mine=not_mine,
    )


def _guard_kill(watch: NodeWatch, wall: float) -> GuardKill:
    kill = watch.memory_kills.pending
    if kill is None:
        return GuardKill.NONE
    if watch.memory_kills.grown_old(wall):
        return GuardKill.OLD
    return GuardKill.KILLED if kill.get("result") == "killed" else GuardKill.FAILED


def cluster_view(
    parts: Parts,
    serving: ServingRestarts,
    doubt: WatcherDoubt,
    late_after: float,
    doubt_alerted: bool = False,
    serving_not_mine: str | None = None,
) -> ClusterView:
    """``late_after``: how long an agent may go without progress before it is
    silent; ``doubt_alerted``: the doubt's alert went out this spell;
    ``serving_not_mine``: why another controller on the Sparks restarts serving."""
    config: ControllerConfig = parts.config
    now = parts.clock.monotonic()
    watches = parts.watches.values()
    return ClusterView(
        history_problem=parts.ledger.problem,
        stalled=doubt.stall_reason(now),
        all_silent=all_silent_reason(w.agent_silent_s(now) >= late_after for w in watches),
        latch_acting=config.policy.clock_latch_off_seconds > 0,
        unlatch_in_progress=parts.unlatch_in_progress(),
        ladders_running=parts.ladders_running(),
        busy=any(w.state in _BUSY for w in watches),
        auto_restart=config.serving.auto_restart,
        serving_running=serving.running(),
        serving_blocked=serving.budget.blocked(now),
        serving_cooling=serving.cooling(now),
        recovering=frozenset(serving.recovering(lambda _: True)),
        held_down=frozenset(serving.held_down(lambda _: True)),
        doubt_alerted=doubt_alerted,
        nodes=len(parts.watches),
        breaker_open_s=parts.holds.breaker_open_for(now),
        breaker_trouble=parts.holds.breaker_trouble,
        breaker_latch_after=config.guards.breaker_latch_after,
        cluster_held=parts.holds.cluster_hold is not None,
        serving_not_mine=serving_not_mine,
    )


async def history_reads(
    watch: NodeWatch, wanted: Needs, power: PowerActions, serving: ServingRestarts
) -> Reads:
    """What the history says, where the decision depends on it (``wanted``)."""
    guards = None
    if wanted.guards:
        with contextlib.suppress(HistoryUnwritable):
            guards = await power.guards(watch)
    config = serving.config.serving
    return Reads(
        guards=guards,
        kill_recorded=await kill_recorded(serving.ledger, watch) if wanted.kill_record else False,
        serving_restarts=await serving.budget.count_in_window() if wanted.serving_count else None,
        serving_budget=config.restart_budget,
        serving_window=config.restart_budget_window,
    )
