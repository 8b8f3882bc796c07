"""Bounded fuzzing of the controller's intake of an agent's /v1/state
(controller/look/intake.py), through to the history and the page (bench/fuzz_intake.py).

Near-valid answers: a real /v1/state body (tests/fuzz/corpus/snapshot) with
the sections the controller acts on added (GPU faults, a memory guard kill,
peers), and values swapped for absurd times, numbers beyond 64 bits, NaN,
long or NUL-bearing strings, long lists and deep nesting.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.fuzz_intake import WALL
from bench.fuzz_targets import assert_clean, corpus

BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))

_REAL = dict(corpus("snapshot"))["seed-real-v1-state.http"]
FAULT = {"id": 1, "xid": 43, "what": "x", "at_unix": WALL - 2, "gpu": 0, "result": "stopped"}
REAL_STATE: dict[str, Any] = {
    **json.loads(_REAL.partition(b"\r\n\r\n")[2]),
    "gpu_faults": {"watcher": "on", "detail": None, "faults": [FAULT], "dropped": 0},
    "memory_guard": {"kills": 1, "last_kill": {"id": 1, "at_unix": WALL - 3, "result": "killed"}},
    "peers": {"spark-3": {"seq": 4, "boot_id": "b", "progress_ago_s": 0.5, "via": "http://x"}},
}

NUMBERS = (
    st.integers(-(2**70), 2**70)
    | st.sampled_from([10**31, 2**63, 2**63 - 1, -(2**63 - 1), -(2**63), -1, 0])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1.7e15, -1.7e15, 1e300, WALL, WALL + 301, WALL - 86_401])
)
TEXT = st.text(max_size=8) | st.sampled_from(["a\x00b", "\x1b[2J", "x" * 9000, "x" * 8192, "soon"])
JSON = st.recursive(
    st.none() | st.booleans() | NUMBERS | TEXT,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
PATHS = (
    ("seq",),
    ("boot_id",),
    ("started_at",),
    ("stopping",),
    ("stopping", "since"),
    ("probes", "vllm", "seconds_without_progress"),
    ("probes", "vllm", "progress_ago_s"),
    ("gpu_faults", "faults"),
    ("memory_guard", "last_kill", "at_unix"),
    ("memory_guard", "last_kill", "id"),
    ("peers",),
    ("peers", "spark-3", "seq"),
    ("peers", "spark-3", "progress_ago_s"),
    ("peers", "spark-3", "via"),
    ("serving",),
    # Fields without a rule: a plain value is kept as it is, within the bounds.
    ("version",),
    ("serving", "note"),
)
FAULT_KEYS = ("id", "xid", "at_unix", "gpu", "result")


def _with(state: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(state))
    node = copy
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return copy


@st.composite
def answer(draw: st.DrawFn) -> bytes:
    state = REAL_STATE
    for _ in range(draw(st.integers(0, 3))):
        state = _with(state, draw(st.sampled_from(PATHS)), draw(JSON))
    if draw(st.booleans()):
        fault = {**FAULT, draw(st.sampled_from(FAULT_KEYS)): draw(NUMBERS | TEXT)}
        state = _with(state, ("gpu_faults", "faults"), [FAULT, fault])
    if draw(st.booleans()):
        state = _with(state, ("serving", "argv"), list(range(draw(st.integers(0, 1100)))))
    return json.dumps(state).encode()


@BOUNDED
@given(st.binary(max_size=512))
@example(b'{"seq": 1e400, "gpu_faults": {"faults": [{"id": 1, "at_unix": -Infinity}]}}')
@example(b"[" * 100_000)
def test_raw_bytes(data: bytes) -> None:
    assert_clean("intake", data)


@BOUNDED
@given(answer())
@example(json.dumps(_with(REAL_STATE, ("gpu_faults", "faults", "0"), 1)).encode())
@example(json.dumps(_with(REAL_STATE, ("memory_guard", "last_kill", "at_unix"), 1.7e15)).encode())
def test_near_valid_state(data: bytes) -> None:
    assert_clean("intake", data)
