"""``spark-watchdog serving``: restart serving across the cluster, or pick the profile.

    spark-watchdog serving profile [P] --config FILE      show or set the profile in force
    spark-watchdog serving restart [--profile P] --config FILE

The profile in force is kept in the history database; after an incident the
controller switches to the safe profile, and it stays there until an
operator picks another one here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from spark_watchdog.cli.history_cmd import DEFAULT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from spark_watchdog.config.controller import load_controller_config
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.history.store import HistoryStore

SETTING = "serving_profile"


def add_parser(commands: Any) -> None:
    serving = commands.add_parser("serving", help="restart serving or choose its profile")
    actions = serving.add_subparsers(dest="serving", metavar="ACTION")
    actions.required = True
    profile = actions.add_parser("profile", help="show or set the serving profile in force")
    profile.add_argument("profile", nargs="?", metavar="P")
    restart = actions.add_parser(
        "restart", help="restart every rank (head stop first, head start last) and wait"
    )
    restart.add_argument("--profile", metavar="P", help="default: the profile in force")
    for parser in (profile, restart):
        parser.add_argument(
            "--config", default=DEFAULT_CONFIG, metavar="FILE", help="controller config"
        )
        parser.add_argument("--json", action="store_true")
    profile.set_defaults(func=run_profile)
    restart.set_defaults(func=run_restart)


def _fail(message: str, code: int) -> int:
    print(f"spark-watchdog serving: {message}", file=sys.stderr)
    return code


def run_profile(args: argparse.Namespace) -> int:
    try:
        config = load_controller_config(args.config)
        with HistoryStore(config.history, read_only=args.profile is None) as store:
            if args.profile is not None:
                store.set_setting(SETTING, args.profile, by="cli")
            setting = store.setting(SETTING)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchdogError as exc:
        return _fail(str(exc), EXIT_FAILED)
    current = None if setting is None else setting.value
    if args.json:
        print(json.dumps({"profile": current}))
    else:
        print(f"serving profile: {current or 'as configured on the agents'}")
    return EXIT_OK


def run_restart(args: argparse.Namespace) -> int:
    from spark_watchdog.controller.serving_restart import ServingNode, ServingRestart

    try:
        config = load_controller_config(args.config)
        serving = config.serving
        if serving.head is None or serving.token_file is None:
            return _fail("set serving.head and serving.token_file in the config", EXIT_USAGE)
        token = read_secret("serving.token_file", serving.token_file).reveal()
        store = HistoryStore(config.history)
    except ConfigError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except WatchdogError as exc:
        return _fail(str(exc), EXIT_FAILED)
    with store:
        setting = store.setting(SETTING)
        profile = args.profile or (setting.value if setting else serving.safe_profile)
        nodes = [ServingNode(n.name, n.agent) for n in config.nodes]
        head = next(n for n in nodes if n.name == serving.head)
        workers = [n for n in nodes if n is not head]
        record = store.start_serving_restart(profile)
        print(f"serving: restarting {len(nodes)} ranks with profile {profile}", file=sys.stderr)
        report = asyncio.run(
            ServingRestart(head, workers, token, timeout=serving.start_timeout).run(profile)
        )
        store.finish_serving_restart(
            record.id, report.result, step_durations=report.step_durations, error=report.error
        )
        if report.result == "succeeded":
            store.set_setting(SETTING, profile, by="cli")
    body = {
        "profile": profile,
        "result": report.result,
        "error": report.error,
        "steps": report.step_durations,
    }
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        total = sum(report.step_durations.values())
        print(f"serving restart with profile {profile}: {report.result} in {total:.1f}s")
        if report.error:
            print(f"  {report.error}")
    return EXIT_OK if report.result == "succeeded" else EXIT_FAILED
