"""The fuzz target ``intake``: an agent's ``/v1/state`` object through the
controller's intake (spark_watchdog/controller/look/intake.py) and on to what is
built on it: the node's record, its kills and peers' sightings, an incident's
onset and evidence written to a real (in-memory SQLite) history and read back
as ``show --json`` and the page do, and the page's view of the node.

Input: JSON text (NaN, Infinity and integers of any size included, as
Python's decoder takes them); anything that is not a JSON object is no
answer the intake ever sees. Nothing may escape: the target's expected
errors are none. What it asserts of the intake's output:

- every time the controller takes is within its window of the controller's
  clock (or is the controller's receipt time);
- every integer fits in 64 bits, every float is finite, every string, list
  and nesting within the intake's bounds;
- the result is JSON (``allow_nan=False``), and the history and the page
  render it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

WALL = 1_764_000_000.0  # the controller's wall clock of every run
_STORE: Any = None
_RUNS = 0
_FRESH_STORE_EVERY = 500  # runs: the in-memory history stays small


def fuzz_intake(data: bytes) -> None:
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        return  # no JSON object: the controller's HTTP reading says so (target snapshot)
    if not isinstance(answer, dict):
        return
    from spark_watchdog.controller.look.intake import take_state

    taken = take_state(answer, WALL)
    _assert_bounded(taken.state)
    _assert_times(taken.state)
    json.dumps(taken.state, allow_nan=False)
    json.dumps(taken.dropped)
    _through_the_controller(answer)


def _values(value: Any, depth: int = 0) -> Iterator[tuple[Any, int]]:
    yield value, depth
    if isinstance(value, dict):
        for key, item in value.items():
            yield key, depth + 1
            yield from _values(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _values(item, depth + 1)


def _assert_bounded(state: dict[str, Any]) -> None:
    from spark_watchdog.controller.look import intake

    for value, depth in _values(state):
        assert depth <= intake.MAX_DEPTH + 1, depth
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            assert abs(value) <= intake.MAX_INT, value
        elif isinstance(value, float):
            assert math.isfinite(value), value
        elif isinstance(value, str):
            assert len(value) <= intake.MAX_STRING and "\0" not in value, value[:40]
        elif isinstance(value, (list, dict)):
            assert len(value) <= intake.MAX_ITEMS, len(value)
        else:
            raise AssertionError(f"not JSON: {type(value).__name__}")
    seq = state.get("seq")
    assert seq is None or not isinstance(seq, int) or 0 <= seq <= intake.MAX_INT, seq


def _in_window(at: Any, first: float = WALL, last: float = WALL) -> bool:
    """Within the intake's window of an answer taken at a wall clock from
    ``first`` to ``last``."""
    from spark_watchdog.controller.look.intake import FUTURE_S, PAST_S

    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return False
    return first - PAST_S <= at <= last + FUTURE_S


def _assert_times(state: dict[str, Any]) -> None:
    guard = state.get("memory_guard")
    kill = guard.get("last_kill") if isinstance(guard, dict) else None
    section = state.get("gpu_faults")
    faults = section.get("faults") if isinstance(section, dict) else None
    timed = [(kill, "at_unix"), (state.get("stopping"), "since")]
    timed += [(fault, "at_unix") for fault in (faults if isinstance(faults, list) else [])]
    for holder, key in timed:
        if isinstance(holder, dict) and holder.get(key) is not None:
            assert _in_window(holder[key]), (key, holder[key])


def _through_the_controller(answer: dict[str, Any]) -> None:
    from spark_watchdog.config.controller import NodeConfig
    from spark_watchdog.controller.look.intake import PAST_S
    from spark_watchdog.controller.look.node_watch import NodeWatch
    from spark_watchdog.controller.look.peer_evidence import sightings
    from spark_watchdog.controller.look.rank_kills import live_faults
    from spark_watchdog.controller.page.page_view import node_view

    watch = NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)
    for now in (1.0, 2.0):  # the second compares against the first
        watch.note_answer(answer, now, WALL + now)
    for kills in (watch.memory_kills, watch.gpu_kills):
        if kills.pending is not None:
            # Taken from an answer that came at WALL + 1 or WALL + 2.
            at = kills.pending.get("at_unix")
            assert _in_window(at, WALL + 1.0, WALL + 2.0), kills.pending
    onset = watch.serving_fault_onset(WALL)
    # The agent's own age counted back from now, or its last progress (by then WALL + 2).
    assert onset is None or WALL - PAST_S <= onset <= WALL + 2.0, onset
    peers = (watch.snapshot or {}).get("peers")
    names = [str(name) for name in peers][:50] if isinstance(peers, dict) else []
    for sighting in sightings([watch], names, 2.0, 10.0).values():
        assert math.isfinite(sighting.at) and sighting.at <= 2.0, sighting
    faults = live_faults(watch.snapshot, WALL)
    kill = watch.gpu_fault or watch.guard_kill
    _rendered(watch.snapshot or {}, faults, kill, onset if kill is None else kill["at_unix"])
    json.dumps(node_view(watch, 3.0), allow_nan=False)


def _rendered(state: dict[str, Any], faults: Any, kill: Any, onset: float | None) -> None:
    """An incident built on what was taken, written and read back as ``show
    --json`` and the page read it."""
    from spark_watchdog.history.store import HistoryStore

    global _STORE, _RUNS
    _RUNS += 1
    if _STORE is None or _RUNS % _FRESH_STORE_EVERY == 0:
        if _STORE is not None:
            _STORE.close()
        _STORE = HistoryStore(":memory:", clock=lambda: WALL)
    evidence = {"agent_state": state, "live_gpu_faults": faults, "gpu_fault": kill}
    incident = _STORE.open_incident(
        "gpu_fault", ["spark-1"], evidence=evidence, fault_onset=onset, dry_run=True
    )
    timeline = _STORE.incident(incident.id)
    assert timeline is not None
    json.dumps(timeline.to_json(), allow_nan=False)
    listed = _STORE.list_incidents(limit=1)
    json.dumps([i.to_json() for i in listed], allow_nan=False)
    assert listed[0].to_json()["fault_onset"] is not None or onset is None
