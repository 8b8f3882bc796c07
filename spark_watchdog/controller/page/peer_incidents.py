"""Every controller's incidents where controllers run on the Sparks: this one's
own and the others', asked over their page API.
docs/design.md, "One story from either node" says why and how.

Each controller keeps its own history, so the one story of the cluster is
the union of theirs. The others are asked ``GET /v1/incidents`` (a list) or
``GET /v1/incidents/{id}`` (a timeline) on each of their URLs in turn, each
within ``PEER_TIMEOUT_S``, all of them at once; what they answer is read
through :mod:`~spark_watchdog.controller.page.peer_records` (outside input:
checked field by field, bounded). One that does not answer, or answers
something else, is named with why (redacted, bounded), never fatal: the
rest of the story still shows. ``spark-watchdog history``, ``show`` and
``status`` use this, and so does the page's ``GET /v1/colocated/incidents``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from spark_watchdog.config.colocated import controller_urls
from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError, request
from spark_watchdog.controller.page import peer_records
from spark_watchdog.controller.page.peer_records import BadRecord
from spark_watchdog.history.records import Incident, IncidentTimeline
from spark_watchdog.redact import plain_error

# How long one URL of another controller may take to answer; its URLs are tried
# in turn, the controllers all at once.
PEER_TIMEOUT_S = 2.0
# The incidents one controller may list (the page API's own limit).
MAX_LISTED = 500
MAX_ERROR = 300  # characters of why a controller is not in the story

# One GET: the URL and its deadline (controller/look/http_client.py's request).
Get = Callable[[str, float], Awaitable[HttpAnswer]]


async def http_get(url: str, timeout: float) -> HttpAnswer:
    return await request(url, timeout=timeout)


@dataclass(frozen=True)
class Listed:
    """One incident of the story, and the controller whose history holds it: who acted."""

    by: str
    incident: Incident
    # The names of its evidence, for another controller's (its list has no more);
    # None for this controller's own, whose evidence is at hand.
    evidence_keys: tuple[str, ...] | None = None

    @property
    def ref(self) -> str:
        """``<node>#<id>``: an incident id is its controller's own."""
        return f"{self.by}#{self.incident.id}"

    def to_json(self) -> dict[str, Any]:
        body = self.incident.to_json()
        if self.evidence_keys is not None:
            body.pop("evidence", None)
            body["evidence_keys"] = list(self.evidence_keys)
        return {**body, "by": self.by, "ref": self.ref}


class Unanswered(Exception):
    """A controller left out of the story, and why (redacted, bounded)."""

    def __init__(self, controller: str, error: str) -> None:
        super().__init__(controller, error)
        self.controller = controller
        self.error = error

    def __str__(self) -> str:
        return f"controller {self.controller}: {self.error}"

    def to_json(self) -> dict[str, str]:
        return {"controller": self.controller, "error": self.error}


@dataclass(frozen=True)
class Gathered:
    incidents: list[Listed]
    unreachable: list[Unanswered]


def other_controllers(config: ControllerConfig, me: str) -> dict[str, tuple[str, ...]]:
    """Each other controller of ``colocated.controllers`` and the URLs it is heard on."""
    colocated = config.colocated
    if colocated is None:
        return {}
    port = config.listen.port
    return {
        p.node: controller_urls(p, config.node(p.node).agent, port)
        for p in colocated.controllers
        if p.node != me
    }


def _bare(url: str) -> str:
    """Scheme, host and port: what a message may say of a URL."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a URL that does not parse)"
    host = parts.hostname or ""
    return f"{parts.scheme}://{f'[{host}]' if ':' in host else host}{port}"


def _said(answer: HttpAnswer) -> str:
    """What a refusal's JSON says, shortened: shown as text, never as markup."""
    try:
        body = answer.json()
    except HttpError:
        return ""
    said = body.get("error") if isinstance(body, dict) else None
    return f" ({said[:160]})" if isinstance(said, str) else ""


def _short(text: str) -> str:
    text = plain_error(text)
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


async def ask(
    name: str, urls: Sequence[str], path: str, get: Get, timeout: float
) -> tuple[int, Any]:
    """(200 or 404, its JSON) from the first of ``urls`` that answers so.

    :raises Unanswered: no URL did, with what each said.
    """
    problems = []
    for url in urls:
        try:
            answer = await get(f"{url.rstrip('/')}{path}", timeout)
            if answer.status not in (200, 404):
                problems.append(f"{_bare(url)}: answered {answer.status}{_said(answer)}")
                continue
            return answer.status, answer.json()
        except HttpError as exc:
            problems.append(f"{_bare(url)}: {exc}")
    raise Unanswered(name, _short("; ".join(problems) or "no URL"))


async def _listed(
    name: str, urls: Sequence[str], query: str, limit: int, get: Get, timeout: float
) -> list[Listed] | Unanswered:
    try:
        status, body = await ask(name, urls, f"/v1/incidents?{query}", get, timeout)
        if status != 200:
            return Unanswered(name, "it has no GET /v1/incidents: an older version?")
        found = peer_records.incident_list(body, limit)
    except Unanswered as exc:
        return exc
    except BadRecord as exc:
        return Unanswered(name, _short(f"answered something else than its incidents: {exc}"))
    return [Listed(name, incident, keys) for incident, keys in found]


def newest_first(incidents: Sequence[Listed], limit: int) -> list[Listed]:
    """The story in one list: newest detection first (an unknown time last), at most ``limit``."""

    def age(listed: Listed) -> tuple[bool, float, str, int]:
        at = listed.incident.detected_at
        known = isinstance(at, (int, float)) and math.isfinite(at)
        return (not known, -at if known else 0.0, listed.by, -listed.incident.id)

    return sorted(incidents, key=age)[:limit]


async def gather(
    config: ControllerConfig,
    me: str,
    filters: Mapping[str, str | int],
    *,
    get: Get = http_get,
    timeout: float = PEER_TIMEOUT_S,
) -> Gathered:
    """Every other controller's incidents that match ``filters`` (the page API's
    query: node, kind, status, limit), and the controllers that did not answer."""
    limit = min(int(filters.get("limit", MAX_LISTED)), MAX_LISTED)
    query = urlencode({**filters, "limit": limit})
    peers = other_controllers(config, me)
    answers = await asyncio.gather(
        *(_listed(name, urls, query, limit, get, timeout) for name, urls in peers.items())
    )
    incidents: list[Listed] = []
    unreachable: list[Unanswered] = []
    for answer in answers:
        if isinstance(answer, Unanswered):
            unreachable.append(answer)
        else:
            incidents.extend(answer)
    return Gathered(incidents, unreachable)


async def timeline_of(
    config: ControllerConfig,
    me: str,
    node: str,
    incident_id: int,
    *,
    get: Get = http_get,
    timeout: float = PEER_TIMEOUT_S,
) -> IncidentTimeline | None:
    """Incident ``incident_id`` of the controller on ``node`` (None: it has none).

    :raises KeyError: no other controller runs on ``node``.
    :raises Unanswered: it did not answer, or answered something else.
    """
    urls = other_controllers(config, me)[node]
    status, body = await ask(node, urls, f"/v1/incidents/{incident_id}", get, timeout)
    if status == 404:
        return None
    try:
        return peer_records.timeline(body, incident_id)
    except BadRecord as exc:
        raise Unanswered(node, _short(f"answered something else than a timeline: {exc}")) from None
