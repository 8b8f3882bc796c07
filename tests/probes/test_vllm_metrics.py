"""Reading vLLM's /metrics body: realistic payloads, old names, and bad bodies."""

from __future__ import annotations

import pytest

from spark_watchdog.errors import MetricsFormatError
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.probes.vllm_metrics import EngineSample, models_seen, parse_metrics

# Shaped like a vLLM V1 head with two data-parallel engines, as prometheus_client
# writes it: counters as <name>_total plus _created, histogram buckets, the
# finished_reason label, and series this parser does not read.
TWO_ENGINES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="ds-v4"} 5.0
vllm:num_requests_running{engine="1",model_name="ds-v4"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="ds-v4"} 2.0
vllm:num_requests_waiting{engine="1",model_name="ds-v4"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="ds-v4"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="ds-v4"} 0.17
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="ds-v4"} 123456.0
vllm:prompt_tokens_total{engine="1",model_name="ds-v4"} 65432.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="ds-v4"} 1.7510304e+09
vllm:prompt_tokens_created{engine="1",model_name="ds-v4"} 1.7510304e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="ds-v4"} 98765.0
vllm:generation_tokens_total{engine="1",model_name="ds-v4"} 45678.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="ds-v4"} 1.7510304e+09
vllm:generation_tokens_created{engine="1",model_name="ds-v4"} 1.7510304e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="ds-v4"} 310.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="ds-v4"} 12.0
vllm:request_success_total{engine="1",finished_reason="stop",model_name="ds-v4"} 200.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="ds-v4"} 4000.0
# HELP vllm:iteration_tokens_total Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="ds-v4"} 10.0
vllm:iteration_tokens_total_bucket{engine="0",le="8.0",model_name="ds-v4"} 9000.0
vllm:iteration_tokens_total_bucket{engine="0",le="+Inf",model_name="ds-v4"} 20001.0
vllm:iteration_tokens_total_count{engine="0",model_name="ds-v4"} 20001.0
vllm:iteration_tokens_total_sum{engine="0",model_name="ds-v4"} 222221.0
vllm:iteration_tokens_total_bucket{engine="1",le="1.0",model_name="ds-v4"} 5.0
vllm:iteration_tokens_total_bucket{engine="1",le="8.0",model_name="ds-v4"} 4000.0
vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="ds-v4"} 11000.0
vllm:iteration_tokens_total_count{engine="1",model_name="ds-v4"} 11000.0
vllm:iteration_tokens_total_sum{engine="1",model_name="ds-v4"} 111110.0
# HELP vllm:iteration_tokens_total_created Histogram of number of tokens per engine_step.
# TYPE vllm:iteration_tokens_total_created gauge
vllm:iteration_tokens_total_created{engine="0",model_name="ds-v4"} 1.7510304e+09
vllm:iteration_tokens_total_created{engine="1",model_name="ds-v4"} 1.7510304e+09
# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 812.5
"""

# vLLM before V1: no engine label, KV usage under its old name.
OLD_NAMES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llama"} 1.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="llama"} 0.25
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="llama"} 700.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="llama"} 350.0
vllm:iteration_tokens_total_count{model_name="llama"} 350.0
vllm:iteration_tokens_total_sum{model_name="llama"} 1400.0
"""


def test_two_engines_are_read_apart() -> None:
    engines = parse_metrics(TWO_ENGINES)

    assert set(engines) == {"0", "1"}
    assert engines["0"] == EngineSample(
        engine="0",
        running=5,
        waiting=2,
        engine_steps=20001,
        generation_tokens=98765,
        prompt_tokens=123456,
        kv_cache_usage=0.42,
        models=("ds-v4",),
    )
    assert engines["1"].running == 3
    assert engines["1"].engine_steps == 11000
    assert engines["1"].generation_tokens == 45678


def test_created_samples_are_not_counts() -> None:
    # The _created timestamps (~1.75e9) must not leak into any count.
    engine = parse_metrics(TWO_ENGINES)["0"]

    assert engine.prompt_tokens == 123456
    assert engine.engine_steps == 20001


def test_counts_are_summed_over_model_names_per_engine() -> None:
    text = """\
vllm:num_requests_running{engine="0",model_name="a"} 2
vllm:num_requests_running{engine="0",model_name="b"} 3
vllm:generation_tokens_total{engine="0",model_name="a"} 10
vllm:generation_tokens_total{engine="0",model_name="b"} 20
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.3
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.5
"""
    engine = parse_metrics(text)["0"]

    assert engine.running == 5
    assert engine.generation_tokens == 30
    # A fraction of one cache is not summed: the fullest is reported.
    assert engine.kv_cache_usage == 0.5
    assert engine.models == ("a", "b")


def test_old_names_and_missing_engine_label() -> None:
    engines = parse_metrics(OLD_NAMES)

    assert list(engines) == ["0"]
    engine = engines["0"]
    assert engine.kv_cache_usage == 0.25
    assert engine.engine_steps == 350
    assert engine.generation_tokens == 700
    assert engine.running == 2
    assert engine.prompt_tokens is None


def test_missing_families_are_none_not_zero() -> None:
    engines = parse_metrics('vllm:num_requests_waiting{engine="0",model_name="m"} 4\n')

    engine = engines["0"]
    assert engine.waiting == 4
    assert engine.running is None
    assert engine.engine_steps is None
    assert engine.generation_tokens is None
    assert engine.kv_cache_usage is None


def test_body_without_vllm_series_has_no_engines() -> None:
    text = "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n"
    assert parse_metrics(text) == {}


def test_info_series_without_engine_label_invents_no_engine() -> None:
    text = (
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="9000"} 1.0\n'
        'vllm:num_requests_running{engine="3",model_name="m"} 1\n'
    )
    assert list(parse_metrics(text)) == ["3"]


def test_models_seen_in_first_seen_order() -> None:
    text = (
        'vllm:num_requests_running{engine="0",model_name="b"} 1\n'
        'vllm:num_requests_running{engine="1",model_name="a"} 1\n'
        'vllm:num_requests_running{engine="1",model_name="b"} 1\n'
    )
    assert models_seen(parse_metrics(text).values()) == ("b", "a")


@pytest.mark.parametrize("body", ["", "   \n\n"])
def test_empty_body_is_an_error(body: str) -> None:
    with pytest.raises(MetricsFormatError, match="empty /metrics body"):
        parse_metrics(body)


def test_html_error_page_names_the_line() -> None:
    body = "<html>\n<body>502 Bad Gateway</body>\n</html>\n"
    with pytest.raises(MetricsFormatError, match=r"line 1 is not Prometheus text.*<html>"):
        parse_metrics(body)


def test_garbage_after_good_lines_names_its_line() -> None:
    body = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
        'vllm:num_requests_waiting{engine="0" 1\n'
    )
    with pytest.raises(MetricsFormatError, match=r"line 3 .*num_requests_waiting"):
        parse_metrics(body)


def test_json_body_is_an_error() -> None:
    with pytest.raises(MetricsFormatError, match="not Prometheus text"):
        parse_metrics('{"detail": "Not Found"}')


def test_non_finite_count_is_an_error() -> None:
    body = 'vllm:num_requests_running{engine="0",model_name="m"} NaN\n'
    with pytest.raises(MetricsFormatError, match=r"num_requests_running\{.*\} is nan"):
        parse_metrics(body)


def test_the_standin_exposition_reads_back() -> None:
    # The stand-in's own registry, no HTTP: its names must be the ones read here.
    standin = VllmStandin(engines=2, seed=7)  # not started: no thread steps it
    try:
        standin.advance(5)
        engines = parse_metrics(standin.exposition().decode())
    finally:
        standin.stop()

    assert set(engines) == {"0", "1"}
    for engine in engines.values():
        assert engine.engine_steps == 5
        assert engine.running is not None and engine.running > 0
        assert engine.generation_tokens is not None and engine.generation_tokens >= 5
        assert engine.kv_cache_usage is not None
        assert engine.models == ("standin-model",)
