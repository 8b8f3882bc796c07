"""The freeze path's trace (bench/freeze_path_trace.py): it finds the poll, the
power off and the modules between them, so the figures it reports stand for the path."""

from __future__ import annotations

import json

import pytest

from bench.freeze_path_trace import Figures, Move, _figures, main, trace_freeze


def test_the_trace_runs_from_the_poll_to_the_power_off_through_the_freeze_path() -> None:
    path = trace_freeze(seed=1, node="spark-3", at=30.0)
    assert path.frozen_at_s < path.poll_sent_s <= path.ladder_created_s <= path.power_off_s
    assert path.out_of_order == 0
    modules = set(path.whole.modules)
    assert {"controller/decide/detector.py", "controller/act/recovery.py"} <= modules
    assert any(m.startswith("power/") for m in path.ladder.modules)
    assert "controller/decide/detector.py" in path.tick.modules
    # Neither the simulation nor the history's internals are counted.
    assert not any(m.startswith(("simulation/", "history/")) for m in modules)
    # The whole path is its two parts.
    assert path.whole.moves == path.tick.moves + path.ladder.moves == len(path.moves)
    assert path.whole.calls == path.tick.calls + path.ladder.calls
    assert 0 < path.whole.reentries < path.whole.moves
    # The last move before the command is in the power code, in the ladder's part.
    assert path.moves[-1].part == "ladder"
    assert path.sequence[-1].startswith("power/")


def test_another_node_freezing_gives_the_same_path() -> None:
    # The other nodes' work in the tick is left out, whichever node froze.
    one, other = trace_freeze(node="spark-3"), trace_freeze(seed=2, node="spark-1")
    assert (one.whole, one.tick, one.ladder) == (other.whole, other.tick, other.ladder)


def test_a_reentry_is_a_move_into_a_module_left_before() -> None:
    def move(source: str, target: str) -> Move:
        return Move(0, "t", "tick", "call", source, target, "f")

    moves = [move("a", "b"), move("b", "c"), move("c", "b"), move("b", "a"), move("a", "d")]
    assert _figures([], moves) == Figures(("a", "b", "c", "d"), 0, 0, 5, 2, 0)


def test_the_figures_print_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["whole"]["moves"] == len(data["moves"]) > 0
    assert data["per_module"]["controller/decide/detector.py"]["calls"] > 0
