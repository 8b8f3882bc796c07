"""``history``, ``show`` and ``status`` where controllers run on the Sparks: one
story from either node (docs/design.md, "One story from either node").

Each controller keeps its own history, so besides this Spark's the commands
ask every other controller's page API (``GET /v1/incidents``,
``/v1/incidents/{id}``) through
:mod:`~spark_watchdog.controller.page.peer_incidents`, merge what they answer
newest first and name who acted: the node whose controller holds the
incident. Incident ids are each controller's own, so an incident reads
``<node>#<id>``. A controller that does not answer is named on stderr (and
under ``unreachable`` in ``--json``); it never fails the command. What the
others answer is outside input: checked and bounded as it is read, escaped
as it is printed.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from spark_watchdog.cli import say
from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.page import peer_incidents, peer_records
from spark_watchdog.controller.page.peer_incidents import Gathered, Listed, Unanswered
from spark_watchdog.history.records import Incident, IncidentTimeline
from spark_watchdog.terminal import escape

_REF = re.compile(r"(?P<node>[A-Za-z0-9][A-Za-z0-9._-]{0,62})#(?P<id>[0-9]{1,19})")
HEADER = ("ID", "BY", "DETECTED (UTC)", "KIND", "NODES", "STATUS", "DETECT", "RECOVER")


def parse_ref(text: str) -> tuple[str, int] | None:
    """``spark-2#7`` as (node, id); None when ``text`` is not of that form."""
    match = _REF.fullmatch(text)
    if match is None:
        return None
    return match.group("node"), int(match.group("id"))


def warn(unreachable: Iterable[Unanswered]) -> None:
    """One line on stderr for each controller left out of the story."""
    for missing in unreachable:
        say.error(f"warning: {missing}; its incidents are not shown")


def story(
    config: ControllerConfig,
    me: str,
    own: Iterable[Incident],
    filters: Mapping[str, str | int],
    since: float | None,
) -> Gathered:
    """This controller's incidents (``own``) and every other's that match
    ``filters`` and are newer than ``since``, newest first, at most ``limit``."""
    limit = int(filters.get("limit", peer_incidents.MAX_LISTED))
    others = asyncio.run(peer_incidents.gather(config, me, filters))
    listed = [Listed(me, i) for i in own]
    for item in others.incidents:
        at = item.incident.detected_at
        if since is None or (math.isfinite(at) and at >= since):
            listed.append(item)
    return Gathered(peer_incidents.newest_first(listed, limit), others.unreachable)


def print_history(
    gathered: Gathered, as_json: bool, cells: Callable[[Incident], tuple[str, ...]]
) -> None:
    """The story as ``history`` prints it; ``cells``: one incident's cells of the
    table as ``history`` writes them for one controller (all but its ID)."""
    warn(gathered.unreachable)
    if as_json:
        body = {
            "incidents": [i.to_json() for i in gathered.incidents],
            "unreachable": [u.to_json() for u in gathered.unreachable],
        }
        print(json.dumps(body, indent=2))
        return
    if not gathered.incidents:
        print("no incidents")
        return
    table: list[tuple[str, ...]] = [HEADER]
    table += [(item.ref, item.by, *cells(item.incident)) for item in gathered.incidents]
    widths = [max(len(escape(r[i])) for r in table) for i in range(len(HEADER))]
    for row in table:
        line = "  ".join(escape(c).ljust(w) for c, w in zip(row, widths, strict=True))
        print(line.rstrip())


def other_timeline(
    config: ControllerConfig, me: str, node: str, incident_id: int
) -> IncidentTimeline | None:
    """Incident ``incident_id`` of the controller on ``node``: its timeline, or None.

    :raises Unanswered: it did not answer, or answered something else.
    """
    return asyncio.run(peer_incidents.timeline_of(config, me, node, incident_id))


def open_story(
    config: ControllerConfig,
    me: str,
    status: dict[str, Any],
    own: list[Incident] | None,
    url: str | None,
) -> None:
    """``status`` gains every controller's open incidents with who acted, and the
    controllers that did not answer. This controller's are ``own`` (read from
    the history), else asked of the controller at ``url`` that gave the status."""

    async def both() -> tuple[list[Listed], Gathered]:
        filters: dict[str, str | int] = {"status": "open", "limit": peer_incidents.MAX_LISTED}
        others = peer_incidents.gather(config, me, filters)
        if own is not None or url is None:
            return [Listed(me, i) for i in own or []], await others
        here, gathered = await asyncio.gather(_from_here(me, url), others)
        if isinstance(here, Unanswered):
            return [], Gathered(gathered.incidents, [here, *gathered.unreachable])
        return here, gathered

    mine, others = asyncio.run(both())
    merged = peer_incidents.newest_first([*mine, *others.incidents], peer_incidents.MAX_LISTED)
    status["open_incidents"] = [i.to_json() for i in merged]
    status["unreachable"] = [u.to_json() for u in others.unreachable]
    warn(others.unreachable)


async def _from_here(me: str, url: str) -> list[Listed] | Unanswered:
    """This controller's open incidents, from the controller that answered the status."""
    path = f"/v1/incidents?status=open&limit={peer_incidents.MAX_LISTED}"
    try:
        _, body = await peer_incidents.ask(
            me, [url], path, peer_incidents.http_get, peer_incidents.PEER_TIMEOUT_S
        )
        found = peer_records.incident_list(body, peer_incidents.MAX_LISTED)
    except Unanswered as exc:
        return exc
    except peer_records.BadRecord as exc:
        return Unanswered(me, f"answered something else than its incidents: {exc}")
    return [Listed(me, incident, keys) for incident, keys in found]
