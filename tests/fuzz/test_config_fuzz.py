"""Bounded fuzzing of the config loaders: YAML text as an agent and a controller config.

Raw bytes, and near-valid configs: the shipped examples (config/*.yaml) with
values swapped for arbitrary YAML scalars and collections, plus YAML's own
sharp edges (aliases, merge keys, tags, .nan).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.fuzz_targets import TARGETS, check


def assert_clean(data: bytes) -> None:
    finding = check(TARGETS["config"], data)
    if finding is not None:
        raise finding


BOUNDED = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))

ROOT = Path(__file__).resolve().parents[2] / "config"
EXAMPLES = [yaml.safe_load(p.read_text()) for p in sorted(ROOT.glob("*.yaml"))]

SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
VALUE = st.recursive(
    SCALAR,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
SNIPPETS = st.sampled_from(
    [
        b"a: &x [1, 2]\nb: *x\n",
        b"<<: {node: x}\n",
        b"node: !!python/object:os.system x\n",
        b"node: .nan\n",
        b"listen: {port: .inf}\n",
        b"node: a\nnode: b\n",
        b"%YAML 1.1\n---\nnode: x\n...\n---\nnode: y\n",
    ]
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*prefix, index))
    return found


@st.composite
def near_valid(draw: st.DrawFn) -> bytes:
    data = copy.deepcopy(draw(st.sampled_from(EXAMPLES)))
    paths = _paths(data)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths))
        node = data
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = draw(VALUE)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier swap removed the way there
    text = yaml.safe_dump(data, sort_keys=False).encode()
    if draw(st.booleans()):
        text += draw(SNIPPETS)
    return text


@BOUNDED
@given(st.binary(max_size=1024))
def test_raw_bytes(data: bytes) -> None:
    assert_clean(data)


@BOUNDED
@given(near_valid())
def test_near_valid_config(data: bytes) -> None:
    assert_clean(data)
