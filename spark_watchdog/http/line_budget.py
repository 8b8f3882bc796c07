"""At most so many log lines of one kind a window: what a flood of hostile or
broken clients may cost the journal (docs/bad-input.md, "HTTP")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

# A logging call: log.info, log.error and the like.
LogCall = Callable[..., None]


class LineBudget:
    """At most ``burst`` log lines per ``window`` seconds.

    Past the burst one line says that counting has begun; :meth:`flush`, called
    from the server loop, reports the count once the window is over.
    """

    def __init__(
        self,
        burst: int,
        window: float,
        what: str = "broken connections",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._what = what
        self._burst = burst
        self._window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._started = clock()
        self._logged = 0
        self._suppressed = 0

    def _roll(self, now: float) -> tuple[int, float]:
        """Start a new window if the old one is over: (suppressed, its length)."""
        elapsed = now - self._started
        if elapsed < self._window:
            return 0, 0.0
        suppressed = self._suppressed
        self._started, self._logged, self._suppressed = now, 0, 0
        return suppressed, elapsed

    def _report(self, emit: LogCall, suppressed: int, elapsed: float) -> None:
        if suppressed:
            emit("%d more %s in the last %.0f s were not logged", suppressed, self._what, elapsed)

    def log(self, emit: LogCall, message: str, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            suppressed, elapsed = self._roll(self._clock())
            self._report(emit, suppressed, elapsed)
            if self._logged >= self._burst:
                self._suppressed += 1
                return
            self._logged += 1
            last = self._logged == self._burst
        emit(message, *args, **kwargs)
        if last:
            emit(
                "%d %s logged in %.0f s; further ones in that time are counted, not logged",
                self._burst,
                self._what,
                self._window,
            )

    def flush(self, emit: LogCall) -> None:
        with self._lock:
            suppressed, elapsed = self._roll(self._clock())
        self._report(emit, suppressed, elapsed)
