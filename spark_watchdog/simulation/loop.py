"""An asyncio event loop on virtual time.

``time()`` is a number that only moves when the loop has nothing to do:
where a real loop would block in ``select`` until the next timer, this one
jumps to it. The simulation does no real I/O (every seam is simulated), so
a run is a pure function of its seed, and a ten-minute run takes as long as
its callbacks take. Written here rather than taken from a library: the
loop is thirty lines on asyncio's own selector loop, and what it must
guarantee (no real blocking, no wall time anywhere) is easier to check in
thirty lines than in a dependency.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Nothing is scheduled and nothing can wake the loop: the run cannot go on."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)  # the loop's self-pipe only: never blocks
        if ready:
            return ready
        if timeout is None:
            raise Deadlock("the simulation has nothing scheduled")
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


async def _cancel_the_rest() -> None:
    me = asyncio.current_task()
    left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in left:
        task.cancel()
    await asyncio.gather(*left, return_exceptions=True)


def run_virtual(main: Coroutine[Any, Any, T], start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh virtual-time loop."""
    loop = VirtualLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        # What the run left behind (a killed controller's tasks) ends here,
        # cancelled and awaited, not destroyed pending.
        loop.run_until_complete(_cancel_the_rest())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
