"""``spark-watchdog agent --config FILE``: run the node agent."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from spark_watchdog import logs
from spark_watchdog.agent.daemon import serve
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.files import read_yaml
from spark_watchdog.config.secret_refs import agent_secrets, check_secrets
from spark_watchdog.errors import ConfigError, WatchdogError

log = logging.getLogger("spark_watchdog.agent")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "agent",
        help="run the node agent (the systemd service)",
        description=(
            "Run the node agent: probes vLLM, the GPU (NVML), the journal and the host, "
            "serves GET /v1/state, /v1/boots and /metrics, and speaks the systemd notify "
            "protocol (READY, WATCHDOG, STATUS)."
        ),
        epilog="example: spark-watchdog agent --config /etc/spark-watchdog/agent.yaml",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="agent YAML config")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config and every secret file it names, and exit (a credential "
        "name is checked only where $CREDENTIALS_DIRECTORY is set, as in the unit)",
    )
    parser.add_argument("--debug", action="store_true", help="log debug messages")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(logging.DEBUG if args.debug else logging.INFO)
    try:
        config = parse_agent_config(read_yaml(args.config), str(args.config))
        # Every secret file the config names, now: at --check, and before a start.
        secrets = check_secrets(
            str(args.config), agent_secrets(config), credentials_required=not args.check
        )
    except ConfigError as exc:
        print(f"spark-watchdog agent: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok (node {config.node})")
        for note in secrets.notes():
            print(f"  {note}")
        return 0
    try:
        asyncio.run(serve(config))
    except WatchdogError as exc:
        log.error("%s", exc)
        return 1
    return 0
