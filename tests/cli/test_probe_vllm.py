"""``spark-watchdog probe vllm``: exit codes, JSON contract, usage errors."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import pytest

from spark_watchdog.cli import probe_vllm
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port

CONTRACT_KEYS = {
    "url",
    "state",
    "health_status",
    "running",
    "waiting",
    "engine_steps",
    "generation_tokens",
    "seconds_without_progress",
}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spark-watchdog probe")
    probe_vllm.add_parser(parser.add_subparsers(dest="probe", required=True))
    return parser.parse_args(["vllm", *argv])


def run(*argv: str) -> int:
    args = parse(*argv)
    code: int = args.func(args)
    return code


@pytest.fixture
def standin() -> Iterator[VllmStandin]:
    with VllmStandin(step_rate=40.0) as server:
        yield server


def test_bad_url_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--url", "localhost:8000")

    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "localhost:8000" in err
    assert "http(s)://host[:port]" in err


@pytest.mark.parametrize("flag", ["--watch", "--stall-after", "--timeout"])
@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_seconds_must_be_positive(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--url", "http://127.0.0.1:8000", flag, value)

    assert exit_info.value.code == 2
    assert "expected a number of seconds > 0" in capsys.readouterr().err


def test_stall_after_longer_than_watch_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = run("--url", "http://127.0.0.1:9", "--watch", "5", "--stall-after", "15")

    assert code == 2
    assert "--stall-after 15 is longer than --watch 5" in capsys.readouterr().err


@pytest.mark.integration
def test_progressing_exits_0_with_the_json_contract(
    standin: VllmStandin, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run("--url", standin.url, "--watch", "1", "--json")

    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(report) >= CONTRACT_KEYS
    assert report["state"] == "progressing"
    assert report["url"] == standin.url
    assert report["health_status"] == 200
    assert report["samples"] >= 2
    assert report["watched_seconds"] >= 1.0


@pytest.mark.integration
def test_idle_exits_0(standin: VllmStandin, capsys: pytest.CaptureFixture[str]) -> None:
    standin.set_mode("idle")

    code = run("--url", standin.url, "--watch", "1", "--json")

    assert code == 0
    assert json.loads(capsys.readouterr().out)["state"] == "idle"


@pytest.mark.integration
def test_wedged_exits_1_as_stalled(
    standin: VllmStandin, capsys: pytest.CaptureFixture[str]
) -> None:
    standin.set_mode("wedged")

    code = run("--url", standin.url, "--stall-after", "1", "--json")

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["state"] == "stalled"
    assert report["health_status"] == 200
    assert report["seconds_without_progress"] >= 1.0


@pytest.mark.integration
def test_dead_exits_1(standin: VllmStandin, capsys: pytest.CaptureFixture[str]) -> None:
    standin.set_mode("dead")

    code = run("--url", standin.url, "--watch", "1", "--json")

    assert code == 1
    assert json.loads(capsys.readouterr().out)["state"] == "dead"


@pytest.mark.integration
def test_nothing_listening_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = run("--url", f"http://127.0.0.1:{port}", "--watch", "1", "--json")

    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["state"] == "unreachable"
    assert "connection refused" in report["reason"]


@pytest.mark.integration
def test_human_output_shows_progress_lines(
    standin: VllmStandin, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run("--url", standin.url, "--watch", "1")

    captured = capsys.readouterr()
    assert code == 0
    progress = captured.err.strip().splitlines()
    assert len(progress) >= 2
    assert progress[-1].startswith("[")
    assert "progressing" in progress[-1]
    assert captured.out.startswith(f"vLLM at {standin.url}: progressing")
    assert "engine steps:" in captured.out
