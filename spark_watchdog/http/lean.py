"""The plain GET answered without http.server's request parsing.

Nearly every request the agent's server sees is the same few hundred bytes:
the controller's poll of ``/v1/state`` every second, each peer's
``GET /v1/pulse`` every second, a Prometheus scrape. http.server parses each
head through the email package, and the server parsed it once more to frame
it; for a pulse that was most of the agent's cost of answering. A head that
is plainly such a request is answered here with the same bytes
:class:`~spark_watchdog.http.handler.Exchange` would write; anything else
(another method or version, a query, a header that changes the answer:
``Connection`` other than keep-alive, ``Expect``; a folded or malformed
header line; a server whose ``paths_of`` screens requests) returns None and
takes the full path, which stays the one place for every rule and error.
See docs/design.md, "The HTTP servers".

A ``Pulse`` header (a peer agent's own pulse, carried in its request for
this one's: docs/design.md, "Peers") goes to ``routes.pulse_in`` with the
client's address, once the request is answered here; a request that takes
the full path carries none (the peer is then asked in turn).
"""

from __future__ import annotations

import functools
import logging
import time
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from spark_watchdog.http.handler import Route, Routes, json_response

log = logging.getLogger("spark_watchdog.http")

# Header names whose presence can change how a GET is answered or framed;
# ``Connection: keep-alive`` (what requests sends) changes nothing in HTTP/1.1.
_STEERING = frozenset({b"connection", b"expect"})
_PULSE = b"pulse"
_KEEP = b"keep-alive"
_SERVER = BaseHTTPRequestHandler.server_version + " " + BaseHTTPRequestHandler.sys_version
# Answers with a body up to this long are kept to be sent again (a pulse's is
# about 80 bytes); a scrape's or a state's are built each time.
_KEPT_BODY_BYTES = 1024


class _DateLine:
    """The ``Date`` header, formatted once a second, not once a request."""

    def __init__(self) -> None:
        self._second = -1
        self._line = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = f"Date: {formatdate(now, usegmt=True)}\r\n".encode("latin-1")
        return self._line


_date_line = _DateLine()


def lean_get(head: bytes, routes: Routes, address: Any = None) -> bytes | None:
    """The answer to ``head`` (a whole request head, as framed by
    :func:`~spark_watchdog.http.framing.scan_head`) when it is a plain
    ``GET <route> HTTP/1.1`` that keeps its connection; None for the full path.
    ``address``: the client's, for ``routes.pulse_in``."""
    if routes.paths_of is not None:
        return None
    lines = head.split(b"\n")
    words = lines[0].split()
    if len(words) != 3 or words[0] != b"GET" or words[2] != b"HTTP/1.1":
        return None
    path = words[1].decode("latin-1")
    route = routes.get.get(path)
    if route is None:
        return None
    carried: bytes | None = None
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            return None  # a folded line continues the header before it
        name, colon, value = line.partition(b":")
        if not colon:
            if line.strip():
                return None
            continue
        name = name.strip().lower()
        if name in _STEERING and not (name == b"connection" and value.strip().lower() == _KEEP):
            return None
        if name == _PULSE:
            carried = value.strip()
    return _answered(path, route, routes, carried, address)


def _answered(
    path: str, route: Route, routes: Routes, carried: bytes | None, address: Any
) -> bytes:
    if carried is not None and routes.pulse_in is not None:
        try:
            routes.pulse_in(carried, address)
        except Exception:
            log.exception("taking the pulse carried by a request failed")
    try:
        status, content_type, body = route()
    except Exception as exc:
        log.exception("GET %s failed", path)
        status, content_type, body = json_response({"error": f"{type(exc).__name__}: {exc}"}, 500)
    date = _date_line()
    # The same body (the same object: a pulse between two loops) within the
    # same second is the same answer; a pulse is asked 3 times a second.
    last = routes.answered.get(path)
    if (
        last is not None
        and last[0] is body
        and last[1] is date
        and last[2] == status
        and last[3] == content_type
    ):
        return last[4]
    answer = b"".join(
        (
            _status_lines(status),
            date,
            _type_line(content_type),
            str(len(body)).encode(),
            b"\r\nCache-Control: no-store\r\n\r\n",
            body,
        )
    )
    if len(body) <= _KEPT_BODY_BYTES:
        routes.answered[path] = (body, date, status, content_type, answer)
    return answer


@functools.lru_cache(maxsize=32)
def _status_lines(status: int) -> bytes:
    return f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nServer: {_SERVER}\r\n".encode(
        "latin-1"
    )


@functools.lru_cache(maxsize=16)
def _type_line(content_type: str) -> bytes:
    return f"Content-Type: {content_type}\r\nContent-Length: ".encode("latin-1")


def lean_answer(head: bytes, routes: Routes, address: Any) -> bytes | None:
    """:func:`lean_get`, where a failure of its own leaves the request to the full path."""
    try:
        return lean_get(head, routes, address)
    except Exception:
        log.exception("answering a plain GET failed; it takes the full path")
        return None
