"""Bounded fuzzing of the controller's reading of an agent's /v1/state answer.

Raw bytes as the whole HTTP answer, and near-valid answers: a real /v1/state
body captured from a running agent (tests/fuzz/corpus/snapshot), with values
swapped for arbitrary JSON and framed by odd status lines and headers.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.fuzz_targets import assert_clean, corpus

BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))

_REAL = dict(corpus("snapshot"))["seed-real-v1-state.http"]
REAL_STATE: dict[str, Any] = json.loads(_REAL.partition(b"\r\n\r\n")[2])

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**400), 10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
PATHS = (
    ("seq",),
    ("boot_id",),
    ("started_at",),
    ("probes",),
    ("probes", "vllm"),
    ("probes", "vllm", "state"),
    ("probes", "vllm", "reason"),
    ("probes", "vllm", "seconds_without_progress"),
    ("stopping",),
    ("serving",),
)


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
        state = _with(
            state, ("probes", "vllm", "state"), draw(st.sampled_from(["stalled", "dead"]))
        )
    body = json.dumps(state).encode()
    if draw(st.booleans()):
        body = body[: draw(st.integers(0, len(body)))]
    status = draw(st.sampled_from([b"200 OK", b"503 Service Unavailable", b"200", b"\xb200 OK"]))
    length = draw(
        st.one_of(
            st.just(str(len(body)).encode()),
            st.integers(-5, 10**6).map(lambda n: str(n).encode()),
            st.sampled_from([b"", b"abc", b"\xb3", b"1_0", b" 12 "]),
        )
    )
    headers = b"Content-Type: application/json\r\n"
    if draw(st.booleans()):
        headers += b"Content-Length: " + length + b"\r\n"
    return b"HTTP/1.1 " + status + b"\r\n" + headers + b"\r\n" + body


@BOUNDED
@given(st.binary(max_size=2048))
@example(b"HTTP/1.1 \xb200 OK\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n")
@example(b"HTTP/1.1 200 OK\r\n\r\n" + b"[" * 100_000)
def test_raw_bytes(data: bytes) -> None:
    assert_clean("snapshot", data)


@BOUNDED
@given(answer())
@example(
    b"HTTP/1.1 200 OK\r\n\r\n"
    + json.dumps(
        _with(
            _with(REAL_STATE, ("probes", "vllm", "state"), "stalled"),
            ("probes", "vllm", "seconds_without_progress"),
            10**400,
        )
    ).encode()
)
def test_near_valid_state(data: bytes) -> None:
    assert_clean("snapshot", data)
