"""The entry point: subcommands, help and exit codes."""

from __future__ import annotations

import pytest

from spark_watchdog import __version__
from spark_watchdog.cli.main import build_parser, main


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    for command in ("agent", "probe", "lab"):
        assert command in out
    assert "Exit codes: 0 ok, 1 unhealthy or action failed, 2 usage or config error." in out


def test_probe_help_lists_every_probe(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    out = capsys.readouterr().out
    for probe in ("journal", "vllm", "gpu"):
        assert probe in out


@pytest.mark.parametrize(
    "argv",
    [[], ["probe"], ["nonsense"], ["agent"], ["probe", "vllm", "--stall-after", "x"]],
)
def test_usage_errors_exit_2_with_a_hint(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(argv)
    assert caught.value.code == 2
    assert "--help" in capsys.readouterr().err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--version"])
    assert __version__ in capsys.readouterr().out
