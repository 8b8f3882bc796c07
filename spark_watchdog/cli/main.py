"""``spark-watchdog``: one entry point, with subcommands.

Exit codes (docs/design.md, "Interfaces that stay stable"): 0 ok, 1 the thing
checked is unhealthy or the action failed, 2 usage or config error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from spark_watchdog import __version__
from spark_watchdog.cli import (
    agent_cmd,
    controller_cmd,
    doctor_cmd,
    examples,
    ha_cmd,
    history_cmd,
    lab_cmd,
    power_cmd,
    probe_gpu,
    probe_journal,
    probe_vllm,
    reference_cmd,
    serving_cmd,
)
from spark_watchdog.cli.parser_tree import Command, tree
from spark_watchdog.errors import ConfigError, WatchdogError

EXIT_OK = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message, add a hint."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spark-watchdog",
        description="Freeze watchdog for vLLM on NVIDIA DGX Spark clusters.",
        epilog="Exit codes: 0 ok, 1 unhealthy or action failed, 2 usage or config error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    agent_cmd.add_parser(commands)

    probe = commands.add_parser(
        "probe",
        help="run one probe once and print what it sees",
        description="Run one of the agent's probes by hand.",
    )
    probes: Any = probe.add_subparsers(dest="probe", metavar="PROBE", parser_class=_Parser)
    probes.required = True
    probe_journal.add_parser(probes)
    probe_vllm.add_parser(probes)
    probe_gpu.add_parser(probes)

    controller_cmd.add_parser(commands)
    power_cmd.add_parser(commands)
    history_cmd.add_parsers(commands)
    serving_cmd.add_parser(commands)
    ha_cmd.add_parser(commands)
    lab_cmd.add_parser(commands)
    doctor_cmd.add_parser(commands)
    reference_cmd.add_parsers(commands)
    examples.attach(parser)
    # The man page and the completions are drawn from this very parser: handed
    # to them here, so that no command module imports the one that builds it.
    parser.set_defaults(root_parser=parser)
    return parser


def program() -> Command:
    """The whole command tree, as the man page and the completions see it."""
    return tree(build_parser())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # a command that did not catch its own: still exit 2
        print(f"spark-watchdog: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except WatchdogError as exc:
        print(f"spark-watchdog: {exc}", file=sys.stderr)
        return EXIT_UNHEALTHY
    except BrokenPipeError:
        # `spark-watchdog ... | head`: the reader left; not an error of ours.
        return EXIT_OK
    return code


if __name__ == "__main__":
    sys.exit(main())
