"""One HTTP request, already read whole, answered: http.server's parsing and
errors over bytes in memory, the caller's routes, and JSON for every error.

The server (:mod:`spark_watchdog.http.server`) owns the sockets and hands
this module a request only once its head (and, for a POST it will serve, its
body) is in, so nothing here waits on a client. GET and HEAD routes run on
the server's thread and only read snapshots the caller has already built;
a POST route runs on a thread of its own (a serving stop may wait for a
process group).

POST routes take a JSON object body (empty means ``{}``) of at most
``MAX_BODY_BYTES``, nested at most ``MAX_BODY_DEPTH`` deep. When an
``authorize`` check is given, every POST must pass it before its body is even
read. Whatever a client sends gets a JSON answer, never a traceback: every
error (a wrong method, a malformed request line, an oversized header) is
``{"error": "..."}`` with its status. docs/bad-input.md lists them.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

from spark_watchdog.bearer import TOKEN_IN_URL, credential_in_target, decoded_target, target_parts

log = logging.getLogger("spark_watchdog.http")

# A route answers (status, content type, body).
Response = tuple[int, str, bytes]
Route = Callable[[], Response]
# A POST route gets the request's JSON object.
PostRoute = Callable[[dict[str, Any]], Response]
# Checks an Authorization header value: None to let the request in, else why not.
Authorize = Callable[[str | None], str | None]
# Told a peer's own pulse, carried in its request (the ``Pulse`` header's value,
# probes/pulse.py), and the address the request came from.
PulseIn = Callable[[bytes, Any], None]

# An answer with headers of its own (a page's security headers, a 401's scheme).
Reply = tuple[int, str, bytes, dict[str, str]]


@dataclass(frozen=True)
class Request:
    """One whole request, for routes that look past its path: the query
    string (raw, undecoded), the headers, and a POST's JSON object."""

    method: str
    path: str
    query: str
    headers: Message
    body: dict[str, Any] = field(default_factory=dict)


class PathRoutes(Protocol):
    """Routes that match paths themselves (templates such as
    ``/v1/incidents/{id}``, a folder of static files) and see the whole
    request. Each request line is first shown to ``screen`` whatever its
    method and path, so a refusal (a secret in the URL) holds for every
    route and every error."""

    def methods(self, path: str) -> tuple[str, ...]:
        """The methods ``path`` answers, in ``Allow`` order; () when not one of these."""
        ...

    def operations(self) -> dict[str, tuple[str, ...]]:
        """Every path template served and its methods (what docs/api/ describes)."""
        ...

    def on_thread(self, path: str) -> bool:
        """True where a GET waits on something (a database) and runs on a thread."""
        ...

    def screen(self, request: Request) -> Reply | None:
        """A refusal for any request before its route runs; None to let it through.
        It sees the request line alone, before the headers are read: ``query``
        holds every part of the target (path segments and parameters, query,
        fragment), percent-decoded, as one query string
        (:func:`spark_watchdog.bearer.target_parts`)."""
        ...

    def answer(self, request: Request) -> Reply: ...


# Serving requests are a few dozen bytes; anything near this is not one of them.
MAX_BODY_BYTES = 64 * 1024
# Serving requests are flat objects; the JSON parser recurses once per level.
MAX_BODY_DEPTH = 32

JSON = "application/json"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

# A JSON string (escapes included) or a bracket: enough to measure nesting.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def json_response(payload: Any, status: int = 200) -> Response:
    body = json.dumps(payload, indent=None, separators=(",", ":"), sort_keys=False).encode()
    return status, JSON, body + b"\n"


def json_nesting(raw: bytes) -> int:
    """How deep arrays and objects nest in ``raw`` (brackets in strings don't count)."""
    depth = deepest = 0
    for match in _JSON_NESTING.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def error_answer(status: int, message: str, **headers: str) -> bytes:
    """A whole HTTP/1.1 error answer that closes the connection, for the
    server's own refusals (no request handler behind them)."""
    code, content_type, body = json_response({"error": message}, status)
    head = (
        f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        + "Connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + body


@dataclass(frozen=True)
class Routes:
    """What a server answers: its GET routes, its POST routes, and the check
    every POST passes first."""

    get: dict[str, Route]
    post: dict[str, PostRoute] = field(default_factory=dict)
    authorize: Authorize | None = None
    # Routes that match their paths themselves (None: none).
    paths_of: PathRoutes | None = None
    # Where a plain GET's ``Pulse`` header goes (http/lean.py; None: ignored).
    pulse_in: PulseIn | None = None
    # The last small answer of each path, kept by http/lean.py to send again.
    answered: dict[str, tuple[bytes, bytes, int, str, bytes]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def own(self, path: str) -> tuple[str, ...]:
        """The methods ``paths_of`` answers at ``path`` (() where it has none)."""
        return () if self.paths_of is None else self.paths_of.methods(path)

    def on_thread(self, method: str, target: str) -> bool:
        """Whether the request runs on a thread of its own: a POST, or a GET
        that ``paths_of`` says waits on something."""
        if method == "POST":
            return True
        path = target.split("?", 1)[0]
        return (
            method in ("GET", "HEAD")
            and path not in self.get
            and self.paths_of is not None
            and method in self.own(path)
            and self.paths_of.on_thread(path)
        )

    def allowed_methods(self, path: str) -> tuple[str, ...]:
        """The methods ``path`` answers, in ``Allow`` order; () for no such path."""
        methods: tuple[str, ...] = ()
        if path in self.get:
            methods += ("GET", "HEAD")
        if path in self.post:
            methods += ("POST",)
        return methods or self.own(path)

    def paths(self) -> list[str]:
        extra = self.paths_of.operations() if self.paths_of is not None else {}
        return sorted({*self.get, *self.post, *extra})

    def body_length(self, method: str, target: str, headers: Message) -> int:
        """The body bytes the handler will read after this head: 0 wherever it
        answers without one (not a POST it serves, not authorized, a length
        it refuses), so the server waits for no more than that."""
        path = target.split("?", 1)[0]
        if method != "POST" or (path not in self.post and "POST" not in self.own(path)):
            return 0
        if (
            path in self.post
            and self.authorize is not None
            and self.authorize(headers.get("Authorization")) is not None
        ):
            return 0
        if headers.get("Transfer-Encoding"):
            return 0
        try:
            length = int(headers.get("Content-Length") or "0")
        except ValueError:
            return 0
        return length if 0 <= length <= MAX_BODY_BYTES else 0


class Exchange(BaseHTTPRequestHandler):
    """Answers the one request in ``request`` (bytes already read whole):
    ``answer`` is what to send, ``close_connection`` whether to close after."""

    protocol_version = "HTTP/1.1"

    def __init__(self, request: bytes, client_address: Any, routes: Routes) -> None:
        # Not BaseHTTPRequestHandler.__init__, which reads a socket: the
        # request is in memory and the answer goes to memory.
        self.client_address = client_address
        self.routes = routes
        self.rfile = io.BytesIO(request)
        self._written = io.BytesIO()
        self.wfile = self._written
        self.close_connection = True
        self.handle_one_request()

    @property
    def answer(self) -> bytes:
        return self._written.getvalue()

    # -- dispatch ----------------------------------------------------------------

    def do_GET(self) -> None:
        self._get()

    def do_HEAD(self) -> None:
        self._get()  # _send leaves the body out

    def do_POST(self) -> None:
        path = self._path()
        route = self.routes.post.get(path)
        if route is None:
            if "POST" in self.routes.own(path):
                self._own_route(path)
            else:
                self._no_route(path)
            return
        authorize = self.routes.authorize
        if authorize is not None:
            problem = authorize(self.headers.get("Authorization"))
            if problem is not None:
                # RFC 6750 §3: a 401 names the scheme it wants.
                self._error(401, problem, **{"WWW-Authenticate": 'Bearer realm="spark-watchdog"'})
                return
        body = self._read_json()
        if body is None:
            return
        try:
            response = route(body)
        except Exception as exc:
            log.exception("POST %s failed", path)
            response = json_response({"error": f"{type(exc).__name__}: {exc}"}, 500)
        self._send(*response)

    def _not_allowed(self) -> None:
        self._no_route(self._path())

    # Standard methods these paths do not take (QUERY: the IETF httpbis draft's
    # safe method with a body); a method the server does not know is a 501.
    do_OPTIONS = do_PUT = do_DELETE = do_PATCH = do_TRACE = do_CONNECT = do_QUERY = _not_allowed

    def _get(self) -> None:
        path = self._path()
        route = self.routes.get.get(path)
        if route is None:
            if "GET" in self.routes.own(path):
                self._own_route(path)
            else:
                self._no_route(path)
            return
        try:
            response = route()
        except Exception as exc:
            log.exception("%s %s failed", self.command, path)
            response = json_response({"error": f"{type(exc).__name__}: {exc}"}, 500)
        self._send(*response)

    def _path(self) -> str:
        return self.path.split("?", 1)[0]

    def _request(self, path: str, body: dict[str, Any] | None = None) -> Request:
        query = urlsplit(self.path).query if "?" in self.path else ""
        return Request(self.command, path, query, self.headers, body or {})

    def _credential_in(self, target: str) -> Reply | None:
        """The refusal of a request target that carries a credential (the
        server's own token included, under any name or none); None when it
        carries none. docs/page.md, "The token"."""
        authorize = self.routes.authorize
        is_secret = None
        if authorize is not None:
            check = authorize

            def is_secret(part: str) -> bool:
                return bool(part.strip()) and check(f"Bearer {part.strip()}") is None

        if credential_in_target(target, is_secret):
            status, content_type, body = json_response({"error": TOKEN_IN_URL}, 400)
            return status, content_type, body, {}
        screen = self.routes.paths_of
        text = decoded_target(target)
        if screen is None or text is None:
            return None
        return screen.screen(Request("", "", urlencode(target_parts(text)), Message()))

    def _own_route(self, path: str) -> None:
        """A route of ``paths_of``: the whole request is its to answer."""
        routes = self.routes.paths_of
        assert routes is not None
        body: dict[str, Any] | None = {}
        if self.command == "POST":
            body = self._read_json()
            if body is None:
                return
        try:
            status, content_type, payload, headers = routes.answer(self._request(path, body))
        except Exception as exc:
            log.exception("%s %s failed", self.command, path)
            status, content_type, payload = json_response(
                {"error": f"{type(exc).__name__}: {exc}"}, 500
            )
            headers = {}
        if status >= 400:
            self.close_connection = True
            headers = {"Connection": "close", **headers}
        self._send(status, content_type, payload, headers)

    def _no_route(self, path: str) -> None:
        """405 with Allow when the path takes other methods, else 404."""
        allowed = self.routes.allowed_methods(path)
        if allowed:
            use = " or ".join(allowed)
            message = f"{self.command} is not allowed on {path}; use {use}"
            self._error(405, message, Allow=", ".join(allowed))
            return
        known = ", ".join(self.routes.paths()) or "none"
        self._error(404, f"no such path {path}; paths: {known}")

    # -- the request body ---------------------------------------------------------

    def _read_json(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None after answering why it is not one."""
        if self.headers.get("Transfer-Encoding"):
            self._error(411, "send the body with a Content-Length (no chunked bodies)")
            return None
        raw_length = self.headers.get("Content-Length")
        length = 0
        if raw_length is not None:
            try:
                length = int(raw_length)
                if length < 0:
                    raise ValueError(raw_length)
            except ValueError:
                self._error(400, f"Content-Length: expected a byte count, got {raw_length!r}")
                return None
        if length > MAX_BODY_BYTES:
            self._error(413, f"body of {length} bytes; at most {MAX_BODY_BYTES} accepted")
            return None
        raw = self.rfile.read(length) if length else b""
        if len(raw) < length:
            self._error(400, f"body ended after {len(raw)} of {length} bytes")
            return None
        if not raw.strip():
            return {}
        depth = json_nesting(raw)
        if depth > MAX_BODY_DEPTH:
            self._error(
                400,
                f"body nests {depth} levels of arrays and objects; at most {MAX_BODY_DEPTH} "
                "are accepted (a serving request is one flat object)",
            )
            return None
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            self._error(400, f"body is not JSON: {exc}")
            return None
        if not isinstance(value, dict):
            self._error(400, f"body: expected a JSON object, got {type(value).__name__}")
            return None
        return value

    # -- answers -------------------------------------------------------------------

    def parse_request(self) -> bool:
        raw: bytes = getattr(self, "raw_requestline", b"")  # set by handle_one_request
        words = raw.split()
        if self._refused_target(words):
            return False
        if len(words) == 2:
            # No HTTP version: HTTP/0.9 ("GET /path"), which has no headers and
            # no status line; http.server would wait for headers that never come.
            self.command = ""
            self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
            self.request_version = "HTTP/1.0"
            self.close_connection = True
            if words[0] == b"GET":
                self.send_error(
                    505, "HTTP/0.9 is not supported; send HTTP/1.0 or HTTP/1.1 requests"
                )
            else:
                self.send_error(400, f"Bad request syntax ({self.requestline!r})")
            return False
        return bool(super().parse_request())

    def _refused_target(self, words: list[bytes]) -> bool:
        """True after refusing a request line whose target (or any word after
        the method) carries a credential; before any other check, so no error
        echoes it and no log line names it."""
        for word in words[1:]:
            refusal = self._credential_in(word.decode("latin-1"))
            if refusal is not None:
                self.command = ""
                self.request_version = "HTTP/1.0"
                self.close_connection = True
                status, content_type, body, headers = refusal
                self._send(status, content_type, body, {"Connection": "close", **headers})
                return True
        return False

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Every error http.server raises itself (a malformed request line, an
        unknown method, oversized headers) answered in JSON, not HTML."""
        if self.request_version in ("HTTP/0.9", ""):
            # A request line that did not parse still gets a status line.
            self.request_version = "HTTP/1.0"
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            text = f"unsupported method {self.command!r}; use GET, HEAD or POST"
        elif code == HTTPStatus.REQUEST_URI_TOO_LONG:
            text = "request line longer than 65536 bytes; shorten the URL"
        elif code == HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE:
            text = (
                "a header line longer than 65536 bytes; send shorter headers"
                if message == "Line too long"
                else "more than 100 headers; send fewer"
            )
        elif code == HTTPStatus.BAD_REQUEST and message and message.startswith("Bad request"):
            text = f"{message}; expected a request line METHOD /path HTTP/1.1"
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED and message:
            text = message if "HTTP/1.1" in message else f"{message}; send HTTP/1.1 requests"
        else:
            text = message or HTTPStatus(code).phrase
            if explain:
                text = f"{text}: {explain}"
        self._error(code, text)

    def _error(self, status: int, message: str, **headers: str) -> None:
        """Answer an error; the connection closes, since a body may be left unread."""
        self.close_connection = True
        code, content_type, body = json_response({"error": message}, status)
        self._send(code, content_type, body, {"Connection": "close", **headers})

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # Access logs would flood the journal at 1 request/s per controller.
        return

    def log_message(self, format: str, *args: Any) -> None:
        # http.server's own lines (timeouts, errors): each is answered, none logged.
        return
