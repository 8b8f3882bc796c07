"""Asking another node's agent for its pulse (``GET /v1/pulse``) over the fabric.

The pulse is the agent's name, its loop counter ``seq``, its boot id and
its run (an id the agent draws at each start: a restarted agent counts its
``seq`` from 0 again in a new run): a few dozen bytes. A peer's answer is one of:

- ``ok``: a well-formed pulse of the node that was asked for;
- ``silent``: no answer within the timeout, the connection refused, reset or
  closed without an answer;
- ``garbage``: something answered, but not a pulse (a status other than 200,
  a body that is not the pulse's JSON, too long a body);
- ``wrong_node``: a well-formed pulse of another node (an address that moved).

Only ``ok`` carries a seq and a boot id; nothing else is evidence of anything
(docs/design.md, "Peers"). Used by the agent's pulse thread and by doctor.

An agent's request carries its own pulse, the same JSON in a ``Pulse``
header: the peer it asks hears it without asking back, so each pair of
agents makes one exchange a second, not two.
"""

from __future__ import annotations

import http.client
import json
import re
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

PulseState = Literal["ok", "silent", "garbage", "wrong_node"]

PULSE_PATH = "/v1/pulse"
# The request header that carries the asking agent's own pulse.
PULSE_HEADER = "Pulse"
# A pulse is about 80 bytes; anything much longer is not one.
MAX_PULSE_BYTES = 1024
_MAX_BOOT_ID = 64


# Named tuples: made for every pulse heard or answered, where a frozen
# dataclass's construction costs several times as much.
class Pulse(NamedTuple):
    node: str
    seq: int
    boot_id: str | None
    run: str | None = None  # None from an agent that names no run


class PulseAnswer(NamedTuple):
    state: PulseState
    pulse: Pulse | None = None  # the pulse read (ok, wrong_node)
    error: str | None = None


def pulse_json(node: str, seq: int, boot_id: str | None, run: str | None = None) -> dict[str, Any]:
    """The body of ``GET /v1/pulse``."""
    body: dict[str, Any] = {"node": node, "seq": seq, "boot_id": boot_id}
    if run is not None:
        body["run"] = run
    return body


def pulse_bytes(node: str, seq: int, boot_id: str | None, run: str | None = None) -> bytes:
    """The pulse as one line of JSON: the ``Pulse`` header's value."""
    return json.dumps(pulse_json(node, seq, boot_id, run), separators=(",", ":")).encode()


def new_run() -> str:
    """A run id for an agent that starts: 16 random hex digits."""
    return secrets.token_hex(8)


class OwnPulse:
    """An agent's own pulse, encoded once per new ``seq`` or boot id, not once
    per use: the body of its ``GET /v1/pulse`` and the ``Pulse`` header its
    own requests carry. ``read`` gives the current ``(seq, boot_id)``; ``run``
    names this agent's run."""

    def __init__(
        self, node: str, read: Callable[[], tuple[int, str | None]], run: str | None = None
    ) -> None:
        self.node = node
        self.run = run
        self._read = read
        self._encoded: tuple[tuple[int, str | None], bytes, bytes] | None = None

    def _current(self) -> tuple[tuple[int, str | None], bytes, bytes]:
        now = self._read()
        cached = self._encoded  # one attribute, swapped whole: any thread may ask
        if cached is None or cached[0] != now:
            encoded = pulse_bytes(self.node, *now, self.run)
            cached = (now, encoded, encoded + b"\n")
            self._encoded = cached
        return cached

    def encoded(self) -> bytes:
        """The pulse as one line of JSON (no newline)."""
        return self._current()[1]

    def line(self) -> bytes:
        """The pulse as one line of JSON with its newline: the body of
        ``GET /v1/pulse``, the same object while the pulse is the same."""
        return self._current()[2]


# A pulse exactly as :func:`pulse_bytes` writes it, with no escapes in its
# strings: read by one match. Whatever else JSON allows goes through json.loads.
_WRITTEN = re.compile(
    rb'\{"node":"([ !#-\[\]-~]{1,253})","seq":(0|[1-9][0-9]{0,17}),'
    rb'"boot_id":(?:"([ !#-\[\]-~]{1,64})"|null)(?:,"run":"([ !#-\[\]-~]{1,64})")?\}'
)
# The largest seq a pulse may carry (18 digits, as the match above reads).
MAX_SEQ = 10**18 - 1


def parse_pulse(body: bytes) -> Pulse | None:
    """A well-formed pulse, or None: an object with a node name, a whole ``seq``
    from 0 to :data:`MAX_SEQ`, a boot id and, where named, a run (short
    non-empty strings)."""
    written = _WRITTEN.fullmatch(body)
    if written is not None:
        return _pulse_of(written[1], written[2], written[3], written[4])
    return _parse_any_pulse(body)


def _pulse_of(node: bytes, seq: bytes, boot_id: bytes | None, run: bytes | None) -> Pulse:
    """A pulse of the fields one match read."""
    return Pulse(
        node.decode("ascii"),
        int(seq),
        None if boot_id is None else boot_id.decode("ascii"),
        None if run is None else run.decode("ascii"),
    )


def _parse_any_pulse(body: bytes) -> Pulse | None:
    """:func:`parse_pulse` of any JSON form."""
    if len(body) > MAX_PULSE_BYTES:
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    node, seq, boot_id = data.get("node"), data.get("seq"), data.get("boot_id")
    run = data.get("run")
    if not isinstance(node, str) or not node or len(node) > 253:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        return None
    # null only before the agent's first host reading
    if boot_id is not None and not _short_text(boot_id):
        return None
    if run is not None and not _short_text(run):
        return None
    return Pulse(node, seq, boot_id, run)


def _short_text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_BOOT_ID


def judge(expected: str, status: int, body: bytes) -> PulseAnswer:
    """What an HTTP answer from the peer named ``expected`` is."""
    if status != 200:
        return PulseAnswer("garbage", error=f"answered HTTP {status}, not a pulse")
    pulse = parse_pulse(body)
    if pulse is None:
        return PulseAnswer("garbage", error=f"answered {_excerpt(body)}, not a pulse")
    if pulse.node != expected:
        return PulseAnswer(
            "wrong_node", pulse, f'answered as node "{pulse.node[:64]}", not "{expected}"'
        )
    return PulseAnswer("ok", pulse)


def _excerpt(body: bytes) -> str:
    text = body[:40].decode("utf-8", "replace")
    return repr(text + ("…" if len(body) > 40 else ""))


class PulseClient:
    """One peer's connection, kept open between pulses (HTTP/1.1 keep-alive);
    used from one thread at a time.

    A pulse is asked every second of every peer for as long as the agent runs,
    so the request is built once and the answer read off the socket directly
    (http.client's header parsing costs more than the whole exchange)."""

    def __init__(
        self,
        name: str,
        url: str,
        timeout: float,
        carry: Callable[[], bytes] | None = None,
    ) -> None:
        """``carry``: this agent's own pulse (:func:`pulse_bytes`), sent with each request."""
        self.name = name
        self.url = url
        self.timeout = timeout
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if self._https else 80)
        path = parts.path.rstrip("/") + PULSE_PATH
        head = f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: application/json\r\n"
        # Without a pulse to carry the request is the same bytes every time.
        self._head = (head + (f"{PULSE_HEADER}: " if carry is not None else "\r\n")).encode()
        self._carry = carry
        self._sock: socket.socket | None = None
        self._waits = timeout  # what a send or receive on _sock waits at most

    def _request(self) -> bytes:
        if self._carry is None:
            return self._head
        return self._head + self._carry() + b"\r\n\r\n"

    def ask(self) -> PulseAnswer:
        reused = self._sock is not None
        try:
            return self._ask_once()
        except _Closed as exc:
            # The peer closed an idle kept-alive connection: ask again on a new one.
            self.close()
            if not reused:
                return _failure(exc)
        except (OSError, http.client.HTTPException, _Garbage) as exc:
            self.close()
            return _failure(exc)
        try:
            return self._ask_once()
        except (OSError, http.client.HTTPException, _Garbage) as exc:
            self.close()
            return _failure(exc)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self._host, self._port), self.timeout)
        self._waits = self.timeout
        if self._https:
            context = ssl.create_default_context()
            return context.wrap_socket(sock, server_hostname=self._host)
        # A Python socket timeout polls before every send and receive; the
        # kernel's own timeouts make a pulse one send and one receive.
        sock.settimeout(None)
        _kernel_timeouts(sock, self.timeout)
        return sock

    def _wait_at_most(self, sock: socket.socket, seconds: float) -> None:
        """Each send and receive on ``sock`` waits at most ``seconds`` from now on."""
        if self._https:
            sock.settimeout(seconds)
        else:
            _kernel_timeouts(sock, seconds)
        self._waits = seconds

    def _ask_once(self) -> PulseAnswer:
        if self._sock is None:
            self._sock = self._connect()
        sock = self._sock
        deadline = time.monotonic() + self.timeout
        if self._waits != self.timeout:  # shortened by the last answer's wait
            self._wait_at_most(sock, self.timeout)
        try:
            sock.sendall(self._request())
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _Closed(str(exc)) from None
        except BlockingIOError:  # the kernel's send timeout
            raise TimeoutError("no answer within the timeout") from None
        data = self._receive(sock, b"")
        while True:
            answer = _complete(data)
            if answer is not None:
                status, body, close = answer
                if close:
                    self.close()
                return judge(self.name, status, body)
            if len(data) > 2 * MAX_PULSE_BYTES + 4096:
                return self._garbage(f"answered {_excerpt(data)}, not a pulse")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no answer within the timeout")
            self._wait_at_most(sock, remaining)
            data = self._receive(sock, data)

    def _receive(self, sock: socket.socket, data: bytes) -> bytes:
        """``data`` and what comes next on ``sock``; an end of the stream or a
        reset raise :class:`_Closed` before any answer, and :class:`_Garbage` in one."""
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:  # the kernel's receive timeout
            raise TimeoutError("no answer within the timeout") from None
        except ConnectionResetError as exc:
            # A request that reached a connection the peer had already
            # closed is answered by a reset, not by an end of stream.
            if data:
                raise _Garbage("reset the connection mid-answer") from None
            raise _Closed(str(exc)) from None
        if not chunk:
            if data:
                raise _Garbage("closed the connection mid-answer")
            raise _Closed("closed the connection without an answer")
        return data + chunk

    def _garbage(self, error: str) -> PulseAnswer:
        self.close()
        return PulseAnswer("garbage", error=error)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """SO_RCVTIMEO and SO_SNDTIMEO of a blocking socket: a receive or send
    waiting longer fails with EAGAIN (BlockingIOError)."""
    micro = max(1, round(seconds * 1e6))  # a zero timeval would wait forever
    timeval = struct.pack("@ll", *divmod(micro, 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class _Closed(ConnectionResetError):
    """The peer closed the connection before answering."""


class _Garbage(Exception):
    """The peer broke off its answer: ``garbage``, with this error."""


def _complete(data: bytes) -> tuple[int, bytes, bool] | None:
    """The status, body and whether the peer closes, once ``data`` holds a whole
    HTTP/1 answer; None while more is to come.

    :raises http.client.HTTPException: not an HTTP answer, or one a pulse never is.
    """
    head, found, rest = data.partition(b"\r\n\r\n")
    if not found:
        if not data.startswith(b"HTTP/"[: len(data)]):
            raise http.client.BadStatusLine(_excerpt(data))
        return None
    lines = head.split(b"\r\n")
    status_line = lines[0].split(b" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
        raise http.client.BadStatusLine(_excerpt(lines[0]))
    try:
        status = int(status_line[1])
    except ValueError:
        raise http.client.BadStatusLine(_excerpt(lines[0])) from None
    length: int | None = None
    close = status_line[0] == b"HTTP/1.0"
    for line in lines[1:]:
        key, _, value = line.partition(b":")
        key = key.strip().lower()
        if key == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise http.client.HTTPException("a bad Content-Length") from None
        elif key == b"connection":
            close = value.strip().lower() == b"close"
        elif key == b"transfer-encoding":
            raise http.client.HTTPException("a chunked answer: not a pulse")
    if length is None:
        raise http.client.HTTPException("an answer without Content-Length: not a pulse")
    if length > MAX_PULSE_BYTES:
        raise http.client.HTTPException(f"a body of {length} bytes: not a pulse")
    if len(rest) < length:
        return None
    return status, rest[:length], close or len(rest) > length


def _failure(exc: BaseException) -> PulseAnswer:
    if isinstance(exc, _Garbage):
        return PulseAnswer("garbage", error=str(exc))
    if isinstance(exc, _Closed):
        return PulseAnswer("silent", error=str(exc))
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return PulseAnswer("silent", error="no answer within the timeout")
    if isinstance(exc, http.client.HTTPException):
        return PulseAnswer("garbage", error=f"answered something that is not HTTP ({exc!r})"[:200])
    return PulseAnswer("silent", error=(str(exc) or type(exc).__name__)[:200])


def ask_once(name: str, url: str, timeout: float) -> PulseAnswer:
    """One pulse on a fresh connection (doctor)."""
    client = PulseClient(name, url, timeout)
    try:
        return client.ask()
    finally:
        client.close()
