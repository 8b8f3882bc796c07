"""``spark-watchdog lab ...``: the simulated cluster and its demos.

The lab's modules (HTTP clients, stand-ins, journal writers) are imported only
when a lab command runs, so the agent's own process never carries them.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "lab",
        help="simulated Spark nodes on this machine (demos, end-to-end tests)",
        description="Run the real watchdog code against simulated hardware on loopback.",
    )
    labs = parser.add_subparsers(dest="lab", metavar="LAB")
    labs.required = True
    demo = labs.add_parser(
        "agent-demo",
        help="the real agent against a simulated vLLM rank: wedge, crash, restart",
        description=(
            "A vLLM stand-in with synthetic load, a node journal of real journal files "
            "(a clean boot, a boot that froze after Xid 31, the current boot), and the real "
            "agent as a subprocess under a notify socket. The engine wedges, dies and "
            "restarts; the agent must call each of those. Exits 0 only when every step "
            "happened."
        ),
    )
    demo.add_argument(
        "--stall-after",
        type=float,
        default=6.0,
        metavar="SECONDS",
        help="the agent's stall_after for the demo (default 6; production default 15)",
    )
    demo.add_argument("--keep", action="store_true", help="keep the work directory")
    demo.add_argument("--json", action="store_true", help="print the steps as JSON at the end")
    demo.set_defaults(func=_run_agent_demo)


def _run_agent_demo(args: argparse.Namespace) -> int:
    from spark_watchdog.lab import agent_demo

    return agent_demo.run(args)
