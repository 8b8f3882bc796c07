"""The entry point: subcommands, help and exit codes."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from spark_watchdog import __version__
from spark_watchdog.cli.main import ALONE, build_parser, main


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


def _command_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = commands.choices[name]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def _helps(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, str]:
    """Every command's --help under ``parser``, by its path."""
    helps = {" ".join(path): parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                helps.update(_helps(sub, (*path, name)))
    return helps


@pytest.mark.parametrize("command", sorted(ALONE))
def test_a_command_built_alone_parses_as_in_the_whole_tree(command: str) -> None:
    """The parser a process running one command builds is the whole tree's
    for that command: every subcommand, option, help text and example."""
    alone = _command_parser(build_parser(command), command)
    whole = _command_parser(build_parser(), command)
    assert _helps(alone) == _helps(whole)


def test_the_whole_tree_has_every_command_built_alone() -> None:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(ALONE) <= set(commands.choices)


def test_the_agent_loads_no_controller_lab_or_doctor_code() -> None:
    """The agent's process imports its own command's module only (its RSS budget)."""
    script = (
        "import sys\n"
        "from spark_watchdog.cli.main import main\n"
        "try:\n"
        "    main(['agent', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    loaded = done.stdout.split()
    assert "spark_watchdog.cli.agent_cmd" in loaded
    foreign = [
        m
        for m in loaded
        if m.startswith(
            (
                "spark_watchdog.controller",
                "spark_watchdog.lab",
                "spark_watchdog.doctor",
                "spark_watchdog.history",
                "spark_watchdog.power",
            )
        )
        or (
            m.startswith("spark_watchdog.cli.")
            and m.endswith("_cmd")
            and m != "spark_watchdog.cli.agent_cmd"
        )
    ]
    assert foreign == [], foreign
