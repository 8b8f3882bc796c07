"""What the HTTP power backends (Redfish, Shelly, Tasmota) share: timeouts and error mapping.

The one hard question for an HTTP power command is whether it may have
landed. ``requests`` folds very different failures into ``ConnectionError``;
underneath, urllib3 says which happened (requests' ``HTTPAdapter.send``):

- the TCP connection was never made (refused, no route, name not resolved,
  connect timeout) or the TLS handshake failed: nothing of the request left
  this host, so the device certainly did not act;
- the request was sent and the answer did not come (read timeout) or the
  connection broke mid-answer: the device may well have acted.

Messages are built from the failure's *kind* and the innermost OS error,
never from ``str()`` of a requests or urllib3 exception: those quote the URL,
and Tasmota's protocol puts the password in the URL.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import Iterator
from typing import Any

import requests
import urllib3.exceptions

from spark_watchdog.errors import Ambiguous, PowerError, Unreachable

_PASSWORD_IN_URL = re.compile(r"(password=)[^&\s\"']*", re.IGNORECASE)


class _RedactPasswords(logging.Filter):
    """Blank ``password=...`` in urllib3's DEBUG request lines (Tasmota's URLs carry it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "password=" in message.lower():
            record.msg = _PASSWORD_IN_URL.sub(r"\1***", message)
            record.args = ()
        return True


def _install_redaction() -> None:
    # urllib3.connectionpool logs every request line, query string included, at DEBUG.
    target = logging.getLogger("urllib3.connectionpool")
    if not any(isinstance(f, _RedactPasswords) for f in target.filters):
        target.addFilter(_RedactPasswords())


_install_redaction()


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and everything it wraps (args[0], MaxRetryError.reason, __cause__)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, urllib3.exceptions.MaxRetryError) and current.reason is not None:
            todo.append(current.reason)
        for inner in (*current.args[:2], current.__cause__, current.__context__):
            if isinstance(inner, BaseException):
                todo.append(inner)


def _os_reason(exc: BaseException) -> str:
    """The innermost OS-level reason, e.g. "Connection refused"; never a URL."""
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return ""


def _never_sent(exc: BaseException) -> str | None:
    """Why nothing of the request can have reached the device, or None if it may have."""
    for cause in _causes(exc):
        if isinstance(cause, urllib3.exceptions.NameResolutionError):
            return "cannot resolve the host name"
        if isinstance(cause, urllib3.exceptions.NewConnectionError):
            reason = _os_reason(cause)
            return f"cannot connect ({reason})" if reason else "cannot connect"
        if isinstance(cause, ssl.SSLCertVerificationError):
            # Verification is part of the handshake, before any request byte.
            # Other TLS errors can also happen mid-answer, so they stay "may have".
            return f"TLS certificate not trusted ({_tls_reason(cause)}); set ca_file"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "no TCP connection within the timeout"
    return None


def _tls_reason(error: ssl.SSLCertVerificationError) -> str:
    return error.verify_message or error.reason or "verification failed"


def transport_error(
    device: str, exc: requests.RequestException, *, command: bool, timeout: float
) -> PowerError:
    """Map a requests failure: Unreachable if nothing was sent, else Ambiguous for a command."""
    never_sent = _never_sent(exc)
    if never_sent is not None:
        return Unreachable(device, f"{never_sent}; nothing was sent")
    if isinstance(exc, requests.exceptions.Timeout):
        what = f"no answer within {timeout:g}s after the request was sent"
    else:
        reason = _os_reason(exc)
        what = "the connection broke after the request was sent" + (
            f" ({reason})" if reason else ""
        )
    if command:
        return Ambiguous(device, f"{what}; the command may have been applied")
    return Unreachable(device, what)


def new_session() -> requests.Session:
    """A session that takes nothing from the environment.

    With ``trust_env`` on, requests lets ``REQUESTS_CA_BUNDLE`` /
    ``CURL_CA_BUNDLE`` replace a session's ``verify`` (psf/requests#3829):
    ``ca_file`` and ``verify_tls: false`` would be silently ignored. It would
    also route a BMC on the management LAN through ``HTTPS_PROXY`` and take
    credentials from ``~/.netrc``. The config is the only source of all three.
    """
    session = requests.Session()
    session.trust_env = False
    return session


def drop_idle_connections(session: requests.Session) -> None:
    """Make the next request open a fresh connection.

    A command sent on a pooled keep-alive connection that the device has
    already closed fails after sending, which would read as Ambiguous though
    the device never saw it. BMCs and ESP-based plugs close idle connections
    after a few seconds, so a command always gets a new one.
    """
    session.close()  # closes the adapters' pools; the session stays usable


def excerpt(text: str, limit: int = 200) -> str:
    """A short, single-line piece of a device's answer for an error message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def json_body(response: requests.Response) -> Any:
    """The parsed JSON body, or None when it is not JSON."""
    try:
        return json.loads(response.content.decode("utf-8", errors="replace"))
    except ValueError:
        return None
