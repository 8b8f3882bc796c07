"""What counts as a secret in a launch argv or a text, and what does not."""

from __future__ import annotations

import pytest

from spark_watchdog.redact import (
    REDACTED,
    plain_error,
    redact_argv,
    redact_message,
    redact_record,
    redact_text,
)


def test_secret_flags_and_secret_named_variables_are_hidden() -> None:
    argv = [
        "vllm", "serve", "m", "--api-key", "sk-1", "--hf_token=hf-2",
        "HF_TOKEN=hf-3", "--env=OPENAI_API_KEY=sk-4", "AWS_SECRET_ACCESS_KEY=a-5",
        "--my-secret", "s-6",
    ]  # fmt: skip
    assert redact_argv(argv, ["--my-secret"]) == [
        "vllm", "serve", "m", "--api-key", "***", "--hf_token=***",
        "HF_TOKEN=***", "--env=OPENAI_API_KEY=***", "AWS_SECRET_ACCESS_KEY=***",
        "--my-secret", "***",
    ]  # fmt: skip
    assert argv[4] == "sk-1"  # the input is left alone


def test_settings_that_merely_mention_tokens_stay_visible() -> None:
    argv = [
        "vllm", "serve", "m", "--max-num-batched-tokens", "8192", "--tokenizer", "t",
        "max_num_batched_tokens=8192", "--env=TOKENIZERS_PARALLELISM=false",
    ]  # fmt: skip
    assert redact_argv(argv) == argv
    line = "non-default args: {'max_num_batched_tokens': 8192}, max_tokens=16"
    assert redact_text(line) == line


def test_records_hide_secrets_at_any_depth() -> None:
    record = {
        "serving": {"argv": ["vllm", "--api-key", "sk-1"]},
        "errors": ["start failed: `vllm --api-key sk-2 --port 8000`", "HF_TOKEN=hf-3 missing"],
    }
    assert redact_record(record) == {
        "serving": {"argv": ["vllm", "--api-key", "***"]},
        "errors": ["start failed: `vllm --api-key *** --port 8000`", "HF_TOKEN=*** missing"],
    }


def test_a_command_line_inside_one_argument_is_redacted_too() -> None:
    argv = ["bash", "-c", "vllm serve m --api-key sk-123 --port 8000"]
    assert redact_argv(argv) == ["bash", "-c", "vllm serve m --api-key *** --port 8000"]


def test_a_bare_secret_flag_does_not_swallow_the_next_flag() -> None:
    argv = ["vllm", "serve", "m", "--hf-token", "--api-key", "sk-1"]
    assert redact_argv(argv) == ["vllm", "serve", "m", "--hf-token", "--api-key", "***"]


@pytest.mark.parametrize(
    ("message", "hidden"),
    [
        ("cannot reach http://admin:hunter2@10.0.0.5/cm?cmnd=Power: refused", "hunter2"),
        ("cannot reach https://h4cker@10.0.0.5/", "h4cker"),
        ("GET https://h/v1/x?ACCESS_TOKEN=abc123&limit=5 failed", "abc123"),
        ("GET http://h/v1/x;token=zz9876/y failed", "zz9876"),
        ("GET http://h/v1/x?x-api-key=k3y9&a=1 failed", "k3y9"),
        ("answer: Authorization: Bearer abc.def-ghi", "abc.def-ghi"),
        ("/v1/x?q=Bearer%20abcdef", "abcdef"),
        ("/v1/x?q=bearer+abcdef", "abcdef"),
        ("the device said wrong password p@ss€word!", "p@ss€word"),
    ],
)
def test_error_messages_hide_urls_credentials(message: str, hidden: str) -> None:
    shown = redact_message(message, secrets=["p@ss€word"])
    assert hidden not in shown and REDACTED in shown


def test_error_messages_keep_what_is_not_a_secret() -> None:
    text = "GET http://10.0.0.5:8000/v1/incidents?status=open&limit=5: connection refused"
    assert redact_message(text) == text
    assert redact_message("spark-1: tokens 512 of 8192") == "spark-1: tokens 512 of 8192"


def test_a_library_s_private_exception_name_is_left_out() -> None:
    said = "kasa plug: _RetryableError: Unable to query the device 10.0.0.5:9999: 0 bytes read"
    assert plain_error(said) == "kasa plug: Unable to query the device 10.0.0.5:9999: 0 bytes read"
    kept = "snmp pdu: ValueError: outlet 9 of 8"
    assert plain_error(kept) == kept
