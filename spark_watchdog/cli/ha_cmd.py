"""``spark-watchdog ha``: the controller pair's leadership, on a PostgreSQL
history (docs/design.md, "Controller pair").

``ha status`` shows who leads, at which epoch, and how much of its lease is
left by the database's clock, and the standbys seen within a lease; ``ha
step-down`` ends the lease: the leader stops at once, and a standby takes
over two send deadlines later (what the leader's last checked write was
promised).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from spark_watchdog.cli.history_cmd import DEFAULT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from spark_watchdog.config.controller import ControllerConfig, load_controller_config
from spark_watchdog.config.history_location import is_postgres_url
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.history.leadership import Leader, Standby, end_lease, standbys
from spark_watchdog.history.leadership import current as current_leader
from spark_watchdog.history.postgres import PostgresHistoryStore

T = TypeVar("T")


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


def _on_pair_history(
    args: argparse.Namespace,
    fn: Callable[[ControllerConfig, PostgresHistoryStore], T],
    *,
    write: bool = False,
) -> T:
    """``fn`` on the pair's history, opened read-only unless ``write`` (raises
    ConfigError for an SQLite one)."""
    config = load_controller_config(args.config)
    if not is_postgres_url(config.history):
        raise ConfigError(
            str(args.config),
            [
                "history: a single controller on an SQLite history has no leadership; "
                "a controller pair shares a postgresql:// history"
            ],
        )
    with PostgresHistoryStore(
        config.history, password_file=config.history_password_file, read_only=not write
    ) as store:
        return fn(config, store)


def _run(args: argparse.Namespace, show: Callable[[argparse.Namespace], int]) -> int:
    try:
        return show(args)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchdogError as exc:
        return _fail(str(exc), EXIT_FAILED)


def run_status(args: argparse.Namespace) -> int:
    return _run(args, _status)


def _status(args: argparse.Namespace) -> int:
    def read(
        config: ControllerConfig, store: PostgresHistoryStore
    ) -> tuple[Leader | None, list[Standby]]:
        # A standby tries every renew_every; one not seen for a lease is gone.
        return current_leader(store), standbys(store, config.leadership.lease)

    leader, waiting = _on_pair_history(args, read)
    if args.json:
        print(
            json.dumps(
                {
                    "leader": None if leader is None else leader.to_json(),
                    "standbys": [s.to_json() for s in waiting],
                }
            )
        )
        return EXIT_OK
    if leader is None:
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
    for standby in waiting:
        print(f"standing by: {standby.holder} (seen {standby.ago:.1f}s ago)")
    if not waiting:
        print("no standby seen: if the leader fails, a freeze waits for a person")
    return EXIT_OK


def run_step_down(args: argparse.Namespace) -> int:
    return _run(args, _step_down)


def _step_down(args: argparse.Namespace) -> int:
    ended = _on_pair_history(args, lambda _config, store: end_lease(store), write=True)
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
