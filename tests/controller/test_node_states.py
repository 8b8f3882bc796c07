"""The transition table is the only way a node's state changes
(controller/node_states.py): a hold never needs a second guess."""

from __future__ import annotations

import pytest

from spark_watchdog.controller.node_states import (
    HOLD_EVENTS,
    TRANSITIONS,
    InvalidTransition,
    NodeEvent,
    NodeState,
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
