"""``spark-watchdog serving``: restart serving across the cluster, or pick the profile.

    spark-watchdog serving profile [P] --config FILE      show or set the profile in force
    spark-watchdog serving restart [--profile P] --config FILE

The profile in force is kept in the history database; after an incident the
controller switches to the safe profile, and it stays there until an
operator picks another one here. A profile is checked against what the
agents offer (``GET /v1/serving``) before it is set, and before a restart
stops anything: an unknown one is refused (exit 2) with nothing changed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import TYPE_CHECKING, Any

from spark_watchdog.cli.history_cmd import DEFAULT_CONFIG, EXIT_FAILED, EXIT_OK, EXIT_USAGE
from spark_watchdog.config.controller import ControllerConfig, load_controller_config
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.errors import ConfigError, InvalidRecord, WatchdogError
from spark_watchdog.history.locate import configured_history
from spark_watchdog.steps import StepName

if TYPE_CHECKING:
    from spark_watchdog.controller.serving.serving_restart import ServingRestartReport
    from spark_watchdog.history.store import HistoryStore

SETTING = "serving_profile"
# The incident kind of a serving restart a person asked for here.
OPERATOR_RESTART = "serving_restart"


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


# How long `serving profile P` waits for each agent's GET /v1/serving.
OFFER_TIMEOUT_S = 5.0


def _check_profile(config: ControllerConfig, profile: str) -> tuple[int, str] | None:
    """(exit code, message) when ``profile`` cannot be set; None when it can.

    The agents say what they offer (GET /v1/serving): a profile an answering
    agent does not offer is refused, so the next restart cannot stop every
    rank and then fail. With no agent to ask, only built-in profiles pass.
    """
    from spark_watchdog.controller.serving.serving_restart import (
        ServingNode,
        serving_offers,
        unknown_profile_problem,
    )
    from spark_watchdog.profiles import BUILTIN_PROFILES

    nodes = [ServingNode(n.name, n.agent) for n in config.nodes]
    offers = asyncio.run(serving_offers(nodes, OFFER_TIMEOUT_S))
    problem = unknown_profile_problem(profile, offers)
    if problem is not None:
        return EXIT_USAGE, f"{problem} (GET /v1/serving); nothing was changed"
    unasked = [f"{o.node}: {o.error}" for o in offers if not o.answered]
    if any(o.answered and o.enabled for o in offers):
        if unasked:
            note = f"spark-watchdog serving: note: not checked on {'; '.join(unasked)}"
            print(note, file=sys.stderr)
        return None
    why = "; ".join(unasked) or "serving control is off on every agent"
    if profile in BUILTIN_PROFILES:
        print(
            f"spark-watchdog serving: note: no agent could be asked ({why}); "
            f"{profile} is built into every agent",
            file=sys.stderr,
        )
        return None
    builtin = ", ".join(sorted(BUILTIN_PROFILES))
    return EXIT_FAILED, (
        f'cannot check profile "{profile}": no agent with serving control answered '
        f"GET /v1/serving ({why}); nothing was changed. Set it once the agents are up, "
        f"or pick a built-in profile ({builtin})"
    )


def run_profile(args: argparse.Namespace) -> int:
    try:
        config = load_controller_config(args.config)
        if args.profile is not None:
            refusal = _check_profile(config, args.profile)
            if refusal is not None:
                return _fail(refusal[1], refusal[0])
        with configured_history(config, read_only=args.profile is None) as store:
            if store.read_note:
                print(f"spark-watchdog serving: note: {store.read_note}", file=sys.stderr)
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
    from spark_watchdog.controller.io import serving_restart_for
    from spark_watchdog.controller.serving.serving_restart import PreflightFailed, ServingNode

    try:
        config = load_controller_config(args.config)
        serving = config.serving
        if serving.head is None or serving.token_file is None:
            return _fail("set serving.head and serving.token_file in the config", EXIT_USAGE)
        token = read_secret("serving.token_file", serving.token_file).reveal()
        store = configured_history(config)
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
        try:
            restart = serving_restart_for(config, head, workers, token, serving.start_timeout)
        except (ConfigError, ValueError) as exc:
            return _fail(f"restart: {exc}; nothing was run", EXIT_USAGE)
        # Every agent must answer and offer the profile before any rank is stopped.
        try:
            asyncio.run(restart.preflight(profile))
        except PreflightFailed as exc:
            return _fail(f"restart: {exc}", EXIT_USAGE if exc.unknown_profile else EXIT_FAILED)
        incident_id, record_id = _record_start(store, [n.name for n in nodes], profile)
        print(f"serving: restarting {len(nodes)} ranks with profile {profile}", file=sys.stderr)
        report = asyncio.run(restart.run(profile))
        _record_end(store, incident_id, record_id, report)
    body = {
        "profile": profile,
        "result": report.result,
        "error": report.error,
        "note": report.note,
        "steps": report.step_durations,
        "incident": incident_id,
    } | ({"launcher": report.launcher} if report.launcher else {})
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        total = sum(report.step_durations.values())
        print(f"serving restart with profile {profile}: {report.result} in {total:.1f}s")
        for line in (report.error, report.note):
            if line:
                print(f"  {line}")
        for command in (report.launcher or {}).get("commands", []):
            print(f"  launcher {command['detail']} ({command['duration_s']:.1f}s)")
    return EXIT_OK if report.result == "succeeded" else EXIT_FAILED


def _record_start(store: HistoryStore, nodes: list[str], profile: str) -> tuple[int, int]:
    """An operator's restart is an incident of its own (kind ``serving_restart``),
    so ``history``, ``show`` and the page list it with the controller's own:
    (incident id, serving restart id)."""
    incident = store.open_incident(
        OPERATOR_RESTART,
        nodes,
        evidence={"reasons": [f"serving restart with profile {profile} asked by a person (CLI)"]},
    )
    store.add_step(
        incident.id,
        StepName.SERVING_RESTART_STARTED,
        detail={"profile": profile, "reason": "asked by a person (CLI)"},
    )
    record = store.start_serving_restart(profile, incident_id=incident.id)
    return incident.id, record.id


def _record_end(
    store: HistoryStore, incident_id: int, record_id: int, report: ServingRestartReport
) -> None:
    """The restart's outcome, its incident's last steps, and the profile in force
    (which a running controller reads from here: controller/serving/serving_policy.py)."""
    store.finish_serving_restart(
        record_id, report.result, step_durations=report.step_durations, error=report.error
    )
    succeeded = report.result == "succeeded"
    if succeeded:
        store.set_setting(SETTING, report.profile, by="cli")
    detail: dict[str, Any] = {"result": report.result, "error": report.error}
    detail |= ({"note": report.note} if report.note else {}) | (
        {"launcher": report.launcher} if report.launcher else {}
    )
    try:
        store.add_step(incident_id, StepName.SERVING_RESTART_DONE, detail=detail)
        store.resolve_incident(
            incident_id, "recovered" if succeeded else "gave_up", detail={"profile": report.profile}
        )
    except InvalidRecord as exc:  # a controller that started meanwhile closed it
        print(f"spark-watchdog serving: note: incident {incident_id}: {exc}", file=sys.stderr)
