"""Bounded fuzzing of the journal probe's reading of entries into boots and evidence.

Raw bytes in the harness's input format, and near-valid journals: entries
with real kernel and journald lines, message ids, boot ids (proper, missing
or raw bytes), any timestamps sd-journal accepts, and a file header that
agrees with them or has bytes written over it.
"""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.fuzz_targets import _blob, _journal_entry, assert_clean

BOUNDED = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))

T0 = 1_751_000_000_000_000

ENTRY = st.builds(
    _journal_entry,
    flags=st.integers(0, 255),
    realtime=st.one_of(st.integers(T0, T0 + 10**9), st.integers(0, 2**64 - 1)),
    monotonic=st.one_of(st.integers(0, 10**9), st.integers(0, 2**64 - 1)),
    transport=st.integers(0, 5),
    identifier=st.integers(0, 4),
    message_id=st.integers(0, 3),
    message=st.integers(0, 9),
    extra=st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"0123456789abcdef0123456789abcdef\n", "é".encode() * 1100]),
    ),
)
PATCH = st.tuples(st.integers(0, 207), st.binary(max_size=16)).map(
    lambda p: bytes([p[0]]) + _blob(p[1], 16)
)


@st.composite
def journal_file(draw: st.DrawFn) -> bytes:
    entries = draw(st.lists(ENTRY, max_size=10))
    patches = draw(st.lists(PATCH, max_size=3))
    return bytes([len(entries)]) + b"".join(entries) + bytes([len(patches)]) + b"".join(patches)


@st.composite
def journal(draw: st.DrawFn) -> bytes:
    layout = draw(st.integers(0, 255))
    files = [draw(journal_file()) for _ in range(1 + (layout & 1))]
    return bytes([layout]) + b"".join(files)


@BOUNDED
@given(st.binary(max_size=1024))
def test_raw_bytes(data: bytes) -> None:
    assert_clean("journal", data)


@BOUNDED
@given(journal())
# A header whose head_entry_realtime (offset 184) is all ones.
@example(
    bytes([16 | 4, 1]) + _journal_entry(1, T0, 5) + b"\x01" + bytes([184]) + _blob(b"\xff" * 8, 16)
)
def test_near_valid_journal(data: bytes) -> None:
    assert_clean("journal", data)
