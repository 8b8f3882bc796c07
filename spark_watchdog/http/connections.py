"""The HTTP server's open connections (spark_watchdog/http/server.py): each
one's phase, since when it is in it and until when it may stay, what it
holds of requests and answers; the late, the oldest and the biggest cut.

The server speaks HTTP on them (reads, frames, answers, writes); this table
keeps the account it reads before each wait and cuts by: connections by
phase, oldest first (each phase has one deadline, so the first of each is
the next to fall due), and the bytes all of them hold together. See
docs/design.md, "The HTTP servers".
"""

from __future__ import annotations

import collections
import contextlib
import socket
from collections.abc import Callable
from typing import Any

from spark_watchdog.http.connection_log import ConnectionLog
from spark_watchdog.http.poll import READ, WRITE, Poller

NOTHING = memoryview(b"")


class Phase:
    READING = "reading"  # waiting for a request, or the rest of one
    RUNNING = "running"  # a POST route runs on its thread
    WRITING = "writing"  # the answer is not all taken yet
    CLOSING = "closing"  # answered for the last time; input discarded until the linger ends
    CLOSED = "closed"


# Phases that end at a deadline; a route running has none of its own.
TIMED = (Phase.READING, Phase.WRITING, Phase.CLOSING)

# What the poller watches a connection for, by phase (none while a route runs).
_EVENTS = {
    Phase.READING: READ,
    Phase.CLOSING: READ,
    Phase.WRITING: WRITE,
}


class Connection:
    __slots__ = ("address", "due", "events", "inbox", "keep_alive", "outbox", "phase", "since")

    def __init__(self, address: Any) -> None:
        self.address = address
        self.inbox = bytearray()
        self.outbox = NOTHING
        self.keep_alive = True
        self.phase = Phase.READING
        self.since = 0.0
        self.due = 0.0
        # What the poller watches for (0: not registered).
        self.events = 0


def holding(conn: Connection) -> int:
    """The bytes ``conn`` holds: its request not yet whole, its answer not yet taken."""
    return len(conn.inbox) + len(conn.outbox)


class ConnectionTable:
    """The open connections of one server loop, used from its thread only.

    ``deadline_s(phase)``: how long a connection may stay in a timed phase,
    asked as it enters one (the server's limits, read when they apply).
    ``held`` is the bytes all connections hold; the server counts what it
    takes in and sends out."""

    def __init__(
        self,
        poller: Poller,
        clock: Callable[[], float],
        log: ConnectionLog,
        deadline_s: Callable[[str], float],
    ) -> None:
        self._poller = poller
        self._clock = clock
        self._log = log
        self._deadline_s = deadline_s
        self.sockets: dict[Connection, socket.socket] = {}
        # Connections by phase, oldest first.
        self.phases: dict[str, collections.OrderedDict[Connection, None]] = {
            phase: collections.OrderedDict() for phase in (*TIMED, Phase.RUNNING)
        }
        self.held = 0

    def __len__(self) -> int:
        return len(self.sockets)

    def open(self, sock: socket.socket, address: Any) -> Connection:
        """``sock``, just accepted, as a connection waiting for its first request."""
        sock.setblocking(False)
        conn = Connection(address)
        self.sockets[conn] = sock
        self.enter(conn, Phase.READING)
        return conn

    def enter(self, conn: Connection, phase: str) -> None:
        """``conn`` moves to ``phase``: its clock starts and the poller
        watches what that phase waits for."""
        self.phases[conn.phase].pop(conn, None)
        now = self._clock()
        conn.phase, conn.since = phase, now
        if phase != Phase.RUNNING:
            conn.due = now + self._deadline_s(phase)
        self.phases[phase][conn] = None
        events = _EVENTS.get(phase, 0)
        if events != conn.events:
            self._poller.change(self.sockets[conn], conn.events, events, conn)
            conn.events = events

    def next_due(self, until: float) -> float:
        """The first deadline of any connection, if it comes before ``until``."""
        for phase in TIMED:
            oldest = next(iter(self.phases[phase]), None)
            if oldest is not None:
                until = min(until, oldest.due)
        return until

    def expire(self, now: float) -> None:
        """Close every connection whose phase's deadline has passed."""
        for phase in TIMED:
            waiting = self.phases[phase]
            while waiting:
                conn = next(iter(waiting))
                if conn.due > now:
                    break
                if conn.phase == Phase.READING and conn.inbox:
                    self._log.slow_request(conn.address, self._deadline_s(conn.phase))
                elif conn.phase == Phase.WRITING:
                    self._log.slow_answer(
                        conn.address, len(conn.outbox), self._deadline_s(conn.phase)
                    )
                self.close(conn)

    def evict_oldest(self, why: str) -> bool:
        """Close the connection that has waited longest (never one running a route)."""
        fronts = [
            next(iter(self.phases[phase]), None)
            for phase in (Phase.CLOSING, Phase.READING, Phase.WRITING)
        ]
        candidates = [conn for conn in fronts if conn is not None]
        if not candidates:
            return False
        oldest = min(candidates, key=lambda conn: conn.since)
        if oldest.phase != Phase.CLOSING:
            waited = self._clock() - oldest.since
            self._log.evicted_oldest(oldest.address, oldest.phase, waited, why)
        self.close(oldest)
        return True

    def shed(self, limit: int) -> None:
        """Past ``limit`` bytes held: close the connections holding the most."""
        while self.held > limit:
            biggest = max(self.sockets, key=holding)
            self._log.shed(biggest.address, holding(biggest), limit)
            self.close(biggest)

    def broken(self, conn: Connection, exc: OSError) -> None:
        self._log.failed(conn.address, exc)
        self.close(conn)

    def close(self, conn: Connection) -> None:
        sock = self.sockets.pop(conn, None)
        if sock is None:
            return
        if conn.events:
            self._poller.unregister(sock)
        self.phases[conn.phase].pop(conn, None)
        self.held -= holding(conn)
        conn.inbox = bytearray()
        conn.outbox = NOTHING
        conn.phase = Phase.CLOSED
        with contextlib.suppress(OSError):
            sock.close()

    def close_all(self) -> None:
        for conn in list(self.sockets):
            self.close(conn)
