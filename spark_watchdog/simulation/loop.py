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
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Deadlock(RuntimeError):
    """Nothing is scheduled and nothing can wake the loop: the run cannot go on."""


class _VirtualSelector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout == 0:
            # Callbacks are ready: time stays. A callback from call_soon_threadsafe
            # is in the ready queue already; its byte on the self-pipe waits for
            # the next poll (nothing in the simulation runs threads).
            return []
        ready = super().select(0)  # the loop's self-pipe only: never blocks
        if ready:
            return ready
        if timeout is None:
            raise Deadlock("the simulation has nothing scheduled")
        if timeout > 0:
            self._loop.advance(timeout)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """Also pauses a process: while ``paused`` says a task is, every step or
    wakeup of it is kept back, to run when :meth:`resume` is called, as if
    the process had been stopped with SIGSTOP at its next await."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self.paused: Callable[[asyncio.Task[Any]], bool] | None = None
        self._kept: list[tuple[asyncio.Handle, Callable[..., Any], tuple[Any, ...], Any]] = []
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., Any], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        paused = self.paused  # None but in a pair's runs: nothing more to look at
        if paused is not None:
            # A task's step and its wakeup are bound to the task (asyncio's own tasks).
            task = getattr(callback, "__self__", None)
            if isinstance(task, asyncio.Task) and paused(task):
                handle = asyncio.Handle(callback, args, self, context)
                self._kept.append((handle, callback, args, context))
                return handle
        return super().call_soon(callback, *args, context=context)

    def resume(self) -> None:
        """Run what was kept back, in the order it was kept (the paused say no more)."""
        kept, self._kept = self._kept, []
        for handle, callback, args, context in kept:
            if not handle.cancelled():
                self.call_soon(callback, *args, context=context)


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
