"""docs/architecture.md's state diagram is the controller's transition table."""

from __future__ import annotations

import re
from pathlib import Path

from spark_watchdog.controller.decide.node_states import TRANSITIONS, NodeEvent, NodeState, diagram

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(
    r"<!-- state-diagram:begin[^>]*-->\n```mermaid\n(?P<body>.*?)```\n<!-- state-diagram:end -->",
    re.S,
)


def documented() -> str:
    found = BLOCK.search((ROOT / "docs" / "architecture.md").read_text())
    assert found is not None, "docs/architecture.md has no state-diagram block"
    return found.group("body")


def test_the_drawing_is_the_table() -> None:
    assert documented() == diagram(), (
        "docs/architecture.md's state diagram differs from controller/decide/node_states.py's "
        "TRANSITIONS: paste the output of `python -m spark_watchdog.controller.decide.node_states`"
    )


def test_a_changed_table_changes_the_drawing() -> None:
    changed = dict(TRANSITIONS)
    changed[(NodeState.HELD, NodeEvent.FALSE_ALARM)] = NodeState.WATCHING
    assert diagram(changed) != documented()
    del changed[(NodeState.HELD, NodeEvent.FALSE_ALARM)]
    del changed[(NodeState.FENCING, NodeEvent.RUNG_FAILED)]
    del changed[(NodeState.FENCING, NodeEvent.RUNG_STARTED)]
    assert "fencing --> fencing" not in diagram(changed)


def test_every_transition_is_drawn() -> None:
    drawn = documented()
    for (source, event), target in TRANSITIONS.items():
        arrow = re.search(rf"^    {source.value} --> {target.value}: (.*)$", drawn, re.M)
        assert arrow is not None and event.value in arrow.group(1).split(", ")
