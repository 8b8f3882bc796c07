"""The controller's parts as the views it decides from read them.

``Parts`` is built once by the controller (controller/daemon.py) and read by
the views (controller/views.py): the config, the I/O seams with their clock
and fence, the history (``Ledger``), the notifier, the node watches, and the
parts that look (``Monitor``), hold (``Holds``) and cut power
(``PowerActions``). None of them is the controller, and none of them reaches
back into it; each part that carries out takes only the few it uses.

``Work`` is what the controller is doing: every ladder's task, by kind and
node, so that one ladder can ask whether another runs, and a lost lease can
cancel all of them at once.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.power_actions import PowerActions
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
from spark_watchdog.controller.look.monitor import Monitor
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier


class Ladder(enum.Enum):
    FENCING = "fencing"  # the freeze ladder (controller/act/recovery.py)
    UNWEDGING = "unwedging"  # the wedged-but-alive ladder (controller/act/wedged.py)
    UNLATCHING = "unlatching"  # the clock-latch ladder (controller/act/unlatch.py)


class Work:
    """The ladders' tasks, one per kind and node (the latest started)."""

    def __init__(self) -> None:
        self._tasks: dict[tuple[Ladder, str], asyncio.Task[Any]] = {}

    def add(self, kind: Ladder, node: str, task: asyncio.Task[Any]) -> None:
        self._tasks[(kind, node)] = task

    def task(self, kind: Ladder, node: str) -> asyncio.Task[Any] | None:
        """The node's latest task of that kind, running or done (None: never started)."""
        return self._tasks.get((kind, node))

    def running(self, *kinds: Ladder) -> bool:
        """A task of any of those kinds runs for some node."""
        return any(k in kinds and not t.done() for (k, _), t in self._tasks.items())

    def running_for(self, kind: Ladder, node: str) -> bool:
        task = self._tasks.get((kind, node))
        return task is not None and not task.done()

    def tasks(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks.values())


@dataclass(frozen=True)
class Parts:
    config: ControllerConfig
    io: ControllerIO
    ledger: Ledger
    notifier: Notifier
    watches: dict[str, NodeWatch]
    monitor: Monitor
    holds: Holds
    power: PowerActions
    work: Work

    @property
    def clock(self) -> Clock:
        return self.io.clock

    @property
    def fence(self) -> Fence:
        return self.io.fence

    @property
    def recorder(self) -> FlightRecorder:
        return self.monitor.recorder

    def ladders_running(self) -> bool:
        """A host recovery or a wedged-but-alive ladder runs (each ends with a restart)."""
        return self.work.running(Ladder.FENCING, Ladder.UNWEDGING)

    def unlatch_in_progress(self) -> bool:
        """An unlatch ladder runs, or a node halted for its latch (here or by an
        earlier controller) is silent, waiting for its long cut."""
        if self.work.running(Ladder.UNLATCHING):
            return True
        now, freeze_after = self.clock.monotonic(), self.config.detection.freeze_after
        return any(
            w.halted_boot is not None and not w.shows_life(now, freeze_after)
            for w in self.watches.values()
        )
