"""What the controller takes from an agent's /v1/state (controller/look/intake.py):
one bad value from one agent is left out, with its reason, and blinds nothing."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bench.fuzz_targets import corpus
from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.look.intake import (
    FUTURE_S,
    MAX_DEPTH,
    MAX_INT,
    MAX_ITEMS,
    MAX_STRING,
    PAST_S,
    take_state,
)
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.look.peer_evidence import sightings
from spark_watchdog.controller.look.rank_kills import live_faults

WALL = 1_764_000_000.0  # the controller's wall clock in these tests
REAL = json.loads(dict(corpus("snapshot"))["seed-real-v1-state.http"].partition(b"\r\n\r\n")[2])
# Times no agent's clock gives now: microseconds where seconds belong, forged,
# beyond any float, not a number, text.
ABSURD_TIMES = [1.7e15, -1, 1e300, 10**400, math.nan, math.inf, "soon", WALL - PAST_S - 1]


def watch() -> NodeWatch:
    return NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)


def state(seq: int = 1, **more: Any) -> dict[str, Any]:
    return {"seq": seq, "boot_id": "b1", "started_at": "t0", "stopping": None, **more}


def ended_by(at: Any, fault_id: int = 1) -> dict[str, Any]:
    fault = {"id": fault_id, "xid": 43, "what": "x", "at_unix": at, "gpu": 0, "result": "stopped"}
    return {"watcher": "on", "detail": None, "faults": [fault], "dropped": 0, "malformed": 0}


def test_a_real_answer_is_taken_whole() -> None:
    taken = take_state(REAL, WALL)
    assert taken.state == REAL and taken.dropped == ()
    fault = ended_by(WALL - 3.0)
    taken = take_state(state(gpu_faults=fault, peers={"spark-2": {"seq": 7}}), WALL)
    assert taken.state["gpu_faults"] == fault and taken.dropped == ()


@pytest.mark.parametrize("absurd", ABSURD_TIMES, ids=lambda v: repr(v)[:24])
def test_a_gpu_fault_at_an_absurd_time_starts_nothing_and_blinds_nothing(absurd: Any) -> None:
    taken = take_state(state(gpu_faults=ended_by(absurd)), WALL)
    fault = taken.state["gpu_faults"]["faults"][0]
    assert fault["at_unix"] == WALL  # the controller's receipt time stands in
    assert isinstance(fault["agent_at_unix"], str)
    assert any(r.startswith("gpu_faults.faults[0].at_unix: ") for r in taken.dropped)
    json.dumps(taken.state, allow_nan=False)
    w = watch()
    w.note_answer(state(gpu_faults=ended_by(absurd)), 1.0, WALL)
    # Before: 1.7e15 became the gpu_fault incident's start time.
    assert w.gpu_fault is None
    said = live_faults(w.snapshot, WALL - 1)[0]["said"]
    assert "seen by the controller at" in said and "its agent gave the time" in said


def test_times_at_the_edges_of_the_window_are_the_agents() -> None:
    for at in (WALL - PAST_S, WALL + FUTURE_S, WALL - 2.0):
        taken = take_state(state(gpu_faults=ended_by(at)), WALL)
        assert taken.state["gpu_faults"]["faults"][0]["at_unix"] == at and not taken.dropped
    w = watch()
    w.note_answer(state(gpu_faults=ended_by(WALL - 2.0)), 1.0, WALL)
    assert w.gpu_fault is not None and w.gpu_fault["at_unix"] == WALL - 2.0


def test_the_controllers_own_note_cannot_be_forged() -> None:
    fault = ended_by(WALL - 2.0)
    fault["faults"][0]["agent_at_unix"] = "1.0"
    taken = take_state(state(gpu_faults=fault), WALL)
    assert "agent_at_unix" not in taken.state["gpu_faults"]["faults"][0]
    assert any("only the controller writes" in r for r in taken.dropped)


@pytest.mark.parametrize("absurd", [1.7e15, 1e300, 10**400, -1.0, math.nan])
def test_a_serving_fault_onset_never_comes_from_an_absurd_age(absurd: Any) -> None:
    w = watch()
    vllm = {"state": "stalled", "seconds_without_progress": absurd}
    w.note_answer(state(probes={"vllm": vllm}), 1.0, WALL)
    # Before: 1.7e15 s without progress put the incident's onset 54 million years back.
    assert w.serving_fault_onset(WALL) == WALL


@pytest.mark.parametrize("forged", [10**31, 2**63, -1, 1.5, "9"])
def test_a_forged_seq_is_no_progress_and_the_next_real_one_is(forged: Any) -> None:
    w = watch()
    assert w.note_answer(state(4), 1.0, WALL)
    assert not w.note_answer(state(forged), 2.0, WALL)  # life, no progress
    # Before: a 31-digit seq counted once, and no real seq ever passed it.
    assert w.note_answer(state(5), 3.0, WALL + 2)
    assert w.seq == 5


def test_a_peers_numbers_beyond_bounds_are_no_sighting() -> None:
    reporter = watch()
    reporter.note_answer(state(1), 1.0, WALL)
    peers = {
        "spark-2": {"seq": 10**30, "progress_ago_s": 1e300},
        "spark-3": {"seq": 3, "progress_ago_s": -1.0},
        "spark-4": {"seq": 3, "progress_ago_s": PAST_S + 1},
        "spark-5": {"seq": 3, "progress_ago_s": 0.5},
    }
    taken = take_state(state(2, peers=peers), WALL)
    assert taken.state["peers"]["spark-2"] == {}
    assert "progress_ago_s" not in taken.state["peers"]["spark-4"]
    reporter.note_answer(state(2, peers=peers), 2.0, WALL + 1)
    seen = sightings([reporter], ["spark-2", "spark-3", "spark-4", "spark-5"], 2.0, 10.0)
    # Before: an age of 1e300 s was a sighting (at -1e300).
    assert set(seen) == {"spark-5"} and seen["spark-5"].at == 1.5


def test_strings_lists_and_depth_are_bounded_field_by_field() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 4):
        deep = [deep]
    raw = state(
        version="a\0b",
        probes={"vllm": {"reason": "x" * (MAX_STRING + 1), "state": "stalled"}},
        serving={"argv": list(range(MAX_ITEMS + 10))},
        deep=deep,
        loop_lag_s=math.inf,
        healthy=True,
        **{"\x1b[2Jkey": 10**400},
    )
    taken = take_state(raw, WALL)
    out = taken.state
    assert "version" not in out and "loop_lag_s" not in out and "\x1b[2Jkey" not in out
    assert out["probes"]["vllm"] == {"state": "stalled"}  # the rest of the section stands
    assert out["serving"]["argv"] == list(range(10, MAX_ITEMS + 10))  # the newest kept
    assert out["seq"] == 1 and out["healthy"] is True
    json.dumps(out, allow_nan=False)
    reasons = " | ".join(taken.dropped)
    assert "version: a text with a NUL" in reasons and "probes.vllm.reason: a text of" in reasons
    assert "'\\x1b[2Jkey'" in reasons and "\x1b" not in reasons  # escaped, never raw
    assert f"nested deeper than {MAX_DEPTH} levels" in reasons


def test_the_reasons_are_bounded() -> None:
    nans: dict[str, Any] = {f"k{n}": math.nan for n in range(100)}
    raw = state(**nans)
    dropped = take_state(raw, WALL).dropped
    assert len(dropped) == 21 and dropped[-1] == "and 80 more"


# Values at each bound of what a field without a rule keeps, and past it.
EDGES: list[Any] = [
    None,
    True,
    0,
    MAX_INT,
    -MAX_INT,
    MAX_INT + 1,
    -MAX_INT - 1,
    10**400,
    -0.0,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
    "",
    "x" * MAX_STRING,
    "x" * (MAX_STRING + 1),
    "a\0b",
    "\x1b[2J",
    {"k": 1},
    [],
]


@pytest.mark.parametrize("value", EDGES, ids=lambda v: repr(v)[:24])
@pytest.mark.parametrize("key", ["version", "serving.note", "peers.spark-2.via"])
def test_a_field_without_a_rule_is_taken_as_a_list_item_of_it_is(value: Any, key: str) -> None:
    """The intake keeps a plain value of a field without a rule as it is, without
    the general rules' path: it keeps and drops exactly what they do (one of
    them as an item of a list)."""
    *outer, name = key.split(".")

    def answer(field: Any) -> dict[str, Any]:
        raw: dict[str, Any] = {name: field}
        for part in reversed(outer):
            raw = {part: raw}
        return state(**raw)

    def inner(taken: dict[str, Any]) -> Any:
        for part in outer:
            taken = taken[part]
        return taken

    alone, listed = take_state(answer(value), WALL), take_state(answer([value]), WALL)
    as_item, kept = inner(listed.state)[name], inner(alone.state).get(name, "dropped")
    assert kept == (as_item[0] if as_item else "dropped")
    assert alone.dropped == tuple(r.replace(f"{name}[0]", name) for r in listed.dropped)
    if as_item and not isinstance(value, (dict, list)):
        assert kept is value  # as it is
