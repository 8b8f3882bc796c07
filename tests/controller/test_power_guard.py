"""The one guard before every action that cuts power or forces a reboot
(planner.power_blocked): what stops each action, in which order, and that the
planner never plans a rung the guard would stop."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_watchdog.controller.decide.detector import Finding, Verdict
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.planner import (
    Action,
    Block,
    Guards,
    Step,
    decide,
    power_blocked,
)

CLEAR = Guards(node_budget=3, cluster_budget=8, budget_window=3600.0)
ALL = list(Action)


@pytest.mark.parametrize("action", ALL)
def test_nothing_stops_an_action_with_the_guards_clear(action: Action) -> None:
    assert power_blocked(CLEAR, action) is None


@pytest.mark.parametrize("action", ALL)
def test_a_hold_stops_every_action_and_says_its_reason_first(action: Action) -> None:
    guards = replace(
        CLEAR, node_held=True, hold_reason="a person is on it", breaker_tripped=True, dry_run=True
    )

    blocked = power_blocked(guards, action)

    assert blocked is not None and blocked.block is Block.HELD
    assert blocked.reason == "held (a person is on it)"
    cluster = power_blocked(replace(CLEAR, cluster_held=True), action)
    assert cluster is not None and cluster.block is Block.HELD


@pytest.mark.parametrize(("action", "stops"), [(a, a is not Action.FORCED_REBOOT) for a in ALL])
def test_the_breaker_stops_cuts_not_a_reboot_of_a_host_that_answers_ssh(
    action: Action, stops: bool
) -> None:
    blocked = power_blocked(replace(CLEAR, breaker_tripped=True), action)

    assert (blocked is not None and blocked.block is Block.BREAKER) is stops


@pytest.mark.parametrize("action", [Action.CYCLE, Action.LONG_CUT])
def test_a_cut_needs_one_of_the_nodes_cycles(action: Action) -> None:
    blocked = power_blocked(replace(CLEAR, node_cycles_in_window=3), action)

    assert blocked is not None and blocked.block is Block.BUDGET
    assert blocked.reason == "node budget spent (3/3 cycles in 3600s)"
    assert power_blocked(replace(CLEAR, node_cycles_in_window=2), action) is None


def test_a_long_cut_leaves_the_clusters_last_cycle_for_a_freeze() -> None:
    last_one_left = replace(CLEAR, cluster_cycles_in_window=7)

    assert power_blocked(last_one_left, Action.CYCLE) is None
    blocked = power_blocked(last_one_left, Action.LONG_CUT)
    assert blocked is not None and blocked.block is Block.BUDGET
    assert "one kept for a freeze" in blocked.reason
    spent = power_blocked(replace(CLEAR, cluster_cycles_in_window=8), Action.CYCLE)
    assert spent is not None and spent.reason == "cluster budget spent (8/8 cycles in 3600s)"


def test_a_forced_reboot_counts_forced_reboots_not_cycles() -> None:
    cycles_spent = replace(CLEAR, node_cycles_in_window=3, cluster_cycles_in_window=8)
    assert power_blocked(cycles_spent, Action.FORCED_REBOOT) is None

    blocked = power_blocked(replace(CLEAR, node_reboots_in_window=3), Action.FORCED_REBOOT)
    assert blocked is not None and blocked.block is Block.BUDGET
    assert blocked.reason == "node budget spent (3/3 forced reboots in 3600s)"


@pytest.mark.parametrize("action", ALL)
def test_dry_run_stops_every_action_last(action: Action) -> None:
    blocked = power_blocked(replace(CLEAR, dry_run=True), action)
    assert blocked is not None and blocked.block is Block.DRY_RUN

    spent = replace(CLEAR, dry_run=True, node_cycles_in_window=3, node_reboots_in_window=3)
    budget = power_blocked(spent, action)
    assert budget is not None and budget.block is Block.BUDGET


guard_values = st.builds(
    Guards,
    node_held=st.booleans(),
    cluster_held=st.booleans(),
    breaker_tripped=st.booleans(),
    dry_run=st.booleans(),
    node_cycles_in_window=st.integers(0, 5),
    node_budget=st.integers(0, 4),
    cluster_cycles_in_window=st.integers(0, 10),
    cluster_budget=st.integers(0, 9),
    power_actions_in_flight=st.integers(0, 2),
    max_concurrent_power_actions=st.integers(1, 2),
    rungs=st.integers(0, 3),
    rungs_done=st.frozensets(st.integers(0, 2)),
)


@settings(max_examples=500, deadline=None)
@given(guards=guard_values)
def test_the_planner_fences_only_where_the_guard_lets_a_cycle_through(guards: Guards) -> None:
    frozen = Finding(Verdict.HOST_FROZEN, ("silent",))

    decision = decide(NodeState.WATCHING, frozen, guards)
    blocked = power_blocked(guards, Action.CYCLE)

    if decision.step in (Step.FENCE, Step.WAIT_TURN):
        assert blocked is None
    if decision.step is Step.RECORD_DRY_RUN:
        assert blocked is not None and blocked.block is Block.DRY_RUN
    if blocked is None:
        assert decision.step in (Step.FENCE, Step.WAIT_TURN, Step.HOLD)
    elif blocked.block is Block.BUDGET:
        assert decision.step is Step.HOLD
    elif blocked.block in (Block.HELD, Block.BREAKER):
        assert decision.step is Step.NOTHING
