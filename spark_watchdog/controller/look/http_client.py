"""A small asyncio HTTP/1.1 client for the controller's own traffic.

The controller pulls every agent every second and must never wait longer
than its timeout on one of them (a frozen host completes the TCP handshake
and then says nothing). One bounded request per connection, no keep-alive,
no redirects, a size cap: asyncio streams are enough, and the whole request
is cancelled when the deadline passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

MAX_BODY = 4 * 1024 * 1024
# An agent sends about ten; a peer that never stops sending headers is cut off.
MAX_HEADERS = 100


# How a request failed, as the detector reads it (docs/design.md, "Signals"):
# silence counts toward a freeze, a refusal proves a live kernel, and a name
# that does not resolve or the controller's own dead network means the
# controller cannot look at all.
FailureKind = str
SILENCE = "silence"  # timeout, no route to the host itself
REFUSED = "refused"  # the host's kernel answered with a reset
ANSWERED = "answered"  # an HTTP status line came back, then something was wrong
UNRESOLVABLE = "unresolvable"
NO_NETWORK = "no_network"

_OWN_NETWORK_ERRNOS = frozenset(
    {errno.ENETUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT}
)


class HttpError(Exception):
    """No usable answer: connect failure, timeout, or a malformed response."""

    def __init__(self, message: str, kind: FailureKind = ANSWERED) -> None:
        super().__init__(message)
        self.kind = kind


def failure_kind(exc: OSError) -> FailureKind:
    if isinstance(exc, socket.gaierror):
        return UNRESOLVABLE
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if exc.errno in _OWN_NETWORK_ERRNOS:
        return NO_NETWORK
    if isinstance(exc, ConnectionError):
        return REFUSED  # reset or aborted by the peer's kernel
    return SILENCE


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: bytes
    # Header names lower-cased; the last one wins when a name repeats.
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise HttpError(f"answer is not JSON ({exc})") from None
        except RecursionError:
            # json.loads recurses once per nesting level: "[[[[..." of a few
            # thousand levels, well within MAX_BODY, exhausts the stack.
            raise HttpError("answer is not JSON (nested too deeply)") from None


async def request(
    url: str,
    *,
    method: str = "GET",
    timeout: float,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> HttpAnswer:
    """One request with an overall deadline; raises HttpError on anything but an answer."""
    try:
        return await asyncio.wait_for(_request(url, method, body, headers or {}), timeout)
    except asyncio.TimeoutError:
        raise HttpError(f"{method} {_safe(url)}: no answer within {timeout:g}s", SILENCE) from None
    except OSError as exc:
        raise HttpError(
            f"{method} {_safe(url)}: {exc.strerror or exc}", failure_kind(exc)
        ) from None


def _safe(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port}{parts.path}"


async def _request(url: str, method: str, body: Any, headers: dict[str, str]) -> HttpAnswer:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise HttpError(f"{_safe(url)}: only http:// URLs are supported here", UNRESOLVABLE)
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {parts.hostname}:{port}",
        "Connection: close",
        "Accept: application/json",
        f"Content-Length: {len(payload)}",
    ]
    if body is not None:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    reader, writer = await asyncio.open_connection(parts.hostname, port)
    try:
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        return await read_answer(reader, f"{method} {_safe(url)}")
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def read_answer(reader: asyncio.StreamReader, what: str) -> HttpAnswer:
    """Read one HTTP/1.1 answer (status line, headers, body) from ``reader``.

    Whatever the peer sends, the result is an ``HttpAnswer`` or an
    ``HttpError`` naming ``what`` (the request, e.g. ``GET http://…/v1/state``).
    """
    try:
        status_line = await reader.readline()
        if not status_line:
            raise HttpError(f"{what}: closed without an answer", REFUSED)
        fields = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        # ASCII digits only: str.isdigit() also takes "²" or "³", which int() refuses.
        if len(fields) < 2 or not fields[0].startswith("HTTP/") or not _digits(fields[1]):
            raise HttpError(f"{what}: not an HTTP answer ({status_line[:60]!r})")
        status = int(fields[1])
        length: int | None = None
        answer_headers: dict[str, str] = {}
        for count in range(MAX_HEADERS + 1):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            if count == MAX_HEADERS:
                raise HttpError(f"{what}: more than {MAX_HEADERS} header lines")
            name, _, value = line.decode("latin-1").partition(":")
            answer_headers[name.strip().lower()] = value.strip()
            if name.strip().lower() == "content-length":
                if not _digits(value.strip()):
                    raise HttpError(
                        f"{what}: bad Content-Length {value.strip()[:40]!r}; "
                        "expected a number of bytes"
                    )
                length = int(value.strip())
        if length is not None:
            if length > MAX_BODY:
                raise HttpError(f"{what}: answer of {length} bytes is too large")
            data = await reader.readexactly(length)
        else:
            data = await reader.read(MAX_BODY + 1)
            if len(data) > MAX_BODY:
                raise HttpError(f"{what}: answer is too large")
        return HttpAnswer(status, data, answer_headers)
    except asyncio.IncompleteReadError:
        raise HttpError(f"{what}: connection closed mid-answer") from None
    except (asyncio.LimitOverrunError, ValueError) as exc:
        # StreamReader.readline raises ValueError for a line over its limit (64 KiB).
        raise HttpError(f"{what}: a status or header line is too long ({exc})") from None


def _digits(text: str) -> bool:
    """1 to 18 ASCII digits: an HTTP status or a Content-Length."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()
