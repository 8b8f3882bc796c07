"""``spark-watchdog ha``: the controller pair's leadership, on a PostgreSQL
history (docs/design.md, "Controller pair").

``ha status`` shows who leads, at which epoch, and how much of its lease is
left by the database's clock; ``ha step-down`` ends the lease: the leader
stops at once, and a standby takes over two send deadlines later (what the
leader's last checked write was promised).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from spark_watchdog.cli.history_cmd import DEFAULT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from spark_watchdog.config.controller import load_controller_config
from spark_watchdog.config.history_location import is_postgres_url
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.history.leadership import current as current_leader
from spark_watchdog.history.leadership import end_lease
from spark_watchdog.history.postgres import PostgresHistoryStore


def add_parser(commands: Any) -> None:
    ha = commands.add_parser("ha", help="the controller pair's leadership (PostgreSQL history)")
    actions = ha.add_subparsers(dest="ha", metavar="ACTION")
    actions.required = True
    status = actions.add_parser("status", help="who leads, at which epoch, lease left")
    step_down = actions.add_parser(
        "step-down", help="end the leader's lease now: a standby takes over"
    )
    for parser in (status, step_down):
        parser.add_argument(
            "--config", default=DEFAULT_CONFIG, metavar="FILE", help="controller config"
        )
        parser.add_argument("--json", action="store_true")
    status.set_defaults(func=run_status)
    step_down.set_defaults(func=run_step_down)


def _fail(message: str, code: int) -> int:
    print(f"spark-watchdog ha: {message}", file=sys.stderr)
    return code


def _open(args: argparse.Namespace, *, write: bool) -> PostgresHistoryStore:
    config = load_controller_config(args.config)
    if not is_postgres_url(config.history):
        raise ConfigError(
            str(args.config),
            [
                "history: a single controller on an SQLite history has no leadership; "
                "a controller pair shares a postgresql:// history"
            ],
        )
    return PostgresHistoryStore(
        config.history, password_file=config.history_password_file, read_only=not write
    )


def run_status(args: argparse.Namespace) -> int:
    try:
        with _open(args, write=False) as store:
            leader = current_leader(store)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchdogError as exc:
        return _fail(str(exc), EXIT_FAILED)
    if args.json:
        print(json.dumps({"leader": None if leader is None else leader.to_json()}))
    elif leader is None:
        print("no controller has led yet")
    elif leader.released_at is not None and not leader.expired:
        print(
            f"nobody leads: {leader.holder} (epoch {leader.epoch}) was stepped down; "
            f"a standby may take over in {leader.left:.1f}s"
        )
    elif leader.expired:
        print(
            f"nobody leads: the lease of {leader.holder} (epoch {leader.epoch}) "
            f"expired {-leader.left:.1f}s ago"
        )
    else:
        print(f"{leader.holder} leads at epoch {leader.epoch}, {leader.left:.1f}s of lease left")
    return EXIT_OK


def run_step_down(args: argparse.Namespace) -> int:
    try:
        with _open(args, write=True) as store:
            ended = end_lease(store)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchdogError as exc:
        return _fail(str(exc), EXIT_FAILED)
    if ended is None or ended.expired:
        message = "nobody leads: nothing to end"
        payload: dict[str, Any] = {"ended": None}
    else:
        message = (
            f"ended the lease of {ended.holder} (epoch {ended.epoch}): it stops now, "
            f"and a standby may take over in {ended.left:.1f}s"
        )
        payload = {"ended": ended.to_json()}
    print(json.dumps(payload) if args.json else message)
    return EXIT_OK
