"""Operator commands over the freeze history: status, history, show, boots, hold, release.

They read the history database directly (``--db PATH``, or the ``history``
path of ``--config FILE``), so they work with or without a running
controller; ``status`` asks the running controller first. Every command
takes ``--json``.

A ``--db`` that does not exist is refused (exit 2): only the controller, or a
command given the ``history`` path of a config, creates a history, so a typo
never gets a database of its own. Reads open the file read-only, and still
work for a user who may read the file but not write its directory (see
:class:`HistoryStore`). ``hold`` and ``release`` take only nodes the
controller knows: those of ``--config``, else those the history has recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import socket
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

from spark_watchdog.cli import history_everywhere, say
from spark_watchdog.cli.incident_view import print_timeline, seconds, short_time, table
from spark_watchdog.config.controller import ControllerConfig, load_controller_config
from spark_watchdog.controller.page.peer_incidents import Unanswered
from spark_watchdog.errors import ConfigError, WatchdogError
from spark_watchdog.history.checks import SQLITE_MAX_INT
from spark_watchdog.history.locate import configured_history
from spark_watchdog.history.records import (
    CLUSTER,
    Incident,
    IncidentTimeline,
)
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.terminal import escape
from spark_watchdog.verdicts import FINE

DEFAULT_CONFIG = "/etc/spark-watchdog/controller.yaml"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_SINCE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class CliUsage(ConfigError):
    """A bad command line: printed as one line, exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__("command line", [message])
        self.message = message

    def __str__(self) -> str:
        return self.message


def whole_number(minimum: int = 1, maximum: int = SQLITE_MAX_INT) -> Any:
    """An argparse ``type=``: an integer from ``minimum`` to ``maximum`` (SQLite's
    largest by default: an id or limit beyond it cannot even be looked up)."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            value = None
        if value is None or not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number from {minimum} to {maximum}, got {text!r}"
            )
        return value

    parse.__name__ = "whole number"  # argparse names the type in some messages
    return parse


def seconds_at_least(minimum: float = 0.0) -> Any:
    """An argparse ``type=``: a finite number of seconds ≥ ``minimum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds ≥ {minimum:g}, got {text!r}"
            )
        return value

    parse.__name__ = "seconds"
    return parse


def incident_ref(text: str) -> tuple[str | None, int]:
    """An argparse ``type=``: ``ID`` (this controller's) or ``NODE#ID`` (the
    controller on NODE's, where controllers run on the Sparks)."""
    ref = history_everywhere.parse_ref(text)
    if ref is not None:
        return ref
    return None, whole_number()(text)


incident_ref.__name__ = "incident"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH", help="history database (default: from --config)")
    parser.add_argument(
        "--config", metavar="FILE", help=f"controller config (default {DEFAULT_CONFIG})"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")


def _here(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--here",
        metavar="NODE",
        help="where controllers run on the Sparks (colocated:): the node whose controller "
        "keeps this history (default: this host's short name, as controller --node)",
    )


def add_parsers(commands: Any) -> None:
    _add_reads(commands)
    _add_holds(commands)


def _add_reads(commands: Any) -> None:
    status = commands.add_parser(
        "status",
        help="nodes, verdicts, holds and the serving profile",
        description="Ask the running controller (GET /v1/status); without one, read the history.",
    )
    _common(status)
    _here(status)
    status.add_argument("--url", metavar="URL", help="controller URL (default: from --config)")
    status.set_defaults(func=run_status)

    history = commands.add_parser(
        "history",
        help="incidents, newest first",
        epilog="example: spark-watchdog history --node spark-3 --since 7d",
    )
    _common(history)
    _here(history)
    history.add_argument("--node", metavar="N", help="only incidents of this node")
    history.add_argument("--since", metavar="AGE", help="only newer than AGE: 30m, 12h, 7d, 2w")
    history.add_argument("--kind", metavar="K", help="host_frozen, serving_stalled, ...")
    history.add_argument(
        "--limit", type=whole_number(), default=100, metavar="N", help="at most N (default 100)"
    )
    history.set_defaults(func=run_history)

    show = commands.add_parser("show", help="one incident's timeline, evidence and actions")
    _common(show)
    _here(show)
    show.add_argument(
        "incident",
        type=incident_ref,
        metavar="INCIDENT",
        help="incident number; NODE#NUMBER for the controller on NODE's (colocated:)",
    )
    show.set_defaults(func=run_show)


def _add_holds(commands: Any) -> None:
    boots = commands.add_parser("boots", help="a node's boots: clean or unclean, and evidence")
    _common(boots)
    boots.add_argument("node", metavar="NODE")
    boots.set_defaults(func=run_boots)

    hold = commands.add_parser("hold", help="stop automatic actions on a node or the cluster")
    _common(hold)
    hold.add_argument("node", nargs="?", metavar="NODE")
    hold.add_argument("--all", action="store_true", help="hold the whole cluster")
    hold.add_argument("--reason", required=True, metavar="TEXT")
    hold.set_defaults(func=run_hold)

    release = commands.add_parser(
        "release", help="allow automatic actions again (also clears the circuit breaker)"
    )
    _common(release)
    release.add_argument("node", nargs="?", metavar="NODE")
    release.add_argument("--all", action="store_true", help="release every hold")
    release.set_defaults(func=run_release)


def _usage(message: str) -> int:
    say.error(message)
    return EXIT_USAGE


def _db_path(args: argparse.Namespace) -> str:
    if args.db:
        path = str(args.db)
        if not os.path.exists(path):
            raise CliUsage(
                f"--db {path}: no such file; give the history database the controller "
                f"writes (the history: path of its config, default "
                f"/var/lib/spark-watchdog/history.db), or --config FILE instead of --db"
            )
        if os.path.isdir(path):
            raise CliUsage(f"--db {path}: a directory; give the history database file in it")
        return path
    if not args.config and not Path(DEFAULT_CONFIG).exists():
        raise CliUsage(f"give --db PATH or --config FILE (there is no {DEFAULT_CONFIG})")
    return _config(args).history


def _config(args: argparse.Namespace) -> ControllerConfig:
    config: ControllerConfig = load_controller_config(args.config or DEFAULT_CONFIG)
    return config


def _open(args: argparse.Namespace, *, write: bool = False) -> HistoryStore:
    location = _db_path(args)
    if args.db:
        store = HistoryStore(location, read_only=not write)
    else:
        store = configured_history(_config(args), read_only=not write)
    if store.read_note:
        print(f"spark-watchdog: note: {store.read_note}", file=sys.stderr)
    return store


def _since(text: str | None) -> float | None:
    if text is None:
        return None
    match = _SINCE.match(text)
    seconds = float(match.group(1)) * _UNIT[match.group(2)] if match else math.nan
    if not math.isfinite(seconds):
        raise CliUsage(f'--since: expected an age like 30m, 12h, 7d or 2w, got "{text}"')
    return time.time() - seconds


def _nodes_config(args: argparse.Namespace) -> ControllerConfig | None:
    """The config that says which nodes there are: --config, the default one when
    the history comes from it, or the default one whose history is --db."""
    if args.config or not args.db:
        return _config(args)
    if not Path(DEFAULT_CONFIG).exists():
        return None
    try:
        config = load_controller_config(DEFAULT_CONFIG)
    except ConfigError:
        return None  # not what --db is about; the history's nodes will do
    try:
        same = os.path.samefile(config.history, args.db)
    except OSError:
        same = False
    return config if same else None


def _placed(args: argparse.Namespace) -> tuple[ControllerConfig, str] | None:
    """Where controllers run on the Sparks: the config and the node whose controller
    keeps this history (``--here``, else the host's short name). None otherwise."""
    known = args.config or args.db or Path(DEFAULT_CONFIG).exists()
    config = _nodes_config(args) if known else None
    colocated = None if config is None else config.colocated
    if config is None or colocated is None:
        if args.here:
            raise CliUsage(
                f"--here {args.here}: only where controllers run on the Sparks "
                "(colocated: in the controller config); this config has none"
            )
        return None
    here = args.here or socket.gethostname().split(".", 1)[0]
    if here not in colocated.order:
        raise CliUsage(
            f"this history's controller runs on {here}, which has no place in "
            f"colocated.controllers ({', '.join(colocated.order)}): pass --here with one of them"
        )
    return config, here


def _check_node(args: argparse.Namespace, store: HistoryStore, node: str, verb: str) -> None:
    """Refuse a node the controller does not know (a typo would be held forever)."""
    if node == CLUSTER:
        return
    config = _nodes_config(args)
    if config is not None:
        known = [n.name for n in config.nodes]
        where, hint = f"the config {args.config or DEFAULT_CONFIG}", ""
    else:
        known = sorted({n.name for n in store.nodes()})
        where = f"history {store.path} (nodes it has recorded)"
        hint = "; to check the name against the controller's nodes, add --config FILE"
    if node in known:
        return
    if verb == "release" and any(h.node == node for h in store.active_holds()):
        return  # a hold left on a node since removed from the config
    raise CliUsage(
        f'{verb}: no node "{node}" in {where}; known: {", ".join(known) or "none"}{hint}'
    )


def _guarded(fn: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except ConfigError as exc:
            return _usage(str(exc))
        except WatchdogError as exc:
            say.error(exc)
            return EXIT_FAILED

    return wrapper


@_guarded
def run_history(args: argparse.Namespace) -> int:
    since = _since(args.since)
    with _open(args) as store:
        incidents = store.list_incidents(
            node=args.node, since=since, kind=args.kind, limit=args.limit
        )
    placed = _placed(args)
    if placed is not None:
        filters = {k: v for k, v in (("node", args.node), ("kind", args.kind)) if v is not None}
        story = history_everywhere.story(
            *placed, incidents, {**filters, "limit": args.limit}, since
        )
        history_everywhere.print_history(story, args.json, _cells)
        return EXIT_OK
    if args.json:
        print(json.dumps({"incidents": [i.to_json() for i in incidents]}, indent=2))
        return EXIT_OK
    if not incidents:
        print("no incidents")
        return EXIT_OK
    rows: list[tuple[str, ...]] = [
        ("ID", "DETECTED (UTC)", "KIND", "NODES", "STATUS", "DETECT", "RECOVER")
    ]
    rows += [(str(i.id), *_cells(i)) for i in incidents]
    print(table(rows))
    return EXIT_OK


def _cells(i: Incident) -> tuple[str, ...]:
    """One incident's row of ``history``'s table, but its ID."""
    status = i.resolution or i.status
    if i.dry_run:
        status += " (dry run)"
    return (
        short_time(i.detected_at),
        i.kind,
        ",".join(i.nodes),
        status,
        seconds(i.time_to_detect_s),
        seconds(i.time_to_recover_s),
    )


@_guarded
def run_show(args: argparse.Namespace) -> int:
    node, number = args.incident
    placed = _placed(args)
    by = None if placed is None else placed[1]
    if node is not None and node != by:
        timeline = _other_incident(placed, node, number)
        by = node
    else:
        with _open(args) as store:
            timeline = store.incident(number)
    if timeline is None:
        where = "" if by is None else f" in the history of {by}'s controller"
        print(f"spark-watchdog: no incident {number}{escape(where)}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        body = timeline.to_json()
        body = body if by is None else {**body, "by": by, "ref": f"{by}#{number}"}
        print(json.dumps(body, indent=2))
        return EXIT_OK
    print_timeline(timeline, f"#{number}" if by is None else f"{by}#{number} (by {by})")
    return EXIT_OK


def _other_incident(
    placed: tuple[ControllerConfig, str] | None, node: str, number: int
) -> IncidentTimeline | None:
    """Incident ``number`` of the controller on ``node``, asked over its page API."""
    if placed is None:
        raise CliUsage(
            f"{node}#{number}: NODE#NUMBER names another controller's incident, where "
            "controllers run on the Sparks (colocated:); give the number alone"
        )
    config, here = placed
    assert config.colocated is not None
    if node not in config.colocated.order:
        raise CliUsage(
            f"{node}#{number}: no controller runs on {node}; "
            f"colocated.controllers: {', '.join(config.colocated.order)}"
        )
    try:
        return history_everywhere.other_timeline(config, here, node, number)
    except Unanswered as exc:
        raise WatchdogError(f"{exc}; its incident {number} is not shown") from None


@_guarded
def run_boots(args: argparse.Namespace) -> int:
    with _open(args) as store:
        boots = store.boots(args.node)
    if args.json:
        print(json.dumps({"node": args.node, "boots": [b.to_json() for b in boots]}, indent=2))
        return EXIT_OK
    if not boots:
        print(f"no boots recorded for {escape(args.node)}")
        return EXIT_OK
    rows = [("BOOT", "FIRST ENTRY", "LAST ENTRY", "END", "INCIDENT")]
    for b in boots:
        end = {True: "clean", False: "UNCLEAN", None: "-"}[b.clean_shutdown]
        rows.append(
            (
                str(b.boot_id)[:12],
                short_time(b.first_entry),
                short_time(b.last_entry),
                end,
                str(b.incident_id or "-"),
            )
        )
    print(table(rows))
    return EXIT_OK


def _target(args: argparse.Namespace) -> str | None:
    if args.all == bool(args.node):
        return None
    return CLUSTER if args.all else str(args.node)


@_guarded
def run_hold(args: argparse.Namespace) -> int:
    target = _target(args)
    if target is None:
        return _usage("hold: give a NODE or --all (not both)")
    if not args.reason.strip():
        return _usage("hold: --reason must say why (it is shown with the hold)")
    with _open(args, write=True) as store:
        _check_node(args, store, target, "hold")
        hold = store.hold(target, args.reason, by="cli")
    if args.json:
        print(json.dumps(hold.to_json(), indent=2))
    else:
        what = "the cluster" if target == CLUSTER else target
        print(f"held {escape(what)}: {escape(hold.reason)}")
    return EXIT_OK


@_guarded
def run_release(args: argparse.Namespace) -> int:
    target = _target(args)
    if target is None:
        return _usage("release: give a NODE or --all (not both)")
    with _open(args, write=True) as store:
        _check_node(args, store, target, "release")
        released = (
            store.release_all(by="cli")
            if target == CLUSTER
            else ([h] if (h := store.release(target, by="cli")) is not None else [])
        )
    if args.json:
        print(json.dumps({"released": [h.to_json() for h in released]}, indent=2))
    else:
        print(
            "released "
            + (", ".join(escape(h.node) for h in released) if released else "nothing (no hold)")
        )
    return EXIT_OK


def _is_http_url(text: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _status_url(args: argparse.Namespace) -> str | None:
    url = args.url
    if url is not None and not _is_http_url(url):
        raise CliUsage(f"--url {url}: expected the controller's URL, http://HOST:PORT")
    if url is None and (args.config or Path(DEFAULT_CONFIG).exists()):
        listen = load_controller_config(args.config or DEFAULT_CONFIG).listen
        url = f"http://{listen.address}:{listen.port}"
    return str(url) if url else None


def _controller_status(url: str | None) -> dict[str, Any] | None:
    """What the running controller at ``url`` says of itself; None: no answer."""
    if not url:
        return None
    import requests

    try:
        answer = requests.get(f"{url.rstrip('/')}/v1/status", timeout=3)
        if answer.ok:
            status: dict[str, Any] = answer.json()
            status["source"] = "controller"
            return status
    except (requests.RequestException, ValueError):
        pass
    return None


@_guarded
def run_status(args: argparse.Namespace) -> int:
    url = _status_url(args)
    status = _controller_status(url)
    own: list[Incident] | None = None
    if status is None:
        with _open(args) as store:
            own = store.open_incidents()
            status = {
                "source": "history (no running controller answered)",
                "open_incidents": [i.to_json() for i in own],
                "holds": [h.to_json() for h in store.active_holds()],
                "serving_profile": (s.value if (s := store.setting("serving_profile")) else None),
            }
    placed = _placed(args)
    if placed is not None:
        history_everywhere.open_story(*placed, status, own, url)
    if args.json:
        print(json.dumps(status, indent=2))
        return EXIT_OK
    _print_status(status)
    unhealthy = [n for n in status.get("nodes", []) if n.get("verdict") not in FINE]
    return EXIT_FAILED if unhealthy else EXIT_OK


def _print_status(status: dict[str, Any]) -> None:
    print(f"source: {escape(status['source'])}")
    for node in status.get("nodes", []):
        reasons = "; ".join(map(str, node.get("reasons") or []))
        if node.get("hardware_suspect"):
            reasons += f" [hardware suspect: {node.get('freezes_in_window')} freezes]"
        if node.get("gpu_clock_latched"):
            reasons += " [GPU clock latched on this boot]"
        if node.get("held_reason"):
            reasons += f" [held: {node['held_reason']}]"
        print(f"  {escape(node['name']):<12} {escape(node['verdict']):<16} {escape(reasons)}")
    for hold in status.get("holds", []):
        print(f"  hold {escape(hold['node'])}: {escape(hold['reason'])}")
    for incident in status.get("open_incidents", []):
        nodes = ",".join(map(str, incident["nodes"]))
        ref = incident.get("ref") or f"#{incident['id']}"
        by = f" (by {incident['by']})" if "by" in incident else ""
        print(f"  open incident {escape(ref)}: {escape(incident['kind'])} {escape(nodes)}{by}")
    print(f"serving profile: {escape(status.get('serving_profile') or 'as configured')}")
