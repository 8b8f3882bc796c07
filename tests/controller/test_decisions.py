"""The one place that decides whether anything happens to a node now
(controller/decide/decisions.py): what the controller is already doing, the doubt
about the watcher and what the history says, over any combination of them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_watchdog.controller.decide.decisions import (
    ClusterView,
    GuardKill,
    Kill,
    NodeView,
    Reads,
    needs,
    plan,
    plan_cluster,
)
from spark_watchdog.controller.decide.detector import Finding, Verdict
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.planner import (
    SERVING_FAULTS,
    Guards,
    Step,
    serving_after_recovery,
)

STALLED = "the controller's loop stalled"
SILENT = "every node fell silent at once"

nodes = st.builds(
    NodeView,
    name=st.sampled_from(["spark-1", "spark-2"]),
    state=st.sampled_from(list(NodeState)),
    finding=st.builds(Finding, st.sampled_from(list(Verdict)), st.just(("why",))),
    incident_id=st.one_of(st.none(), st.just(7)),
    fencing=st.booleans(),
    unwedging=st.booleans(),
    kill=st.sampled_from(list(Kill)),
    latched_boot=st.sampled_from([None, "b1", "b2"]),
    latch_alerted=st.sampled_from([None, "b1"]),
    latch_answered=st.sampled_from([None, "b1"]),
    agent_restart_cooling=st.booleans(),
    agent_restart_running=st.booleans(),
    guard_kill=st.sampled_from(list(GuardKill)),
    dry_run_recorded=st.sampled_from(
        [None, Step.RECORD_DRY_RUN, Step.UNWEDGE, Step.RESTART_SERVING]
    ),
)
clusters = st.builds(
    ClusterView,
    history_problem=st.sampled_from([None, "disk full"]),
    stalled=st.sampled_from([None, STALLED]),
    all_silent=st.sampled_from([None, SILENT]),
    latch_acting=st.booleans(),
    unlatch_in_progress=st.booleans(),
    ladders_running=st.booleans(),
    busy=st.booleans(),
    auto_restart=st.booleans(),
    serving_running=st.booleans(),
    serving_blocked=st.booleans(),
    serving_cooling=st.booleans(),
    recovering=st.sampled_from([frozenset(), frozenset({"spark-1"}), frozenset({"spark-2"})]),
    held_down=st.sampled_from([frozenset(), frozenset({"spark-2"})]),
    doubt_alerted=st.booleans(),
    nodes=st.just(4),
    breaker_open_s=st.sampled_from([None, 0.0, 299.0, 300.0, 900.0]),
    breaker_trouble=st.sampled_from([(), ("spark-1", "spark-2", "spark-3")]),
    breaker_latch_after=st.just(300.0),
    cluster_held=st.booleans(),
)
guards = st.builds(
    Guards,
    node_held=st.booleans(),
    cluster_held=st.booleans(),
    breaker_tripped=st.booleans(),
    dry_run=st.booleans(),
    node_cycles_in_window=st.integers(0, 4),
    power_actions_in_flight=st.integers(0, 1),
)
reads = st.builds(
    Reads,
    guards=st.one_of(st.none(), guards),
    kill_recorded=st.sampled_from([None, False, True]),
    serving_restarts=st.one_of(st.none(), st.integers(0, 8)),
)

POWER = {Step.FENCE, Step.RECORD_DRY_RUN}
STARTS = POWER | {Step.UNWEDGE, Step.RESTART_AGENT, Step.RESTART_SERVING, Step.UNLATCH}


@settings(max_examples=500, deadline=None)
@given(node=nodes, cluster=clusters, history=reads)
def test_nothing_starts_where_something_already_has_the_node_or_the_watcher_is_in_doubt(
    node: NodeView, cluster: ClusterView, history: Reads
) -> None:
    steps = {d.step for d in plan(node, cluster, history)}
    started = steps & STARTS
    if node.fencing or node.unwedging or node.state is not NodeState.WATCHING:
        assert started == set()
    if node.incident_id is not None:
        assert started == set()
    if steps & POWER:
        assert node.finding.verdict is Verdict.HOST_FROZEN
        assert cluster.history_problem is None and cluster.stalled is None
        assert history.guards is not None
        assert history.guards.dry_run is (Step.RECORD_DRY_RUN in steps)
    if Step.RESTART_AGENT in steps:
        assert cluster.stalled is None and cluster.all_silent is None
        assert not node.agent_restart_cooling and not node.agent_restart_running
    if Step.RESTART_SERVING in steps:
        assert node.finding.verdict in SERVING_FAULTS and cluster.auto_restart
        assert not (cluster.serving_running or cluster.serving_blocked or cluster.serving_cooling)
        assert not (cluster.ladders_running or cluster.unlatch_in_progress)
        assert history.serving_restarts is not None
        assert history.serving_restarts < history.serving_budget
    if Step.UNLATCH in steps:
        assert node.finding.verdict is Verdict.HEALTHY and cluster.latch_acting
        assert not (cluster.unlatch_in_progress or cluster.busy or cluster.ladders_running)
        assert node.latch_answered != node.latched_boot
    if Step.HAND_TO_POWER in steps:
        assert node.unwedging and node.finding.verdict is Verdict.HOST_FROZEN
    for once in steps & {Step.RECORD_DRY_RUN, Step.UNWEDGE, Step.RESTART_SERVING}:
        assert node.dry_run_recorded is not once, "one dry-run incident a spell of each"
    guard_settled = node.guard_kill in (GuardKill.FAILED, GuardKill.OLD)
    if guard_settled and node.finding.verdict is Verdict.MEMORY_EXHAUSTED:
        assert Step.RESTART_SERVING not in steps, "a kill that is no news restarts nothing"
    assert (Step.ALERT_GUARD_FAILED in steps) is (node.guard_kill is GuardKill.FAILED)
    assert len(steps & STARTS) <= 1, "one start per node and tick"


@settings(max_examples=500, deadline=None)
@given(node=nodes, cluster=clusters, history=reads)
def test_a_read_the_decision_does_not_ask_for_never_changes_it(
    node: NodeView, cluster: ClusterView, history: Reads
) -> None:
    """The controller reads the history only where needs() says so: the plan
    with those reads left at their defaults is the plan with any values."""
    wanted = needs(node, cluster)
    blank = Reads()
    kept = Reads(
        guards=history.guards if wanted.guards else blank.guards,
        kill_recorded=history.kill_recorded if wanted.kill_record else blank.kill_recorded,
        serving_restarts=history.serving_restarts
        if wanted.serving_count
        else blank.serving_restarts,
    )
    assert plan(node, cluster, kept) == plan(node, cluster, history)


def _frozen(**changes: object) -> NodeView:
    node = NodeView("spark-2", NodeState.WATCHING, Finding(Verdict.HOST_FROZEN, ("silent",)))
    return replace(node, **changes)  # type: ignore[arg-type]


def test_a_stalled_loop_fences_nothing_and_restarts_no_agent() -> None:
    history = Reads(guards=Guards())
    assert [d.step for d in plan(_frozen(), ClusterView(), history)] == [Step.FENCE]
    stalled = ClusterView(stalled=STALLED)
    assert [d.step for d in plan(_frozen(), stalled, history)] == [Step.NOTHING]
    agent_down = _frozen(finding=Finding(Verdict.AGENT_DOWN, ("stuck",)))
    assert [d.step for d in plan(agent_down, ClusterView(), history)] == [Step.RESTART_AGENT]
    for doubt in (stalled, ClusterView(all_silent=SILENT)):
        decisions = plan(agent_down, doubt, history)
        assert [d.step for d in decisions] == [Step.NOTHING]
        assert "not acted on" in decisions[0].reason


def test_every_node_silent_at_once_still_leaves_a_frozen_host_to_the_breaker() -> None:
    """All silent is doubt about agent_down only: a real freeze of both nodes of
    a two-node cluster is still fenced; a partition is the breaker's."""
    steps = plan(_frozen(), ClusterView(all_silent=SILENT), Reads(guards=Guards()))
    assert [d.step for d in steps] == [Step.FENCE]


def test_a_frozen_host_with_an_unwritable_history_is_held_unrecorded_before_any_read() -> None:
    cluster = ClusterView(history_problem="disk full")
    assert needs(_frozen(), cluster).guards is False
    assert [d.step for d in plan(_frozen(), cluster, Reads())] == [Step.HOLD_UNRECORDED]


def test_a_silent_host_in_its_wedged_ladder_is_handed_to_the_freeze_path() -> None:
    steps = plan(_frozen(unwedging=True), ClusterView(), Reads(guards=Guards()))
    assert [d.step for d in steps] == [Step.HAND_TO_POWER]
    alive = _frozen(unwedging=True, finding=Finding(Verdict.GPU_WEDGED, ()))
    assert [d.step for d in plan(alive, ClusterView(), Reads())] == [Step.NOTHING]


def test_a_latch_is_alerted_once_and_unlatched_only_on_a_free_healthy_node() -> None:
    healthy = _frozen(finding=Finding(Verdict.HEALTHY, ()), latched_boot="b1")
    acting = ClusterView(latch_acting=True)
    steps = [d.step for d in plan(healthy, acting, Reads())]
    assert steps == [Step.ALERT_CLOCK_LATCH, Step.UNLATCH]
    told = replace(healthy, latch_alerted="b1")
    assert [d.step for d in plan(told, replace(acting, busy=True), Reads())] == [
        Step.FORGET_DRY_RUN
    ]
    done = replace(told, latch_answered="b1")
    assert Step.UNLATCH not in [d.step for d in plan(done, acting, Reads())]


def test_a_serving_fault_past_its_budget_is_refused_and_within_it_restarted() -> None:
    stalled = _frozen(finding=Finding(Verdict.SERVING_STALLED, ("no progress",)))
    assert needs(stalled, ClusterView()).serving_count
    within = Reads(guards=Guards(), serving_restarts=5, serving_budget=6)
    assert [d.step for d in plan(stalled, ClusterView(), within)] == [Step.RESTART_SERVING]
    spent = replace(within, serving_restarts=6)
    assert [d.step for d in plan(stalled, ClusterView(), spent)] == [Step.SERVING_BUDGET_SPENT]
    busy = ClusterView(serving_running=True)
    assert not needs(stalled, busy).serving_count
    assert plan(stalled, busy, within)[0].step is Step.NOTHING


def test_a_wedged_gpu_past_the_serving_budget_gets_its_ladder_without_the_serving_rung() -> None:
    wedged = _frozen(finding=Finding(Verdict.GPU_WEDGED, ("gpu reads time out",)))
    assert needs(wedged, ClusterView()).serving_count
    within = plan(wedged, ClusterView(), Reads(guards=Guards(), serving_restarts=0))
    assert [(d.step, d.with_serving) for d in within] == [(Step.UNWEDGE, True)]
    spent = plan(wedged, ClusterView(), Reads(guards=Guards(), serving_restarts=6))
    assert [(d.step, d.with_serving) for d in spent] == [
        (Step.SERVING_BUDGET_SPENT, True),
        (Step.UNWEDGE, False),
    ]
    unread = plan(wedged, ClusterView(), Reads(guards=Guards(), serving_restarts=None))
    assert [d.step for d in unread] == [Step.NOTHING]


def test_a_guard_trip_that_killed_nothing_is_an_alert_and_no_serving_restart() -> None:
    exhausted = _frozen(
        finding=Finding(Verdict.MEMORY_EXHAUSTED, ("guard tripped",)), kill=Kill.PENDING
    )
    history = Reads(guards=Guards(), serving_restarts=0)
    killed = replace(exhausted, guard_kill=GuardKill.KILLED)
    assert [d.step for d in plan(killed, ClusterView(), history)] == [Step.RESTART_SERVING]
    failed = replace(exhausted, guard_kill=GuardKill.FAILED)
    assert not needs(failed, ClusterView()).kill_record
    assert [d.step for d in plan(failed, ClusterView(), history)] == [
        Step.ALERT_GUARD_FAILED,
        Step.NOTHING,
    ]
    old = replace(exhausted, guard_kill=GuardKill.OLD)
    assert [d.step for d in plan(old, ClusterView(), history)] == [
        Step.FORGET_OLD_KILL,
        Step.NOTHING,
    ]
    # On another verdict the guard's kill is settled and the verdict decided as ever.
    frozen = _frozen(guard_kill=GuardKill.FAILED)
    steps = plan(frozen, ClusterView(), Reads(guards=Guards()))
    assert [d.step for d in steps] == [Step.ALERT_GUARD_FAILED, Step.FENCE]


def test_dry_run_records_one_incident_a_spell() -> None:
    dry = Reads(guards=Guards(dry_run=True), serving_restarts=0)
    assert [d.step for d in plan(_frozen(), ClusterView(), dry)] == [Step.RECORD_DRY_RUN]
    recorded = _frozen(dry_run_recorded=Step.RECORD_DRY_RUN)
    assert [d.step for d in plan(recorded, ClusterView(), dry)] == [Step.NOTHING]
    wedged = _frozen(finding=Finding(Verdict.GPU_WEDGED, ("gpu reads time out",)))
    assert [d.step for d in plan(wedged, ClusterView(), dry)] == [Step.UNWEDGE]
    again = replace(wedged, dry_run_recorded=Step.UNWEDGE)
    assert [d.step for d in plan(again, ClusterView(), dry)] == [Step.NOTHING]
    dead = _frozen(finding=Finding(Verdict.SERVING_DEAD, ("no rank",)))
    assert [d.step for d in plan(dead, ClusterView(), dry)] == [Step.RESTART_SERVING]
    told = replace(dead, dry_run_recorded=Step.RESTART_SERVING)
    assert [d.step for d in plan(told, ClusterView(), dry)] == [Step.NOTHING]
    # A serving fault's record does not hide the freeze that follows it (an
    # out-of-memory kill, then the host hangs), nor a wedged GPU's record the freeze.
    for before in (Step.RESTART_SERVING, Step.UNWEDGE):
        hung = _frozen(dry_run_recorded=before)
        assert [d.step for d in plan(hung, ClusterView(), dry)] == [Step.RECORD_DRY_RUN]


@settings(max_examples=500, deadline=None)
@given(cluster=clusters)
def test_the_cluster_is_held_only_once_its_breaker_stayed_open(cluster: ClusterView) -> None:
    steps = [d.step for d in plan_cluster(cluster)]
    latched = Step.LATCH_BREAKER in steps
    stayed_open = (cluster.breaker_open_s or 0.0) >= cluster.breaker_latch_after
    open_now = cluster.breaker_open_s is not None
    assert latched is (open_now and stayed_open and not cluster.cluster_held)
    doubt = cluster.stalled or cluster.all_silent
    assert (Step.ALERT_WATCHER_DOUBT in steps) is (doubt is not None and not cluster.doubt_alerted)


def test_the_breakers_latch_names_the_nodes_it_counted() -> None:
    cluster = ClusterView(
        nodes=4,
        breaker_open_s=301.0,
        breaker_trouble=("spark-1", "spark-3"),
        breaker_latch_after=300,
    )
    (latch,) = plan_cluster(cluster)
    assert latch.step is Step.LATCH_BREAKER
    assert "2/4 nodes" in latch.reason and "(spark-1, spark-3) for 301s" in latch.reason
    assert plan_cluster(replace(cluster, breaker_open_s=299.0)) == ()


def test_a_recoverys_serving_rung_waits_for_another_nodes_recovery() -> None:
    waits = serving_after_recovery({"spark-3", "spark-2"}, for_incident=True)
    assert waits.step is Step.NOTHING and "spark-2, spark-3" in waits.reason
    assert serving_after_recovery(set(), for_incident=True).step is Step.RESTART_SERVING
    # A restart of no incident's has no recovery to hand over to: it runs now.
    assert serving_after_recovery({"spark-2"}, for_incident=False).step is Step.RESTART_SERVING
