"""The transition table is the only way a node's state changes
(controller/decide/node_states.py): a hold never needs a second guess."""

from __future__ import annotations

import pytest

from spark_watchdog.controller.decide.node_states import (
    HOLD_EVENTS,
    TRANSITIONS,
    Booting,
    Doing,
    Fencing,
    Held,
    HeldBy,
    InvalidTransition,
    MissingDetail,
    NodeEvent,
    NodeState,
    Unlatching,
    Unwedging,
    Watching,
    enter,
    transition,
)


@pytest.mark.parametrize("state", list(NodeState))
@pytest.mark.parametrize("event", [NodeEvent(v) for v in sorted(e.value for e in HOLD_EVENTS)])
def test_every_hold_event_leads_to_held_from_every_state(
    state: NodeState, event: NodeEvent
) -> None:
    assert transition(state, event) is NodeState.HELD


def test_a_pair_outside_the_table_is_refused() -> None:
    with pytest.raises(InvalidTransition, match="no transition from held on power_restored"):
        transition(NodeState.HELD, NodeEvent.POWER_RESTORED)


def test_every_event_is_used_and_every_state_is_reached() -> None:
    assert {e for _, e in TRANSITIONS} == set(NodeEvent)
    assert set(TRANSITIONS.values()) == set(NodeState)


def test_each_state_carries_what_belongs_to_it() -> None:
    fencing = enter(Watching(), NodeEvent.FROZEN_CONFIRMED)
    assert fencing == Fencing(None)
    fencing = enter(fencing, NodeEvent.RUNG_STARTED, rung=1)
    assert fencing == Fencing(1)
    booting = enter(fencing, NodeEvent.POWER_RESTORED)
    assert booting == Booting(1)  # the rung that restored power
    assert enter(booting, NodeEvent.BOOT_TIMEOUT) == Fencing(None)
    assert enter(Watching(), NodeEvent.WEDGED_CONFIRMED, incident=7) == Unwedging(7)
    assert enter(Watching(), NodeEvent.LATCH_CONFIRMED, incident=8) == Unlatching(8)
    held = enter(Unwedging(7), NodeEvent.HOLD, reason="a person looks", by=HeldBy.OPERATOR)
    assert held == Held("a person looks", HeldBy.OPERATOR)
    assert enter(held, NodeEvent.NEW_BOOT) is held  # a held node keeps its hold
    assert enter(held, NodeEvent.AMBIGUOUS, reason="unknown") == Held("unknown")


@pytest.mark.parametrize(
    ("doing", "event", "needs"),
    [
        (Watching(), NodeEvent.WEDGED_CONFIRMED, "the incident"),
        (Watching(), NodeEvent.LATCH_CONFIRMED, "the incident"),
        (Watching(), NodeEvent.HOLD, "a reason"),
        (Fencing(0), NodeEvent.AMBIGUOUS, "a reason"),
    ],
)
def test_a_state_without_what_it_carries_is_refused(
    doing: Doing, event: NodeEvent, needs: str
) -> None:
    with pytest.raises(MissingDetail, match=needs):
        enter(doing, event)


def test_the_tagged_value_and_the_table_agree() -> None:
    for kind in (Watching, Fencing, Booting, Unwedging, Unlatching, Held):
        assert kind.kind in set(NodeState)
    assert {k.kind for k in (Watching, Fencing, Booting, Unwedging, Unlatching, Held)} == set(
        NodeState
    )


def test_a_gentler_ladder_ends_only_its_own_state() -> None:
    from spark_watchdog.config.controller import NodeConfig
    from spark_watchdog.controller.look.node_watch import NodeWatch

    watch = NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9101"), 0.0)
    watch.apply(NodeEvent.WEDGED_CONFIRMED, incident=3)
    watch.leave_ladder(4)  # another incident's ladder: not this state
    assert watch.doing == Unwedging(3)
    watch.apply(NodeEvent.HOLD, reason="operator")
    watch.leave_ladder(3)  # a hold took the node: the ladder's end leaves it held
    assert watch.held_reason == "operator"
    watch.apply(NodeEvent.RELEASE)
    watch.apply(NodeEvent.LATCH_CONFIRMED, incident=5)
    watch.leave_ladder(5, NodeEvent.HANDED_TO_POWER)
    assert watch.state is NodeState.WATCHING


def test_a_watchs_state_is_the_kind_of_what_it_does_through_every_change() -> None:
    from spark_watchdog.config.controller import NodeConfig
    from spark_watchdog.controller.look.node_watch import NodeWatch

    config = NodeConfig(name="spark-1", agent="http://spark-1:9101")
    watch = NodeWatch(config, 0.0)
    assert (watch.name, watch.state) == ("spark-1", NodeState.WATCHING)
    assert NodeWatch(config, 0.0, doing=Held("a person", HeldBy.OPERATOR)).state is NodeState.HELD
    for event in (NodeEvent.FROZEN_CONFIRMED, NodeEvent.RUNG_STARTED, NodeEvent.POWER_RESTORED):
        assert watch.apply(event, rung=0) is watch.state is watch.doing.kind
    assert watch.apply(NodeEvent.HOLD, reason="operator") is watch.state is NodeState.HELD
    assert watch.apply(NodeEvent.RELEASE) is watch.state is watch.doing.kind
