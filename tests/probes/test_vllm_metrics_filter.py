"""The pre-filter before the Prometheus parser keeps the refusal of garbled bodies."""

from __future__ import annotations

import pytest

from spark_watchdog.errors import MetricsFormatError
from spark_watchdog.probes.vllm_metrics import parse_metrics

BODY = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 4.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 2.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 117.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 900.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="a model"} 3.0
"""


def test_needed_series_are_read_through_the_filter() -> None:
    engine = parse_metrics(BODY)["0"]
    assert engine.running == 4.0 and engine.engine_steps == 117.0


def test_a_garbled_line_we_do_not_read_is_still_refused() -> None:
    garbled = BODY + 'vllm:e2e_request_latency_seconds_count{engine="0"\n'
    with pytest.raises(MetricsFormatError, match="line 9 is not Prometheus text"):
        parse_metrics(garbled)


def test_a_garbled_needed_line_is_refused_by_the_parser() -> None:
    garbled = BODY.replace("} 117.0", "} one-hundred")
    with pytest.raises(MetricsFormatError):
        parse_metrics(garbled)
