"""``spark-watchdog controller --config FILE``: run the controller."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys
from typing import Any

from spark_watchdog import logs
from spark_watchdog.config.controller import (
    ControllerConfig,
    load_controller_config,
    power_libraries_missing,
)
from spark_watchdog.config.history_location import is_postgres_url
from spark_watchdog.config.secret_refs import check_secrets, controller_secrets
from spark_watchdog.controller.look.this_host import not_here
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.terminal import escape

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
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config and every secret file it names, and exit (a credential "
        "name is checked only where $CREDENTIALS_DIRECTORY is set, as in the unit)",
    )
    parser.add_argument(
        "--node",
        metavar="NAME",
        help="the node this controller runs on, where controllers run on the Sparks "
        "(colocated:); default: this host's short name",
    )
    parser.add_argument("--debug", action="store_true", help="log debug messages")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(logging.DEBUG if args.debug else logging.INFO)
    try:
        config = load_controller_config(args.config)
        # Every secret file the config names (PDU communities, BMC passwords, SSH
        # keys, the serving token), now: the unit's ExecStartPre, and before a start.
        secrets = check_secrets(
            str(args.config), controller_secrets(config), credentials_required=not args.check
        )
        missing = power_libraries_missing(config)
        if missing:
            raise ConfigError(str(args.config), missing)
    except ConfigError as exc:
        print(f"spark-watchdog controller: {exc}", file=sys.stderr)
        return 2
    node = _this_node(config, args.node)
    placed = _place(config, node)
    if placed.startswith("!"):
        print(f"spark-watchdog controller: {args.config}: {placed[1:]}", file=sys.stderr)
        return 2
    if args.check:
        names = ", ".join(n.name for n in config.nodes)
        print(f"{args.config}: ok ({len(config.nodes)} nodes: {names})")
        if placed:
            print(f"  {placed}")
        for note in secrets.notes():
            print(f"  {note}")
        return 0
    from spark_watchdog.power.paths import preload_libraries

    preload_libraries(config)
    if is_postgres_url(config.history):
        # One of a pair, a standby until it takes the lease:
        # docs/design.md, "Controller pair".
        from spark_watchdog.controller.pair.pair import run_pair

        return run_pair(config)
    from spark_watchdog.controller.daemon import serve

    try:
        asyncio.run(serve(config, node))
    except WatchdogError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _this_node(config: ControllerConfig, given: str | None) -> str | None:
    """Where this controller runs: ``--node``, else (controllers on the Sparks) the
    host's short name; None for a controller on a host of its own."""
    if given is not None or config.colocated is None:
        return given
    return socket.gethostname().split(".", 1)[0]


def _place(config: ControllerConfig, node: str | None) -> str:
    """Where this controller stands in the order of controllers on the Sparks: a
    line for ``--check``, "" for a controller on a host of its own, or "!" and
    why it has no place."""
    if config.colocated is None:
        return ""
    order = config.colocated.order
    if node not in order:
        return (
            f"!this controller runs on {escape(node or '?')}, which has no place in "
            f"colocated.controllers ({', '.join(order)}): pass --node with one of them"
        )
    elsewhere = not_here(config, node)
    if elsewhere is not None:
        return f"!{elsewhere}"
    return f"runs on {node}: place {order.index(node) + 1} of {len(order)}"
