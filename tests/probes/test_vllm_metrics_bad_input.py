"""/metrics bodies found by fuzzing (bench/fuzz.py, target ``metrics``)."""

from __future__ import annotations

import pytest

from spark_watchdog.errors import MetricsFormatError
from spark_watchdog.probes.vllm_metrics import parse_metrics


def test_finite_values_whose_sum_overflows_are_a_format_error() -> None:
    body = (
        'vllm:generation_tokens_total{engine="0",model_name="a"} 1e308\n'
        'vllm:generation_tokens_total{engine="0",model_name="b"} 1e308\n'
    )
    # Before: OverflowError (cannot convert float infinity to integer) escaped.
    with pytest.raises(MetricsFormatError) as caught:
        parse_metrics(body)
    assert str(caught.value) == (
        "vllm:generation_tokens_total of engine '0' adds up to inf over its series; "
        "expected counts that sum to a finite number"
    )


@pytest.mark.parametrize("separator", ["\u2028", "\x85", "\x1c", "\x0c"])
def test_unicode_line_separators_inside_a_label_or_help_text_are_not_line_breaks(
    separator: str,
) -> None:
    body = (
        f"# HELP vllm:num_requests_running Requests{separator}running\n"
        f'vllm:num_requests_running{{engine="0",model_name="a{separator}b"}} 3.0\n'
    )
    # Before: "/metrics line 2 is not Prometheus text: ..." for a valid body.
    engines = parse_metrics(body)
    assert engines["0"].running == 3
    assert engines["0"].models == (f"a{separator}b",)


def test_line_numbers_count_newlines_only() -> None:
    body = "# a\x0bcomment\nvllm:num_requests_running 1\n{bad}\n"
    with pytest.raises(MetricsFormatError) as caught:
        parse_metrics(body)
    assert str(caught.value) == (
        "/metrics line 3 is not Prometheus text (Invalid labels: bad): '{bad}'"
    )
