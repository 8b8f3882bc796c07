"""The operator's page, served by the controller (docs/page.md).

``/`` and ``/static/...``: the page's own files (HTML, CSS, JavaScript),
shipped in the package, read once at start, answered from memory under a
strict Content-Security-Policy: the page loads nothing and sends nothing to
any other host. The page polls ``/v1/status`` and reads what else it shows
from the routes here (docs/api/controller.openapi.yaml):

- ``GET /v1/nodes``: each node's signal ages, power path and serving profile
  (:mod:`~spark_watchdog.controller.page.page_view`), built on the controller's loop;
- ``GET /v1/incidents`` and ``/v1/incidents/{id}``: the history's incidents
  and one incident's timeline, read from the store on a thread of the server;
- ``GET /v1/colocated/incidents`` and ``/v1/colocated/incidents/{node}/{id}``:
  where controllers run on the Sparks, every controller's incidents with who
  acted, the others' asked by this controller over their own
  ``/v1/incidents`` (:mod:`~spark_watchdog.controller.page.peer_incidents`), so
  the page still talks to its own controller alone
  (docs/design.md, "One story from either node");
- ``POST /v1/actions/hold``, ``/release``, ``/step-down``: behind the
  controller's token (:mod:`~spark_watchdog.controller.page.page_actions`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.controller.page.page_actions import (
    ACTIONS,
    LoopGetter,
    PageSource,
    StepDown,
    Unavailable,
    run_action,
    run_on_loop,
)
from spark_watchdog.controller.page.page_auth import PageAuth
from spark_watchdog.controller.page.page_view import nodes_view
from spark_watchdog.controller.page.peer_incidents import (
    Listed,
    Unanswered,
    gather,
    newest_first,
    timeline_of,
)
from spark_watchdog.controller.page.peer_records import NODE_NAME
from spark_watchdog.controller.page.status_api import StandbyEndpoint, StatusEndpoint, StatusSource
from spark_watchdog.errors import StoreError
from spark_watchdog.http.server import Reply, Request, json_response

# What the browser may do with the page: its own files and API, nothing else.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}
STATIC_PREFIX = "/static/"
PAGE_FILE = "index.html"  # served at / only, as the schema says of /static/{name}
INCIDENT_PREFIX = "/v1/incidents/"
# Every controller's incidents, where controllers run on the Sparks.
COLOCATED = "/v1/colocated/incidents"
COLOCATED_PREFIX = COLOCATED + "/"
# How long GET /v1/nodes waits for the controller's loop: the page asks again in a second.
NODES_TIMEOUT_S = 2.0
# Incidents per list: the page shows the newest; ``limit`` asks for fewer or more.
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
_INCIDENT_ID = re.compile(r"[1-9][0-9]{0,17}")
_KIND = re.compile(r"[a-z][a-z0-9_]{0,39}")
_QUERY_KEYS = {"node", "kind", "status", "limit"}
_STATUSES = ("open", "resolved")

Handler = Callable[[Request], Reply]


def load_files() -> dict[str, tuple[str, bytes]]:
    """The page's files by name: (content type, bytes)."""
    folder = resources.files("spark_watchdog.controller.page").joinpath("web")
    files = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (_TYPES[suffix], entry.read_bytes())
    return files


def load_auth(config: ControllerConfig) -> PageAuth:
    """The page's token from ``listen.token_file``; ConfigError when unreadable."""
    reference = config.listen.token_file
    return PageAuth(None if reference is None else read_secret("listen.token_file", reference))


def _error(status: int, message: str, **headers: str) -> Reply:
    code, content_type, body = json_response({"error": message}, status)
    return code, content_type, body, {**SECURITY_HEADERS, **headers}


def _json(payload: Any) -> Reply:
    code, content_type, body = json_response(payload)
    return code, content_type, body, dict(SECURITY_HEADERS)


class PageRoutes:
    """The page's routes (``http.server.PathRoutes``). ``source`` None: a
    standby of a pair, which serves the page but not its data or actions."""

    def __init__(
        self,
        source: PageSource | None,
        auth: PageAuth,
        loop: LoopGetter,
        *,
        step_down: StepDown | None = None,
        files: dict[str, tuple[str, bytes]] | None = None,
    ) -> None:
        self._source = source
        self._auth = auth
        self._loop = loop
        self._step_down = step_down
        self._files = load_files() if files is None else files
        self._gets: dict[str, Handler] = {
            "/": self._index,
            "/v1/nodes": self._nodes,
            "/v1/incidents": self._incidents,
            COLOCATED: self._story,
        }

    # -- PathRoutes ------------------------------------------------------------

    def methods(self, path: str) -> tuple[str, ...]:
        if path in self._gets or path.startswith(
            (STATIC_PREFIX, INCIDENT_PREFIX, COLOCATED_PREFIX)
        ):
            return ("GET", "HEAD")
        if path in ACTIONS:
            return ("POST",)
        return ()

    def operations(self) -> dict[str, tuple[str, ...]]:
        served: dict[str, tuple[str, ...]] = {path: ("GET", "HEAD") for path in self._gets}
        served[STATIC_PREFIX + "{name}"] = ("GET", "HEAD")
        served[INCIDENT_PREFIX + "{id}"] = ("GET", "HEAD")
        served[COLOCATED_PREFIX + "{node}/{id}"] = ("GET", "HEAD")
        served.update({path: ("POST",) for path in ACTIONS})
        return served

    def on_thread(self, path: str) -> bool:
        return path.startswith("/v1/")

    def screen(self, request: Request) -> Reply | None:
        if self._auth.token_in_query(request.query):
            return _error(
                400,
                "a token never goes in a URL (browser history, proxy logs and Referer keep "
                "URLs); send it in an Authorization: Bearer header",
            )
        return None

    def answer(self, request: Request) -> Reply:
        if request.method == "POST":
            return self._act(request)
        handler = self._gets.get(request.path)
        if handler is not None:
            return handler(request)
        if request.path.startswith(STATIC_PREFIX):
            return self._static(request.path[len(STATIC_PREFIX) :])
        if request.path.startswith(COLOCATED_PREFIX):
            return self._story_incident(request.path[len(COLOCATED_PREFIX) :])
        return self._incident(request.path[len(INCIDENT_PREFIX) :])

    # -- the page's files ---------------------------------------------------------

    def _index(self, request: Request) -> Reply:
        content_type, body = self._files[PAGE_FILE]
        return 200, content_type, body, dict(SECURITY_HEADERS)

    def _static(self, name: str) -> Reply:
        """The page's CSS and JavaScript; the page itself is ``/`` alone."""
        found = self._files.get(name) if name != PAGE_FILE else None
        if found is None:
            known = ", ".join(sorted(n for n in self._files if n != PAGE_FILE))
            return _error(404, f"no such file {STATIC_PREFIX}{name}; files: {known}")
        content_type, body = found
        return 200, content_type, body, dict(SECURITY_HEADERS)

    # -- reads --------------------------------------------------------------------

    def _standby(self) -> Reply:
        return _error(
            503,
            "this controller of a pair stands by: the leader's page has the nodes, the "
            "incidents and the actions (GET /v1/status names the leader)",
            **{"Retry-After": "5"},
        )

    def _nodes(self, request: Request) -> Reply:
        source = self._source
        if source is None:
            return self._standby()
        if request.query:
            return _error(400, "GET /v1/nodes takes no query parameters")

        async def view() -> dict[str, Any]:
            now = source.clock.monotonic()
            return nodes_view(
                source.config,
                source.watches.values(),
                now,
                source.serving.profile,
                source.holds.breaker_open(),
            )

        try:
            return _json(run_on_loop(self._loop, view, NODES_TIMEOUT_S))
        except Unavailable as exc:
            return _error(503, str(exc), **{"Retry-After": "2"})

    def _incidents(self, request: Request) -> Reply:
        source = self._source
        if source is None:
            return self._standby()
        try:
            filters = _incident_filters(request.query, [n.name for n in source.config.nodes])
        except ValueError as exc:
            return _error(400, str(exc))
        try:
            found = source.ledger.store.list_incidents(**filters)
        except StoreError as exc:
            return _error(503, f"the history cannot be read: {exc}", **{"Retry-After": "5"})
        return _json({"incidents": [_summary(i.to_json()) for i in found]})

    def _incident(self, raw_id: str) -> Reply:
        source = self._source
        if source is None:
            return self._standby()
        if not _INCIDENT_ID.fullmatch(raw_id):
            shown = raw_id if len(raw_id) <= 40 else raw_id[:40] + "..."
            return _error(400, f"incident id: expected a positive integer, got {shown!r}")
        try:
            timeline = source.ledger.store.incident(int(raw_id))
        except StoreError as exc:
            return _error(503, f"the history cannot be read: {exc}", **{"Retry-After": "5"})
        if timeline is None:
            return _error(404, f"no incident {raw_id} in the history")
        return _json(timeline.to_json())

    # -- every controller's, where controllers run on the Sparks ---------------

    def _placed(self) -> tuple[PageSource, str] | None:
        """The controller and the node it runs on, where controllers run on the Sparks."""
        source = self._source
        placement = None if source is None else source.peers.placement
        return None if source is None or placement is None else (source, placement.me)

    def _not_placed(self) -> Reply:
        if self._source is None:
            return self._standby()
        return _error(
            404,
            "this controller does not run on a Spark beside others (no colocated: in "
            "its config): GET /v1/incidents has every incident it handled",
        )

    def _story(self, request: Request) -> Reply:
        """This controller's incidents and every other's, newest first, with who acted."""
        placed = self._placed()
        if placed is None:
            return self._not_placed()
        source, here = placed
        try:
            filters = _incident_filters(request.query, [n.name for n in source.config.nodes])
            own = source.ledger.store.list_incidents(**filters)
        except ValueError as exc:
            return _error(400, str(exc))
        except StoreError as exc:
            return _error(503, f"the history cannot be read: {exc}", **{"Retry-After": "5"})
        others = asyncio.run(gather(source.config, here, filters))
        mine = [Listed(here, i, tuple(sorted(i.evidence))) for i in own]
        story = newest_first([*mine, *others.incidents], filters["limit"])
        return _json(
            {
                "here": here,
                "incidents": [i.to_json() for i in story],
                "unreachable": [u.to_json() for u in others.unreachable],
            }
        )

    def _story_incident(self, rest: str) -> Reply:
        """One incident of any controller: this one's from its history, another's
        asked of it. ``rest``: ``{node}/{id}``."""
        placed = self._placed()
        if placed is None:
            return self._not_placed()
        source, here = placed
        node, _, raw_id = rest.partition("/")
        if not NODE_NAME.fullmatch(node) or not _INCIDENT_ID.fullmatch(raw_id):
            shown = rest if len(rest) <= 60 else rest[:60] + "..."
            return _error(400, f"expected {COLOCATED_PREFIX}NODE/ID, got {shown!r}")
        colocated = source.config.colocated
        order = () if colocated is None else colocated.order
        if node not in order:
            return _error(404, f"no controller runs on {node}; the controllers: {', '.join(order)}")
        try:
            if node == here:
                timeline = source.ledger.store.incident(int(raw_id))
            else:
                timeline = asyncio.run(timeline_of(source.config, here, node, int(raw_id)))
        except StoreError as exc:
            return _error(503, f"the history cannot be read: {exc}", **{"Retry-After": "5"})
        except Unanswered as exc:
            return _error(502, str(exc))
        if timeline is None:
            return _error(404, f"no incident {raw_id} in the history of {node}'s controller")
        return _json({"by": node, "timeline": timeline.to_json()})

    # -- actions ------------------------------------------------------------------

    def _act(self, request: Request) -> Reply:
        if self._source is None:
            return self._standby()
        if request.query:
            return _error(400, f"POST {request.path} takes no query parameters")
        if not self._auth.enabled:
            return _error(
                403,
                "actions are off: this controller has no listen.token_file, so its page "
                "is read-only (docs/page.md)",
            )
        foreign = self._auth.foreign_origin(request.headers)
        if foreign is not None:
            return _error(403, f"refused: {foreign}; actions come from the controller's own page")
        problem = self._auth.check(request.headers.get("Authorization"))
        if problem is not None:
            # RFC 6750 §3: a 401 names the scheme it wants.
            return _error(401, problem, **{"WWW-Authenticate": 'Bearer realm="spark-watchdog"'})
        status, payload = run_action(
            self._source, self._loop, self._step_down, request.path, request.body
        )
        if status >= 400:
            return _error(status, str(payload["error"]))
        return _json(payload)


def _summary(incident: dict[str, Any]) -> dict[str, Any]:
    """An incident for the list: its evidence only by name (a timeline has it all)."""
    evidence = incident.pop("evidence", None)
    incident["evidence_keys"] = sorted(evidence) if isinstance(evidence, dict) else []
    return incident


def _incident_filters(query: str, known: list[str]) -> dict[str, Any]:
    """``GET /v1/incidents``'s query as ``list_incidents`` arguments; ValueError: why not."""
    try:
        fields = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        # Not echoed: whatever it holds stays out of the answer.
        raise ValueError("query string: expected name=value pairs separated by &") from None
    unknown = sorted(set(fields) - _QUERY_KEYS)
    if unknown:
        raise ValueError(
            f"unknown query parameter {unknown[0]!r}; known: {', '.join(sorted(_QUERY_KEYS))}"
        )
    repeated = sorted(k for k, v in fields.items() if len(v) > 1)
    if repeated:
        raise ValueError(f"query parameter {repeated[0]!r} given more than once")
    one = {k: v[0] for k, v in fields.items()}
    filters: dict[str, Any] = {"limit": DEFAULT_LIMIT}
    if "node" in one:
        if one["node"] not in known:
            raise ValueError(f"node: no node {one['node']!r}; known: {', '.join(known)}")
        filters["node"] = one["node"]
    if "kind" in one:
        if not _KIND.fullmatch(one["kind"]):
            raise ValueError(
                f"kind: expected an incident kind such as host_frozen, got {one['kind'][:40]!r}"
            )
        filters["kind"] = one["kind"]
    if "status" in one:
        if one["status"] not in _STATUSES:
            raise ValueError(f"status: expected open or resolved, got {one['status'][:40]!r}")
        filters["status"] = one["status"]
    if "limit" in one:
        raw = one["limit"]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
            raise ValueError(f"limit: expected an integer from 1 to {MAX_LIMIT}, got {raw[:40]!r}")
        filters["limit"] = int(raw)
    return filters


def page_endpoint(
    config: ControllerConfig,
    source: PageSource,
    status: StatusSource,
    loop: LoopGetter,
    *,
    step_down: StepDown | None = None,
) -> StatusEndpoint:
    """The controller's endpoint with its page: ``/v1/status``, ``/metrics`` and
    the page's routes. Raises ConfigError when ``listen.token_file`` cannot be read."""
    routes = PageRoutes(source, load_auth(config), loop, step_down=step_down)
    return StatusEndpoint(config.listen.address, config.listen.port, status, paths_of=routes)


def standby_endpoint(
    config: ControllerConfig, view: Callable[[], dict[str, Any]]
) -> StandbyEndpoint:
    """A standby's endpoint: its status, and the page (which says it stands by)."""
    routes = PageRoutes(None, load_auth(config), lambda: None)
    return StandbyEndpoint(config.listen.address, config.listen.port, view, paths_of=routes)
