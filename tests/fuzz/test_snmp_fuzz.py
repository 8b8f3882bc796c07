"""Bounded fuzzing of the SNMP answer decoding: sysObjectID, outlet status, names.

Raw bytes in the harness's input format, and near-valid answers: BER
VarBindLists for the OIDs a profile asks for (or neighbours of them), with
values of every SNMP type, error statuses and silences.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pysnmp.proto import rfc1902, rfc1905

from bench.fuzz_targets import _snmp_answer, assert_clean
from spark_watchdog.power.snmp_profiles import PROFILES, SYS_OBJECT_ID

BOUNDED = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))

VENDORS = ["auto", "generic", *PROFILES]
ARC = st.integers(0, 2**32 - 1)
OID = st.lists(ARC, min_size=0, max_size=6).map(lambda arcs: ".".join(map(str, [1, 3, 6, *arcs])))

VALUE: st.SearchStrategy[Any] = st.one_of(
    st.integers(-(2**31), 2**31 - 1).map(rfc1902.Integer32),
    st.sampled_from([0, 1, 2, 3, 7, 8]).map(rfc1902.Integer32),
    st.binary(max_size=40).map(rfc1902.OctetString),
    OID.map(rfc1902.ObjectName),
    st.integers(0, 2**32 - 1).map(rfc1902.Counter32),
    st.integers(0, 2**32 - 1).map(rfc1902.Gauge32),
    st.integers(0, 2**32 - 1).map(rfc1902.TimeTicks),
    st.integers(0, 2**64 - 1).map(rfc1902.Counter64),
    st.binary(min_size=4, max_size=4).map(rfc1902.IpAddress),
    st.binary(max_size=8).map(rfc1902.Opaque),
    st.sampled_from(
        [rfc1905.NoSuchObject(""), rfc1905.NoSuchInstance(""), rfc1905.EndOfMibView("")]
    ),
)


@st.composite
def answers(draw: st.DrawFn) -> bytes:
    key = draw(st.sampled_from(list(PROFILES)))
    profile = PROFILES[key]
    outlet = draw(st.integers(1, 48))
    wanted = [
        SYS_OBJECT_ID,
        profile.instance(profile.status_oid, outlet),
        profile.names_root() or "1.3.6",
        f"{profile.names_root()}.{outlet}",
    ]
    out = bytes([draw(st.sampled_from(range(len(VENDORS)))), draw(st.integers(0, 255))])
    for _ in range(draw(st.integers(1, 8))):
        oid = draw(st.one_of(st.sampled_from(wanted), OID))
        if draw(st.booleans()):
            oid = f"{oid}.{draw(ARC)}"
        pairs = [(oid, draw(VALUE)) for _ in range(draw(st.integers(0, 2)))]
        if not pairs:
            pairs = [(oid, draw(VALUE))]
        out += _snmp_answer(
            pairs, kind=draw(st.sampled_from([0, 0, 0, 5, 6, 7])), status=draw(st.integers(0, 19))
        )
    return out


@BOUNDED
@given(st.binary(max_size=1024))
def test_raw_bytes(data: bytes) -> None:
    assert_clean("snmp", data)


@BOUNDED
@given(answers())
def test_near_valid_answers(data: bytes) -> None:
    assert_clean("snmp", data)
