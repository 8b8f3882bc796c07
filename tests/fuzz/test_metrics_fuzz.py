"""Bounded fuzzing of the vLLM /metrics parser: raw bytes and near-valid exposition."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bench.fuzz_targets import assert_clean

BOUNDED = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))

NAMES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:iteration_tokens_total_count",
    "vllm:iteration_tokens_total_bucket",
    "vllm:iteration_tokens_total_sum",
    "vllm:generation_tokens_total",
    "vllm:generation_tokens_created",
    "vllm:prompt_tokens_total",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:request_success_total",
    "process_cpu_seconds_total",
)
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(10**30), 10**30).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "1.7976931348623157e+308", "0x10", "", "1_0"]),
    st.text(max_size=6),
)
LABEL_VALUE = st.text(max_size=12).map(
    lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
)
LABEL = st.tuples(
    st.sampled_from(["engine", "model_name", "le", "finished_reason", "x"]), LABEL_VALUE
)


@st.composite
def sample_line(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES))
    labels = draw(st.lists(LABEL, max_size=3))
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    braced = bool(labels) or draw(st.booleans())
    braces = f"{{{inner}}}" if braced else ""
    stamp = draw(st.one_of(st.none(), st.integers(0, 2**63).map(str), st.text(max_size=4)))
    sep = draw(st.sampled_from([" ", "\t", "  "]))
    line = f"{name}{braces}{sep}{draw(VALUES)}" + (f" {stamp}" if stamp is not None else "")
    return line


COMMENT = st.sampled_from(NAMES).flatmap(
    lambda n: st.sampled_from(
        [f"# TYPE {n} gauge", f"# TYPE {n} counter", f"# HELP {n} text", "#", "# EOF"]
    )
)
JUNK = st.text(max_size=30)


@st.composite
def exposition(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.one_of(sample_line(), COMMENT, JUNK), min_size=1, max_size=12))
    newline = draw(st.sampled_from(["\n", "\r\n", "\x85", "\u2028", "\x0b"]))
    return newline.join(lines).encode("utf-8", "surrogatepass")


@BOUNDED
@given(st.binary(max_size=2048))
def test_raw_bytes(data: bytes) -> None:
    assert_clean("metrics", data)


@BOUNDED
@given(exposition())
@example(b"vllm:num_requests_running 1e308\nvllm:num_requests_running 1e308\n")
@example('vllm:num_requests_running{model_name="a\u2028b"} 1\n'.encode())
def test_near_valid_exposition(data: bytes) -> None:
    assert_clean("metrics", data)
