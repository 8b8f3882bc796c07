"""The one clock every part of a process is given (docs/design.md, "Time").

Every deadline, hold and cadence runs on ``monotonic``: a wall-clock step
(NTP, an operator's ``date``) can neither end a wait early nor stretch it.
``time`` (UNIX seconds) is only for what is recorded. ``sleep`` waits on
the same clock. The controller, its power paths and the simulation take one
(``SystemClock`` in production, virtual time in the simulation); a pair's
controller records on the database's clock (controller/clock.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clocks; ``sleep`` is asyncio's (the event loop's monotonic time)."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
