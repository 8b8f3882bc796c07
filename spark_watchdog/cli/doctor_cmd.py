"""``spark-watchdog doctor``: before an incident, will detection and the power path work?

    spark-watchdog doctor [--agent-config FILE] [--controller-config FILE] [--json]

Exit codes: 0 nothing failed (warnings allowed), 1 a check failed, 2 usage
error or a config file that cannot be read at all.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from spark_watchdog import logs
from spark_watchdog.doctor.config_checks import ConfigUnreadable
from spark_watchdog.doctor.plan import diagnose
from spark_watchdog.doctor.report import TerminalProgress, render_json, render_text
from spark_watchdog.terminal import unescaped

DEFAULT_AGENT_CONFIG = Path("/etc/spark-watchdog/agent.yaml")
DEFAULT_CONTROLLER_CONFIG = Path("/etc/spark-watchdog/controller.yaml")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "doctor",
        help="check, before an incident, that detection and the power path will work",
        description=(
            "Check, before an incident, that detection and the power path will work,\n"
            "and explain each finding with a fix.\n\n"
            "With an agent config (a node): the config, the journal's persistence and\n"
            "the previous boot, the hardware watchdog, NVML within its deadline, vLLM's\n"
            "metrics, the token file's permissions.\n"
            "With a controller config: the config, each agent's /v1/state, clock skew,\n"
            "SSH banners, every power device (its state and outlet name; read only:\n"
            "doctor never switches power), the witness targets, the secret files, and\n"
            "with colocated: each controller of the order on each of its URLs (its\n"
            "place, its order, whether it still listens)."
        ),
        epilog=(
            "examples:\n"
            "  spark-watchdog doctor                      # whichever default configs exist\n"
            "  spark-watchdog doctor --controller-config controller.yaml --json\n"
            f"defaults: {DEFAULT_AGENT_CONFIG} and {DEFAULT_CONTROLLER_CONFIG}, when they exist\n"
            "exit codes: 0 nothing failed (warnings allowed), 1 a check failed, "
            "2 usage error or unreadable config"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--agent-config", type=Path, metavar="FILE", help="the node agent's YAML config"
    )
    parser.add_argument(
        "--controller-config", type=Path, metavar="FILE", help="the controller's YAML config"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--debug", action="store_true", help="also show the libraries' logs")
    parser.set_defaults(func=run)


def _usage(message: str) -> int:
    print(f"spark-watchdog doctor: {message}", file=sys.stderr)
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    # Every problem is a line of the report; the libraries' own warnings (a
    # loose secret file, an unconfirmed PDU profile) would say it twice.
    logs.configure(logging.DEBUG if args.debug else logging.CRITICAL, to_journal=False)
    agent_config: Path | None = args.agent_config
    controller_config: Path | None = args.controller_config
    if agent_config is None and controller_config is None:
        agent_config = DEFAULT_AGENT_CONFIG if DEFAULT_AGENT_CONFIG.exists() else None
        if DEFAULT_CONTROLLER_CONFIG.exists():
            controller_config = DEFAULT_CONTROLLER_CONFIG
        if agent_config is None and controller_config is None:
            return _usage(
                f"no config to check: neither {DEFAULT_AGENT_CONFIG} nor "
                f"{DEFAULT_CONTROLLER_CONFIG} exists; give --agent-config FILE and/or "
                "--controller-config FILE"
            )
    # The progress line erases itself with the terminal's own controls: the
    # process's stream, not the escaping one the CLI prints through.
    progress = TerminalProgress(unescaped(sys.stderr)) if sys.stderr.isatty() else None
    try:
        report = diagnose(agent_config, controller_config, progress)
    except ConfigUnreadable as exc:
        return _usage(str(exc))
    print(render_json(report) if args.json else render_text(report))
    return EXIT_OK if report.ok else EXIT_FAILED
