"""``spark-watchdog completion SHELL`` and ``spark-watchdog man``."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_parsers(commands: Any) -> None:
    completion = commands.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script generated from this program's own parser.",
        epilog=(
            "examples:\n"
            "  spark-watchdog completion bash > /etc/bash_completion.d/spark-watchdog\n"
            "  spark-watchdog completion zsh > ~/.zfunc/_spark-watchdog"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell")
    completion.set_defaults(func=run_completion)
    man = commands.add_parser(
        "man",
        help="print the spark-watchdog(1) man page (roff)",
        description="Print the man page, generated from this program's own parser.",
        epilog="examples:\n  spark-watchdog man | man -l -",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    man.set_defaults(func=run_man)


def run_completion(args: argparse.Namespace) -> int:
    from spark_watchdog.cli.completion import bash_script, zsh_script
    from spark_watchdog.cli.parser_tree import tree

    root = tree(args.root_parser)
    sys.stdout.write(bash_script(root) if args.shell == "bash" else zsh_script(root))
    return 0


def run_man(args: argparse.Namespace) -> int:
    from spark_watchdog.cli.manpage import man_page
    from spark_watchdog.cli.parser_tree import tree

    sys.stdout.write(man_page(tree(args.root_parser)))
    return 0
