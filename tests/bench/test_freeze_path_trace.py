"""The freeze path's trace (bench/freeze_path_trace.py): it finds the poll, the
power off and the modules between them, so the figures it reports stand for the path."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import CodeType

import pytest

from bench.freeze_path_steps import CLUSTER_WIDE, StepCodes, cluster_wide
from bench.freeze_path_trace import Figures, Measure, Move, _figures, main, trace_freeze
from spark_watchdog.clock import SystemClock
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.pair import fence
from spark_watchdog.controller.views import cluster_view


def _parts_add_up(measure: Measure) -> None:
    assert measure.whole.moves == measure.tick.moves + measure.ladder.moves == len(measure.moves)
    assert measure.whole.calls == measure.tick.calls + measure.ladder.calls
    assert 0 < measure.cluster_wide.moves < measure.tick.moves
    assert set(measure.cluster_wide.modules) <= set(measure.tick.modules)
    assert 0 < measure.whole.reentries < measure.whole.moves


def test_the_trace_runs_from_the_poll_to_the_power_off_through_the_freeze_path() -> None:
    path = trace_freeze(seed=1, node="spark-3", at=30.0)
    assert path.frozen_at_s < path.poll_sent_s <= path.ladder_created_s <= path.power_off_s
    assert path.out_of_order == 0
    for measure in (path.steps, path.frames):
        modules = set(measure.whole.modules)
        assert {"controller/decide/detector.py", "controller/act/recovery.py"} <= modules
        assert any(m.startswith("power/") for m in measure.ladder.modules)
        assert "controller/decide/detector.py" in measure.tick.modules
        # Neither the simulation nor the history's internals are counted.
        assert not any(m.startswith(("simulation/", "history/")) for m in modules)
        # The whole path is its two parts; the cluster-wide work is of the tick.
        _parts_add_up(measure)
        # The last move before the command is in the power code, in the ladder's part.
        assert measure.moves[-1].part == "ladder"
        assert measure.sequence[-1].startswith("power/")


def test_counted_by_steps_the_path_is_the_frames_less_what_is_no_step() -> None:
    path = trace_freeze()
    steps, frames = path.steps, path.frames
    assert set(steps.whole.modules) <= set(frames.whole.modules)
    assert steps.whole.moves < frames.whole.moves
    assert steps.whole.calls < frames.whole.calls
    assert not {m.function for m in steps.moves} & {"NodeWatch.last_life_at", "Finding.summary"}
    assert "NodeWatch.observation" in {m.function for m in steps.moves}


def test_another_node_freezing_gives_the_same_path() -> None:
    # The other nodes' work in the tick is left out, whichever node froze.
    one, other = trace_freeze(node="spark-3"), trace_freeze(seed=2, node="spark-1")
    for mine, theirs in ((one.steps, other.steps), (one.frames, other.frames)):
        assert (mine.whole, mine.tick, mine.cluster_wide, mine.ladder) == (
            theirs.whole,
            theirs.tick,
            theirs.cluster_wide,
            theirs.ladder,
        )


def test_a_reentry_is_a_move_into_a_module_left_before() -> None:
    def move(source: str, target: str) -> Move:
        return Move(0, "t", "tick", "call", source, target, "f")

    moves = [move("a", "b"), move("b", "c"), move("c", "b"), move("b", "a"), move("a", "d")]
    assert _figures([], moves) == Figures(("a", "b", "c", "d"), 0, 0, 5, 2, 0)


@dataclass(frozen=True)
class _At:
    code: CodeType
    parent: _At | None = None


def _getter(cls: type, name: str) -> CodeType:
    prop = vars(cls)[name]
    assert isinstance(prop, property) and prop.fget is not None
    return prop.fget.__code__


def test_properties_constructors_defaults_and_clock_reads_are_no_steps() -> None:
    codes = StepCodes.loaded()
    not_steps = [
        _getter(NodeWatch, "last_life_at"),
        NodeWatch.__init__.__code__,
        fence._never.__code__,  # Fence.deposed's default
        SystemClock.monotonic.__code__,
    ]
    assert not any(codes.is_step(code) for code in not_steps)
    assert codes.is_step(NodeWatch.note_banner.__code__)
    assert codes.is_step(cluster_view.__code__)


def test_what_a_non_step_calls_counts_from_the_nearest_step_above_it() -> None:
    codes = StepCodes.loaded()
    last_life = _getter(NodeWatch, "last_life_at")
    step = _At(NodeWatch.note_banner.__code__)
    inside = _At(NodeWatch.shows_life.__code__, _At(last_life, step))
    assert codes.nearest(inside.parent) is step
    assert codes.nearest(inside) is inside
    assert codes.nearest(_At(last_life)) is None


def test_the_cluster_wide_work_is_what_its_functions_call() -> None:
    assert "cluster_view" in CLUSTER_WIDE
    view = _At(cluster_view.__code__)
    assert cluster_wide(_At(NodeWatch.agent_silent_s.__code__, view))
    assert not cluster_wide(_At(NodeWatch.agent_silent_s.__code__, _At(main.__code__)))


def test_the_figures_print_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for measure in ("steps", "frames"):
        assert data[measure]["whole"]["moves"] == len(data[measure]["moves"]) > 0
        assert data[measure]["per_module"]["controller/decide/detector.py"]["calls"] > 0


def test_the_figures_print_as_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.index("By steps") < out.index("By every product frame")
