"""The controller's door to the freeze history: async, and honest about failure.

Every write goes through here. When the history cannot be written (locked,
full, corrupt), the controller keeps detecting but takes no power action it
could not record first: it holds rather than acts blind (issue: controller).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.record.tallies import Tallies
from spark_watchdog.errors import NotLeader, StoreError
from spark_watchdog.history.store import HistoryStore

log = logging.getLogger("spark_watchdog.controller")

# Who the controller's own records (holds, settings) are by, in the history.
BY = "controller"

T = TypeVar("T")
P = ParamSpec("P")


class HistoryUnwritable(Exception):
    """A write-ahead record could not be made; the action must not happen."""


class NotLeading(HistoryUnwritable):
    """A controller of a pair may not send now (history/leadership.py): like an
    unwritable history, the action does not happen and its incident stays open,
    for this controller once it leads again or for the one that leads now."""


class Ledger:
    def __init__(
        self,
        store: HistoryStore,
        notifier: Notifier,
        blocking: Callable[[Callable[[], Any]], Awaitable[Any]] | None = None,
    ) -> None:
        self.store = store
        # How a store call runs: in a thread (production), inline (the simulation).
        self._blocking = blocking or asyncio.to_thread
        self.notifier = notifier
        # Counts for /metrics, fed from what was written (never a table scan per scrape).
        self.tallies = Tallies()
        self.problem: str | None = None

    async def write(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` off the event loop, checked like a direct call.

        :raises HistoryUnwritable: the record was not made; the action it stands
            before must not happen (``NotLeading`` in a pair that may not send).
        """
        try:
            result: T = await self._blocking(functools.partial(fn, *args, **kwargs))
        except NotLeader as exc:
            # Not a history problem: this controller of a pair may not write
            # now; the pair says so itself (leadership_lost), once.
            raise NotLeading(str(exc)) from exc
        except StoreError as exc:
            if self.problem is None:
                log.error("history unwritable: %s", exc)
                self.notifier.send(
                    Event("history_unwritable", f"history cannot be written: {exc}; holding")
                )
            self.problem = str(exc)
            raise HistoryUnwritable(str(exc)) from exc
        if self.problem is not None:
            log.info("history writable again")
            self.problem = None
        self.tallies.note_record(result)
        return result

    async def read(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` off the event loop.

        :raises HistoryUnwritable: the history cannot be read; decide nothing on it.
        """
        try:
            result: T = await self._blocking(functools.partial(fn, *args, **kwargs))
            return result
        except StoreError as exc:
            self.problem = str(exc)
            raise HistoryUnwritable(str(exc)) from exc
