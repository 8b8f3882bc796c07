"""The wall clock of a controller pair: the database's, not the host's
(docs/design.md, "One clock for the pair").

Every recorded time of a pair (a step's ``at``, an incident's detection) is
read later by whichever controller leads then, and a resumed wait (the off
hold, a boot wait) is what is left of it by that controller's wall clock.
Two management hosts' clocks differ by their skew, and a hold resumed
across a skew of s seconds would end s seconds early. So a pair's
controllers stamp and measure on one clock, the database's
``clock_timestamp()``, which the lease already reads on every take, renewal
and write check.

Each reading is taken between two readings of the monotonic clock; the
database's time now is that reading carried forward on the monotonic clock,
so a step of the host's own clock moves nothing. Its error is half the round
trip of the reading it came from, plus the drift of the two clocks since
(``DRIFT``); a new reading replaces the kept one when it is closer. A
record is stamped with the latest the database's time may be (``latest``)
and a wait measured against the earliest (``earliest``), so the error can
only make a resumed wait longer, never shorter. Before the first reading (a
standby that has not reached the database yet) it is the host's clock: a
standby records nothing that a resumed wait reads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spark_watchdog.history.core import Connection

# PostgreSQL's clock, in seconds since the epoch (history/postgres.py's dialect).
POSTGRES_NOW = "extract(epoch from clock_timestamp())::float8"

# How fast a host's monotonic clock and the database server's clock may run
# apart, as a fraction (100 ppm: ten times a typical crystal's rating).
DRIFT = 1e-4


def boot_clock() -> float:
    """Seconds on CLOCK_BOOTTIME: unlike CLOCK_MONOTONIC it counts a suspend of
    this host, after which a command checked before it must not leave."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class _Reading:
    database: float  # the database's clock ...
    at: float  # ... at this monotonic instant (the middle of the round trip)
    half_width: float  # half that round trip


class DatabaseTime:
    """The database's clock as this process last read it (thread-safe)."""

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = boot_clock,
        fallback: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic = monotonic
        self._fallback = fallback
        self._lock = threading.Lock()
        self._kept: _Reading | None = None

    def read(self, conn: Connection, now_sql: str = POSTGRES_NOW) -> float:
        """The database's clock, asked on ``conn`` (``now_sql``: the engine's
        expression for it, ``Dialect.now``); kept when it is the closest reading."""
        before = self._monotonic()
        (now,) = conn.execute(f"SELECT {now_sql}").fetchone()
        after = self._monotonic()
        self.note(float(now), before, after)
        return float(now)

    def note(self, database_now: float, before: float, after: float) -> None:
        """A reading of the database's clock taken between ``before`` and ``after``
        (one whose round trip ran backwards says nothing, and is dropped)."""
        if after < before:
            return
        half = (after - before) / 2
        reading = _Reading(database_now, before + half, half)
        with self._lock:
            kept = self._kept
            if kept is None or half <= self._error(kept, reading.at):
                self._kept = reading

    def now(self) -> float:
        """The database's time now (the host's clock before any reading)."""
        with self._lock:
            kept = self._kept
        if kept is None:
            return self._fallback()
        return kept.database + (self._monotonic() - kept.at)

    def latest(self) -> float:
        """The latest the database's time may be now: what a record is stamped with."""
        return self.now() + (self.error() or 0.0)

    def earliest(self) -> float:
        """The earliest it may be now: what a resumed wait is measured against."""
        return self.now() - (self.error() or 0.0)

    def error(self) -> float | None:
        """How far ``now`` may be from the database's clock (None: never read)."""
        with self._lock:
            kept = self._kept
        return None if kept is None else self._error(kept, self._monotonic())

    @staticmethod
    def _error(reading: _Reading, at: float) -> float:
        return reading.half_width + abs(at - reading.at) * DRIFT
