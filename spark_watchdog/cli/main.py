"""``spark-watchdog``: one entry point, with subcommands.

Exit codes (docs/design.md, "Interfaces that stay stable"): 0 ok, 1 the thing
checked is unhealthy or the action failed, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from spark_watchdog import __version__
from spark_watchdog.cli import examples, say
from spark_watchdog.cli.parser_tree import Command, tree
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.terminal import EscapedStream

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2

# The commands that one module of this package registers by itself. A process
# that runs one of them builds only that command's parser and imports only its
# module: the agent, a long-lived process held to an RSS budget, loads no
# controller, lab or doctor code (docs/benchmarks.md, "Agent cost"). Any other
# first argument (help, a probe, the history commands) builds the whole tree.
ALONE = {
    "agent": "agent_cmd",
    "controller": "controller_cmd",
    "power": "power_cmd",
    "serving": "serving_cmd",
    "ha": "ha_cmd",
    "lab": "lab_cmd",
    "doctor": "doctor_cmd",
}

# The long-running commands: their output is their log, escaped by its formatter
# (spark_watchdog/logs.py), and their streams stay the process's own.
DAEMONS = frozenset({"agent", "controller"})


def _module(name: str) -> Any:
    return importlib.import_module(f"spark_watchdog.cli.{name}")


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message, add a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command, or only the command ``only``
    (one of ``ALONE``), which parses its arguments exactly as the whole tree does."""
    parser = _Parser(
        prog="spark-watchdog",
        description="Freeze watchdog for vLLM on NVIDIA DGX Spark clusters.",
        epilog="Exit codes: 0 ok, 1 unhealthy or action failed, 2 usage or config error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    if only is not None:
        _module(ALONE[only]).add_parser(commands)
    else:
        _add_every_command(commands)
    examples.attach(parser)
    # The man page and the completions are drawn from this very parser: handed
    # to them here, so that no command module imports the one that builds it.
    parser.set_defaults(root_parser=parser)
    return parser


def _add_every_command(commands: Any) -> None:
    """Every command, in the order ``--help`` and the man page list them."""
    _module("agent_cmd").add_parser(commands)

    probe = commands.add_parser(
        "probe",
        help="run one probe once and print what it sees",
        description="Run one of the agent's probes by hand.",
    )
    probes: Any = probe.add_subparsers(dest="probe", metavar="PROBE", parser_class=_Parser)
    probes.required = True
    for name in ("probe_journal", "probe_vllm", "probe_gpu"):
        _module(name).add_parser(probes)

    for name in ("controller_cmd", "power_cmd"):
        _module(name).add_parser(commands)
    _module("history_cmd").add_parsers(commands)
    for name in ("serving_cmd", "ha_cmd", "lab_cmd", "doctor_cmd"):
        _module(name).add_parser(commands)
    _module("reference_cmd").add_parsers(commands)


def program() -> Command:
    """The whole command tree, as the man page and the completions see it."""
    return tree(build_parser())


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given and given[0] in DAEMONS:
        return _run(given)
    # Whatever a command prints on a terminal, no control character from
    # outside gets through (spark_watchdog/terminal.py); JSON is unchanged.
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapedStream(sys.stdout), EscapedStream(sys.stderr)
    try:
        return _run(given)
    finally:
        sys.stdout, sys.stderr = saved


def _run(given: list[str]) -> int:
    parser = build_parser(given[0] if given and given[0] in ALONE else None)
    args = parser.parse_args(given)
    try:
        code = int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # a command that did not catch its own: still exit 2
        say.error(exc)
        return EXIT_USAGE
    except WatchdogError as exc:
        say.error(exc)
        return EXIT_UNHEALTHY
    except BrokenPipeError:
        # `spark-watchdog ... | head`: the reader left; not an error of ours.
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
