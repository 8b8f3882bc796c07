"""The controller's one clock, injected (docs/design.md, "Proof").

Every deadline, hold and cadence inside a process runs on ``monotonic``:
a wall-clock step (NTP, an operator's ``date``) can neither end a wait early
nor stretch it. ``time`` (UNIX seconds) is only for what is recorded. Across
a restart a resumed wait is computed from recorded wall times and clamped to
``[0, configured]`` by ``remaining``, so no step shortens or stretches it
beyond that. A controller of a pair records and resumes on the database's
clock (``SharedWallClock``), so the skew between two management hosts
cannot shorten a wait the other began. The simulation passes a clock of
virtual time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from spark_watchdog.clock import Clock as Clock
from spark_watchdog.clock import SystemClock as SystemClock


class SharedWallClock(SystemClock):
    """A controller pair's wall clock: the system's monotonic clock and sleep,
    and as ``time`` the earlier of ``shared`` (the earliest the database's
    time may be, history/database_time.py) and the host's own clock.

    The earlier of two clocks is the safe side of every use of ``time``: a
    resumed wait is what is left since its record, so an earlier now leaves
    more of it (never more than all of it), and a budget counts the cuts
    since now minus its window, so an earlier now counts more. A resumed
    wait is cut short only if both clocks run ahead.
    """

    def __init__(self, shared: Callable[[], float], host: Callable[[], float] = time.time) -> None:
        self._shared = shared
        self._host = host

    def time(self) -> float:
        return min(self._shared(), self._host())


def remaining(configured: float, started_wall: float | None, now_wall: float) -> float:
    """What is left of a ``configured`` wait that began at ``started_wall`` (a record).

    Clamped to ``[0, configured]``: a clock stepped back cannot stretch the
    wait, one stepped forward cannot make it negative. Unknown start: all of it.
    """
    if started_wall is None:
        return configured
    return min(configured, max(0.0, configured - (now_wall - started_wall)))


async def wait_until(clock: Clock, done: Callable[[], bool], seconds: float, every: float) -> bool:
    """Poll ``done`` every ``every`` s for up to ``seconds`` on ``clock``; whether it came."""
    deadline = clock.monotonic() + seconds
    while True:
        if done():
            return True
        if clock.monotonic() >= deadline:
            return False
        await clock.sleep(every)
