"""The agent asked to stop (SIGTERM): it says so in ``/v1/state``, and lingers
while the whole system goes down so the controller sees a planned reboot, not
a frozen host (whether it does is :mod:`spark_watchdog.agent.shutdown`'s
question)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from spark_watchdog.agent.shutdown import SystemStopping

log = logging.getLogger("spark_watchdog.agent")


class WindDown:
    """What ``stopping`` in ``/v1/state`` says, and the shutdown linger."""

    def __init__(self, node: str, linger: float, system_stopping: SystemStopping) -> None:
        self._node = node
        self._linger = linger
        # Asked once, at SIGTERM, off the event loop: is the whole system
        # going down? Tests pass their own answer.
        self._system_stopping = system_stopping
        self._cut = asyncio.Event()
        # None while running; {"since", "system"} once asked to stop.
        self.stopping: dict[str, Any] | None = None

    async def run(self, publish: Callable[[], None]) -> None:
        """Asked to stop: say why in /v1/state (``publish``), and linger while the
        system goes down.

        The heartbeat, the probes and the endpoint all keep running meanwhile,
        so ``seq`` keeps advancing: a stopping agent is not a frozen one.
        """
        since = time.time()
        system = await asyncio.to_thread(self._ask_system_stopping)
        self.stopping = {"since": round(since, 3), "system": system}
        publish()
        linger = self._linger
        if not system or linger <= 0:
            log.info("agent %s stopping", self._node)
            return
        log.info(
            "agent %s stopping: the system is going down; /v1/state says so for %.1f s",
            self._node,
            linger,
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cut.wait(), linger)

    def _ask_system_stopping(self) -> bool:
        try:
            return bool(self._system_stopping())
        except Exception:
            # Not knowing is "no": exit promptly, as before this existed.
            log.exception("cannot tell whether the system is shutting down")
            return False

    def cut(self) -> None:
        """End the linger now (a second SIGTERM or SIGINT)."""
        self._cut.set()
