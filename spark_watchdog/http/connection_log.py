"""What the HTTP server (spark_watchdog/http/server.py) says about its
connections: broken, refused, evicted, slow, or failed by a bug. Each kind
has a line budget of its own (spark_watchdog/http/line_budget.py), so a flood of
hostile or broken clients costs the journal a few lines a minute."""

from __future__ import annotations

import errno
import logging
from typing import Any

from spark_watchdog.http.line_budget import LineBudget

log = logging.getLogger("spark_watchdog.http")

# Log lines of one kind per window; past them a count.
BROKEN_LOG_BURST = 10
BROKEN_LOG_WINDOW_S = 60.0

# What a client that went away leaves behind: not the server's fault, not a bug.
_BROKEN_ERRNOS = frozenset(
    {errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ENOTCONN, errno.ETIMEDOUT}
)


def is_broken_connection(exc: BaseException) -> bool:
    """The client went away (reset, pipe closed, timed out): no bug of ours."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in _BROKEN_ERRNOS


def peer(client_address: Any) -> str:
    """``host:port`` of a client, for a log line."""
    if isinstance(client_address, tuple) and len(client_address) >= 2:
        return f"{client_address[0]}:{client_address[1]}"
    return str(client_address)


class ConnectionLog:
    """The server's lines about its connections, each kind within its budget;
    :meth:`flush` (each turn of the loop) reports what went uncounted."""

    def __init__(self) -> None:
        self._broken = LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S)
        self._refused = LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "refused connections")
        self._evicted = LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "evicted connections")
        self._error = LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "unexpected errors")
        self._slow = LineBudget(BROKEN_LOG_BURST, BROKEN_LOG_WINDOW_S, "slow requests")

    def flush(self) -> None:
        self._broken.flush(log.info)
        self._refused.flush(log.warning)
        self._evicted.flush(log.info)
        self._error.flush(log.error)
        self._slow.flush(log.info)

    def failed(self, address: Any, exc: OSError) -> None:
        """Serving ``address`` failed: its client went away, or a bug of ours."""
        if is_broken_connection(exc):
            reason = exc.strerror or str(exc) or "no detail"
            self._broken.log(
                log.info,
                "connection from %s broken by the client (%s: %s)",
                peer(address),
                type(exc).__name__,
                reason,
            )
        else:
            self.error(address, exc)

    def error(self, address: Any, exc: BaseException) -> None:
        self._error.log(log.error, "unexpected error serving %s", peer(address), exc_info=exc)

    def cannot_accept(self, pause: float, exc: OSError) -> None:
        self._refused.log(
            log.warning, "cannot accept connections for %g s: %s", pause, exc.strerror or exc
        )

    def refused(self, address: Any, open_connections: int) -> None:
        self._refused.log(
            log.warning,
            "refused a connection from %s: %d connections already open",
            peer(address),
            open_connections,
        )

    def evicted_oldest(self, address: Any, phase: str, waited: float, why: str) -> None:
        self._evicted.log(
            log.info,
            "closed the oldest connection, from %s (%s for %.1f s): %s",
            peer(address),
            phase,
            waited,
            why,
        )

    def shed(self, address: Any, holding: int, limit: int) -> None:
        self._evicted.log(
            log.info,
            "closed the connection from %s: it held %d bytes, the most while all held over %d",
            peer(address),
            holding,
            limit,
        )

    def slow_request(self, address: Any, deadline: float) -> None:
        self._slow.log(
            log.info,
            "closed the connection from %s: its request was not in within %g s",
            peer(address),
            deadline,
        )

    def slow_answer(self, address: Any, left: int, deadline: float) -> None:
        self._slow.log(
            log.info,
            "closed the connection from %s: %d bytes of its answer were not taken within %g s",
            peer(address),
            left,
            deadline,
        )
