"""``spark-watchdog controller --config FILE``: run the controller."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from spark_watchdog import logs
from spark_watchdog.config.controller import load_controller_config
from spark_watchdog.errors import ConfigError, WatchdogError

log = logging.getLogger("spark_watchdog.controller")


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "controller",
        help="run the controller (detect frozen hosts, recover, record)",
        description=(
            "Pull every agent, check SSH banners and the witness, decide verdicts, run the "
            "escalation ladder for frozen hosts, restart serving, and keep the freeze history."
        ),
        epilog="example: spark-watchdog controller --config /etc/spark-watchdog/controller.yaml",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="controller YAML config")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("--debug", action="store_true", help="log debug messages")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(logging.DEBUG if args.debug else logging.INFO)
    try:
        config = load_controller_config(args.config)
    except ConfigError as exc:
        print(f"spark-watchdog controller: {exc}", file=sys.stderr)
        return 2
    if args.check:
        names = ", ".join(n.name for n in config.nodes)
        print(f"{args.config}: ok ({len(config.nodes)} nodes: {names})")
        return 0
    from spark_watchdog.controller.daemon import serve

    try:
        asyncio.run(serve(config))
    except WatchdogError as exc:
        log.error("%s", exc)
        return 1
    return 0
