"""``spark-watchdog lab ...``: the simulated cluster and its demos."""

from __future__ import annotations

from typing import Any

from spark_watchdog.lab import agent_demo


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "lab",
        help="simulated Spark nodes on this machine (demos, end-to-end tests)",
        description="Run the real watchdog code against simulated hardware on loopback.",
    )
    labs = parser.add_subparsers(dest="lab", metavar="LAB")
    labs.required = True
    agent_demo.add_parser(labs)
