"""Small stand-ins for the tests that build one controller part from only what
it uses (tests/controller/test_*_ladder.py): a clock that moves only when the
part waits, a notifier that keeps what it was told, a history call run inline."""

from __future__ import annotations

import asyncio
from typing import Any

from spark_watchdog.controller.record.notify import Event


class StepClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.01)
        await asyncio.sleep(0)


class Told:
    """The notifier: the kinds of what was said, in order."""

    def __init__(self) -> None:
        self.kinds: list[str] = []

    def send(self, event: Event) -> None:
        self.kinds.append(event.kind)


async def inline(fn: Any) -> Any:
    """How the ledger runs a history call here: at once, on the loop."""
    return fn()
